"""``normbench prepare``: text in, llm.c token shards out, streaming, in a directory named by content.

Sources (``SOURCE...``): text files, folders (every file below, sorted) and globs, one document per
file or, with ``split_on_blank_lines``, one per blank-line-separated paragraph; JSONL and Parquet
(``column``); a Hugging Face dataset saved with ``save_to_disk`` (a local folder), or a hub name
streamed through ``datasets`` when the network allows. The validation split is every
1/val_fraction-th document, or a separate ``val`` source.

The output is ``OUT/NAME-HASH/``: ``train_000000.bin``, ... and ``val_000000.bin``, ... (llm.c's
format, ``normbench.data.shards``), ``meta.json`` and the tokenizer's file. HASH covers the sources'
contents, the tokenizer and the options, so preparing the same thing again finds the directory and
returns at once. Everything is written into a hidden temporary directory renamed into place only
when complete: a kill or a full disk never leaves a directory a later run would take as finished.

Memory stays bounded: text is read in pieces of at most ``PIECE_BYTES`` and encoded a batch of
pieces at a time; a document longer than a piece continues across pieces (its one end-of-text
token comes before its first piece). The next batch is read while the previous one encodes.
"""

from __future__ import annotations

import codecs
import glob
import hashlib
import itertools
import json
import os
import re
import shutil
import socket
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
from normbench.data.shards import ShardWriter, dtype_for

FORMAT = "llm.c"  # bump the hash's version below when the output of the same inputs changes
LAYOUT_VERSION = 1
PIECE_BYTES = 1 << 20  # the longest piece of text encoded at once
BATCH_BYTES = 4 << 20  # text per encode_batch call: pieces for every core, bounded memory
SHARD_TOKENS = 100_000_000  # modded-nanogpt's shard size
META = "meta.json"
HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


@dataclass
class Source:
    """One input: ``kind`` is text, jsonl, parquet, hf_disk or hub; ``size`` its bytes on disk (0 for hub)."""

    kind: str
    location: str
    size: int = 0


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


# --------------------------------------------------------------------------- finding the sources


def _kind(path: Path) -> str:
    return {".jsonl": "jsonl", ".parquet": "parquet"}.get(path.suffix.lower(), "text")


def _is_hf_folder(path: Path) -> bool:
    """A folder written by ``datasets``' save_to_disk (a Dataset or a DatasetDict)."""
    return (path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file()


def resolve_sources(specs: list[str]) -> list[Source]:
    """Files, folders and globs expanded (sorted, hidden files left out); a hub name if nothing local."""
    out = []
    for spec in specs:
        path = Path(os.path.expanduser(spec))
        if any(c in spec for c in "*?["):
            files = sorted(Path(p) for p in glob.glob(os.path.expanduser(spec), recursive=True))
            files = [p for p in files if p.is_file()]
            if not files:
                raise ConfigError(f"empty source: the glob {spec!r} matches no file")
        elif path.is_dir() and _is_hf_folder(path):
            out.append(Source("hf_disk", str(path.resolve()), _tree_size(path)))
            continue
        elif path.is_dir():
            files = sorted(
                p
                for p in path.rglob("*")
                if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts)
            )
            if not files:
                raise ConfigError(f"empty source: the folder {spec} holds no file")
        elif path.is_file():
            files = [path]
        elif HUB_NAME.match(spec) and "." not in Path(spec).suffix:
            out.append(Source("hub", spec))
            continue
        else:
            raise ConfigError(
                f"no such source: {spec}", allowed=["a file", "a folder", "a glob", "a hub dataset name"]
            )
        out += [Source(_kind(p), str(p.resolve()), p.stat().st_size) for p in files]
    for source in out:
        if source.kind == "text":
            _sniff(source.location)
    return out


def _sniff(path: str) -> None:
    """A binary file refused before any work (a NUL byte in its first 8 KB); later ones while reading."""
    with open(path, "rb") as f:
        head = f.read(8192)
    if b"\0" in head:
        raise _binary(path, head.index(0))


def _binary(path: str, offset: int) -> ConfigError:
    return ConfigError(
        f"{path} looks binary (a NUL byte at offset {offset}); "
        "give text files only, or leave it out of the sources"
    )


def _tree_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _content_hash(source: Source) -> str:
    """SHA-256 of a source's bytes (a folder: of its files' names and bytes); a hub name: of the name."""
    h = hashlib.sha256()
    if source.kind == "hub":
        h.update(f"hub:{source.location}".encode())
        return h.hexdigest()
    root = Path(source.location)
    files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
    for p in files:
        h.update(str(p.relative_to(root)).encode() if root.is_dir() else b"")
        with open(p, "rb") as f:
            while chunk := f.read(1 << 22):
                h.update(chunk)
    return h.hexdigest()


# --------------------------------------------------------------------------- reading documents


