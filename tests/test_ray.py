"""hydra/launcher=ray_cluster, run for real: a local Ray cluster on 127.0.0.1, a 4-run CPU sweep, a resume.

The test process starts the cluster itself (ray.init, loopback only, 2 CPUs, no dashboard)
and shuts it down, which ends exactly the Ray processes it started. The sweep command
joins it by its address, as it would join a real cluster with ray.init.address=auto.
"""

from __future__ import annotations

import json
import os

import pytest
from conftest import run_cli

LOOPBACK = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # Ray's single-machine mode: every Ray process on 127.0.0.1
    "RAY_USAGE_STATS_ENABLED": "0",
}
# Ray reads these when it is imported; the sweep's processes inherit them.
os.environ.update(LOOPBACK)

pytestmark = pytest.mark.slow  # a local Ray cluster and the CLI in subprocesses

ray = pytest.importorskip("ray", reason="the Ray launcher needs ray: pip install 'normbench[ray]'")
pytest.importorskip("hydra_plugins.hydra_ray_launcher", reason="pip install 'normbench[ray]'")


@pytest.fixture
def cluster():
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=80 * 2**20,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
    )
    try:
        address = ray.get_runtime_context().gcs_address
        assert address.startswith("127.0.0.1:"), address
        yield address
    finally:
        ray.shutdown()


def test_a_sweep_runs_on_a_local_ray_cluster_and_resumes(cluster, tmp_path):
    args = [
        "sweep",
        "norm=ln,rms",
        "seed=0,1",
        "model=micro",
        "data.train_sequences=128",
        "data.val_sequences=32",
        "train.steps=10",
        "train.batch_size=8",
        "train.eval_every=10",
        "train.eval_batches=1",
        "train.log_every=5",
        "train.warmup_steps=2",
        "train.stats_every=0",
        f"results_dir={tmp_path}/results",
        "hydra/launcher=ray_cluster",
        f"hydra.launcher.ray.init.address={cluster}",
        "hydra.launcher.ray.remote.num_gpus=0",
        "hydra.launcher.ray.remote.num_cpus=1",
    ]
    first = run_cli(*args, cwd=tmp_path, timeout=540)
    assert first.returncode == 0, first.stdout + first.stderr
    sweep_dirs = list((tmp_path / "results" / "sweeps").iterdir())
    assert len(sweep_dirs) == 1
    runs = sorted(p for p in sweep_dirs[0].iterdir() if p.is_dir())
    assert [p.name.split("-")[0] for p in runs] == ["ln", "ln", "rms", "rms"]
    summaries = {p.name: json.loads((p / "summary.json").read_text()) for p in runs}
    assert all(s["status"] == "completed" for s in summaries.values())
    # Each job ran in a Ray worker with the CPU count its task asked for.
    assert all(s["provenance"]["threads"] == 1 for s in summaries.values())

    stamps = {p.name: os.stat(p / "summary.json").st_mtime_ns for p in runs}
    again = run_cli(*args, cwd=tmp_path, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "4 have results (4 completed), 0 to run" in again.stdout
    assert {p.name: os.stat(p / "summary.json").st_mtime_ns for p in runs} == stamps  # nothing redone


def test_a_run_no_node_can_hold_is_refused_before_anything_is_submitted(cluster, tmp_path):
    # The preset's request (4 CPUs, 1 GPU per run) on this 2-CPU cluster without a GPU.
    result = run_cli(
        "sweep",
        "norm=ln,rms",
        "model=micro",
        f"results_dir={tmp_path}/results",
        "hydra/launcher=ray_cluster",
        f"hydra.launcher.ray.init.address={cluster}",
        cwd=tmp_path,
        timeout=300,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert (
        f"each run asks Ray for 4 CPUs and 1 GPU, but the largest node of the Ray cluster at {cluster} has "
        "2 CPUs and 0 GPUs: no run could ever start; set hydra.launcher.ray.remote.num_cpus=2 "
        "hydra.launcher.ray.remote.num_gpus=0"
    ) in " ".join(result.stderr.split())
    assert "Traceback" not in result.stderr and not (tmp_path / "results").exists()
