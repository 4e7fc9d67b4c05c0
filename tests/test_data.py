"""The corpora: the synthetic process's exact floor, text files, and the shipped tiny-shakespeare."""

from __future__ import annotations

import hashlib
import math

import pytest
import torch
from conftest import SHARED_DATA, train_tiny

from normbench.core.errors import ConfigError
from normbench.data.corpus import (
    build_dataset,
    sample_synthetic,
    shakespeare_path,
    synthetic_transitions,
)
from normbench.training.config import load_group


def slow_true_logprob(seq: list[int], transitions: torch.Tensor, copy_prob: float) -> list[float]:
    """The process's definition written out token by token, independent of the vectorised sampler."""
    out = []
    for t in range(1, len(seq)):
        prev = seq[t - 1]
        earlier = [j for j in range(t - 1) if seq[j] == prev]
        p = float(transitions[prev, seq[t]])
        if earlier:
            copied = seq[max(earlier) + 1]
            p = (1 - copy_prob) * p + copy_prob * (1.0 if seq[t] == copied else 0.0)
        out.append(math.log(p))
    return out


def test_synthetic_logprob_matches_the_process_definition():
    torch.manual_seed(3)
    M = synthetic_transitions(8, 0.3)
    tokens, logprob = sample_synthetic(16, 40, M, copy_prob=0.6)
    for row in range(16):
        expected = slow_true_logprob(tokens[row].tolist(), M, 0.6)
        assert torch.allclose(logprob[row], torch.tensor(expected, dtype=torch.float64), atol=1e-12)


def test_uniform_iid_process_has_floor_ln_vocab():
    data = build_dataset(
        load_group(
            "data", vocab_size=50, concentration=None, copy_prob=0.0, train_sequences=8, val_sequences=8
        ),
        16,
        8,
    )
    # i.i.d. uniform over 50 tokens: every token costs ln 50 nats, whatever came before
    assert data.floor_loss == pytest.approx(math.log(50), abs=1e-12)


def test_copy_always_makes_repeated_contexts_deterministic():
    """copy_prob=1: once a token has been seen, what follows it is certain (log p = 0)."""
    M = synthetic_transitions(6, None)
    tokens, logprob = sample_synthetic(4, 30, M, copy_prob=1.0)
    for row in range(4):
        seq = tokens[row].tolist()
        for t in range(1, 30):
            seen_before = seq[t - 1] in seq[: t - 1]
            expected = 0.0 if seen_before else -math.log(6)
            assert logprob[row, t - 1].item() == pytest.approx(expected, abs=1e-12)


def test_markov_floor_is_the_empirical_transition_entropy():
    cfg = load_group(
        "data", vocab_size=16, concentration=0.2, copy_prob=0.0, train_sequences=8, val_sequences=64
    )
    data = build_dataset(cfg, 32, 64)
    val = data.val[:64]
    by_hand = -data.transitions[val[:, :-1], val[:, 1:]].log().mean().item()
    assert data.floor_loss == pytest.approx(by_hand, rel=1e-12)


def test_corpus_depends_on_data_seed_not_training_seed():
    cfg = load_group("data", train_sequences=16, val_sequences=16)
    torch.manual_seed(0)
    a = build_dataset(cfg, 16, 16)
    torch.manual_seed(99)
    b = build_dataset(cfg, 16, 16)
    assert torch.equal(a.train, b.train) and a.floor_loss == b.floor_loss
    c = build_dataset(load_group("data", train_sequences=16, val_sequences=16, seed=7), 16, 16)
    assert not torch.equal(a.train, c.train)


@pytest.mark.slow  # a 60-step training
def test_trained_model_does_not_beat_the_floor(tmp_path):
    summary = train_tiny(tmp_path, "train.steps=60", "train.lr=1e-2")
    assert summary["status"] == "completed"
    assert summary["best_val_loss"] < math.log(64) - 0.5  # it learned something
    assert summary["best_val_loss"] > summary["floor_loss"] - 0.02  # but not the impossible


def test_text_dataset_is_character_level(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("hello world, héllo wörld\n" * 20, encoding="utf-8")
    data = build_dataset(load_group("data", "text", path=str(path)), 8, 4)
    assert data.vocab_size == len(set(path.read_text(encoding="utf-8")))
    x, y = data.train_batch(3, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (3, 8) and torch.equal(x[:, 1:], y[:, :-1])
    assert data.floor_loss is None


@pytest.mark.parametrize(
    "content, message",
    [(None, "no such file"), (b"", "is empty"), (b"\xff\xfe\x00bad", "is not UTF-8"), (b"ab", "fewer than")],
)
def test_bad_text_files(tmp_path, content, message):
    path = tmp_path / "bad.txt"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ConfigError, match=message):
        build_dataset(load_group("data", "text", path=str(path)), 8, 4)


def test_shakespeare_trains_on_the_shipped_copy_offline():
    """data=shakespeare reads the copy shipped in the package, whose SHA-256 is the published one
    (hashed here independently of the loader), and splits it at 65 characters, nanoGPT's vocabulary."""
    cfg = load_group("data", "shakespeare")
    path = shakespeare_path(cfg)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == (
        "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
    )
    data = build_dataset(cfg, 64, 4)
    assert data.vocab_size == 65


def test_shakespeare_with_another_checksum_is_refused():
    cfg = load_group("data", "shakespeare", sha256="0" * 64)
    with pytest.raises(ConfigError, match="SHA-256.*not training on a changed copy"):
        build_dataset(cfg, 64, 4)


@pytest.mark.skipif(not (SHARED_DATA / "tinyshakespeare.txt").exists(), reason="../shared/data not present")
def test_real_shakespeare_matches_the_published_checksum():
    text = (SHARED_DATA / "tinyshakespeare.txt").read_bytes()
    assert hashlib.sha256(text).hexdigest() == load_group("data", "shakespeare").sha256
    data = build_dataset(load_group("data", "text", path=str(SHARED_DATA / "tinyshakespeare.txt")), 64, 4)
    assert data.vocab_size == 65  # nanoGPT's shakespeare_char vocabulary
