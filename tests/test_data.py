"""The corpora: the synthetic process's exact floor, text files, and the shakespeare cache."""

from __future__ import annotations

import hashlib
import math

import pytest
import torch
from conftest import SHARED_DATA, train_tiny

from normbench.core.errors import ConfigError
from normbench.data.corpus import (
    build_dataset,
    fetch_shakespeare,
    sample_synthetic,
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


def test_shakespeare_downloads_verifies_and_reuses_cache(tmp_path):
    source = tmp_path / "input.txt"
    source.write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n" * 30)
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    cfg = load_group(
        "data", "shakespeare", url=source.as_uri(), sha256=digest, cache_dir=str(tmp_path / "cache")
    )
    cached = fetch_shakespeare(cfg)
    assert cached.read_bytes() == source.read_bytes()
    source.unlink()  # the second call must not touch the "network"
    assert fetch_shakespeare(cfg) == cached
    data = build_dataset(cfg, 16, 4)
    assert data.vocab_size == len(set(cached.read_text()))


def test_parallel_first_downloads_do_not_race(tmp_path, monkeypatch):
    """The jobs of a sweep downloading at once: each writes its own file, every one of them succeeds.

    A barrier in os.replace holds every download until all have written their temporary file,
    the interleaving under which downloads sharing one temporary name lose it to each other.
    """
    import os
    import threading

    source = tmp_path / "input.txt"
    source.write_text("Before we proceed any further, hear me speak.\n" * 100)
    cfg = load_group(
        "data",
        "shakespeare",
        url=source.as_uri(),
        sha256=hashlib.sha256(source.read_bytes()).hexdigest(),
        cache_dir=str(tmp_path / "cache"),
    )
    jobs = 4
    barrier = threading.Barrier(jobs, timeout=30)
    real_replace = os.replace

    def replace_together(src, dst, *args, **kwargs):
        if str(dst).startswith(cfg.cache_dir):
            barrier.wait()
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace_together)
    results, errors = [], []

    def job():
        try:
            results.append(fetch_shakespeare(cfg))
        except Exception as err:
            errors.append(err)

    threads = [threading.Thread(target=job) for _ in range(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert len(results) == jobs and all(r.read_bytes() == source.read_bytes() for r in results)
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["tinyshakespeare.txt"], (
        "temporary files left behind"
    )


def test_shakespeare_checksum_mismatch_is_refused(tmp_path):
    source = tmp_path / "input.txt"
    source.write_text("tampered")
    cfg = load_group(
        "data", "shakespeare", url=source.as_uri(), sha256="0" * 64, cache_dir=str(tmp_path / "cache")
    )
    with pytest.raises(ConfigError, match="SHA-256"):
        fetch_shakespeare(cfg)
    assert not (tmp_path / "cache" / "tinyshakespeare.txt").exists()


def test_shakespeare_offline_names_the_local_alternative(tmp_path):
    cfg = load_group(
        "data", "shakespeare", url=(tmp_path / "missing.txt").as_uri(), cache_dir=str(tmp_path / "cache")
    )
    with pytest.raises(ConfigError, match=r"data=text data.path="):
        fetch_shakespeare(cfg)


@pytest.mark.skipif(not (SHARED_DATA / "tinyshakespeare.txt").exists(), reason="../shared/data not present")
def test_real_shakespeare_matches_the_published_checksum():
    text = (SHARED_DATA / "tinyshakespeare.txt").read_bytes()
    assert hashlib.sha256(text).hexdigest() == load_group("data", "shakespeare").sha256
    data = build_dataset(load_group("data", "text", path=str(SHARED_DATA / "tinyshakespeare.txt")), 64, 4)
    assert data.vocab_size == 65  # nanoGPT's shakespeare_char vocabulary
