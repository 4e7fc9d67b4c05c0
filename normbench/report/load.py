"""Reading runs: find run directories (and bench CSVs) below the inputs and read each run once.

A run is any directory holding config.yaml. Its summary.json says how it ended; metrics.jsonl
holds its curves. A run that failed before training (a config error, a crash while building)
has a failed summary.json and no metrics.jsonl: it is kept and counted, with no curves.
Everything else in the report is computed from the ``ReportData`` this module returns.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from normbench.core.errors import ConfigError
from normbench.core.fileio import leaves, read_jsonl
from normbench.core.identity import ADDED_KEYS
from normbench.core.provenance import numerics_of, provenance_of
from normbench.core.runs import LEARN_MARGIN
from normbench.report.metrics import BITS_PER_BYTE, METRICS
from normbench.report.metrics import DEFAULT as DEFAULT_METRIC

LOSS_FIELDS = ("final_val_loss", "best_val_loss", "floor_gap")
SPEED_FIELDS = ("tokens_per_s", "step_ms_p50", "step_ms_p90", "peak_mem_mb")
BENCH_COLUMNS = ("norm", "impl", "dim", "dtype", "device", "pass", "ms")
# The logit diagnostics (Wortsman et al. 2023): per stats record and, as peaks, in summary.json.
# Under a soft-cap each is what the softmax sees and its *_raw the value before the cap; a run
# without the cap (or older than the raw fields) writes no *_raw: there the raw value is the capped one.
LOGIT_FIELDS = ("max_attn_logit", "max_log_z", "max_attn_logit_raw", "max_log_z_raw")
RAW_LOGITS = {"max_attn_logit_raw": "max_attn_logit", "max_log_z_raw": "max_log_z"}
ALIASES = {"norm.name": "norm", "placement.name": "placement"}


def find_inputs(paths: list[Path]) -> tuple[list[Path], list[Path]]:
    """Run directories (any directory holding config.yaml) below ``paths``, and bench CSVs."""
    run_dirs, bench_csvs = [], []
    for path in paths:
        if not path.exists():
            raise ConfigError(
                f"path does not exist: {path}", allowed=["a run or sweep directory", "a bench .csv file"]
            )
        if path.is_file():
            if path.suffix.lower() != ".csv":
                raise ConfigError(
                    f"{path} is a file but not a bench CSV",
                    allowed=["a run or sweep directory", "a bench .csv file"],
                )
            bench_csvs.append(path)
            continue
        for root, dirs, files in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))  # .hydra/ holds a config.yaml too
            if "config.yaml" in files:
                run_dirs.append(Path(root))
    unique = {d.resolve(): d for d in run_dirs}  # overlapping input paths must not count a run twice
    return list(unique.values()), bench_csvs


def _num(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _finite(value) -> float:
    """A number, or NaN for a missing or non-finite one (a diverged run logs inf/NaN logits)."""
    value = _num(value)
    return value if math.isfinite(value) else math.nan


def load_run(run_dir: Path, warn) -> tuple[dict, dict, list[dict]] | None:
    """(config, summary, metric records) of one run, or None (with a warning) if it cannot be used."""
    if not (run_dir / "summary.json").exists():
        warn(f"skipped {run_dir}: no summary.json (still running or killed)")
        return None
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        config = yaml.load((run_dir / "config.yaml").read_text(), Loader=loader)
        if not isinstance(config, dict):
            raise ValueError("not a mapping")
    except (OSError, ValueError, yaml.YAMLError) as e:
        warn(f"skipped {run_dir}: unreadable config.yaml ({e})")
        return None
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
        if not isinstance(summary, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as e:
        warn(f"skipped {run_dir}: corrupt summary.json ({e})")
        return None
    if not (run_dir / "metrics.jsonl").exists():
        # A run that failed before its first step (a config error, a crash while building the
        # model) has nothing to plot, but it is a result: it must be counted.
        if summary.get("status") == "failed":
            return config, summary, []
        warn(f"skipped {run_dir}: no metrics.jsonl")
        return None
    try:
        records = read_jsonl(run_dir / "metrics.jsonl", warn)
    except (OSError, ValueError) as e:
        warn(f"skipped {run_dir}: unreadable metrics.jsonl ({e})")
        return None
    return config, summary, records


# The provenance columns of summary.csv, one per key of a run's provenance block (normbench.core.provenance).
PROVENANCE = ("commit", "dirty", "torch", "device", "device_name", "precision", "compile", "norm_impl")
NUMERICS = "provenance.numerics"
NOT_RECORDED = "not recorded"  # a run stored before provenance


def provenance_columns(summary: dict) -> dict:
    """provenance.<key> for the keys of PROVENANCE, norm_impl as 'ln=torch rms=fused-cpu', and the
    numerics version (a run without provenance counts as the legacy one)."""
    block = provenance_of(summary)
    impl = block.get("norm_impl")
    if isinstance(impl, dict):
        block["norm_impl"] = " ".join(f"{k}={v}" for k, v in sorted(impl.items()))
    return {
        **{
            f"provenance.{k}": str(block[k]) if block.get(k) is not None else NOT_RECORDED for k in PROVENANCE
        },
        NUMERICS: numerics_of(summary),
    }


@dataclass
class ReportData:
    runs: pd.DataFrame  # one row per run: summary.csv
    config_keys: list[str]  # dotted config keys, in first-seen order
    train: pd.DataFrame  # run, step, tokens, train_loss
    evals: pd.DataFrame  # run, step, val_loss
    grads: pd.DataFrame  # run, step, grad_norm (global, from stats records)
    layers: pd.DataFrame  # run, when ("first"/"last" stats record), step, layer, grad (mlp_out), resid_rms,
    # saturation (the largest saturated fraction among the layer's point-wise norms; NaN for other norms),
    # grad_layer (the L2 norm of all the layer's gradients together), resid_var (its output's variance)
    logits: pd.DataFrame  # run, step, LOGIT_FIELDS (stats records that carry them; finite only)
    bench: pd.DataFrame | None = None
    metric: str = DEFAULT_METRIC  # --metric: the verdict's metric (normbench.report.metrics)
    size_key: str | None = None  # the scale axis's key (--scale): configurations are ranked within a size
    # Filled in by the later stages of a report (normbench.report.build):
    keys: list[str] | None = None  # group keys
    agg: pd.DataFrame | None = None  # one row per group, best first: aggregate.csv
    styles: dict | None = None  # config label -> matplotlib line/bar style
    tune: str | None = None  # the tuning key (train.lr), or None
    tuned: pd.DataFrame | None = None  # one row per configuration (group keys without tune): tuned.csv
    scale: object | None = (
        None  # normbench.report.scale.Scale: the scale axis, scale.csv and trend.csv, or None
    )
    predict: pd.DataFrame | None = None  # predict.csv (--predict), or None
    backtest: pd.DataFrame | None = None  # backtest.csv (--predict with ≥ 4 sizes), or None


def load_runs(run_dirs: list[Path], warn) -> ReportData:
    """Every run's row (config, summary, provenance, loss at init) and its records as tables."""
    rows, records = [], _Records()
    config_keys: dict = {}
    for run_dir in run_dirs:
        loaded = load_run(run_dir, warn)
        if loaded is None:
            continue
        config, summary, run_records = loaded
        row = _run_row(run_dir, config, summary, run_records)
        config_keys.update(dict.fromkeys(row.pop("_config_keys")))
        records.add(len(rows), run_records)
        rows.append(row)
    return records.data(_runs_frame(rows), list(config_keys))


