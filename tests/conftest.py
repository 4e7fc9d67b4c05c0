"""Shared test helpers: compose configs the way the CLI does, train tiny models, run the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from hypothesis import settings
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from normbench.config import conf_dir, parse_config
from normbench.train import train

# CI replays the same examples every time; locally hypothesis keeps exploring new ones.
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

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
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def train_tiny(run_dir: Path, *overrides: str) -> dict:
    cfg = compose_cfg(tiny(*overrides))
    return train(parse_config(cfg), Path(run_dir))


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def run_cli(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: int = 300):
    """The installed command as a user types it (python -m normbench), output captured."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "normbench", *args], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout
    )


