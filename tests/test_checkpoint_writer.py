"""Checkpoints written beside training: what is written is the state at the snapshot, a write that
fails is reported and costs nothing else, a write cut short or given up never replaces a complete
checkpoint, and the writer yields the CPU to training."""

from __future__ import annotations

import errno
import os
import threading
import time

import pytest
import torch

from normbench.core.errors import DiskFull
from normbench.core.fileio import atomic_file
from normbench.training import checkpoint
from normbench.training.checkpoint_writer import CheckpointWriter


def test_the_checkpoint_holds_the_state_at_the_snapshot_not_what_training_did_after(tmp_path):
    weights, history = torch.zeros(1000), [1.0]
    writer = CheckpointWriter(tmp_path, warn=pytest.fail)
    writer.submit(5, ({"model": {"w": weights}, "loop": {"val_losses": history}}))
    weights += 1.0  # training goes on while the thread writes
    history.append(2.0)
    writer.wait()
    saved = checkpoint.load(tmp_path, warn=pytest.fail)
    assert torch.equal(saved["model"]["w"], torch.zeros(1000)) and saved["loop"]["val_losses"] == [1.0]
    assert writer.written == 5


def test_checkpoints_land_in_order_and_keep_the_one_before(tmp_path):
    writer = CheckpointWriter(tmp_path, warn=pytest.fail)
    for step in (10, 20, 30):
        writer.submit(step, ({"step": step, "w": torch.full((100,), float(step))}))
    writer.wait()
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=True)["step"] == 30
    previous = torch.load(tmp_path / "checkpoint.prev.pt", weights_only=True)
    # its buffers held step 30's copy afterwards: the file is what was written
    assert previous["step"] == 20 and torch.equal(previous["w"], torch.full((100,), 20.0))


def test_a_failed_write_is_reported_on_the_training_thread_and_the_last_checkpoint_stands(tmp_path):
    warnings = []
    writer = CheckpointWriter(tmp_path, warn=warnings.append)
    writer.submit(10, ({"step": 10}))
    writer.wait()
    writer.run_dir = tmp_path / "gone"  # a directory that cannot be written: the write fails
    writer.submit(20, ({"step": 20}))
    writer.wait()
    assert len(warnings) == 1 and "checkpoint at step 20 not written" in warnings[0]
    assert writer.written == 10 and checkpoint.load(tmp_path, warn=pytest.fail)["step"] == 10


def test_a_write_cut_short_leaves_the_complete_file_and_no_temporary(tmp_path):
    path = tmp_path / "checkpoint.pt"
    path.write_bytes(b"complete")
    with pytest.raises(RuntimeError), atomic_file(path) as f:
        f.write(b"half of the new")
        raise RuntimeError("killed mid-write")
    assert path.read_bytes() == b"complete" and [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]


class HeldPickle:
    """Pickles only once released, recording the thread that pickles it: a write held mid-serialization."""

    def __init__(self):
        self.started, self.release = threading.Event(), threading.Event()
        self.policy = None

    def __reduce__(self):
        self.policy = os.sched_getscheduler(0) if hasattr(os, "sched_getscheduler") else None
        self.started.set()
        assert self.release.wait(30)
        return (int, (0,))


def test_a_discarded_write_is_given_up_and_leaves_the_complete_checkpoint_alone(tmp_path):
    writer = CheckpointWriter(tmp_path, warn=pytest.fail)
    writer.submit(10, {"step": 10, "w": torch.ones(100)})
    writer.wait()
    held = HeldPickle()
    writer.submit(20, {"step": 20, "w": torch.zeros(100), "held": held})
    assert held.started.wait(30)  # serializing step 20 now
    discarding = threading.Thread(target=writer.discard)
    discarding.start()
    while discarding.is_alive() and not writer._discarding.is_set():
        time.sleep(0.001)
    held.release.set()
    discarding.join(30)
    assert writer.written == 10 and [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]
    assert checkpoint.load(tmp_path, warn=pytest.fail)["step"] == 10
    writer.submit(30, {"step": 30})  # discarding was for that write only
    writer.wait()
    assert writer.written == 30 and checkpoint.load(tmp_path, warn=pytest.fail)["step"] == 30