def _text_blocks(path: str) -> Iterator[str]:
    """A text file decoded strictly as UTF-8, in blocks of at most PIECE_BYTES bytes."""
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    offset = 0
    with open(path, "rb") as f:
        while raw := f.read(PIECE_BYTES):
            if b"\0" in raw:
                raise ConfigError(
                    f"{path} looks binary (a NUL byte at offset {offset + raw.index(0)}); "
                    "give text files only, or leave it out of the sources"
                )
            try:
                yield decoder.decode(raw)
            except UnicodeDecodeError as err:
                raise ConfigError(
                    f"{path} is not UTF-8 text ({err.reason} at byte {offset + err.start}); "
                    "convert it (iconv -f LATIN1 -t UTF-8) or leave it out of the sources"
                ) from None
            offset += len(raw)
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not UTF-8 text (it ends inside a character)") from None


def _text_lines(path: str) -> Iterator[str]:
    """A text file's lines (without their newlines), decoded strictly as UTF-8."""
    rest = ""
    for block in _text_blocks(path):
        *lines, rest = (rest + block).split("\n")
        yield from lines
    if rest:
        yield rest


BLANK_LINES = re.compile(r"\n(?:[^\S\n]*\n)+")  # the end of a line, then whitespace-only lines
LEADING_BLANK_LINES = re.compile(r"(?:[^\S\n]*\n)+")


def _text_documents(path: str, split_on_blank_lines: bool) -> Iterator[tuple[str, bool]]:
    """(piece, starts a document) of one text file: the file is one document, or each paragraph is.
    A piece longer than PIECE_BYTES is cut after a newline (or anywhere, in a line that long)."""
    buf, new = "", True
    for block in _text_blocks(path):
        buf += block
        if split_on_blank_lines:
            *paragraphs, buf = BLANK_LINES.split(buf)
            for paragraph in paragraphs:
                if paragraph:
                    yield paragraph + "\n", new
                new = True
        while len(buf) >= PIECE_BYTES:
            cut = buf.rfind("\n", 0, PIECE_BYTES) + 1 or PIECE_BYTES
            yield buf[:cut], new
            buf, new = buf[cut:], False
            if split_on_blank_lines and (blank := LEADING_BLANK_LINES.match(buf)):
                buf, new = buf[blank.end() :], True  # the cut fell just before a blank line
    if buf.strip() if split_on_blank_lines else buf:
        yield buf, new


def _rows(texts, where: str, column: str) -> Iterator[tuple[str, bool]]:
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise ConfigError(f"{where}: row {i} of column {column!r} is {type(text).__name__}, not text")
        if text:
            yield from _long_document(text)


def _long_document(text: str) -> Iterator[tuple[str, bool]]:
    for start in range(0, len(text), PIECE_BYTES):
        yield text[start : start + PIECE_BYTES], start == 0


