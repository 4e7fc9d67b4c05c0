"""What a tracker adds per run, and a 4-run sweep on Ray against joblib.

    python benchmarks/trackers_and_launchers.py trackers [--repeats 3]
    python benchmarks/trackers_and_launchers.py launchers

`trackers` trains one small run (model=micro, 100 steps, stats every 50, logger=jsonl), then
feeds its records and summary to the sinks of each logger choice exactly as train() does, the
choices interleaved `--repeats` times after a warm-up round, and prints each choice's median
time (tracker start-up, one batch per log window, summary, artifacts, end of run) and its
difference to logger=jsonl; the trackers' import, paid once per process, is reported apart. `launchers` runs
the same 4-run sweep (norm=ln,rms seed=0,1, model=micro, 100 steps) with hydra/launcher=joblib n_jobs=2 and
on a local 2-CPU Ray cluster on 127.0.0.1 (1 CPU per run), each in a fresh results directory, and prints the
wall times of the sweep commands. Nothing reaches a network: W&B offline, telemetry off.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.update(
    {
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_USAGE_STATS_ENABLED": "0",
        "WANDB_MODE": "offline",
        "WANDB_ERROR_REPORTING": "false",
        "WANDB_SILENT": "true",
        "WANDB_BASE_URL": "http://127.0.0.1:9",
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "DO_NOT_TRACK": "true",
    }
)
REPO = Path(__file__).resolve().parents[1]
SMALL = [
    "model=micro",
    "train.steps=100",
    "train.eval_every=50",
    "train.stats_every=50",
    "train.log_every=10",
    "train.progress=false",
    "train.device=cpu",
    "train.threads=1",
]


def trackers(repeats: int) -> None:
    """Train one run with logger=jsonl, then replay its records and summary into MetricSinks per logger
    choice, as train() does (log each record, flush after each train record, close, finish): the time a
    tracker adds to a run, without the training's own noise."""
    from normbench.core.configtree import compose
    from normbench.core.fileio import read_jsonl
    from normbench.training.config import parse_config
    from normbench.training.loop import train
    from normbench.training.sinks import MetricSinks

    def run_config(choice: str, tmp: str):
        return parse_config(compose([*SMALL, f"logger={choice}", f"results_dir={tmp}"]))

    start = time.perf_counter()
    import mlflow  # noqa: F401  (paid once per process: a sweep's worker pays it once)

    imported = time.perf_counter() - start
    choices = ["jsonl", "[jsonl,mlflow]", "[jsonl,wandb]"]
    times: dict[str, list[float]] = {c: [] for c in choices}
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "source"
        summary = train(run_config("jsonl", tmp), source)
        records = read_jsonl(source / "metrics.jsonl")
        for r in range(repeats + 1):  # round 0 warms up (creates the SQLite store, starts W&B's service)
            for choice in choices:
                run_dir = Path(tmp) / f"{r}-{choice.strip('[]').replace(',', '-')}"
                run_dir.mkdir()
                run = run_config(choice, tmp)
                start = time.perf_counter()
                sinks = MetricSinks(run_dir, run, config_hash="bench")
                for record in records:
                    sinks.log(record)
                    if record["kind"] == "train":
                        sinks.flush()
                sinks.close()
                assert sinks.finish(summary)["status"] == "completed"
                if r:
                    times[choice].append(time.perf_counter() - start)
    base = statistics.median(times["jsonl"])
    print(
        f"{len(records)} records of a {summary['steps']}-step run (training took {summary['wall_s']:.1f} s); "
        f"import mlflow + wandb: {imported:.1f} s once per process"
    )
    print(f"{'logger':<16} {'median s':>9} {'vs jsonl':>9}   runs")
    for choice in choices:
        med = statistics.median(times[choice])
        print(f"{choice:<16} {med:9.3f} {med - base:+9.3f}   {', '.join(f'{t:.3f}' for t in times[choice])}")


def launchers() -> None:
    import ray

    grid = ["norm=ln,rms", "seed=0,1", *SMALL[:-1]]  # threads come from the launcher's rule
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "normbench", "sweep", *grid]
        start = time.perf_counter()
        subprocess.run(
            [*cmd, f"results_dir={tmp}/joblib", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2"],
            check=True,
            cwd=REPO,
            stdout=subprocess.DEVNULL,
        )
        results["joblib, n_jobs=2"] = time.perf_counter() - start
        start = time.perf_counter()
        ray.init(
            address="local",
            num_cpus=2,
            include_dashboard=False,
            object_store_memory=80 * 2**20,
            _node_ip_address="127.0.0.1",
            log_to_driver=False,
        )
        results["ray cluster start"] = time.perf_counter() - start
        try:
            address = ray.get_runtime_context().gcs_address
            assert address.startswith("127.0.0.1:"), address
            start = time.perf_counter()
            subprocess.run(
                [
                    *cmd,
                    f"results_dir={tmp}/ray",
                    "hydra/launcher=ray_cluster",
                    f"hydra.launcher.ray.init.address={address}",
                    "hydra.launcher.ray.remote.num_gpus=0",
                    "hydra.launcher.ray.remote.num_cpus=1",
                ],
                check=True,
                cwd=REPO,
                stdout=subprocess.DEVNULL,
            )
            results["ray_cluster, 1 CPU a run"] = time.perf_counter() - start
        finally:
            ray.shutdown()
    for name, seconds in results.items():
        print(f"{name:<26} {seconds:7.1f} s")


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "trackers"
    if what == "trackers":
        trackers(int(sys.argv[sys.argv.index("--repeats") + 1]) if "--repeats" in sys.argv else 3)
    else:
        launchers()
