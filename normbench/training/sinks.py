"""Metric sinks: where the training loop's records go.

The JSONL file in the run directory is the source of truth and is always written;
``logger=NAME``, or several at once (``logger=[mlflow,wandb]``), adds mirrors, each one
class in ``SINKS`` plus one YAML in conf/logger/ holding its options:

- ``tensorboard``: event files in the run directory, one scalar per JSONL key;
- ``mlflow``: one MLflow run per normbench run, in a SQLite store under results/ by default;
- ``wandb``: one Weights & Biases run, offline unless told otherwise.

Trackers (mlflow, wandb) name a metric ``KIND/KEY`` (``train/train_loss``,
``stats/layers.0.grad_norm.mlp_out``) with the record's step, buffer a log window's
records and send them in one call at ``flush()``; ``finish(summary)`` gives them the
summary (MLflow also the run directory's files) and ends their run. A tracker that cannot
start is a config error, before anything trains. One that fails later (``log``, ``flush``,
``finish``) costs its own mirror, never the run: one warning names it and what to check
(its ``check``), it is left out from then on, and the run ends as it would have, its summary,
checkpoints and metrics.jsonl (the source of truth) kept as for any run.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path
from typing import ClassVar
from urllib.parse import urlparse

from normbench.core.errors import ConfigError, first_line, installed
from normbench.core.fileio import NO_SPACE, disk_full_is, leaves, to_json
from normbench.core.runs import METRICS, SUMMARY


class JsonlSink:
    """Appends one JSON object per line and flushes, so a crash keeps everything logged so far.

    A resumed run first cuts the file back to its length at the checkpoint (``offset``),
    so no record appears twice.
    """

    def __init__(self, run_dir: Path, offset: int | None = None):
        self.path = Path(run_dir) / METRICS
        if offset is not None:
            os.truncate(self.path, offset)
        # held open for the whole run (close() ends it), so not a with-block
        self.file = open(self.path, "w" if offset is None else "a", encoding="utf-8")  # noqa: SIM115

    def position(self) -> int:
        """The file's length, on disk: what a checkpoint records."""
        with disk_full_is(self.path):
            self.file.flush()
            os.fsync(self.file.fileno())
        return self.file.tell()

    def log(self, record: dict) -> None:
        with disk_full_is(self.path):
            self.file.write(to_json(record) + "\n")
            self.file.flush()

    def close(self) -> None:
        try:
            self.file.close()
        except OSError as err:  # the buffer could not be flushed: a torn last line, cut when the run resumes
            if err.errno not in NO_SPACE:
                raise


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def flatten(record: dict) -> dict[str, float]:
    """The numeric leaves of a record but its step, as floats."""
    return {k: float(v) for k, v in leaves(record).items() if _is_number(v) and k != "step"}


def summary_fields(summary: dict) -> tuple[dict[str, float], dict[str, str]]:
    """A summary as (numbers, labels): numeric leaves become metrics; text and flags (status, leaks_future)
    tags."""
    flat = leaves(summary)
    numbers = {k: float(v) for k, v in flat.items() if _is_number(v)}
    labels = {
        k: str(v).lower() if isinstance(v, bool) else str(v)
        for k, v in flat.items()
        if v is not None and not _is_number(v)
    }
    return numbers, labels


@dataclass
class RunInfo:
    """What a tracker needs to know about the run besides its records."""

    name: str  # the run directory's name
    group: str | None  # the sweep's name, when the run belongs to one
    config: dict  # the typed config, nested; params are its leaves
    config_hash: str | None = None
    resume_step: int | None = None  # a resumed run: the checkpoint's step (records after it are logged again)


# ----------------------------------------------------------------------------- options (conf/logger/*.yaml)


@dataclass
class NoOptions:
    pass


@dataclass
class MlflowOptions:
    tracking_uri: str
    experiment: str | None  # default: the sweep's name in a sweep, else "normbench"
    artifact_location: str | None  # for a new experiment; default: mlartifacts/ beside a SQLite store


@dataclass
class WandbOptions:
    project: str
    entity: str | None
    group: str | None  # default: the sweep's name in a sweep
    mode: str | None  # default: $WANDB_MODE, else offline
    dir: str | None  # default: the run directory (its wandb/ folder)


