"""Corpora and batches: the embedded synthetic process, any UTF-8 text file, tiny-shakespeare;
token shards (``data=tokens``) live in ``normbench.data.tokens``.

Every dataset gives the training loop the same things: ``vocab_size`` (and
``embedding_size``, the rows of the embedding), ``train_batch(batch_size, generator)`` returning
(inputs, targets) of shape (B, block_size), a fixed list of validation batches (the same tokens
every eval, so val losses are comparable across steps and runs), and ``bytes_per_token`` of the
validation text (bits per byte), None where tokens are not text. The synthetic process
also knows the true probability of every token it emitted, so it reports the exact
Bayes-optimal cross-entropy of its validation tokens: ``floor_loss``.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from normbench.core.errors import ConfigError
from normbench.data.tokens import TokensData, build_tokens


# One schema per data option, its fields required: conf/data/NAME.yaml holds the values (defaults live once).
@dataclass
class SyntheticData:
    name: str
    vocab_size: int
    concentration: float | None  # Dirichlet alpha of the transition rows; None = uniform rows
    copy_prob: float
    train_sequences: int
    val_sequences: int
    seed: int  # the corpus seed: fixed across training seeds so every run sees the same data


@dataclass
class TextData:
    name: str
    path: str | None
    val_fraction: float


@dataclass
class ShakespeareData:
    name: str
    sha256: str
    val_fraction: float


DATA_SCHEMAS = {
    "synthetic": SyntheticData,
    "text": TextData,
    "shakespeare": ShakespeareData,
    "tokens": TokensData,
}
DataConfig = SyntheticData | TextData | ShakespeareData | TokensData


class SequenceDataset:
    """Independent sequences of block_size + 1 tokens: the model sees each one's whole past."""

    floor_loss: float | None = None
    bytes_per_token: float | None = None  # the synthetic process emits tokens, not text: no bytes

    def __init__(self, train: torch.Tensor, val: torch.Tensor, vocab_size: int):
        self.train, self.val, self.vocab_size = train, val, vocab_size
        self.embedding_size = vocab_size

    def train_batch(self, batch_size: int, generator: torch.Generator):
        rows = torch.randint(len(self.train), (batch_size,), generator=generator)
        seq = self.train[rows]
        return seq[:, :-1], seq[:, 1:]

    def val_batches(self, n_batches: int, batch_size: int):
        seq = self.val[: n_batches * batch_size]
        return [(s[:, :-1], s[:, 1:]) for s in seq.split(batch_size)]


class WindowDataset:
    """Random windows of one long token stream (text): train and val are disjoint spans."""

    floor_loss = None

    def __init__(
        self,
        tokens: torch.Tensor,
        vocab_size: int,
        block_size: int,
        val_fraction: float,
        token_bytes: torch.Tensor | None = None,
    ):
        n_val = int(len(tokens) * val_fraction)
        self.train, self.val = tokens[: len(tokens) - n_val], tokens[len(tokens) - n_val :]
        self.vocab_size, self.block_size = vocab_size, block_size
        self.embedding_size = vocab_size
        # UTF-8 bytes per token of the validation span (bytes per character, for character-level text).
        self.bytes_per_token = (
            float(token_bytes[self.val].double().mean()) if token_bytes is not None else None
        )
        for split, part in (("train", self.train), ("val", self.val)):
            if len(part) < block_size + 2:
                raise ConfigError(
                    f"the text's {split} split has {len(part)} characters, fewer than "
                    f"model.block_size + 2 = {block_size + 2}; use a longer file or a smaller block_size"
                )

    def _windows(self, stream: torch.Tensor, starts: torch.Tensor):
        idx = starts[:, None] + torch.arange(self.block_size + 1)
        seq = stream[idx]
        return seq[:, :-1], seq[:, 1:]

    def train_batch(self, batch_size: int, generator: torch.Generator):
        starts = torch.randint(len(self.train) - self.block_size - 1, (batch_size,), generator=generator)
        return self._windows(self.train, starts)

    def val_batches(self, n_batches: int, batch_size: int):
        fixed = torch.Generator().manual_seed(0)  # the same windows at every eval and in every run
        return [
            self._windows(
                self.val, torch.randint(len(self.val) - self.block_size - 1, (batch_size,), generator=fixed)
            )
            for _ in range(n_batches)
        ]


