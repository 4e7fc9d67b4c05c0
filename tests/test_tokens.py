"""Token shards: llm.c's and nanoGPT's formats, `normbench prepare`, data=tokens, bits per byte."""

from __future__ import annotations

import json
import math
import os
import random
import stat
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny, train_tiny
from typer.testing import CliRunner

from normbench.cli import app
from normbench.core.errors import ConfigError
from normbench.data.corpus import build_dataset
from normbench.data.prepare import Options, prepare
from normbench.data.shards import dtype_for, read_tokens, write_shard
from normbench.data.tokenizers import EOT, from_meta
from normbench.training.config import load_group

WORDS = [
    "the",
    "a",
    "norm",
    "layer",
    "token",
    "model",
    "train",
    "loss",
    "café",
    "naïve",
    "über",
    "smörgåsbord",
]


def corpus(n_docs: int, seed: int = 0) -> list[str]:
    """Documents of a few random lines (some non-ASCII), none with a blank line inside."""
    rng = random.Random(seed)
    return [
        "\n".join(" ".join(rng.choices(WORDS, k=rng.randint(3, 12))) for _ in range(rng.randint(1, 4))) + "\n"
        for _ in range(n_docs)
    ]


def write_corpus(path: Path, docs: list[str]) -> Path:
    path.write_text("\n".join(docs), encoding="utf-8")  # one blank line between documents
    return path


def independent_header(path: Path) -> tuple[int, int, int]:
    """llm.c's header as llm.c's own C reader sees it: 256 little-endian int32, the first three used."""
    with open(path, "rb") as f:
        ints = struct.unpack("<256i", f.read(1024))
    assert all(v == 0 for v in ints[3:])
    return ints[0], ints[1], ints[2]


def tokens_data(**overrides):
    return load_group("data", "tokens", **overrides)


# --------------------------------------------------------------------------- the formats


@pytest.mark.parametrize("dtype, magic, version", [("uint16", 20240520, 1), ("uint32", 20240801, 7)])
def test_llmc_shard_header_and_tokens_as_an_independent_reader_sees_them(tmp_path, dtype, magic, version):
    tokens = np.random.default_rng(0).integers(0, 60000, 1000).astype(dtype)
    write_shard(tmp_path / "s.bin", tokens, dtype)
    assert independent_header(tmp_path / "s.bin") == (magic, version, 1000)
    assert (tmp_path / "s.bin").stat().st_size == 1024 + 1000 * np.dtype(dtype).itemsize
    np.testing.assert_array_equal(np.fromfile(tmp_path / "s.bin", dtype=dtype, offset=1024), tokens)