# ----------------------------------------------------------------------------- the mirrors


class TensorBoardSink:
    name, Options = "tensorboard", NoOptions
    check = "that the run directory is writable (its events.out.tfevents.* files)"

    def __init__(self, run_dir: Path, options: NoOptions, info: RunInfo):
        from torch.utils.tensorboard import SummaryWriter

        # A resumed run hides the events logged after its checkpoint (they are logged again).
        purge_step = None if info.resume_step is None else info.resume_step + 1
        self.writer = SummaryWriter(log_dir=str(run_dir), purge_step=purge_step)

    def log(self, record: dict) -> None:
        for name, value in flatten(record).items():
            self.writer.add_scalar(name, value, global_step=record["step"])

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.writer.close()

    def finish(self, summary: dict) -> None:
        pass

    def abort(self) -> None:
        self.close()


def _sqlite_path(uri: str) -> Path | None:
    """The file of a sqlite:/// URI (relative to the current directory unless absolute), else None."""
    return Path(uri[len("sqlite:///") :]) if uri.startswith("sqlite:///") else None


@contextlib.contextmanager
def _sqlite_lock(db: Path | None):
    """Parallel sweep jobs that open a new SQLite store at once would each create its tables: one at a
    time."""
    if db is None:
        yield
        return
    import fcntl

    with open(f"{db}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _check_server(uri: str) -> None:
    """An http(s) tracking server that does not answer is an error now, not after MLflow's minutes of
    retries."""
    url = urlparse(uri)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=10).close()
    except OSError as err:
        raise ConfigError(
            f"logger=mlflow: cannot reach the MLflow tracking server {uri} ({err.strerror or err}); "
            "start it or set logger.mlflow.tracking_uri (default: a SQLite file under results/)"
        ) from None


class MlflowSink:
    """One MLflow run: the config as params, every record as metrics with steps, the summary, the run's
    files."""

    name, Options = "mlflow", MlflowOptions
    check = "its tracking store (logger.mlflow.tracking_uri)"
    STATUS: ClassVar[dict[str, str]] = {"completed": "FINISHED", "diverged": "FINISHED", "failed": "FAILED"}

    def __init__(self, run_dir: Path, options: MlflowOptions, info: RunInfo):
        import logging

        from mlflow import MlflowClient
        from mlflow.entities import Metric, Param

        self.Metric, self.run_dir, self.buffer, self.ended = Metric, Path(run_dir), [], False
        uri = options.tracking_uri
        db = _sqlite_path(uri)
        if uri.startswith(("http://", "https://")):
            _check_server(uri)
        if db is not None:
            db.parent.mkdir(parents=True, exist_ok=True)
        for name in ("alembic", "mlflow.store.db.utils"):  # "creating tables" chatter on a new store
            logging.getLogger(name).setLevel(logging.WARNING)
        experiment = options.experiment or info.group or "normbench"
        try:
            with _sqlite_lock(db):
                self.client = MlflowClient(tracking_uri=uri)
                found = self.client.get_experiment_by_name(experiment)
                if found is None:
                    location = options.artifact_location
                    if location is None and db is not None:
                        location = (db.parent.resolve() / "mlartifacts").as_uri()
                    experiment_id = self.client.create_experiment(experiment, artifact_location=location)
                else:
                    experiment_id = found.experiment_id
                tags = {"run_dir": str(self.run_dir.resolve()), "config_hash": str(info.config_hash)}
                self.run_id = self.client.create_run(experiment_id, run_name=info.name, tags=tags).info.run_id
            params = [Param(k, str(v)) for k, v in leaves(info.config).items()]
            self.client.log_batch(self.run_id, params=params)
        except Exception as err:
            raise ConfigError(
                f"logger=mlflow: cannot use the tracking store {uri}: {first_line(err)}"
            ) from None

    def log(self, record: dict) -> None:
        now, kind = int(time.time() * 1000), record["kind"]
        self.buffer += [
            self.Metric(f"{kind}/{k}", v, now, record["step"]) for k, v in flatten(record).items()
        ]

    def flush(self) -> None:
        if self.buffer:
            metrics, self.buffer = self.buffer, []
            self.client.log_batch(self.run_id, metrics=metrics)

    def close(self) -> None:
        self.flush()

    def finish(self, summary: dict) -> None:
        from mlflow.entities import RunTag

        self.flush()
        numbers, labels = summary_fields(summary)
        now, step = int(time.time() * 1000), summary.get("steps") or 0
        self.client.log_batch(
            self.run_id,
            metrics=[self.Metric(k, v, now, step) for k, v in numbers.items()],
            tags=[RunTag(k, v[:5000]) for k, v in labels.items()],
        )
        self.client.log_dict(self.run_id, summary, SUMMARY)  # summary.json is written after the trackers
        for path in sorted(self.run_dir.iterdir()):
            if path.name in (SUMMARY, "wandb") or path.name.startswith("."):
                if path.name == ".hydra":  # the composed config and the overrides
                    self.client.log_artifacts(self.run_id, str(path), artifact_path=".hydra")
                continue
            if path.is_dir():
                self.client.log_artifacts(self.run_id, str(path), artifact_path=path.name)
            else:
                self.client.log_artifact(self.run_id, str(path))
        self.client.set_terminated(self.run_id, self.STATUS.get(summary.get("status"), "FAILED"))
        self.ended = True

    def abort(self) -> None:
        if not self.ended:
            with contextlib.suppress(Exception):  # interrupted: end the run if the store lets us, and go
                self.flush()
                self.client.set_terminated(self.run_id, "KILLED")


