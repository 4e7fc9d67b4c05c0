"""A run directory's checkpoint files (normbench.training.checkpoint.Checkpoints): the last two kept, a
write that fails for any reason reported with the step saved last and costing nothing else, a write cut
short never replacing a complete checkpoint, and every write made on the caller's own thread."""

from __future__ import annotations

import errno
import os
import pickle
import threading

import pytest
import torch

from normbench.core.errors import DiskFull
from normbench.core.fileio import atomic_file
from normbench.training import checkpoint
from normbench.training.checkpoint import Checkpoints


def names(directory) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


class Unpicklable:
    """A state that torch.save cannot write (a lock, a generator, an open file in a real state)."""

    def __reduce__(self):
        raise pickle.PicklingError("cannot pickle this state")


class Recorded:
    """Records the thread that pickles it and that thread's scheduling policy."""

    def __init__(self):
        self.thread = self.policy = None

    def __reduce__(self):
        self.thread = threading.current_thread()
        self.policy = os.sched_getscheduler(0) if hasattr(os, "sched_getscheduler") else None
        return (int, (0,))


def test_checkpoints_land_in_order_and_keep_the_one_before(tmp_path):
    files = Checkpoints(tmp_path, warn=pytest.fail)
    for step in (10, 20, 30):
        assert files.save(step, {"step": step, "w": torch.full((100,), float(step))})
    assert files.saved == 30 and names(tmp_path) == ["checkpoint.prev.pt", "checkpoint.pt"]
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=True)["step"] == 30
    previous = torch.load(tmp_path / "checkpoint.prev.pt", weights_only=True)
    assert previous["step"] == 20 and torch.equal(previous["w"], torch.full((100,), 20.0))
    assert files.load()["step"] == 30


def test_an_unpicklable_state_is_reported_with_the_step_saved_last_and_the_last_checkpoint_stands(tmp_path):
    warnings = []
    files = Checkpoints(tmp_path, warn=warnings.append)
    assert files.save(10, {"step": 10})
    assert not files.save(20, {"step": 20, "bad": Unpicklable()})
    failure = "checkpoint at step 20 not written (PicklingError: cannot pickle this state)"
    assert warnings == [f"{failure}; the last saved is step 10"]
    assert files.saved == 10 and "PicklingError" in files.failure
    assert names(tmp_path) == ["checkpoint.pt"]  # no temporary file, and the last one untouched
    assert checkpoint.load(tmp_path, warn=pytest.fail)["step"] == 10
    assert files.save(30, {"step": 30}) and files.failure is None


def test_a_first_checkpoint_that_fails_says_none_is_saved(tmp_path):
    warnings = []
    files = Checkpoints(tmp_path / "gone", warn=warnings.append)  # a directory that does not exist
    assert not files.save(5, {"step": 5})
    assert len(warnings) == 1 and warnings[0].startswith("checkpoint at step 5 not written (")
    assert warnings[0].endswith("; none is saved yet") and files.saved is None


def test_a_write_cut_short_leaves_the_complete_file_and_no_temporary(tmp_path):
    path = tmp_path / "checkpoint.pt"
    path.write_bytes(b"complete")
    with pytest.raises(RuntimeError), atomic_file(path) as f:
        f.write(b"half of the new")
        raise RuntimeError("killed mid-write")
    assert path.read_bytes() == b"complete" and names(tmp_path) == ["checkpoint.pt"]


def test_the_temporary_file_of_a_killed_write_is_removed_and_nothing_else(tmp_path):
    files = Checkpoints(tmp_path, warn=pytest.fail)
    files.save(10, {"step": 10})
    (tmp_path / ".checkpoint.pt.k1ll3d.tmp").write_bytes(b"half a checkpoint")  # what kill -9 leaves
    (tmp_path / ".summary.json.x.tmp").write_bytes(b"not a checkpoint's")
    files.remove_stale()
    assert names(tmp_path) == [".summary.json.x.tmp", "checkpoint.pt"]


@pytest.mark.parametrize("full_at", [1, 2, 3, 6])
def test_a_disk_filling_at_any_write_of_a_checkpoint_is_a_full_disk_and_the_last_stands(
    tmp_path, monkeypatch, full_at
):
    checkpoint.save(tmp_path, {"step": 1})
    writes, write = 0, checkpoint._Stream._write

    def filling(self, data):  # the disk fills at write number full_at
        nonlocal writes
        writes += 1
        if writes >= full_at:
            raise OSError(errno.ENOSPC, "No space left on device")
        write(self, data)

    monkeypatch.setattr(checkpoint._Stream, "_write", filling)
    # wherever in torch.save's archive the write fails, the user is told of a full disk
    with pytest.raises(DiskFull):
        checkpoint.save(tmp_path, {"step": 2, "w": torch.zeros(1000)})
    assert names(tmp_path) == ["checkpoint.pt"]
    assert checkpoint.load(tmp_path, warn=pytest.fail)["step"] == 1
    warnings = []
    assert not Checkpoints(tmp_path, warn=warnings.append, saved=1).save(2, {"step": 2})
    assert "no space left" in warnings[0].lower() and warnings[0].endswith("the last saved is step 1")


def test_a_failed_checkpoint_frees_its_state_without_the_garbage_collector(tmp_path, monkeypatch):
    """A run's next run measures its own peak memory: the state of a failed checkpoint must not stay
    alive in a reference cycle (the error's traceback and a frame holding the error)."""
    import gc
    import weakref

    def full(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint._Stream, "_write", full)
    state = {"step": 1, "w": torch.zeros(10_000)}
    copy = weakref.ref(state["w"])
    gc.collect()
    gc.disable()
    try:
        with pytest.raises(DiskFull):
            checkpoint.save(tmp_path, state)
        del state
        assert copy() is None
    finally:
        gc.enable()


def test_a_checkpoint_written_in_synced_chunks_is_the_state_it_was_given(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoint._Stream, "SYNC_BYTES", 100_000)  # a sync every few records
    state = {"step": 3, **{f"w{i}": torch.randn(50_000) for i in range(8)}}
    size = checkpoint.save(tmp_path, state)
    assert size == (tmp_path / "checkpoint.pt").stat().st_size
    saved = checkpoint.load(tmp_path, warn=pytest.fail)
    assert all(torch.equal(saved[key], value) for key, value in state.items() if key != "step")


def test_a_checkpoint_is_written_on_the_callers_thread_at_its_priority(tmp_path):
    """No writer thread: the loop never waits on a thread the scheduler may starve (one at idle
    priority gets no CPU while training's threads want it all)."""
    recorded, threads = Recorded(), threading.active_count()
    assert Checkpoints(tmp_path, warn=pytest.fail).save(1, {"step": 1, "who": recorded})
    assert recorded.thread is threading.current_thread() and threading.active_count() == threads
    if recorded.policy is not None:
        assert recorded.policy == os.sched_getscheduler(0)


def test_a_tied_weight_is_written_once(tmp_path):
    embedding = torch.randn(4096, 64)
    state = {"model": {"tok_emb.weight": embedding.detach(), "head.weight": embedding.detach()}, "step": 1}
    size = checkpoint.save(tmp_path, state)
    assert embedding.numel() * 4 <= size < 1.5 * embedding.numel() * 4  # one copy in the file, not two
    loaded = checkpoint.load(tmp_path, warn=pytest.fail)["model"]
    assert torch.equal(loaded["head.weight"], embedding)
