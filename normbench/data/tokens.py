"""``data=tokens``: training on token shards without loading them.

``data.path`` is a folder of shards: ``normbench prepare``'s output (its meta.json gives the
vocabulary and the bytes per token), llm.c / modded-nanogpt ``.bin`` files (format known by the
magic number), or headerless uint16/uint32 arrays such as nanoGPT's ``train.bin`` / ``val.bin``
(``data.dtype``, ``data.vocab_size``). ``data.source`` instead names text to prepare first (into
``data.cache_dir``, reused by every later run).

Training windows are drawn at random across all training shards, in proportion to their sizes;
validation windows are drawn once with a fixed seed, the same at every eval and in every run.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from normbench.core.errors import ConfigError
from normbench.data.shards import Shard, open_shard

# The vocabularies llm.c's shards imply when nothing else says: GPT-2's and LLaMA-3's.
LLMC_VOCAB = {np.dtype(np.uint16): 50257, np.dtype(np.uint32): 128256}
PAD_TO = 64  # the embedding is padded to a multiple of this (nanoGPT's 50,257 -> 50,304)
SHARD_SUFFIXES = (".bin", ".npy")


@dataclass
class TokensData:
    name: str
    path: str | None  # a folder of shards
    source: str | None  # or text to prepare first (a file, folder, glob, JSONL/Parquet, dataset)
    tokenizer: str  # with source: char, byte, bpe:N, a tokenizer.json, tiktoken:NAME
    split_on_blank_lines: bool  # with source: one document per blank-line-separated paragraph
    val_fraction: float  # with source: the documents held out for validation
    cache_dir: str  # with source: where the prepared shards are kept
    train_glob: str
    val_glob: str
    dtype: str  # auto: from the header; uint16 / uint32: headerless arrays
    vocab_size: int | None  # the vocabulary, when no meta.json says it (nanoGPT: 50257)
    bytes_per_token: float | None  # for bits per byte, when no meta.json says it


def padded_vocab(vocab_size: int) -> int:
    """The embedding's rows: the vocabulary rounded up to a multiple of 64."""
    return PAD_TO * math.ceil(vocab_size / PAD_TO)


