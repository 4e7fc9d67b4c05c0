"""Gradient accumulation: train.micro_batch_size computes the optimizer's batch in pieces, with the
losses, gradients and statistics of the whole batch."""

from __future__ import annotations

import pytest
from conftest import compose_cfg, read_metrics, tiny, train_tiny
from omegaconf import open_dict

from normbench.core.errors import ConfigError
from normbench.core.identity import config_hash
from normbench.training.config import parse_config

# fp32 and no dropout: the micro-batches' mean loss is the batch's to float rounding
EXACT = ("model.dropout=0.0", "train.threads=1", "train.stats_every=4", "train.steps=12")


def losses(run_dir) -> dict:
    return {
        (r["kind"], r["step"]): r.get("train_loss", r.get("val_loss"))
        for r in read_metrics(run_dir)
        if r["kind"] in ("train", "eval")
    }


def test_micro_batches_reproduce_the_whole_batchs_losses_and_gradient_statistics(tmp_path):
    whole = train_tiny(tmp_path / "whole", *EXACT)
    split = train_tiny(tmp_path / "split", *EXACT, "train.micro_batch_size=2")
    want, got = losses(tmp_path / "whole"), losses(tmp_path / "split")
    assert got.keys() == want.keys() and len(want) >= 6
    for key, value in want.items():
        assert got[key] == pytest.approx(value, abs=1e-4), key
    grads = [
        {
            (r["step"], k): v
            for r in read_metrics(d)
            if r["kind"] == "stats"
            for k, v in r.items()
            if "grad" in k
        }
        for d in (tmp_path / "whole", tmp_path / "split")
    ]
    assert grads[0] and grads[0].keys() == grads[1].keys()
    for key, value in grads[0].items():
        assert grads[1][key] == pytest.approx(value, rel=1e-3, abs=1e-6), key
    assert split["final_val_loss"] == pytest.approx(whole["final_val_loss"], abs=1e-4)


def test_a_micro_batch_that_does_not_divide_the_batch_is_refused():
    with pytest.raises(ConfigError, match="micro_batch_size=3 must divide train.batch_size=8"):
        parse_config(compose_cfg(tiny("train.micro_batch_size=3")))
    with pytest.raises(ConfigError, match=r"micro_batch_size must be in 1..train.batch_size=8"):
        parse_config(compose_cfg(tiny("train.micro_batch_size=16")))


def test_the_whole_batch_and_the_new_defaults_keep_every_stored_runs_identity():
    """micro_batch_size=null, end_checks=auto, compile=cuda hash as the configs before them did."""
    before = compose_cfg(tiny())
    with open_dict(before):
        for key in ("micro_batch_size", "end_checks", "checkpoint_minutes"):
            del before.train[key]
        before.train.compile = False
    assert config_hash(compose_cfg(tiny())) == config_hash(before)
    assert config_hash(compose_cfg(tiny("train.micro_batch_size=2"))) != config_hash(before)