def test_save_stops_writing_at_the_record_under_way_when_no_longer_wanted(tmp_path):
    checkpoint.save(tmp_path, {"step": 1})
    asked = 0

    def wanted():  # given up once the first few writes are done: the rest are never made
        nonlocal asked
        asked += 1
        return asked <= 3

    state = {"step": 2, **{f"w{i}": torch.full((65536,), float(i)) for i in range(32)}}
    with pytest.raises(checkpoint.Discarded):
        checkpoint.save(tmp_path, state, wanted=wanted)
    assert asked < 10  # written to the end, each of the 32 records would have asked at least once
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]
    assert checkpoint.load(tmp_path, warn=pytest.fail)["step"] == 1


@pytest.mark.parametrize("full_at", [1, 2, 3, 6])
def test_a_disk_filling_at_any_write_of_a_checkpoint_is_a_full_disk_and_the_last_stands(tmp_path, full_at):
    checkpoint.save(tmp_path, {"step": 1})
    writes = 0

    def wanted():  # asked before each write: the disk fills at write number full_at
        nonlocal writes
        writes += 1
        if writes >= full_at:
            raise OSError(errno.ENOSPC, "No space left on device")
        return True

    # wherever in torch.save's archive the write fails, the user is told of a full disk
    with pytest.raises(DiskFull):
        checkpoint.save(tmp_path, {"step": 2, "w": torch.zeros(1000)}, wanted=wanted)
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]
    assert checkpoint.load(tmp_path, warn=pytest.fail)["step"] == 1


def test_a_checkpoint_given_up_frees_its_state_without_the_garbage_collector(tmp_path):
    """A run's next run measures its own peak memory: the copy of a discarded checkpoint must not
    stay alive in a reference cycle (the error's traceback and a frame holding the error)."""
    import gc
    import weakref

    asked = iter([True, False])
    state = {"step": 1, "w": torch.zeros(10_000)}
    copy = weakref.ref(state["w"])
    gc.collect()
    gc.disable()
    try:
        with pytest.raises(checkpoint.Discarded):
            checkpoint.save(tmp_path, state, wanted=lambda: next(asked, False))
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


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")
def test_the_writer_runs_at_idle_priority_and_training_keeps_its_own(tmp_path):
    before = os.sched_getscheduler(0)
    held = HeldPickle()
    held.release.set()
    writer = CheckpointWriter(tmp_path, warn=pytest.fail)
    writer.submit(1, {"step": 1, "held": held})
    writer.wait()
    assert held.policy == os.SCHED_IDLE
    assert os.sched_getscheduler(0) == before != os.SCHED_IDLE


def test_a_tied_weight_is_copied_and_written_once(tmp_path):
    embedding = torch.randn(4096, 64)
    state = {"model": {"tok_emb.weight": embedding.detach(), "head.weight": embedding.detach()}, "step": 1}
    first = checkpoint.snapshot(state)
    again = checkpoint.snapshot(state, reuse=first)
    for copy in (first, again):
        tok, head = copy["model"]["tok_emb.weight"], copy["model"]["head.weight"]
        assert tok is head and torch.equal(tok, embedding) and tok.data_ptr() != embedding.data_ptr()
    untied = checkpoint.snapshot({"a": embedding, "b": embedding.clone()})
    assert untied["a"].data_ptr() != untied["b"].data_ptr()
    size = checkpoint.save(tmp_path, again)
    assert embedding.numel() * 4 <= size < 1.5 * embedding.numel() * 4  # one copy in the file, not two
    loaded = checkpoint.load(tmp_path, warn=pytest.fail)["model"]
    assert torch.equal(loaded["head.weight"], embedding)
