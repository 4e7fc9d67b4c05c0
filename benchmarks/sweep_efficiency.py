r"""Where a sweep's time goes: run a sweep, then split the workers' time into training steps and the rest.

    python benchmarks/sweep_efficiency.py experiment=lr_sensitivity \
        hydra/launcher=joblib hydra.launcher.n_jobs=2

Runs ``normbench sweep`` with the given overrides into a fresh sweep directory (or reads one
already run: --sweep-dir DIR --wall SECONDS), and prints: the wall time; the workers' time
(wall x parallel jobs); the training steps' share of it; and the runs' own time per phase
(summary.json's time_s; for runs from before time_s, the steps from metrics.jsonl's step_ms).
docs/benchmarks.md#sweep-efficiency records the figures.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def phases(run_dir: Path) -> dict[str, float]:
    """The run's seconds per phase; a run without time_s gets its steps from metrics.jsonl and the rest as
    'other'."""
    summary = json.loads((run_dir / "summary.json").read_text())
    if "time_s" in summary:
        return dict(summary["time_s"])
    records = [
        json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()
    ]
    train = [r for r in records if r.get("kind") == "train"]
    steps, last = 0.0, 0
    for r in train:  # step_ms is the window's mean: times the window's length
        steps += r["step_ms"] / 1000 * (r["step"] - last)
        last = r["step"]
    return {"steps": steps, "other": summary["wall_s"] - steps}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--sweep-dir", type=Path, help="analyse this sweep directory instead of running one")
    parser.add_argument("--wall", type=float, help="with --sweep-dir: the sweep's wall time in seconds")
    parser.add_argument("--workers", type=int, help="parallel jobs (default: hydra.launcher.n_jobs, else 1)")
    args = parser.parse_args()
    n_jobs = [int(m[1]) for o in args.overrides if (m := re.fullmatch(r"hydra\.launcher\.n_jobs=(-?\d+)", o))]
    workers = args.workers or (n_jobs[0] if n_jobs else 1)
    sweep_dir, wall = args.sweep_dir, args.wall
    if sweep_dir is None:
        sweep_dir = Path(tempfile.mkdtemp(prefix="sweep-efficiency-")) / "sweep"
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "normbench", "sweep", *args.overrides, f"hydra.sweep.dir={sweep_dir}"],
            check=True,
        )
        wall = time.perf_counter() - start
    runs = [d for d in sorted(sweep_dir.iterdir()) if (d / "summary.json").exists()]
    total: dict[str, float] = {}
    for run_dir in runs:
        for phase, seconds in phases(run_dir).items():
            total[phase] = total.get(phase, 0.0) + seconds
    worker_s = workers * wall
    print(f"{len(runs)} runs in {wall:.1f} s wall, {workers} worker(s): {worker_s:.0f} worker-seconds")
    print(
        f"training steps: {total.get('steps', 0.0):.1f} s = {100 * total.get('steps', 0.0) / worker_s:.1f}% "
        "of the workers' time"
    )
    runs_s = sum(total.values())
    print(
        f"inside the runs: {runs_s:.1f} s ({100 * runs_s / worker_s:.1f}%); outside them (start-up, Hydra, "
        f"waiting): {worker_s - runs_s:.1f} s ({100 * (worker_s - runs_s) / worker_s:.1f}%)"
    )
    for phase, seconds in sorted(total.items(), key=lambda kv: -kv[1]):
        print(
            f"  {phase:<12} {seconds:8.1f} s  {100 * seconds / worker_s:5.1f}%   "
            f"{1000 * seconds / max(1, len(runs)):7.0f} ms/run"
        )


if __name__ == "__main__":
    main()