def _run_row(run_dir: Path, config: dict, summary: dict, records: list[dict]) -> dict:
    """One run's row: its summary's and config's leaves, its provenance, the short columns and its
    validation loss at initialisation (the ceiling of the LR sensitivity; the yardstick of
    ``did_not_learn``). ``_config_keys``: the config's own keys, in order."""
    flat_config = leaves(config, lists="json")
    if any(key.startswith("model.") for key in flat_config):  # a run stored before a key was added
        for key, value in ADDED_KEYS.items():
            flat_config.setdefault(key, value)
    status = summary.get("status")
    if not status:  # runs older than the status field: a finite final loss means it finished
        status = "completed" if math.isfinite(_num(summary.get("final_val_loss"))) else "unknown"
    norm, placement = config.get("norm"), config.get("placement")
    at_init = [r for r in records if r.get("kind") == "eval" and _num(r.get("step")) == 0]
    return {
        **leaves({k: v for k, v in summary.items() if k not in ("status", "provenance")}, lists="json"),
        **flat_config,
        **provenance_columns(summary),
        # last, so that no config or summary key can shadow the short columns
        "run_dir": str(run_dir),
        "norm": norm.get("name") if isinstance(norm, dict) else norm,
        "placement": placement.get("name") if isinstance(placement, dict) else placement,
        "seed": config.get("seed"),
        "status": status,
        "init_val_loss": _num(at_init[0].get("val_loss")) if at_init else math.nan,
        "unigram_loss": _num(at_init[0].get("unigram_loss")) if at_init else math.nan,
        "_config_keys": list(flat_config),
    }