def test_a_shard_written_the_way_llmc_writes_it_is_read(tmp_path):
    """llm.c's write_datafile: header = zeros(256, int32); magic, version, count; then the tokens."""
    tokens = np.arange(700, dtype=np.uint16) * 37 % 50257
    header = np.zeros(256, dtype=np.int32)
    header[:3] = 20240520, 1, len(tokens)
    with open(tmp_path / "tiny_shakespeare_val.bin", "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.tobytes())
    np.testing.assert_array_equal(read_tokens(tmp_path / "tiny_shakespeare_val.bin"), tokens)


def test_nanogpt_headerless_train_and_val_bin_train_the_model(tmp_path):
    """nanoGPT's prepare.py: np.memmap uint16 arrays, no header; windows are exact slices of them."""
    rng = np.random.default_rng(1)
    arrays = {}
    for split, n in (("train", 5000), ("val", 800)):
        arr = np.memmap(tmp_path / f"{split}.bin", dtype=np.uint16, mode="w+", shape=(n,))
        arr[:] = rng.integers(0, 50257, n)
        arr.flush()
        arrays[split] = np.array(arr)
    data = build_dataset(tokens_data(path=str(tmp_path), dtype="uint16", vocab_size=50257), 16, 8)
    assert (data.vocab_size, data.embedding_size) == (50257, 50304)
    x, y = data.train_batch(8, torch.Generator().manual_seed(0))
    stream = arrays["train"].astype(np.int64)
    for row_x, row_y in zip(x.numpy(), y.numpy()):
        starts = np.flatnonzero(np.all(np.lib.stride_tricks.sliding_window_view(stream, 16) == row_x, axis=1))
        assert len(starts) >= 1
        np.testing.assert_array_equal(row_y, stream[starts[0] + 1 : starts[0] + 17])
    summary = train_tiny(
        tmp_path / "run", "data=tokens", f"data.path={tmp_path}", "data.dtype=uint16", "data.vocab_size=50257"
    )
    assert summary["status"] == "completed"
    assert (summary["vocab_size"], summary["embedding_size"]) == (50257, 50304)
    assert summary["final_val_bpb"] is None  # no text behind these tokens: bits per byte unknown


def test_headerless_uint32_array_read(tmp_path):
    """OLMo-core's arrays: headerless uint32, ids past 65,535."""
    tokens = np.random.default_rng(2).integers(0, 100_000, 3000).astype(np.uint32)
    tokens.tofile(tmp_path / "part_train.npy")
    tokens[:500].tofile(tmp_path / "part_val.npy")
    data = build_dataset(tokens_data(path=str(tmp_path), dtype="uint32", vocab_size=100_000), 8, 4)
    assert data.embedding_size == 100_032
    (x, _), *_ = data.val_batches(1, 4)
    assert x.max() < 100_000 and x.dtype == torch.int64


def test_random_windows_cover_every_training_shard_and_validation_windows_are_fixed(tmp_path):
    for i in range(3):  # each shard holds only its own id range, so a window tells its shard
        write_shard(tmp_path / f"x_train_{i:06d}.bin", np.full(400, 10 * i + 1, dtype=np.uint16), "uint16")
    write_shard(tmp_path / "x_val_000000.bin", np.arange(300, dtype=np.uint16) % 7, "uint16")
    cfg = tokens_data(path=str(tmp_path), vocab_size=32)
    data = build_dataset(cfg, 16, 8)
    x, _ = data.train_batch(64, torch.Generator().manual_seed(0))
    assert set(x[:, 0].tolist()) == {1, 11, 21}
    assert all(len(set(row)) == 1 for row in x.tolist())  # no window crosses two shards
    first = data.val_batches(2, 4)
    again = build_dataset(cfg, 16, 8).val_batches(2, 4)
    for (a, _), (b, _) in zip(first, again):
        assert torch.equal(a, b)


# --------------------------------------------------------------------------- prepare


@pytest.mark.parametrize("tokenizer", ["char", "byte", "bpe:300"])
def test_text_to_shards_to_text_round_trip(tmp_path, tokenizer):
    docs = corpus(60)
    src = write_corpus(tmp_path / "docs.txt", docs)
    out = prepare(
        Options([str(src)], tokenizer, split_on_blank_lines=True), tmp_path / "out", show_progress=False
    )
    meta = json.loads((out / "meta.json").read_text())
    tok = from_meta(out)
    decoded = {}
    for split in ("train", "val"):
        ids = np.concatenate([read_tokens(out / name) for name in meta["splits"][split]["shards"]])
        assert meta["splits"][split]["tokens"] == len(ids) and ids.max() < meta["vocab_size"]
        assert independent_header(out / meta["splits"][split]["shards"][0])[:2] == (20240520, 1)
        text = tok.decode(ids.tolist())
        assert text.startswith(EOT)
        decoded[split] = text[len(EOT) :].split(EOT)
    held_out = [i for i in range(60) if (i + 1) // 10 > i // 10]  # every tenth: 9, 19, ...
    assert decoded["val"] == [docs[i] for i in held_out]
    assert decoded["train"] == [d for i, d in enumerate(docs) if i not in held_out]
    assert meta["splits"]["val"]["bytes"] == sum(len(docs[i].encode()) for i in held_out)
    assert meta["eot_id"] < meta["vocab_size"]


def test_same_sources_and_tokenizer_reuse_one_directory(tmp_path, capsys):
    src = write_corpus(tmp_path / "docs.txt", corpus(30))
    opts = Options([str(src)], "byte", split_on_blank_lines=True)
    first = prepare(opts, tmp_path / "out", show_progress=False)
    stamp = (first / "train_000000.bin").stat().st_mtime_ns
    again = prepare(opts, tmp_path / "out", show_progress=False)
    assert again == first and (first / "train_000000.bin").stat().st_mtime_ns == stamp
    assert "reusing" in capsys.readouterr().err
    other = prepare(
        Options([str(src)], "char", split_on_blank_lines=True), tmp_path / "out", show_progress=False
    )
    assert other != first
    src.write_text(src.read_text() + "\nnew text\n")
    assert prepare(opts, tmp_path / "out", show_progress=False) != first  # named by content, not by path


@pytest.mark.parametrize("umask, folder, files", [(0o022, 0o755, 0o644), (0o077, 0o700, 0o600)])
def test_prepared_folder_is_as_readable_as_the_umask_allows(tmp_path, umask, folder, files):
    src = write_corpus(tmp_path / "docs.txt", corpus(20))
    before = os.umask(umask)
    try:
        out = prepare(Options([str(src)], "byte"), tmp_path / "out", show_progress=False)
    finally:
        os.umask(before)
    assert stat.S_IMODE(out.stat().st_mode) == folder  # what mkdir would have made
    assert {stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()} == {files}


def test_shards_roll_over_and_jsonl_and_parquet_sources(tmp_path):
    docs = corpus(40, seed=3)
    (tmp_path / "d.jsonl").write_text(
        "".join(json.dumps({"body": d, "id": i}) + "\n" for i, d in enumerate(docs))
    )
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    pq.write_table(pa.table({"body": docs}), tmp_path / "d.parquet")
    outs = [
        prepare(
            Options([str(tmp_path / f"d.{ext}")], "byte", column="body", shard_tokens=500),
            tmp_path / "o",
            show_progress=False,
        )
        for ext in ("jsonl", "parquet")
    ]
    metas = [json.loads((o / "meta.json").read_text()) for o in outs]
    assert metas[0]["splits"] == metas[1]["splits"]
    assert len(metas[0]["splits"]["train"]["shards"]) > 1
    assert all(independent_header(outs[0] / s)[2] <= 500 for s in metas[0]["splits"]["train"]["shards"])
    assert metas[0]["splits"]["train"]["bytes"] + metas[0]["splits"]["val"]["bytes"] == sum(
        len(d.encode()) for d in docs
    )


def test_a_file_named_parquet_that_is_not_one_is_a_one_line_error(tmp_path):
    pytest.importorskip("pyarrow.parquet")
    (tmp_path / "d.parquet").write_text("body\nnot columnar at all\n")
    with pytest.raises(ConfigError) as err:
        prepare(
            Options([str(tmp_path / "d.parquet")], "byte", column="body"), tmp_path / "o", show_progress=False
        )
    message = str(err.value)
    assert message.startswith(f"{tmp_path / 'd.parquet'}: not a Parquet file (") and "\n" not in message
    assert not any((tmp_path / "o").rglob("*"))  # nothing half-written in the shards' parent folder


def test_a_hugging_face_dataset_folder_and_a_separate_val_source(tmp_path):
    datasets = pytest.importorskip("datasets")
    docs = corpus(20, seed=4)
    datasets.Dataset.from_dict({"text": docs}).save_to_disk(str(tmp_path / "ds"))
    val = write_corpus(tmp_path / "val.txt", corpus(5, seed=5))
    out = prepare(
        Options([str(tmp_path / "ds")], "byte", val=[str(val)]), tmp_path / "o", show_progress=False
    )
    meta = json.loads((out / "meta.json").read_text())
    assert meta["splits"]["train"]["documents"] == 20 and meta["splits"]["val"]["documents"] == 1
    assert meta["splits"]["train"]["bytes"] == sum(len(d.encode()) for d in docs)


# --------------------------------------------------------------------------- training on them, bits per byte


def test_training_on_prepared_shards_reports_bits_per_byte_and_pads_the_embedding(tmp_path):
    src = write_corpus(tmp_path / "docs.txt", corpus(200))
    out = prepare(
        Options([str(src)], "bpe:300", split_on_blank_lines=True), tmp_path / "o", show_progress=False
    )
    meta = json.loads((out / "meta.json").read_text())
    summary = train_tiny(tmp_path / "run", "data=tokens", f"data.path={out}")
    assert (summary["vocab_size"], summary["embedding_size"]) == (300, 320)
    bytes_per_token = meta["splits"]["val"]["bytes"] / meta["splits"]["val"]["tokens"]
    assert summary["bytes_per_token"] == pytest.approx(bytes_per_token)
    assert summary["final_val_bpb"] == pytest.approx(
        summary["final_val_loss"] / math.log(2) / bytes_per_token
    )
    evals = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all("val_bpb" in r for r in evals if r["kind"] == "eval")


def test_character_level_text_bits_per_byte_use_bytes_per_character(tmp_path):
    text = ("ab€ü " * 400) + ("x" * 10)  # the val span: its last tenth
    (tmp_path / "t.txt").write_text(text, encoding="utf-8")
    data = build_dataset(load_group("data", "text", path=str(tmp_path / "t.txt")), 8, 4)
    val = text[len(text) - int(len(text) * 0.1) :]
    assert data.bytes_per_token == pytest.approx(len(val.encode()) / len(val))
    assert build_dataset(load_group("data", "synthetic"), 8, 4).bytes_per_token is None


# --------------------------------------------------------------------------- bad input


def test_vocabulary_too_large_for_the_dtype_asked():
    assert dtype_for(65536) == np.uint16 and dtype_for(65537) == np.uint32
    with pytest.raises(ConfigError, match="does not fit uint16"):
        dtype_for(70000, "uint16")


def llmc_header(magic: int, version: int, count: int) -> bytes:
    return struct.pack("<256i", magic, version, count, *[0] * 253)


def bad_shard_dirs(tmp_path: Path) -> dict[str, tuple[dict, str]]:
    cases = {}
    d = tmp_path / "magic"
    d.mkdir()
    (d / "train.bin").write_bytes(llmc_header(12345, 1, 10) + bytes(20))
    (d / "val.bin").write_bytes((d / "train.bin").read_bytes())
    cases["magic"] = ({"path": str(d)}, "unknown magic number 12345")
    d = tmp_path / "short"
    d.mkdir()
    (d / "train.bin").write_bytes(llmc_header(20240520, 1, 1000) + bytes(200))
    (d / "val.bin").write_bytes((d / "train.bin").read_bytes())
    cases["short"] = ({"path": str(d)}, "the header says 1,000 tokens but the file holds 100")
    d = tmp_path / "ids"
    d.mkdir()
    write_shard(d / "train.bin", np.arange(100, dtype=np.uint16), "uint16")
    write_shard(d / "val.bin", np.arange(100, dtype=np.uint16), "uint16")
    cases["ids"] = ({"path": str(d), "vocab_size": 50}, "token id 99 is at or past the vocabulary size 50")
    cases["block"] = ({"path": str(d), "vocab_size": 100}, "too few tokens for model.block_size=128")
    cases["dtype"] = ({"path": str(d), "vocab_size": 70000}, "does not fit the uint16 tokens")
    cases["headerless"] = ({"path": str(d), "dtype": "uint16"}, "headerless shards need their vocabulary")
    return cases


@pytest.mark.parametrize("case", ["magic", "short", "ids", "block", "dtype", "headerless"])
def test_bad_shards_are_one_line_errors(tmp_path, case):
    overrides, message = bad_shard_dirs(tmp_path)[case]
    with pytest.raises(ConfigError, match=message):
        build_dataset(tokens_data(**overrides), 128 if case == "block" else 16, 8)


BAD_PREPARE = [
    ("empty", "", [], "empty source"),
    ("latin1", b"caf\xe9\n", [], "is not UTF-8 text (invalid continuation byte at byte 3)"),
    ("binary", b"\x7fELF\x00\x01", [], "looks binary (a NUL byte at offset 4)"),
    ("small_n", "some text\n", ["-t", "bpe:100"], "a byte-level BPE needs N >= 257"),
    ("large_n", "some text\n\nmore text\n", ["-t", "bpe:5000"], "the corpus supports only"),
    (
        "one_paragraph",
        "a single document\n",
        ["--split-on-blank-lines"],
        "the val split is empty (1 document(s)",
    ),
    ("dtype", "some text\n", ["--dtype", "uint8"], "unknown --dtype 'uint8'"),
]


@pytest.mark.parametrize("name, content, args, message", BAD_PREPARE, ids=[b[0] for b in BAD_PREPARE])
def test_bad_prepare_input_is_one_line_and_leaves_nothing(tmp_path, name, content, args, message):
    src = tmp_path / "src.txt"
    src.write_bytes(content if isinstance(content, bytes) else content.encode())
    result = CliRunner().invoke(app, ["prepare", str(src), "-t", "byte", *args, "--out", str(tmp_path / "o")])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split()), result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


def test_a_failure_midway_leaves_no_directory(tmp_path):
    """The first file is encoded and written before the second turns out not to be UTF-8."""
    good = write_corpus(tmp_path / "a.txt", corpus(50))
    (tmp_path / "b.txt").write_bytes(b"fine\n" * 1000 + b"\xff\n")
    with pytest.raises(ConfigError, match="b.txt is not UTF-8"):
        prepare(Options([str(good), str(tmp_path / "b.txt")], "byte"), tmp_path / "o", show_progress=False)
    assert list((tmp_path / "o").iterdir()) == []


def test_hub_dataset_offline_is_one_line(tmp_path, monkeypatch):
    pytest.importorskip("datasets")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens on port 9: offline
    with pytest.raises(ConfigError, match="'someone/corpus' is no local file .* 127.0.0.1 cannot be reached"):
        prepare(Options(["someone/corpus"], "byte"), tmp_path / "o", show_progress=False)


def test_documents_longer_than_a_piece_stream_through_whole(tmp_path, monkeypatch):
    """Text is read and encoded in bounded pieces; a document spanning many pieces comes back whole."""
    from normbench.data import sources

    monkeypatch.setattr(sources, "PIECE_BYTES", 64)
    docs = [d * 5 for d in corpus(30, seed=6)]  # documents of a few hundred bytes: many pieces each
    src = write_corpus(tmp_path / "docs.txt", docs)
    out = prepare(Options([str(src)], "char", split_on_blank_lines=True), tmp_path / "o", show_progress=False)
    meta = json.loads((out / "meta.json").read_text())
    tok = from_meta(out)
    train = tok.decode(read_tokens(out / "train_000000.bin").tolist())[len(EOT) :].split(EOT)
    assert train == [d for i, d in enumerate(docs) if (i + 1) // 10 == i // 10]
    assert meta["splits"]["train"]["documents"] == 27


@pytest.mark.slow  # five tiny trainings through the CLI, then a report with its charts
def test_report_compares_tokenizers_in_bits_per_byte(tmp_path):
    """--metric final_val_bpb: the aggregate, the tuning and the verdict all see bits per byte."""
    import pandas as pd

    from normbench.report import run_report

    def train(name, *overrides):
        result = CliRunner().invoke(
            app, ["train", *tiny(*overrides), f"hydra.run.dir={tmp_path / 'runs' / name}"]
        )
        assert result.exit_code == 0, result.output
        return json.loads((tmp_path / "runs" / name / "summary.json").read_text())

    src = write_corpus(tmp_path / "docs.txt", corpus(200))
    bpb = {}
    for tokenizer in ("char", "bpe:300"):
        out = prepare(
            Options([str(src)], tokenizer, split_on_blank_lines=True), tmp_path / "o", show_progress=False
        )
        runs = [
            train(f"{tokenizer[:3]}-{seed}", "data=tokens", f"data.path={out}", f"seed={seed}")
            for seed in (0, 1)
        ]
        bpb[str(out)] = np.mean([r["final_val_bpb"] for r in runs])
    report = run_report([tmp_path / "runs"], metric="final_val_bpb", group_by=["data.path"])
    agg = pd.read_csv(report / "aggregate.csv")
    assert dict(zip(agg["data.path"], agg["final_val_loss_mean"])) == pytest.approx(bpb)
    train("synthetic")  # no bytes: bits per byte cannot be compared
    with pytest.raises(ConfigError, match="have no bytes per token"):
        run_report([tmp_path / "runs"], metric="final_val_bpb")


def test_a_single_text_file_holds_out_its_tail(tmp_path):
    """One file, one document: the last tenth of its bytes (from a line end) is the validation split."""
    text = "".join(corpus(80, seed=7))
    src = tmp_path / "one.txt"
    src.write_text(text, encoding="utf-8")
    out = prepare(Options([str(src)], "char"), tmp_path / "o", show_progress=False)
    meta = json.loads((out / "meta.json").read_text())
    tok = from_meta(out)
    train, val = (tok.decode(read_tokens(out / f"{s}_000000.bin").tolist()) for s in ("train", "val"))
    assert train.startswith(EOT) and val.startswith(EOT)
    head, tail = train[len(EOT) :], val[len(EOT) :]
    assert head + tail == text and head.endswith("\n")
    cut = int(len(text.encode()) * 0.9)
    assert cut <= len(head.encode()) < cut + 100
    assert meta["splits"]["val"]["documents"] == 1 and meta["splits"]["val"]["bytes"] == len(tail.encode())
