"""`normbench prepare` against Hugging Face tokenizers' own batch encoding, and its peak memory.

    python benchmarks/prepare_throughput.py --text ../shared/data/tinyshakespeare.txt --mb 10,50

A corpus of each size is made from the text's paragraphs (shuffled, repeated). A byte-level BPE
of --vocab tokens is trained once on the text and saved. Then, on the smallest corpus, each side
in its own fresh process, alternating, best of --repeats (the clock started after the imports):

- baseline: the file read and split into the same documents (paragraphs), then
  ``Tokenizer.encode_batch_fast`` on batches of the size prepare uses (HF's parallel Rust path),
  and each document's ids read out (``Encoding.ids``: what any use of the encoding does);
- prepare: ``normbench.data.prepare.prepare`` with that tokenizer.json, end to end: hashing the
  source, reading it, encoding, writing the shards and meta.json.

And for every size: prepare's peak resident set (ru_maxrss of its process). Prints one table.
"""

from __future__ import annotations

import argparse
import random
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

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


BASELINE = """
import sys, time
from tokenizers import Tokenizer
from normbench.data.prepare import BATCH_BYTES
tok = Tokenizer.from_file(sys.argv[2])
start = time.perf_counter()
docs = [p for p in open(sys.argv[1], encoding="utf-8").read().split("\\n\\n") if p.strip()]
batch, size = [], 0
for doc in docs:
    batch.append(doc)
    size += len(doc)
    if size >= BATCH_BYTES:
        ids = [e.ids for e in tok.encode_batch_fast(batch, add_special_tokens=False)]
        batch, size = [], 0
ids = [e.ids for e in tok.encode_batch_fast(batch, add_special_tokens=False)]
print(time.perf_counter() - start)
"""
PREPARE = """
import sys, time
from pathlib import Path
from normbench.data.prepare import Options, prepare
start = time.perf_counter()
opts = Options([sys.argv[1]], sys.argv[2], split_on_blank_lines=True)
prepare(opts, Path(sys.argv[3]), show_progress=False)
print(time.perf_counter() - start)
"""


def child(code: str, *args: str) -> tuple[float, float]:
    """(seconds the process timed itself, its peak RSS in MB): each run in a fresh process."""
    result = subprocess.run([sys.executable, "-c", code, *args], check=True, capture_output=True, text=True)
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # the largest child so far
    return float(result.stdout.strip().splitlines()[-1]), peak_kib / 1024


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
        train_bpe(args.vocab, [text]).tok.save(str(tmp / "tokenizer.json"))
        tokenizer = str(tmp / "tokenizer.json")
        rows = []
        for i, mb in enumerate(sorted(sizes)):
            corpus = tmp / f"corpus{mb}.txt"
            make_corpus(text, mb, corpus)
            real_mb = corpus.stat().st_size / 1e6
            if i == 0:
                base, ours = [], []
                for r in range(args.repeats):
                    base.append(child(BASELINE, str(corpus), tokenizer)[0])
                    ours.append(child(PREPARE, str(corpus), tokenizer, str(tmp / f"out{r}"))[0])
                times = " ".join(f"{b:.1f}/{o:.1f}" for b, o in zip(base, ours))
                rows.append(
                    f"throughput, {real_mb:.0f} MB: HF encode_batch_fast {real_mb / min(base):.2f} MB/s, "
                    f"normbench prepare {real_mb / min(ours):.2f} MB/s, ratio {min(base) / min(ours):.2f} "
                    f"(each pair HF/prepare: {times} s)"
                )
            # ru_maxrss of children is the largest so far: sizes run smallest first, each larger one's own.
            seconds, peak = child(PREPARE, str(corpus), tokenizer, str(tmp / f"mem{mb}"))
            rows.append(f"peak RSS, {real_mb:.0f} MB corpus: {peak:,.0f} MB ({seconds:.1f} s)")
            corpus.unlink()
        print(f"bpe:{args.vocab}")
        print("\n".join(rows))


if __name__ == "__main__":
    main()