def unigram_entropy(targets: torch.Tensor, vocab_size: int) -> float:
    """The entropy (nats) of the token frequencies of ``targets``: the loss on them of the best
    prediction that ignores the context."""
    p = torch.bincount(targets.flatten().cpu(), minlength=vocab_size).double() / targets.numel()
    p = p[p > 0]
    return float(-(p * p.log()).sum())


# --------------------------------------------------------------------------- synthetic


def sample_synthetic(n: int, length: int, transitions: torch.Tensor, copy_prob: float):
    """Sample n sequences of a Markov chain with an induction-style copy rule.

    Token t follows a first-order Markov chain, except that with probability
    ``copy_prob`` it instead copies the token that followed the most recent earlier
    occurrence of token t-1 (what an induction head learns; it needs attention).
    Returns (tokens[n, length], logprob[n, length - 1]): the true log-probability of
    each token after the first given everything before it, marginalised over the
    hidden copy-or-not choice: p = (1 - c) * M[a, b] + c * [b == copied].
    """
    vocab = transitions.shape[0]
    tokens = torch.empty(n, length, dtype=torch.long)
    logprob = torch.empty(n, length - 1, dtype=torch.float64)
    tokens[:, 0] = torch.randint(vocab, (n,))
    follower = torch.full((n, vocab), -1, dtype=torch.long)  # token after the last occurrence of v
    rows = torch.arange(n)
    for t in range(1, length):
        if t >= 2:  # the pair (x[t-2], x[t-1]) is now an earlier occurrence for position t
            follower[rows, tokens[:, t - 2]] = tokens[:, t - 1]
        prev = tokens[:, t - 1]
        markov = transitions[prev]  # (n, vocab)
        target = follower[rows, prev]
        can_copy = target >= 0
        mix = markov.clone()
        mix[can_copy] *= 1 - copy_prob
        mix[rows[can_copy], target[can_copy]] += copy_prob
        # Inverse-CDF sampling: one uniform per sequence, much faster than multinomial here.
        nxt = (
            torch.searchsorted(mix.cumsum(1), torch.rand(n, 1, dtype=mix.dtype))
            .squeeze(1)
            .clamp_max(vocab - 1)
        )
        tokens[:, t] = nxt
        logprob[:, t - 1] = mix[rows, nxt].log()
    return tokens, logprob


def synthetic_transitions(vocab: int, concentration: float | None) -> torch.Tensor:
    """Row-stochastic matrix; a small Dirichlet concentration gives peaked, learnable rows."""
    if concentration is None:
        return torch.full((vocab, vocab), 1.0 / vocab, dtype=torch.float64)
    alpha = torch.full((vocab, vocab), float(concentration), dtype=torch.float64)
    rows = torch.distributions.Dirichlet(alpha).sample().clamp_min(1e-12)
    return rows / rows.sum(1, keepdim=True)


class SyntheticDataset(SequenceDataset):
    """The embedded corpus: a seeded stochastic process with an exactly known loss floor."""

    def __init__(self, cfg: DataConfig, block_size: int):
        # A private RNG stream: the corpus depends on data.seed alone, never on the training seed.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed)
            self.transitions = synthetic_transitions(cfg.vocab_size, cfg.concentration)
            train, _ = sample_synthetic(cfg.train_sequences, block_size + 1, self.transitions, cfg.copy_prob)
            val, val_logprob = sample_synthetic(
                cfg.val_sequences, block_size + 1, self.transitions, cfg.copy_prob
            )
        super().__init__(train, val, cfg.vocab_size)
        self.val_logprob = val_logprob

    def floor_for(self, n_sequences: int) -> float:
        """Bayes-optimal cross-entropy (nats/token) on the first n validation sequences."""
        return float(-self.val_logprob[:n_sequences].mean())


# --------------------------------------------------------------------------- text


def _decode_utf8(path: Path) -> str:
    if not path.is_file():
        raise ConfigError(f"data.path: no such file: {path}")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"data.path: {path} is not UTF-8 text ({err.reason} at byte {err.start})") from None
    if not text:
        raise ConfigError(f"data.path: {path} is empty")
    return text


