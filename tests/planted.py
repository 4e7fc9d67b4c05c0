"""Planted run directories and claims, for the claims registry's tests: runs as training leaves them,
with results chosen here, whose verdicts the tests compute by hand."""

from __future__ import annotations

import json

import numpy as np
import yaml
from scipy import stats

from normbench.claims.predicates import judge
from normbench.claims.schema import parse_claim
from normbench.core import provenance
from normbench.report.load import find_inputs, load_runs

PROVENANCE = {
    "commit": "abc1234",
    "dirty": False,
    "torch": "2.13.0+cpu",
    "device": "cpu",
    "numerics": provenance.NUMERICS,
    "date": "2026-11-20",
}


def plant(
    root,
    name,
    *,
    seed,
    final,
    norm="ln",
    placement="pre",
    lr=0.01,
    status="completed",
    curve=None,
    params=1000,
    provenance=PROVENANCE,
    **config,
):
    """A run directory as training leaves it: config.yaml, metrics.jsonl (step-0 eval, then ``curve``:
    {step: val_loss}, ending at ``final`` by default) and summary.json. ``config``: dotted keys."""
    run = root / name
    run.mkdir(parents=True)
    cfg = {
        "seed": seed,
        "norm": {"name": norm},
        "placement": {"name": placement},
        "model": {"n_layer": 2, "d_model": 64},
        "train": {"lr": lr, "steps": 100, "warmup_steps": 10},
    }
    for key, value in config.items():
        group, leaf = key.split("__")
        cfg.setdefault(group, {})[leaf] = value
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    curve = curve or {50: final + 0.5, 100: final}
    evals = [{"kind": "eval", "step": 0, "val_loss": 4.0}]
    evals += [{"kind": "eval", "step": s, "val_loss": v} for s, v in curve.items()]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in evals))
    summary = {
        "status": status,
        "final_val_loss": final if status == "completed" else None,
        "params": params,
        "tokens_per_s": 1000.0,
    }
    if provenance is not None:
        summary["provenance"] = provenance
    (run / "summary.json").write_text(json.dumps(summary))
    return run


def write_claim(folder, cid, *, kind, a, b, tune=None, metric="final_val_loss", min_seeds=None, **predicate):
    """A user's claim YAML in FOLDER/claim/CID.yaml; returns its path."""
    body = {
        "id": cid,
        "claim": f"{cid} holds.",
        "source": {
            "kind": "paper",
            "authors": "Ada Lovelace, Charles Babbage",
            "year": 2020,
            "arxiv": "2001.00001",
            "title": "A planted claim",
            "setting": "1.3B parameters",
        },
        "sweep": {"experiment": None, "overrides": ["norm=ln,rms", "seed=0,1,2"]},
        "compare": {"a": a, "b": b, "metric": metric, "tune": tune},
        "predicate": {"kind": kind, **predicate},
        "scale": {"model": "mini", "why": "the default model, as the sweep composes it."},
        "min_seeds": min_seeds or (6 if kind in ("steps_to_target", "stable_lr") else 3),
        "scale_dependent": "1.3B parameters",
    }
    path = folder / "claim" / f"{cid}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def verdict_of(tmp_path, claim_path, runs):
    d = load_runs(find_inputs([runs])[0], lambda m: None)
    return judge(parse_claim(claim_path), d)


def t_interval(d, confidence=0.95):
    d = np.asarray(d, float)
    return stats.t.interval(confidence, len(d) - 1, loc=d.mean(), scale=stats.sem(d))


def pair(root, a_losses, b_losses, a_norm="rms", b_norm="ln", **kw):
    """Planted rms (a) and ln (b) runs over seeds 0.. at one learning rate."""
    for seed, (la, lb) in enumerate(zip(a_losses, b_losses)):
        plant(root, f"{a_norm}_s{seed}", seed=seed, final=la, norm=a_norm, **kw)
        plant(root, f"{b_norm}_s{seed}", seed=seed, final=lb, norm=b_norm, **kw)