class _Records:
    """The runs' records (metrics.jsonl) as they are read, one table per kind."""

    def __init__(self) -> None:
        self.train, self.evals, self.grads, self.layers, self.logits = [], [], [], [], []

    def add(self, run: int, records: list[dict]) -> None:
        stats = []
        for r in records:
            kind = r.get("kind")
            if kind == "train":
                self.train.append(
                    (run, _num(r.get("step")), _num(r.get("tokens")), _num(r.get("train_loss")))
                )
            elif kind == "eval":
                self.evals.append((run, _num(r.get("step")), _num(r.get("val_loss"))))
            elif kind == "stats":
                self.grads.append((run, _num(r.get("step")), _num(r.get("grad_norm"))))
                # Runs older than the logit diagnostics (or with them off) have neither key.
                peaks = [_finite(r.get(k)) for k in LOGIT_FIELDS]
                if any(map(math.isfinite, peaks)):
                    self.logits.append((run, _num(r.get("step")), *peaks))
                if isinstance(r.get("layers"), list) and r["layers"]:
                    stats.append(r)
        # Only the first and last per-layer snapshots are drawn; keep nothing else.
        for when, r in [("first", stats[0]), ("last", stats[-1])] if stats else []:
            self.layers += [_layer_row(run, when, r, i, layer) for i, layer in enumerate(r["layers"])]

    def data(self, runs: pd.DataFrame, config_keys: list[str]) -> ReportData:
        logits = pd.DataFrame(self.logits, columns=["run", "step", *LOGIT_FIELDS])
        for raw, capped in RAW_LOGITS.items():
            logits[raw] = logits[raw].fillna(logits[capped])
            # only once some run had a cap: no raw column for a report without one
            if raw in runs and capped in runs:
                runs[raw] = runs[raw].fillna(runs[capped])
        return ReportData(
            runs=runs,
            config_keys=config_keys,
            train=pd.DataFrame(self.train, columns=["run", "step", "tokens", "train_loss"]),
            evals=pd.DataFrame(self.evals, columns=["run", "step", "val_loss"]),
            grads=pd.DataFrame(self.grads, columns=["run", "step", "grad_norm"]),
            layers=pd.DataFrame(self.layers, columns=LAYER_COLUMNS),
            logits=logits,
        )


LAYER_COLUMNS = ["run", "when", "step", "layer", "grad", "resid_rms", "saturation", "grad_layer", "resid_var"]


def _layer_row(run: int, when: str, record: dict, i: int, layer) -> tuple:
    """One layer of a per-layer snapshot, as LAYER_COLUMNS."""
    layer = layer if isinstance(layer, dict) else {}
    grad = layer.get("grad_norm") if isinstance(layer.get("grad_norm"), dict) else {}
    saturation = layer.get("saturation") if isinstance(layer.get("saturation"), dict) else {}
    return (
        run,
        when,
        _num(record.get("step")),
        i,
        _num(grad.get("mlp_out")),
        _num(layer.get("resid_rms")),
        max(map(_num, saturation.values()), default=math.nan),
        # the parts' norms combined: the norm of the layer's gradients as one vector
        # (a part without parameters, the norm of a norm-free block, has none: left out)
        math.sqrt(sum(v**2 for v in map(_num, grad.values()) if math.isfinite(v))) if grad else math.nan,
        _num(layer.get("resid_var")),
    )


def _runs_frame(rows: list[dict]) -> pd.DataFrame:
    """The runs' rows as one table: every expected column present, numbers numeric, the gap to the
    floor and ``did_not_learn`` derived, the short columns first."""
    runs = pd.DataFrame(rows)
    expected = (
        "run_dir",
        "norm",
        "placement",
        "seed",
        "status",
        "floor_loss",
        "init_val_loss",
        "unigram_loss",
        "leaks_future",
    )
    for col in (*expected, *METRICS):
        if col not in runs:
            runs[col] = np.nan
    for col in (*METRICS, "init_val_loss", "unigram_loss"):
        runs[col] = pd.to_numeric(runs[col], errors="coerce")
    runs["floor_gap"] = runs["final_val_loss"] - pd.to_numeric(runs["floor_loss"], errors="coerce")
    runs["did_not_learn"] = did_not_learn(runs)
    for col in [c for c in LOGIT_FIELDS if c in runs]:  # the peaks: null with statistics off
        runs[col] = pd.to_numeric(runs[col], errors="coerce").replace([np.inf, -np.inf], np.nan)
    first = ["run_dir", "norm", "placement", "seed", "status", *METRICS, "init_val_loss"]
    return runs[first + [c for c in runs.columns if c not in first]]


# A run learned where its final validation loss ends below this share of its loss at initialisation:
# the claims' stable_lr reads a run as stable by the same share (normbench.claims.predicates).
LEARNED_FRACTION = 0.9


