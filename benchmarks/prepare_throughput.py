"""`normbench prepare` against Hugging Face tokenizers' own batch encoding, and its peak memory.

    python benchmarks/prepare_throughput.py --text ../shared/data/tinyshakespeare.txt --mb 20,100

A corpus of each size is made from the text's paragraphs (shuffled, repeated). A byte-level BPE
of --vocab tokens is trained once on the text. Then, on the smallest corpus, best of --repeats:

- baseline: the file read and split into the same documents, then ``Tokenizer.encode_batch_fast``
  on batches of the same size prepare uses (HF's parallel Rust path), the ids left in Python;
- prepare: ``normbench prepare FILE -t tokenizer.json --split-on-blank-lines`` end to end in a
  fresh process (reading, hashing the source, encoding, writing the shards and meta.json), its
  wall time less the interpreter's start (measured by ``python -c "import normbench.data.prepare"``).

And for every size: prepare's peak resident set (ru_maxrss of the child). Prints one table.
"""

from __future__ import annotations

import argparse
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from normbench.data.prepare import BATCH_BYTES
from normbench.data.tokenizers import train_bpe


def make_corpus(text: str, mb: int, path: Path) -> None:
    paragraphs = [p.strip("\n") + "\n" for p in text.split("\n\n") if p.strip()]
    rng = random.Random(0)
    written = 0
    with open(path, "w", encoding="utf-8") as f:
        while written < mb * 1e6:
            rng.shuffle(paragraphs)
            chunk = "\n".join(paragraphs) + "\n"
            f.write(chunk)
            written += len(chunk.encode())


def baseline(tok, path: Path) -> float:
    """HF's batch encoding of the same documents in the same batch sizes; seconds."""
    start = time.perf_counter()
    docs = [p for p in path.read_text(encoding="utf-8").split("\n\n") if p.strip()]
    batch, size = [], 0
    for doc in docs:
        batch.append(doc)
        size += len(doc)
        if size >= BATCH_BYTES:
            tok.encode_batch_fast(batch, add_special_tokens=False)
            batch, size = [], 0
    if batch:
        tok.encode_batch_fast(batch, add_special_tokens=False)
    return time.perf_counter() - start


def child(args: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS MB) of a fresh Python process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.perf_counter()
    subprocess.run([sys.executable, *args], check=True, capture_output=True)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return seconds, max(peak, before) / 1024  # ru_maxrss of children: the largest so far, in KiB


def run_prepare(path: Path, tokenizer: Path, out: Path) -> tuple[float, float]:
    code = (
        "import sys; from pathlib import Path; from normbench.data.prepare import Options, prepare; "
        "prepare(Options([sys.argv[1]], sys.argv[2], split_on_blank_lines=True), Path(sys.argv[3]), "
        "show_progress=False)"
    )
    return child(["-c", code, str(path), str(tokenizer), str(out)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--text", type=Path, required=True)
    parser.add_argument("--mb", default="20,100", help="Corpus sizes in MB, comma-separated.")
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    text = args.text.read_text(encoding="utf-8")
    sizes = [int(s) for s in args.mb.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        tok = train_bpe(args.vocab, [text])
        tok.tok.save(str(tmp / "tokenizer.json"))
        start_s, _ = child(["-c", "import normbench.data.prepare"])
        rows = []
        for i, mb in enumerate(sizes):
            corpus = tmp / f"corpus{mb}.txt"
            make_corpus(text, mb, corpus)
            real_mb = corpus.stat().st_size / 1e6
            if i == 0:
                base, ours = [], []
                for r in range(args.repeats):
                    base.append(baseline(tok.tok, corpus))
                    ours.append(run_prepare(corpus, tmp / "tokenizer.json", tmp / f"out{r}")[0] - start_s)
                rows.append(
                    f"throughput, {real_mb:.0f} MB: HF encode_batch_fast {real_mb / min(base):.2f} MB/s, "
                    f"normbench prepare {real_mb / min(ours):.2f} MB/s, ratio {min(base) / min(ours):.2f}"
                )
            seconds, peak = run_prepare(corpus, tmp / "tokenizer.json", tmp / f"mem{mb}")
            rows.append(f"peak RSS, {real_mb:.0f} MB corpus: {peak:,.0f} MB ({seconds:.1f} s)")
            corpus.unlink()
        print(f"bpe:{args.vocab}, start-up of a process {start_s:.2f} s (subtracted)")
        print("\n".join(rows))


if __name__ == "__main__":
    main()
