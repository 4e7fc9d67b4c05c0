"""logger=mlflow and logger=wandb: what a tracker holds, read back through its own files and client.

Nothing here reaches a network: MLflow writes a SQLite file in a temp directory, W&B runs
offline with its server pointed at a closed local port, and both tools' telemetry is off.
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest
from conftest import compose_cfg, read_metrics, run_cli, tiny

from normbench.training.config import parse_config
from normbench.training.loop import train

mlflow = pytest.importorskip("mlflow", reason="pip install 'normbench[mlflow]'")
wandb = pytest.importorskip("wandb", reason="pip install 'normbench[wandb]'")

OFFLINE = {
    # were anything to try W&B's server, it would meet a closed port here
    "WANDB_BASE_URL": "http://127.0.0.1:9",
    "WANDB_ERROR_REPORTING": "false",
    "WANDB_SILENT": "true",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "true",
}


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    for key, value in OFFLINE.items():
        monkeypatch.setenv(key, value)
    for key in ("WANDB_MODE", "WANDB_API_KEY", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(key, raising=False)


def train_logged(run_dir: Path, db: Path, *overrides: str, sweep: str | None = None) -> dict:
    cfg = compose_cfg(tiny(f"logger.mlflow.tracking_uri=sqlite:///{db}", "train.stats_every=10", *overrides))
    run = parse_config(cfg)
    run.sweep = sweep
    run.config_hash = "cafe"
    return train(run, run_dir)


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    """One tiny run with logger=[jsonl,mlflow,wandb]: its directory, summary and MLflow store."""
    mp = pytest.MonkeyPatch()
    for key, value in OFFLINE.items():
        mp.setenv(key, value)
    mp.delenv("WANDB_MODE", raising=False)
    root = tmp_path_factory.mktemp("trackers")
    try:
        summary = train_logged(root / "run", root / "mlflow.db", "logger=[jsonl,mlflow,wandb]", "seed=3")
    finally:
        mp.undo()
    return root / "run", summary, root / "mlflow.db"


def one_mlflow_run(db: Path, experiment: str = "normbench"):
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{db}")
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"no experiment {experiment}"
    runs = client.search_runs([exp.experiment_id])
    return client, runs


# W&B's service process and MLflow's SQLite store (its schema migrations): about 10 s of set-up
@pytest.mark.slow
def test_mlflow_holds_the_params_history_and_summary(both):
    run_dir, summary, db = both
    assert summary["status"] == "completed"
    client, runs = one_mlflow_run(db)
    assert len(runs) == 1
    run = runs[0]
    assert run.info.run_name == "run" and run.info.status == "FINISHED"
    # The config as params (the typed config's leaves).
    assert run.data.params["seed"] == "3"
    assert run.data.params["norm.name"] == "ln" and run.data.params["placement.name"] == "pre"
    assert float(run.data.params["train.lr"]) == 3e-3 and run.data.params["model.n_layer"] == "2"
    # Every record's numbers with their steps, identical to the JSONL source of truth.
    records = read_metrics(run_dir)
    for kind, key in (("train", "train_loss"), ("train", "lr"), ("eval", "val_loss"), ("stats", "grad_norm")):
        history = client.get_metric_history(run.info.run_id, f"{kind}/{key}")
        expected = [r for r in records if r["kind"] == kind]
        history = sorted(history, key=lambda m: m.step)
        assert [m.step for m in history] == [r["step"] for r in expected]
        assert [m.value for m in history] == pytest.approx([r[key] for r in expected], rel=1e-12)
    assert [m.step for m in client.get_metric_history(run.info.run_id, "eval/val_loss")] == [0, 10, 20]
    layer = client.get_metric_history(run.info.run_id, "stats/layers.1.grad_norm.mlp_out")
    assert [m.step for m in layer] == [0, 10]
    # The summary: numbers as metrics, status and flags as tags, the file itself as an artifact.
    assert run.data.metrics["final_val_loss"] == pytest.approx(summary["final_val_loss"], rel=1e-12)
    assert run.data.metrics["tokens_per_s"] == pytest.approx(summary["tokens_per_s"], rel=1e-12)
    assert run.data.tags["status"] == "completed" and run.data.tags["leaks_future"] == "false"
    assert run.data.tags["config_hash"] == "cafe"
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"metrics.jsonl", "summary.json"} <= artifacts
    assert "wandb" not in artifacts  # the other tracker's files stay out
    local = Path(client.download_artifacts(run.info.run_id, "summary.json", str(db.parent / "dl")))
    assert json.loads(local.read_text())["final_val_loss"] == summary["final_val_loss"]
    assert local.read_text() != "" and (run_dir / "summary.json").is_file()


def wandb_records(path: Path):
    """The protobuf records of a W&B offline run file: LevelDB's log format (32 KiB blocks of
    7-byte-headed chunks) after a 7-byte ':W&B' header."""
    from wandb.proto import wandb_internal_pb2

    data, block, pos, chunks = path.read_bytes(), 32768, 7, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        length, kind = struct.unpack("<HB", data[pos + 4 : pos + 7])
        chunks += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunks)
            chunks = b""
            yield record


def items(entries) -> dict:
    return {e.key or "/".join(e.nested_key): json.loads(e.value_json) for e in entries}


# W&B's service process and MLflow's SQLite store (its schema migrations): about 10 s of set-up
@pytest.mark.slow
def test_wandb_offline_run_holds_the_same_numbers(both):
    run_dir, summary, _ = both
    files = list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1, "W&B runs offline by default, inside the run directory"
    history, final, run_meta = {}, {}, None
    for record in wandb_records(files[0]):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            history[record.history.step.num] = items(record.history.item)
        elif kind == "summary":
            final.update(items(record.summary.update))
        elif kind == "run":
            run_meta = record.run
    assert run_meta.display_name == "run" and run_meta.project == "normbench"
    records = read_metrics(run_dir)
    for r in records:
        for key, value in r.items():
            if key not in ("kind", "step") and isinstance(value, float):
                assert history[r["step"]][f"{r['kind']}/{key}"] == pytest.approx(value, rel=1e-12), (
                    r["kind"],
                    key,
                )
    assert final["final_val_loss"] == pytest.approx(summary["final_val_loss"], rel=1e-12)
    assert final["status"] == "completed" and final["leaks_future"] == "false"


@pytest.mark.slow  # MLflow's SQLite store (its schema migrations): seconds of set-up
def test_a_sweeps_runs_share_one_experiment_named_after_it(tmp_path):
    for seed in (0, 1):
        train_logged(
            tmp_path / f"s{seed}",
            tmp_path / "mlflow.db",
            "logger=mlflow",
            f"seed={seed}",
            "train.steps=5",
            "train.stats_every=0",
            sweep="grid-1234abcd",
        )
    _, runs = one_mlflow_run(tmp_path / "mlflow.db", "grid-1234abcd")
    assert sorted(r.info.run_name for r in runs) == ["s0", "s1"]
    assert sorted(r.data.params["seed"] for r in runs) == ["0", "1"]
    # The default artifact store sits beside the SQLite file, not in the current directory.
    assert (tmp_path / "mlartifacts").is_dir()


@pytest.mark.slow  # the CLI in a fresh interpreter
def test_a_missing_tracker_package_is_one_line_before_anything_trains(tmp_path):
    import subprocess

    code = (
        "import sys; sys.modules['mlflow'] = None; from normbench.cli import main; "
        "sys.argv = ['normbench', 'train', "
        f"*{tiny('logger=[jsonl,mlflow]', f'hydra.run.dir={tmp_path}/run')!r}]; main()"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300
    )
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].endswith(
        "logger=mlflow needs the mlflow package (not installed): pip install 'normbench[mlflow]'"
    ), proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()  # a config error: no run, no run directory


@pytest.mark.slow  # the CLI in a subprocess
def test_an_unreachable_tracking_server_fails_the_run_clearly(tmp_path):
    proc = run_cli(
        "train",
        *tiny(
            "logger=mlflow", "logger.mlflow.tracking_uri=http://127.0.0.1:9", f"hydra.run.dir={tmp_path}/run"
        ),
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr
    assert "cannot reach the MLflow tracking server http://127.0.0.1:9" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()  # a config error: no run, no run directory


def test_logger_options_are_checked(tmp_path):
    from normbench.core.errors import ConfigError

    with pytest.raises(ConfigError, match="not a W&B mode"):
        train(
            parse_config(compose_cfg(tiny("logger=wandb", "logger.wandb.mode=sometimes"))), tmp_path / "run"
        )
    with pytest.raises(
        ConfigError, match="unknown logger 'comet'; allowed: jsonl, mlflow, tensorboard, wandb"
    ):
        parse_config(compose_cfg(tiny("+logger.comet={}")))