def did_not_learn(runs: pd.DataFrame) -> pd.Series:
    """Whether each run completed without learning: its final validation loss not below
    LEARNED_FRACTION of its own loss at initialisation (a run at the loss of a uniform guess, or
    barely under it), or not LEARN_MARGIN below the unigram loss of its validation targets, where its
    step-0 evaluation recorded one (a run that predicts each token's frequency and ignores its
    context). False for a run that did not complete, or without a step-0 evaluation."""
    final = pd.to_numeric(runs["final_val_loss"], errors="coerce")
    init = pd.to_numeric(runs["init_val_loss"], errors="coerce")
    unigram = pd.to_numeric(runs["unigram_loss"], errors="coerce")
    stuck = (final >= LEARNED_FRACTION * init) | (final >= unigram - LEARN_MARGIN)
    return runs["status"].eq("completed") & stuck


def in_bits_per_byte(d: ReportData, metric: str) -> None:
    """Every run's losses (final, best, at init, the validation curves) in bits per byte, in place.

    loss / ln 2 / bytes_per_token, each run's own: so configurations with different tokenizers
    (a character-level and a BPE run) are compared, tuned and given a verdict on one scale.
    """
    runs = d.runs
    if "bytes_per_token" not in runs:  # runs from before bits per byte
        runs["bytes_per_token"] = math.nan
    per_byte = pd.to_numeric(runs["bytes_per_token"], errors="coerce") * math.log(2)
    missing = runs["run_dir"][per_byte.isna() & runs["status"].eq("completed")]
    if len(missing):
        raise ConfigError(
            f"--metric {metric}: {len(missing)} completed run(s) have no bytes per token (the synthetic "
            f"corpus, or shards without meta.json; set data.bytes_per_token), e.g. {missing.iloc[0]}",
            allowed=[m for m in METRICS if m not in BITS_PER_BYTE],
        )
    for col in ("final_val_loss", "best_val_loss", "init_val_loss", "unigram_loss"):
        runs[col] = runs[col] / per_byte
    runs["floor_gap"] = math.nan  # the synthetic floor is in nats per token, and has no bytes
    if "layer_skip_loss" in runs:  # the losses with one layer skipped, compared with the final loss
        runs["layer_skip_loss"] = [
            _scaled(losses, scale) for losses, scale in zip(runs["layer_skip_loss"], per_byte)
        ]
    d.evals["val_loss"] = d.evals["val_loss"] / d.evals["run"].map(per_byte.reset_index(drop=True))


def _scaled(losses, scale: float):
    """A JSON list of losses (or null entries) divided by ``scale``; NaN/None left as it is."""
    if not isinstance(losses, str):
        return losses
    return json.dumps([None if v is None else v / scale for v in json.loads(losses)])


def layer_skip(d: ReportData) -> pd.DataFrame:
    """run, layer, skip_rise: the validation loss with that layer skipped minus the full model's
    (summary.json's layer_skip_loss, written at the end of a run with statistics on)."""
    rows = []
    column = d.runs["layer_skip_loss"] if "layer_skip_loss" in d.runs else pd.Series(dtype=object)
    for run, losses in column.dropna().items():
        losses = json.loads(losses) if isinstance(losses, str) else losses
        final = d.runs.at[run, "final_val_loss"]
        rows += [(run, i, loss - final) for i, loss in enumerate(losses or []) if loss is not None]
    return pd.DataFrame(rows, columns=["run", "layer", "skip_rise"])


def read_bench(paths: list[Path]) -> pd.DataFrame | None:
    frames = []
    for path in paths:
        try:
            frame = pd.read_csv(path)
        except (OSError, ValueError) as e:  # pandas' EmptyDataError/ParserError are ValueErrors
            raise ConfigError(f"cannot read bench CSV {path}: {e}") from None
        missing = [c for c in BENCH_COLUMNS if c not in frame]
        if missing:
            raise ConfigError(
                f"{path} is not a bench CSV (missing columns {', '.join(missing)})", allowed=BENCH_COLUMNS
            )
        frames.append(frame if "ratio_to_ln" in frame else _with_ratio_to_ln(frame))
    return pd.concat(frames, ignore_index=True) if frames else None


def _with_ratio_to_ln(frame: pd.DataFrame) -> pd.DataFrame:
    """A CSV from before ``ratio_to_ln``: derived from its own LayerNorm native rows, timed in the
    same run (NaN where the file has none: the chart then falls back to the times)."""
    keys = [k for k in ("device", "dtype", "pass", "dim", "tokens") if k in frame]
    ln = frame[frame["norm"].eq("ln") & frame["impl"].eq("native")].groupby(keys, dropna=False)["ms"].mean()
    ref = frame.join(ln.rename("_ln_ms"), on=keys)["_ln_ms"]
    return frame.assign(ratio_to_ln=frame["ms"] / ref)
