"""Token shards on disk: the formats the field already uses, read without loading them.

- llm.c / modded-nanogpt ``.bin``: a header of 256 int32 (1,024 bytes): [0] magic, [1] version,
  [2] token count, the rest 0; then the tokens. Magic 20240520 version 1: uint16 tokens (GPT-2
  sized vocabularies); magic 20240801 version 7: uint32 tokens (LLaMA-3 sized). normbench's own
  ``normbench prepare`` writes this format.
- nanoGPT's ``train.bin`` / ``val.bin`` and OLMo-core's arrays: no header, only tokens (uint16 or
  uint32); the reader must be told the dtype and the vocabulary (``data.dtype``, ``data.vocab_size``).

``normbench prepare`` writes each split as ``{split}_000000.bin``, ... (``SplitWriter``).

A shard is read through ``np.memmap``, opened for each batch and dropped after it, as nanoGPT's
loader does: the pages a batch touched leave the process with it, so a run's memory does not grow
with the corpus, however many windows it draws.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from normbench.core.errors import ConfigError
from normbench.core.fileio import disk_full_is

HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
# magic -> (version, token dtype) of llm.c's training shards.
LLMC_FORMATS = {20240520: (1, np.dtype(np.uint16)), 20240801: (7, np.dtype(np.uint32))}
MAGIC_FOR = {np.dtype(np.uint16): 20240520, np.dtype(np.uint32): 20240801}
DTYPES = {"uint16": np.dtype(np.uint16), "uint32": np.dtype(np.uint32)}
CHUNK_TOKENS = 1 << 22  # what one read of a whole-shard scan holds in memory (16 MB of uint32)


def dtype_for(vocab_size: int, asked: str | None = None) -> np.dtype:
    """The token dtype of a vocabulary: uint16 below 65,536 tokens, uint32 from there (or ``asked``)."""
    if asked in (None, "auto"):
        return DTYPES["uint16"] if vocab_size <= 1 << 16 else DTYPES["uint32"]
    if asked not in DTYPES:
        raise ConfigError(f"unknown token dtype {asked!r}", allowed=["auto", *DTYPES])
    dtype = DTYPES[asked]
    if vocab_size > np.iinfo(dtype).max + 1:
        raise ConfigError(
            f"a vocabulary of {vocab_size:,} tokens does not fit {asked} "
            f"(at most {np.iinfo(dtype).max + 1:,})",
            allowed=["uint32", "auto"],
        )
    return dtype


@dataclass(frozen=True)
class Shard:
    """Where a shard's tokens are: ``tokens`` of ``dtype`` from byte ``offset`` of ``path``."""

    path: Path
    dtype: np.dtype
    offset: int
    tokens: int

    def memmap(self) -> np.ndarray:
        return np.memmap(self.path, dtype=self.dtype, mode="r", offset=self.offset, shape=(self.tokens,))

    def max_token(self) -> int:
        """The largest id in the shard, read in chunks (bounded memory, nothing kept mapped)."""
        top = -1
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            for start in range(0, self.tokens, CHUNK_TOKENS):
                chunk = np.fromfile(f, dtype=self.dtype, count=min(CHUNK_TOKENS, self.tokens - start))
                if len(chunk):
                    top = max(top, int(chunk.max()))
        return top


