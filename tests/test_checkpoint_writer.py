"""Checkpoints written beside training: what is written is the state at the snapshot, a write that
fails is reported and costs nothing else, and a write cut short never replaces a complete checkpoint."""

from __future__ import annotations

import pytest
import torch

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