def _jsonl_documents(path: str, column: str) -> Iterator[tuple[str, bool]]:
    def texts():
        for n, line in enumerate(_text_lines(path), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                raise ConfigError(f"{path}: line {n} is not JSON") from None
            if not isinstance(row, dict) or column not in row:
                keys = sorted(row) if isinstance(row, dict) else []
                raise ConfigError(f"{path}: line {n} has no column {column!r} (give --column)", allowed=keys)
            yield row[column]

    yield from _rows(texts(), path, column)


def _parquet_documents(path: str, column: str) -> Iterator[tuple[str, bool]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError("Parquet sources need pyarrow: pip install 'normbench[datasets]'") from None
    try:
        pf = pq.ParquetFile(path)
    except Exception as err:  # pyarrow's ArrowInvalid: not a Parquet file
        raise ConfigError(f"{path}: not a Parquet file ({str(err).splitlines()[0]})") from None
    if column not in pf.schema_arrow.names:
        raise ConfigError(f"{path}: no column {column!r} (give --column)", allowed=pf.schema_arrow.names)
    for batch in pf.iter_batches(batch_size=1024, columns=[column]):
        yield from _rows(batch.column(0).to_pylist(), path, column)


def _hf_documents(source: Source, column: str) -> Iterator[tuple[str, bool]]:
    try:
        import datasets
    except ImportError:
        raise ConfigError(
            "Hugging Face datasets need the datasets library: pip install 'normbench[datasets]'"
        ) from None
    if source.kind == "hf_disk":
        ds = datasets.load_from_disk(source.location)
        if isinstance(ds, datasets.DatasetDict):
            if "train" not in ds:
                raise ConfigError(
                    f"{source.location}: a DatasetDict without a 'train' split", allowed=list(ds)
                )
            ds = ds["train"]
    else:
        _check_hub_reachable(source.location)
        try:
            ds = datasets.load_dataset(source.location, split="train", streaming=True)
        except Exception as err:  # offline: ConnectionError, or datasets' own "offline mode" errors
            raise ConfigError(
                f"hub dataset {source.location!r} could not be loaded ({first_words(err)}); offline, "
                "save it with datasets' save_to_disk where the network allows and give that folder"
            ) from None
    names = list(ds.column_names or []) if ds.column_names is not None else []
    if names and column not in names:
        raise ConfigError(f"{source.location}: no column {column!r} (give --column)", allowed=names)
    yield from _rows((row[column] for row in ds), source.location, column)


def _check_hub_reachable(name: str) -> None:
    """Fail at once, in one line, when the hub cannot be reached (instead of datasets' retries)."""
    if os.environ.get("HF_HUB_OFFLINE") or os.environ.get("HF_DATASETS_OFFLINE"):
        return  # offline mode on purpose: datasets reads its cache
    from urllib.parse import urlparse

    from huggingface_hub import constants

    url = urlparse(os.environ.get("HF_ENDPOINT") or constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or 443), timeout=5).close()
    except OSError:
        raise ConfigError(
            f"{name!r} is no local file or folder, and as a hub dataset: {url.hostname} cannot be reached "
            "(offline?); save it with datasets' save_to_disk where the network allows and give that folder"
        ) from None


def first_words(err: BaseException) -> str:
    text = (str(err).strip().splitlines() or [type(err).__name__])[0]
    return text[:160]


def documents(source: Source, opts: Options) -> Iterator[tuple[str, bool]]:
    """(piece of text, starts a document) of one source, in order; an empty source is an error."""
    if source.kind == "text":
        pieces = _text_documents(source.location, opts.split_on_blank_lines)
    elif source.kind == "jsonl":
        pieces = _jsonl_documents(source.location, opts.column)
    elif source.kind == "parquet":
        pieces = _parquet_documents(source.location, opts.column)
    else:
        pieces = _hf_documents(source, opts.column)
    empty = True
    for text, new in pieces:
        if text:
            empty = False
            yield text, new
    if empty:
        raise ConfigError(f"empty source: {source.location} holds no text")


def _all_documents(sources: list[Source], opts: Options) -> Iterator[tuple[str, bool]]:
    for source in sources:
        yield from documents(source, opts)


# --------------------------------------------------------------------------- the tokenizer


def build_tokenizer(opts: Options, train: list[Source], val: list[Source]):
    kind, arg = tokenizers.parse_spec(opts.tokenizer)
    if kind == "char":
        chars = set()
        for text, _ in _all_documents([*train, *val], opts):
            chars.update(text)
        return tokenizers.CharTokenizer("".join(chars))
    if kind == "byte":
        return tokenizers.ByteTokenizer()
    if kind == "bpe":
        # Trained on the training split alone: the held-out documents stay unseen.
        return tokenizers.train_bpe(
            arg, (text for split, text, _ in _labelled(train, val, opts) if split == "train")
        )
    if kind == "json":
        return tokenizers.load_json(arg)
    return tokenizers.TiktokenTokenizer(arg)


# --------------------------------------------------------------------------- writing


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


def _in_val(index: int, fraction: float) -> bool:
    """Every 1/fraction-th document (the last of each group) is held out: deterministic and streaming."""
    return int((index + 1) * fraction) > int(index * fraction)


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


def _labelled(train: list[Source], val: list[Source], opts: Options) -> Iterator[tuple[str, str, bool]]:
    """(split, piece, starts a document) of every piece, train sources first."""
    if not val and len(train) == 1 and train[0].kind == "text" and not opts.split_on_blank_lines:
        yield from _split_one_document(train[0], opts)
        return
    index = -1
    for text, new in _all_documents(train, opts):
        index += new
        yield ("val" if not val and _in_val(index, opts.val_fraction) else "train"), text, new
    for text, new in _all_documents(val, opts):
        yield "val", text, new


def _split_one_document(source: Source, opts: Options) -> Iterator[tuple[str, str, bool]]:
    """A single text file is one document: its last ``val_fraction`` of bytes, from the first line end
    after the cut, is held out (as nanoGPT splits tiny-shakespeare) and starts a document of its own."""
    cut, seen = int(source.size * (1 - opts.val_fraction)), 0
    val_started = None  # None while in the training part; then whether the val document has begun
    for text, new in documents(source, opts):
        if val_started is not None:
            yield "val", text, not val_started
            val_started = True
            continue
        data = text.encode("utf-8")
        if seen + len(data) <= cut:
            seen += len(data)
            yield "train", text, new
            continue
        at = data.find(b"\n", cut - seen) + 1 or len(data)  # a line end: never inside a character
        head, tail = data[:at].decode("utf-8"), data[at:].decode("utf-8")
        if head:
            yield "train", head, new
        val_started = bool(tail)
        if tail:
            yield "val", tail, True


def _encode_all(tok, train, val, opts, writers: dict[str, SplitWriter], progress) -> None:
    eot = np.array([tok.eot_id], dtype=np.uint32)
    with ThreadPoolExecutor(1) as pool:  # encodes one batch while the next is read
        pending = None
        for batch in itertools.chain(_batches(_labelled(train, val, opts)), [None]):
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
        "train": [[s.kind, Path(s.location).name, _content_hash(s)] for s in train],
        "val": [[s.kind, Path(s.location).name, _content_hash(s)] for s in val],
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
    tok = build_tokenizer(opts, train, val)
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
