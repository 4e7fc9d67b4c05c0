"""Shared test helpers: compose configs the way the CLI does, train tiny models, run the CLI, build small
models."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import settings

from normbench.core.configtree import compose
from normbench.model.gpt import GPT
from normbench.training.config import load_group, parse_config
from normbench.training.diagnostics import LayerStats
from normbench.training.loop import Run, train

# CI replays the same examples every time; locally hypothesis keeps exploring new ones.
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """End the test process once pytest has said everything, without the interpreter's teardown. This
    process has loaded torch, its extension, pyarrow, tokenizers, ray's and mlflow's clients and more;
    their native destructors at exit once crashed it (SIGSEGV, exit 139) after every test had passed,
    which would fail a green run. Processes the tests start (the CLI, sweeps) exit normally."""
    status = getattr(config, "normbench_exit_status", None)
    if status is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


def pytest_sessionfinish(session, exitstatus):
    session.config.normbench_exit_status = int(exitstatus)


REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"

# Small enough that a run takes about a second on one core.
TINY = [
    "model=tiny",
    "train.steps=20",
    "train.batch_size=8",
    "train.eval_every=10",
    "train.eval_batches=2",
    "train.log_every=5",
    "train.warmup_steps=2",
    "train.progress=false",
    "train.device=cpu",
]
# A small synthetic corpus: these keys exist only under data=synthetic.
SYNTH = ["data.train_sequences=128", "data.val_sequences=32"]


def tiny(*overrides: str) -> list[str]:
    """TINY plus the small corpus unless another dataset is chosen."""
    other_data = any(o.startswith("data=") for o in overrides)
    return [*TINY, *([] if other_data else SYNTH), *overrides]


def compose_cfg(overrides=()):
    return compose(list(overrides))


def skip_unless_ci(reason: str) -> None:
    """Skip here, fail under CI (NORMBENCH_CI=1, set by .ci/run): where CI's machine has what the test
    needs, a skip would hide a cause of ours."""
    if os.environ.get("NORMBENCH_CI") == "1":
        pytest.fail(f"{reason} (under CI this fails rather than skips)")
    pytest.skip(reason)


def train_tiny(run_dir: Path, *overrides: str) -> dict:
    cfg = compose_cfg(tiny(*overrides))
    return train(parse_config(cfg), Path(run_dir))


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def run_cli(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: int = 300):
    """The installed command as a user types it (python -m normbench), output captured."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "normbench", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# A small model built directly, without a config: test_model's QK-norm and test_placements' hand-built blocks.
SMALL_MODEL = load_group("model", n_layer=4, n_head=2, d_model=32, block_size=16)


def build(placement: str, norm: str = "ln", qk_norm: str = "none", **options) -> GPT:
    torch.manual_seed(0)
    cfg = dataclasses.replace(SMALL_MODEL, qk_norm=qk_norm)
    return GPT(cfg, 16, {"name": norm}, {"name": placement, "final_norm": True, **options}).eval()


def randomize_norms(model: torch.nn.Module) -> None:
    """Gains and biases away from their 1/0 init, so a wrong wiring cannot hide behind them."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.rand_like(p) + 0.5)


def stats_step(tmp_path, *overrides):
    """One statistics step of a tiny run, and the model and batch it ran on (rebuilt by hand).

    test_diagnostics' logit statistics and test_train's z-loss check it by hand."""
    cfg = parse_config(compose_cfg(tiny("train.grad_clip=0", "model.n_layer=2", *overrides)))
    state = Run(cfg, tmp_path / "run")
    stats = LayerStats(state.model)
    record_gen = state.batch_gen.get_state()
    attn_inputs = []
    hooks = [
        b.attn.register_forward_pre_hook(lambda m, args: attn_inputs.append(args[0].detach()))
        for b in state.model.blocks
    ]
    weights = {n: t.detach().clone() for n, t in state.model.state_dict().items()}
    _, grad_norm = state.train_step(stats)
    for h in hooks:
        h.remove()
    state.batch_gen.set_state(record_gen)
    x, y = state.data.train_batch(state.tcfg.batch_size, state.batch_gen)
    return stats.record(0, grad_norm, 0.0), weights, attn_inputs, x, y, state