class WandbSink:
    """One W&B run, offline unless logger.wandb.mode or $WANDB_MODE says otherwise; a sweep's runs grouped by
    it."""

    name, Options = "wandb", WandbOptions
    check = "W&B's connection and its local directory (logger.wandb.mode, logger.wandb.dir)"
    MODES = ("online", "offline", "disabled", "shared")

    def __init__(self, run_dir: Path, options: WandbOptions, info: RunInfo):
        import wandb

        mode = options.mode or os.environ.get("WANDB_MODE") or "offline"
        if mode not in self.MODES:
            raise ConfigError(f"logger.wandb.mode={mode} is not a W&B mode", allowed=self.MODES)
        self.pending: list[tuple[int, dict]] = []
        try:
            self.run = wandb.init(
                project=options.project,
                entity=options.entity,
                group=options.group or info.group,
                name=info.name,
                dir=str(options.dir or run_dir),
                config={**info.config, "config_hash": info.config_hash},
                mode=mode,
                reinit="create_new",
                # No console capture: the terminal belongs to normbench's progress bar and tables.
                settings=wandb.Settings(console="off", quiet=True),
            )
        except Exception as err:
            raise ConfigError(f"logger=wandb: cannot start a W&B run ({mode}): {first_line(err)}") from None

    def log(self, record: dict) -> None:
        metrics = {f"{record['kind']}/{k}": v for k, v in flatten(record).items()}
        # W&B wants steps that never go back: a window's records come in step order, equal steps merge.
        if self.pending and self.pending[-1][0] == record["step"]:
            self.pending[-1][1].update(metrics)
        else:
            self.pending.append((record["step"], metrics))

    def flush(self) -> None:
        pending, self.pending = self.pending, []
        for step, metrics in pending:
            self.run.log(metrics, step=step)

    def close(self) -> None:
        self.flush()

    def finish(self, summary: dict) -> None:
        self.flush()
        numbers, labels = summary_fields(summary)
        self.run.summary.update({**numbers, **labels})
        self.run.finish(exit_code=1 if summary.get("status") == "failed" else 0)

    def abort(self) -> None:
        with contextlib.suppress(Exception):
            self.run.finish(exit_code=130)


# name -> (sink class or None for JSONL alone, the modules it imports, the extra that installs them)
SINKS = {
    "jsonl": (None, (), None),
    "tensorboard": (TensorBoardSink, ("tensorboard",), "tensorboard"),
    "mlflow": (MlflowSink, ("mlflow", "sqlalchemy", "alembic"), "mlflow"),
    "wandb": (WandbSink, ("wandb",), "wandb"),
}


