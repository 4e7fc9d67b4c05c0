"""Gradient accumulation: train.micro_batch_size computes the optimizer's batch in pieces, with the
losses, gradients and statistics of the whole batch; a norm that reads the batch (BatchNorm) reads each
micro-batch, and the run says so."""

from __future__ import annotations

import copy
import io

import pytest
import torch
from conftest import compose_cfg, read_metrics, tiny, train_tiny
from omegaconf import open_dict
from rich.console import Console

from normbench.core.errors import ConfigError
from normbench.core.identity import config_hash
from normbench.training.config import parse_config
from normbench.training.loop import Run, train

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


BN = ("norm=bn", "model.dropout=0.0", "train.threads=1", "train.grad_clip=0", "train.micro_batch_size=2")


def test_batchnorm_under_accumulation_computes_each_micro_batch_with_its_own_statistics(tmp_path):
    state = Run(parse_config(compose_cfg(tiny(*BN))), tmp_path / "run")
    before = copy.deepcopy(state.model)
    x, y = state.train_batch(torch.Generator().set_state(state.batch_gen.get_state()))
    bn = next(m for m in state.model.modules() if isinstance(m, torch.nn.BatchNorm1d))
    seen, grads = [], {}
    bn.register_forward_pre_hook(lambda module, args: seen.append(args[0].detach().clone()))
    state.optimizer.register_step_pre_hook(
        lambda *_: grads.update({n: p.grad.clone() for n, p in state.model.named_parameters()})
    )
    loss, _ = state.train_step()

    # By hand: each micro-batch of 2 through the untrained model on its own, its loss a quarter of the step's.
    pieces, reference = list(zip(x.split(2), y.split(2))), copy.deepcopy(before)
    want = []
    for xm, ym in pieces:
        piece_loss = reference(xm, ym)[1]
        (piece_loss / len(pieces)).backward()
        want.append(piece_loss.item())
    assert len(pieces) == 4 and loss.item() == pytest.approx(sum(want) / 4, abs=1e-6)
    for name, param in reference.named_parameters():
        torch.testing.assert_close(grads[name], param.grad, rtol=1e-5, atol=1e-7, msg=name)
    # BatchNorm's running mean, in plain torch: one momentum step per micro-batch, each over its own tokens.
    assert len(seen) == 4 and all(t.shape[0] == 2 * x.shape[1] for t in seen)
    running = torch.zeros_like(bn.running_mean)
    for tokens in seen:
        running = (1 - bn.momentum) * running + bn.momentum * tokens.mean(0)
    torch.testing.assert_close(bn.running_mean, running)
    # ... which is not the whole batch's run: one forward over all 8 sequences has another loss.
    assert abs(copy.deepcopy(before)(x, y)[1].item() - loss.item()) > 1e-3


def test_a_run_whose_norm_reads_the_batch_says_its_statistics_are_per_micro_batch(tmp_path):
    def said(*overrides: str) -> str:
        out = io.StringIO()
        run = parse_config(compose_cfg(tiny("train.steps=2", "train.end_checks=false", *overrides)))
        train(run, tmp_path / "-".join(overrides), console=Console(file=out, width=200))
        return out.getvalue()

    line = (
        "BatchNorm: batch statistics per micro-batch of 2 sequences (train.micro_batch_size), "
        "not per batch of 8"
    )
    assert line in said("norm=bn", "train.micro_batch_size=2")
    assert "micro-batch" not in said("norm=bn") + said("norm=ln", "train.micro_batch_size=2")