class Split:
    """The shards of one split, as one space of window starts (windows never cross a shard)."""

    def __init__(self, shards: list[Shard], block_size: int, name: str):
        self.block_size = block_size
        self.shards = [s for s in shards if s.tokens > block_size]
        if not self.shards:
            most = max((s.tokens for s in shards), default=0)
            raise ConfigError(
                f"the {name} split has too few tokens for model.block_size={block_size}: its largest shard "
                f"holds {most:,} (a window needs block_size + 1); prepare more text or lower model.block_size"
            )
        self.ends = np.cumsum([s.tokens - block_size for s in self.shards])
        self.tokens = sum(s.tokens for s in self.shards)

    def windows(self, starts: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) of the windows at global ``starts``; the shards mapped only meanwhile."""
        which = np.searchsorted(self.ends, starts, side="right")
        local = starts - np.concatenate([[0], self.ends])[which]
        out = np.empty((len(starts), self.block_size + 1), dtype=np.int64)
        offsets = np.arange(self.block_size + 1)
        for i in np.unique(which):
            rows = which == i
            tokens = self.shards[i].memmap()
            out[rows] = tokens[local[rows, None] + offsets]
            del tokens  # unmapped now: the pages read leave the process with the map
        seq = torch.from_numpy(out)
        return seq[:, :-1], seq[:, 1:]

    def draw(self, n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(int(self.ends[-1]), (n,), generator=generator).numpy()
        return self.windows(starts)


class TokenDataset:
    """Random windows of the training shards; fixed windows of the validation shards."""

    floor_loss = None

    def __init__(self, train: Split, val: Split, vocab_size: int, bytes_per_token: float | None):
        self.train, self.val = train, val
        self.vocab_size, self.bytes_per_token = vocab_size, bytes_per_token
        self.embedding_size = padded_vocab(vocab_size)

    def train_batch(self, batch_size: int, generator: torch.Generator):
        return self.train.draw(batch_size, generator)

    def val_batches(self, n_batches: int, batch_size: int):
        fixed = torch.Generator().manual_seed(0)  # the same windows at every eval and in every run
        return [self.val.draw(batch_size, fixed) for _ in range(n_batches)]


def _shards(folder: Path, pattern: str, split: str, dtype: str) -> list[Shard]:
    files = sorted(p for p in folder.glob(pattern) if p.is_file() and p.suffix in SHARD_SUFFIXES)
    if not files:
        raise ConfigError(
            f"data.path: no {split} shard ({pattern}{{{','.join(SHARD_SUFFIXES)}}}) in {folder}; "
            f"set data.{split}_glob to name them"
        )
    return [open_shard(p, dtype) for p in files]


def _meta(folder: Path) -> dict | None:
    path = folder / "meta.json"
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError:
        raise ConfigError(f"{path}: not JSON (a damaged normbench prepare output?)") from None


def _vocab(cfg: TokensData, meta: dict | None, shards: list[Shard]) -> int:
    if cfg.vocab_size is not None:
        if cfg.vocab_size < 2:
            raise ConfigError(f"data.vocab_size must be >= 2, got {cfg.vocab_size}")
        return cfg.vocab_size
    if meta is not None:
        return int(meta["vocab_size"])
    if shards[0].offset == 0:
        raise ConfigError(
            "headerless shards need their vocabulary: data.vocab_size=N (nanoGPT's GPT-2: 50257)"
        )
    return LLMC_VOCAB[shards[0].dtype]


def _check_ids(shards: list[Shard], vocab_size: int) -> None:
    """Every id below the vocabulary: one chunked pass over shards no meta.json vouches for."""
    for shard in shards:
        top = shard.max_token()
        if top >= vocab_size:
            raise ConfigError(
                f"{shard.path}: token id {top} is at or past the vocabulary size {vocab_size}; "
                "set data.vocab_size to the tokenizer's vocabulary"
            )


def build_tokens(cfg: TokensData, block_size: int) -> TokenDataset:
    """The dataset of ``data=tokens``: shards from data.path, or data.source prepared first."""
    if bool(cfg.path) == bool(cfg.source):
        raise ConfigError(
            "data=tokens needs exactly one of data.path=DIR (token shards) "
            "and data.source=TEXT (prepared first)"
        )
    if cfg.source:
        from normbench.data.prepare import Options, prepare  # the tokenizers' imports only when preparing

        opts = Options(
            sources=[cfg.source],
            tokenizer=cfg.tokenizer,
            val_fraction=cfg.val_fraction,
            split_on_blank_lines=cfg.split_on_blank_lines,
        )
        folder = prepare(opts, Path(os.path.expanduser(cfg.cache_dir)), show_progress=False)
    else:
        folder = Path(os.path.expanduser(cfg.path))
    if not folder.is_dir():
        raise ConfigError(f"data.path: no such folder: {folder}")
    meta = _meta(folder)
    train = _shards(folder, cfg.train_glob, "train", cfg.dtype)
    val = _shards(folder, cfg.val_glob, "val", cfg.dtype)
    vocab = _vocab(cfg, meta, train)
    for shard in (*train, *val):
        if shard.dtype.itemsize == 2 and vocab > 1 << 16:
            raise ConfigError(f"data.vocab_size={vocab} does not fit the uint16 tokens of {shard.path}")
    if meta is None or (cfg.vocab_size is not None and cfg.vocab_size < meta["vocab_size"]):
        _check_ids([*train, *val], vocab)
    bytes_per_token = cfg.bytes_per_token
    if bytes_per_token is None and meta is not None:
        val_split = meta["splits"]["val"]
        bytes_per_token = val_split["bytes"] / val_split["tokens"]
    return TokenDataset(
        Split(train, block_size, "train"), Split(val, block_size, "val"), vocab, bytes_per_token
    )