def logger_options(names) -> dict[str, type]:
    """The options dataclass of each chosen logger; an unknown one or one whose package is missing is a
    ConfigError."""
    out = {}
    for name in names:
        if name not in SINKS:
            raise ConfigError(f"unknown logger '{name}'", allowed=sorted(SINKS))
        cls, modules, extra = SINKS[name]
        missing = [m for m in modules if not installed(m)]
        if missing:
            raise ConfigError(
                f"logger={name} needs the {', '.join(missing)} package{'s' if len(missing) > 1 else ''} "
                f"(not installed): pip install 'normbench[{extra}]'"
            )
        out[name] = cls.Options if cls else NoOptions
    return out


def run_info(run_dir: Path, run, config_hash: str | None = None, resume_step: int | None = None) -> RunInfo:
    """RunInfo from a RunConfig: the config without the loggers themselves, the sweep as the group."""
    config = asdict(run) if is_dataclass(run) else {}
    for key in ("logger", "sweep", "source"):  # the source config is the same settings, untyped
        config.pop(key, None)
    return RunInfo(
        name=Path(run_dir).resolve().name,
        group=getattr(run, "sweep", None),
        config=config,
        config_hash=config_hash,
        resume_step=resume_step,
    )


class MetricSinks:
    """Fans each record out to the JSONL file and the configured mirrors.

    ``run`` is the RunConfig (its ``logger`` maps each chosen logger to its options);
    without one, only the JSONL file is written. A mirror that fails once it has started is
    said through ``warn`` and left out from then on: a tracker never costs the run its result.
    """

    def __init__(
        self,
        run_dir: Path,
        run=None,
        enabled: bool = True,
        config_hash: str | None = None,
        resume_at: tuple[int, int] | None = None,
        *,
        warn,
    ):
        """``resume_at``: (metrics.jsonl's length, step) at the checkpoint a resumed run continues from;
        ``warn(message)``: says a mirror failed."""
        self.jsonl, self.mirrors, self.warn = None, [], warn
        if not enabled:  # data-parallel ranks other than 0: one writer per run directory
            return
        loggers = getattr(run, "logger", None) or {}
        classes = logger_options(loggers)
        offset, step = resume_at or (None, None)
        self.jsonl = JsonlSink(run_dir, offset)
        info = run_info(run_dir, run, config_hash, step)
        try:
            for name in classes:
                cls = SINKS[name][0]
                if cls is not None:
                    self.mirrors.append(cls(run_dir, loggers[name], info))
        except BaseException:
            self.abort()
            raise

    def position(self) -> int | None:
        """metrics.jsonl's length, flushed to disk; None where this process writes no metrics."""
        return self.jsonl.position() if self.jsonl else None

    def log(self, record: dict) -> None:
        if self.jsonl:
            self.jsonl.log(record)  # first: whatever a mirror does, the source of truth has the record
        self._each("log", record)

    def flush(self) -> None:
        """The end of a log window: trackers send what they buffered, in one call each."""
        self._each("flush")

    def close(self) -> None:
        if self.jsonl and not self.jsonl.file.closed:
            self.jsonl.close()
        self._each("close")

    def finish(self, summary: dict) -> dict:
        """Hand the summary to the trackers and end their runs. Returns the summary to write, which a
        tracker's failure leaves as it is (a warning says so)."""
        self._each("finish", summary)
        return summary

    def _each(self, method: str, *args) -> None:
        """Call ``method`` on every mirror; one that raises is said in one line and dropped."""
        for sink in list(self.mirrors):
            try:
                getattr(sink, method)(*args)
            except Exception as err:
                self.mirrors.remove(sink)
                with contextlib.suppress(Exception):  # end what it has open, if it still can
                    sink.abort()
                check = getattr(sink, "check", f"its options (logger.{sink.name})")
                self.warn(
                    f"logger={sink.name} failed ({first_line(err)}): it records nothing more of this run, "
                    f"whose results stay in {METRICS} and {SUMMARY}; check {check}"
                )

    def abort(self) -> None:
        """Interrupted: close the JSONL file and end the trackers' runs as killed."""
        if self.jsonl and not self.jsonl.file.closed:
            self.jsonl.close()
        for sink in self.mirrors:
            sink.abort()