def char_tokens(text: str) -> tuple[torch.Tensor, list[str]]:
    """Character-level tokenisation: the vocabulary is the sorted set of characters."""
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    return torch.tensor([index[c] for c in text], dtype=torch.long), chars


SHAKESPEARE = Path(__file__).with_name("tinyshakespeare.txt")  # shipped in the package


def shakespeare_path(cfg: ShakespeareData) -> Path:
    """The shipped tiny-shakespeare, once its SHA-256 is the config's: a changed copy is never trained on."""
    try:
        digest = hashlib.sha256(SHAKESPEARE.read_bytes()).hexdigest()
    except OSError as err:
        raise ConfigError(
            f"tiny-shakespeare is missing from the install: {SHAKESPEARE} ({err.strerror})"
        ) from None
    if digest != cfg.sha256:
        raise ConfigError(
            f"{SHAKESPEARE} has SHA-256 {digest}, data.sha256 is {cfg.sha256}; not training on a changed copy"
        )
    return SHAKESPEARE


_corpus: tuple[tuple, SyntheticDataset] | None = None  # the last synthetic corpus drawn, by its config


def _synthetic(cfg: SyntheticData, block_size: int) -> SyntheticDataset:
    """The corpus of one data config, drawn once per process: the runs of a sweep's worker share it.
    It depends on data.seed alone (its own RNG stream), so sharing it changes no run."""
    global _corpus
    key = (*dataclasses.astuple(cfg), block_size)
    if _corpus is None or _corpus[0] != key:
        _corpus = (key, SyntheticDataset(cfg, block_size))
    return _corpus[1]


def forget_other_corpora(cfg: DataConfig, block_size: int) -> None:
    """Drop the kept corpus unless it is this run's: called before a run's memory is measured, so
    that an earlier run's corpus (a vocabulary of 4096 holds a 128 MB transition matrix) never
    counts as this run's."""
    global _corpus
    if _corpus is not None and _corpus[0] != (*dataclasses.astuple(cfg), block_size):
        _corpus = None


def build_dataset(cfg: DataConfig, block_size: int, eval_sequences: int):
    """The dataset named by ``data.name``."""
    if cfg.name == "synthetic":
        for key in ("vocab_size", "train_sequences", "val_sequences"):
            if getattr(cfg, key) < 2:
                raise ConfigError(f"data.{key} must be >= 2, got {getattr(cfg, key)}")
        if not 0.0 <= cfg.copy_prob <= 1.0:
            raise ConfigError(f"data.copy_prob must be in [0, 1], got {cfg.copy_prob}")
        if cfg.concentration is not None and not cfg.concentration > 0:
            raise ConfigError(
                f"data.concentration must be > 0 (or null for uniform rows), got {cfg.concentration}"
            )
        if cfg.val_sequences < eval_sequences:
            raise ConfigError(
                f"data.val_sequences={cfg.val_sequences} is smaller than train.eval_batches x "
                f"train.batch_size = {eval_sequences}; raise it or evaluate fewer batches"
            )
        data = copy.copy(_synthetic(cfg, block_size))  # the corpus's tensors shared, never written to
        data.floor_loss = data.floor_for(eval_sequences)
        return data
    if cfg.name in ("text", "shakespeare"):
        if cfg.name == "text" and not cfg.path:
            raise ConfigError("data=text needs a file: data.path=/path/to/file.txt")
        path = shakespeare_path(cfg) if cfg.name == "shakespeare" else Path(os.path.expanduser(cfg.path))
        tokens, chars = char_tokens(_decode_utf8(path))
        if len(chars) < 2:
            raise ConfigError(f"data.path: {path} has a single distinct character; nothing to learn")
        if not 0.0 < cfg.val_fraction < 1.0:
            raise ConfigError(f"data.val_fraction must be in (0, 1), got {cfg.val_fraction}")
        token_bytes = torch.tensor([len(c.encode("utf-8")) for c in chars])
        return WindowDataset(tokens, len(chars), block_size, cfg.val_fraction, token_bytes)
    if cfg.name == "tokens":
        return build_tokens(cfg, block_size)
    raise ConfigError(f"unknown data '{cfg.name}'", allowed=sorted(DATA_SCHEMAS))
