"""``normbench prepare``: text in, llm.c token shards out, streaming, in a directory named by content.

Sources (``SOURCE...``): text files, folders (every file below, sorted) and globs, one document per
file or, with ``split_on_blank_lines``, one per blank-line-separated paragraph; JSONL and Parquet
(``column``); a Hugging Face dataset saved with ``save_to_disk`` (a local folder), or a hub name
streamed through ``datasets`` when the network allows (normbench.data.sources reads them). The
validation split is every 1/val_fraction-th document, or a separate ``val`` source. The tokenizer is
built by normbench.data.tokenizers, each split's shards written by normbench.data.shards.

The output is ``OUT/NAME-HASH/``: ``train_000000.bin``, ... and ``val_000000.bin``, ... (llm.c's
format, ``normbench.data.shards``), ``meta.json`` and the tokenizer's file. HASH covers the sources'
contents, the tokenizer and the options, so preparing the same thing again finds the directory and
returns at once. Everything is written into a hidden temporary directory renamed into place only
when complete: a kill or a full disk never leaves a directory a later run would take as finished.

Memory stays bounded: text is read in pieces of at most ``PIECE_BYTES`` (normbench.data.sources)
and encoded a batch of pieces at a time; a document longer than a piece continues across pieces (its
one end-of-text token comes before its first piece). The next batch is read while the previous one
encodes.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from normbench.core.errors import ConfigError
from normbench.core.fileio import as_umask_allows, disk_full_is, to_json, write_atomic
from normbench.data import tokenizers
from normbench.data.shards import SplitWriter, dtype_for
from normbench.data.sources import Source, content_hash, labelled, resolve_sources

FORMAT = "llm.c"  # bump the hash's version below when the output of the same inputs changes
LAYOUT_VERSION = 1
BATCH_BYTES = 4 << 20  # text per encode_batch call: pieces for every core, bounded memory
SHARD_TOKENS = 100_000_000  # modded-nanogpt's shard size
META = "meta.json"


@dataclass
class Options:
    sources: list[str]
    tokenizer: str
    val: list[str] = field(default_factory=list)
    val_fraction: float = 0.1
    column: str = "text"
    split_on_blank_lines: bool = False
    shard_tokens: int = SHARD_TOKENS
    dtype: str = "auto"


# --------------------------------------------------------------------------- writing


def _batches(pieces: Iterator[tuple[str, str, bool]]) -> Iterator[list[tuple[str, str, bool]]]:
    batch, size = [], 0
    for piece in pieces:
        batch.append(piece)
        size += len(piece[1])
        if size >= BATCH_BYTES:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _encode_all(tok, train, val, opts, writers: dict[str, SplitWriter], progress) -> None:
    eot = np.array([tok.eot_id], dtype=np.uint32)
    with ThreadPoolExecutor(1) as pool:  # encodes one batch while the next is read
        pending = None
        for batch in itertools.chain(_batches(labelled(train, val, opts)), [None]):
            if pending is not None:
                _write_batch(*pending, eot, writers, progress)
            texts = None if batch is None else [text for _, text, _ in batch]
            pending = None if batch is None else (batch, pool.submit(tok.encode_batch, texts))


def _write_batch(batch, encoded, eot, writers: dict[str, SplitWriter], progress) -> None:
    """One batch's ids into each split's shards: one write per split, an end-of-text before each document."""
    parts = {split: [] for split in writers}
    n_bytes = n_tokens = 0
    for (split, text, new), ids in zip(batch, encoded.result()):
        if new:
            parts[split].append(eot)
            writers[split].documents += 1
        parts[split].append(ids)
        size = len(text.encode("utf-8"))
        writers[split].bytes += size
        n_bytes, n_tokens = n_bytes + size, n_tokens + len(ids) + new
    for split, arrays in parts.items():
        if arrays:
            writers[split].write(np.concatenate(arrays))
    progress(n_bytes, n_tokens)


def _slug(opts: Options, sources: list[Source]) -> str:
    stem = Path(opts.sources[0].rstrip("/")).stem if len(opts.sources) == 1 else "corpus"
    stem = re.sub(r"[^\w.-]+", "_", stem).strip("_.") or "corpus"
    kind, arg = tokenizers.parse_spec(opts.tokenizer)
    tok = {"bpe": f"bpe{arg}", "json": "json", "tiktoken": f"tiktoken-{arg}"}.get(kind, kind)
    return f"{stem[:40]}-{tok}"


def dataset_identity(opts: Options, train: list[Source], val: list[Source]) -> dict:
    """What the output directory's hash covers: the sources' contents, the tokenizer, the options."""
    kind, arg = tokenizers.parse_spec(opts.tokenizer)
    tok = {"spec": opts.tokenizer if kind != "json" else "json", "arg": str(arg)}
    if kind == "json":
        tok["sha256"] = hashlib.sha256(Path(arg).read_bytes()).hexdigest()
    return {
        "layout": LAYOUT_VERSION,
        "format": FORMAT,
        "tokenizer": tok,
        "train": [[s.kind, Path(s.location).name, content_hash(s)] for s in train],
        "val": [[s.kind, Path(s.location).name, content_hash(s)] for s in val],
        "val_fraction": None if val else opts.val_fraction,
        "column": opts.column,
        "split_on_blank_lines": opts.split_on_blank_lines,
        "shard_tokens": opts.shard_tokens,
        "dtype": opts.dtype,
    }


def check_options(opts: Options) -> None:
    if not opts.sources:
        raise ConfigError("prepare needs at least one SOURCE (a file, folder, glob or dataset)")
    if not opts.val and not 0.0 < opts.val_fraction < 1.0:
        raise ConfigError(f"--val-fraction must be in (0, 1), got {opts.val_fraction}")
    if opts.shard_tokens < 1 or opts.shard_tokens >= 1 << 31:
        raise ConfigError(f"--shard-tokens must be in [1, 2^31), got {opts.shard_tokens}")
    tokenizers.parse_spec(opts.tokenizer)
    if opts.dtype not in ("auto", "uint16", "uint32"):
        raise ConfigError(f"unknown --dtype {opts.dtype!r}", allowed=["auto", "uint16", "uint32"])


def prepare(opts: Options, out: Path, console: Console | None = None, show_progress: bool = True) -> Path:
    """Tokenize ``opts.sources`` into ``out/NAME-HASH`` (reused when it exists); return that directory."""
    console = console or Console(stderr=True)
    check_options(opts)
    train, val = resolve_sources(opts.sources), resolve_sources(opts.val)
    identity = dataset_identity(opts, train, val)
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:12]
    out = Path(os.path.expanduser(out))
    final = out / f"{_slug(opts, train)}-{digest}"
    if (final / META).is_file():
        console.print(
            f"reusing {final} (prepared before from the same sources and tokenizer)", highlight=False
        )
        return final
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=out, prefix=f".{final.name}.", suffix=".tmp"))
    os.chmod(work, as_umask_allows(0o777))  # renamed into place: as readable as a mkdir'd folder
    started = time.perf_counter()
    try:
        splits = _write(opts, train, val, identity, work, console, show_progress)
        try:
            os.rename(work, final)
        except OSError:  # another process finished the same directory first: its copy is as good
            if not (final / META).is_file():
                raise
            shutil.rmtree(work, ignore_errors=True)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    seconds = time.perf_counter() - started
    text_bytes = sum(s["bytes"] for s in splits.values())
    console.print(
        f"prepared {final}: {splits['train']['tokens']:,} train and {splits['val']['tokens']:,} val tokens "
        f"from {text_bytes / 1e6:,.1f} MB of text in {seconds:.1f} s ({text_bytes / 1e6 / seconds:.1f} MB/s)",
        highlight=False,
        soft_wrap=True,
    )
    return final


def _write(opts, train, val, identity, work: Path, console: Console, show_progress: bool) -> None:
    tok = tokenizers.build_tokenizer(opts, train, val)
    dtype = dtype_for(tok.vocab_size, opts.dtype)
    writers = {s: SplitWriter(work, s, dtype, opts.shard_tokens) for s in ("train", "val")}
    total = sum(s.size for s in (*train, *val)) or None
    with Progress(
        TextColumn(f"[bold]prepare[/bold] {tok.spec}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TextColumn("{task.fields[tokens]:,} tokens"),
        TimeRemainingColumn(),
        console=console,
        disable=not show_progress,
        transient=True,  # the summary line below stays; an error leaves only its own line
    ) as bar:
        task = bar.add_task("prepare", total=total, tokens=0)
        counted = {"tokens": 0}

        def progress(n_bytes: int, n_tokens: int) -> None:
            counted["tokens"] += n_tokens
            bar.update(task, advance=n_bytes, tokens=counted["tokens"])

        _encode_all(tok, train, val, opts, writers, progress)
    splits = {s: w.close() for s, w in writers.items()}
    for split, info in splits.items():
        if info["tokens"] == 0:
            hint = "give --val SOURCE" if split == "val" else "the sources hold too little text"
            raise ConfigError(
                f"the {split} split is empty ({splits['train']['documents'] + splits['val']['documents']} "
                f"document(s) in all); split documents with --split-on-blank-lines, raise --val-fraction "
                f"or {hint}"
            )
    meta = {
        "format": FORMAT,
        "dtype": dtype.name,
        "tokenizer": tok.save(work),
        "vocab_size": tok.vocab_size,
        "eot_id": tok.eot_id,
        "splits": splits,
        "sources": {
            "train": [
                {"kind": s.kind, "location": s.location, "sha256": h[2]}
                for s, h in zip(train, identity["train"])
            ],
            "val": [
                {"kind": s.kind, "location": s.location, "sha256": h[2]} for s, h in zip(val, identity["val"])
            ],
        },
        "options": {
            k: identity[k] for k in ("val_fraction", "column", "split_on_blank_lines", "shard_tokens")
        },
    }
    with disk_full_is(work / META):
        write_atomic(work / META, to_json(meta, indent=2) + "\n")
    return splits
