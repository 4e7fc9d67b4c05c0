"""The sources of ``normbench prepare``: finding them, reading their documents, and which split each
piece of text goes to.

A source is a text file, a folder (every file below, sorted) or a glob, one document per file or,
with ``split_on_blank_lines``, one per blank-line-separated paragraph; JSONL and Parquet
(``column``); a Hugging Face dataset saved with ``save_to_disk`` (a local folder), or a hub name
streamed through ``datasets`` when the network allows. Text is read in pieces of at most
``PIECE_BYTES``: a document longer than a piece continues across pieces. The validation split is
every 1/val_fraction-th document, or a separate ``val`` source (``labelled``).

The functions that read take the prepare options (normbench.data.prepare.Options, which imports
this module): its ``column``, ``split_on_blank_lines`` and ``val_fraction``.
"""

from __future__ import annotations

import codecs
import glob
import hashlib
import json
import os
import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from normbench.core.errors import ConfigError, first_line

PIECE_BYTES = 1 << 20  # the longest piece of text encoded at once
HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


@dataclass
class Source:
    """One input: ``kind`` is text, jsonl, parquet, hf_disk or hub; ``size`` its bytes on disk (0 for hub)."""

    kind: str
    location: str
    size: int = 0


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


def content_hash(source: Source) -> str:
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
        raise ConfigError(f"{path}: not a Parquet file ({first_line(err, named=False)})") from None
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
            why = first_line(err, 160, named=False)
            raise ConfigError(
                f"hub dataset {source.location!r} could not be loaded ({why}); offline, "
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


def documents(source: Source, opts) -> Iterator[tuple[str, bool]]:
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


def all_documents(sources: list[Source], opts) -> Iterator[tuple[str, bool]]:
    for source in sources:
        yield from documents(source, opts)


# --------------------------------------------------------------------------- the splits


def _in_val(index: int, fraction: float) -> bool:
    """Every 1/fraction-th document (the last of each group) is held out: deterministic and streaming."""
    return int((index + 1) * fraction) > int(index * fraction)


def labelled(train: list[Source], val: list[Source], opts) -> Iterator[tuple[str, str, bool]]:
    """(split, piece, starts a document) of every piece, train sources first."""
    if not val and len(train) == 1 and train[0].kind == "text" and not opts.split_on_blank_lines:
        yield from _split_one_document(train[0], opts)
        return
    index = -1
    for text, new in all_documents(train, opts):
        index += new
        yield ("val" if not val and _in_val(index, opts.val_fraction) else "train"), text, new
    for text, new in all_documents(val, opts):
        yield "val", text, new


def _split_one_document(source: Source, opts) -> Iterator[tuple[str, str, bool]]:
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
