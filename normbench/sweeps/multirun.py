"""Hydra's multirun in a child process of ``normbench sweep``, in its own process group.

``normbench.sweeps.sweep`` starts the child first thing, with the user's overrides; in it, Hydra's
multirun runs normbench's sweeper (which plans, then says where the plan is) and the chosen
launcher (the local one's workers warm up while the sweeper plans). The child's messages to the
sweep command are JSON objects on stdout, each on its own line after one tag (``tell``):
``{"planned": sweep_dir}`` when the plan is made, ``{"error": message}`` for a mistake found before
anything runs (then exit code 2). The sweep command reads the child's output until the plan is made,
then copies it into sweep.log and watches the run directories. The child's own process group holds
its workers too: Ctrl-C or the death of the sweep command stops every job.

This module imports neither PyTorch nor Hydra, so that the sweep command can start the child first.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from normbench.core.configtree import conf_dir
from normbench.core.runs import RETRY_ENV, SWEEP_ENV

# The stop signals a job checkpoints on (normbench.training.preemption.SIGNALS), named here so that
# neither the sweep command nor the child imports PyTorch: the command forwards them to the child's
# process group, where every job gets them.
STOP_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGUSR1", "SIGUSR2") if hasattr(signal, name)
)
PARENT_ENV = "NORMBENCH_SWEEP_PARENT"
TAG = "[normbench] "  # what starts a line that holds a message of the child's, a JSON object


def sweep_owner() -> str:
    """The sweep command, as its jobs' run locks record it."""
    return f"{os.getpid()}@{socket.gethostname()}"


# ----------------------------------------------------------------------------- in the sweep command


def start(args: list[str], retry_failed: bool = False) -> subprocess.Popen:
    """Start Hydra's multirun over ``args`` in a child process, its output (its workers' too) on a pipe.
    With ``retry_failed`` the sweeper launches the diverged and failed runs again, and they run."""
    if retry_failed:
        args = [*args, "hydra.sweeper.retry_failed=true", f"++hydra.job.env_set.{RETRY_ENV}=1"]
    env = {**os.environ, PARENT_ENV: str(os.getpid()), SWEEP_ENV: sweep_owner(), "HYDRA_FULL_ERROR": "1"}
    root = Path(__file__).resolve().parents[2]
    if conf_dir() == root / "conf":  # a source checkout: the child must import this very normbench
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
    return subprocess.Popen(
        [sys.executable, "-c", "from normbench.sweeps.multirun import main; main()", "--multirun", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )


def read_plan(proc: subprocess.Popen) -> tuple[dict, list[bytes]]:
    """The child's output up to its message that the plan is made: (that message, the lines before it);
    if the child ended first, (its last message, such as an error, or {}; every other line)."""
    lines, said = [], {}
    for line in iter(proc.stdout.readline, b""):
        message = _message(line)
        if message is None:
            lines.append(line)
            continue
        said = message
        if "planned" in message:
            break
    return said, lines


def _message(line: bytes) -> dict | None:
    text = line.decode(errors="replace")
    if not text.startswith(TAG):
        return None
    try:
        message = json.loads(text[len(TAG) :])
    except ValueError:  # a job's own output that happens to start with the tag
        return None
    return message if isinstance(message, dict) else None


def copy_output(proc: subprocess.Popen, log: Path, before: list[bytes]) -> threading.Thread:
    """Append ``before``, then the child's output as it comes, to ``log``, until all its processes
    close it."""

    def copy() -> None:
        with open(log, "ab") as out:
            out.writelines(before)
            out.flush()
            while chunk := proc.stdout.read1(1 << 16):  # what read_plan's reads left buffered, first
                out.write(chunk)
                out.flush()

    thread = threading.Thread(target=copy, daemon=True)
    thread.start()
    return thread


def signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def abandon(proc: subprocess.Popen) -> None:
    """Nothing to launch, or a mistake: the child and its warming workers go at once."""
    signal_group(proc, signal.SIGKILL)
    proc.wait()
    proc.stdout.close()


# ----------------------------------------------------------------------------- in the child


def tell(**message: str) -> None:
    """One message to the sweep command: ``planned=sweep_dir`` (the sweeper) or ``error=text``."""
    print(TAG + json.dumps(message), flush=True)


def main() -> None:
    """The child: Hydra's multirun over normbench.sweeps.job.task, a mistake said in one line."""
    parent = int(os.environ.get(PARENT_ENV) or 0)
    if parent:
        threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()
    # A stop signal reaches the whole group: the jobs checkpoint and exit, and the launcher, here,
    # outlives it to see them do so and end the multirun with their exit code.
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda signum, frame: None)
    from normbench.core.errors import edge

    try:
        edge(_multirun, lambda message: tell(error=message))
    except KeyboardInterrupt:
        sys.exit(130)
    finally:
        gc.freeze()  # as normbench.cli.main does: no last collection over the import-time objects


def _multirun() -> None:
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from normbench.core.errors import ConfigError, composition_error
    from normbench.sweeps.job import hydra_main

    try:
        hydra_main()
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(composition_error(err)) from None


def _exit_with_parent(parent: int) -> None:
    # kill -9 of the sweep command must not leave jobs training behind it: a re-run would
    # race them for the same run directories. The child leads its own process group,
    # which holds the local workers too.
    while os.getppid() == parent:
        time.sleep(0.5)
    os.killpg(os.getpgrp(), signal.SIGKILL)