def open_shard(path: Path, dtype: str | None = None) -> Shard:
    """A shard's layout: read from its llm.c header, or headerless when ``dtype`` is uint16/uint32."""
    path = Path(path)
    size = path.stat().st_size
    if dtype not in (None, "auto"):
        if dtype not in DTYPES:
            raise ConfigError(f"data.dtype: unknown token dtype {dtype!r}", allowed=["auto", *DTYPES])
        width = DTYPES[dtype].itemsize
        if size % width:
            raise ConfigError(f"{path}: {size} bytes is not a whole number of {dtype} tokens")
        return Shard(path, DTYPES[dtype], 0, size // width)
    if size < HEADER_BYTES:
        raise ConfigError(
            f"{path}: {size} bytes, shorter than an llm.c header ({HEADER_BYTES} bytes); for a headerless "
            "array (nanoGPT's train.bin) give data.dtype=uint16 (or uint32) and data.vocab_size"
        )
    header = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
    magic, version, count = (int(v) for v in header[:3])
    if magic not in LLMC_FORMATS:
        raise ConfigError(
            f"{path}: unknown magic number {magic} (llm.c shards have "
            f"{' or '.join(map(str, LLMC_FORMATS))}); for a headerless array (nanoGPT's train.bin, "
            "OLMo's uint32 arrays) give data.dtype=uint16 or uint32 and data.vocab_size"
        )
    want_version, token_dtype = LLMC_FORMATS[magic]
    if version != want_version:
        raise ConfigError(
            f"{path}: magic {magic} with version {version}; llm.c writes version {want_version}"
        )
    have = (size - HEADER_BYTES) // token_dtype.itemsize
    if count < 0 or have < count:
        raise ConfigError(
            f"{path}: the header says {count:,} tokens but the file holds {have:,}; "
            "the shard is truncated (an interrupted copy or download?)"
        )
    return Shard(path, token_dtype, HEADER_BYTES, count)


def read_tokens(path: Path, dtype: str | None = None) -> np.ndarray:
    """A whole shard's tokens as an in-memory array (tests, small files)."""
    return np.array(open_shard(path, dtype).memmap())


class ShardWriter:
    """Writes one llm.c shard incrementally: a placeholder header, the tokens, then the real header."""

    def __init__(self, path: Path, dtype: np.dtype):
        self.path, self.dtype, self.tokens = Path(path), np.dtype(dtype), 0
        self.file = open(self.path, "wb")  # noqa: SIM115 (closed in close(), once the header is final)
        with disk_full_is(self.path):
            self.file.write(bytes(HEADER_BYTES))

    def write(self, tokens: np.ndarray) -> None:
        with disk_full_is(self.path):
            self.file.write(np.ascontiguousarray(tokens, dtype=self.dtype).tobytes())
        self.tokens += len(tokens)

    def close(self) -> None:
        if self.tokens >= 1 << 31:
            raise ConfigError(f"{self.path}: {self.tokens:,} tokens; llm.c's header holds fewer than 2^31")
        header = np.zeros(HEADER_INTS, dtype="<i4")
        magic = MAGIC_FOR[self.dtype]
        header[:3] = magic, LLMC_FORMATS[magic][0], self.tokens
        with disk_full_is(self.path):
            self.file.seek(0)
            self.file.write(header.tobytes())
            self.file.flush()
            os.fsync(self.file.fileno())
            self.file.close()


def write_shard(path: Path, tokens: np.ndarray, dtype: np.dtype | str) -> None:
    """One llm.c shard holding ``tokens`` (of ``dtype``: uint16 or uint32)."""
    writer = ShardWriter(path, DTYPES.get(dtype, dtype) if isinstance(dtype, str) else dtype)
    writer.write(tokens)
    writer.close()


class SplitWriter:
    """One split's shards: ``{split}_000000.bin``, ... of at most ``shard_tokens`` tokens each."""

    def __init__(self, directory: Path, split: str, dtype, shard_tokens: int):
        self.directory, self.split, self.dtype, self.shard_tokens = directory, split, dtype, shard_tokens
        self.shards: list[str] = []
        self.tokens = self.bytes = self.documents = 0
        self.writer: ShardWriter | None = None

    def write(self, ids: np.ndarray) -> None:
        self.tokens += len(ids)
        while len(ids):
            if self.writer is None:
                name = f"{self.split}_{len(self.shards):06d}.bin"
                self.writer = ShardWriter(self.directory / name, self.dtype)
                self.shards.append(name)
            room = self.shard_tokens - self.writer.tokens
            self.writer.write(ids[:room])
            ids = ids[room:]
            if self.writer.tokens >= self.shard_tokens:
                self.writer.close()
                self.writer = None

    def close(self) -> dict:
        if self.writer is not None:
            self.writer.close()
        return {
            "tokens": self.tokens,
            "bytes": self.bytes,
            "documents": self.documents,
            "shards": self.shards,
        }
