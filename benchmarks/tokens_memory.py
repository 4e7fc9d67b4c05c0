"""A run's peak memory on token shards at two corpus sizes: it must not grow with the corpus.

    python benchmarks/tokens_memory.py --tokens 10e6,100e6 --steps 100

For each size, llm.c shards of random uint16 ids (vocabulary 4,096; 100M tokens = 200 MB on disk,
in 4 train shards and one small val shard) are written to a temporary folder, then
``normbench train data=tokens data.path=DIR model=micro`` trains on them in a fresh process.
Prints the run's peak resident set (summary.json's ``peak_mem_mb``, the high-water mark from the
start of the run) and its set-up time (which includes the one pass checking every id).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from normbench.data.shards import ShardWriter

VOCAB = 4096
CHUNK = 1 << 22


def write_corpus(folder: Path, tokens: int) -> None:
    rng = np.random.default_rng(0)
    per_shard = -(-tokens // 4)
    for i in range(4):
        writer = ShardWriter(folder / f"rand_train_{i:06d}.bin", np.uint16)
        n = min(per_shard, tokens - i * per_shard)
        for start in range(0, n, CHUNK):
            writer.write(rng.integers(0, VOCAB, min(CHUNK, n - start), dtype=np.uint16))
        writer.close()
    writer = ShardWriter(folder / "rand_val_000000.bin", np.uint16)
    writer.write(rng.integers(0, VOCAB, 100_000, dtype=np.uint16))
    writer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="10e6,100e6", help="Corpus sizes in tokens, comma-separated.")
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    for size in [int(float(s)) for s in args.tokens.split(",")]:
        with tempfile.TemporaryDirectory() as tmp:
            data, run = Path(tmp) / "shards", Path(tmp) / "run"
            data.mkdir()
            write_corpus(data, size)
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "normbench",
                    "train",
                    "data=tokens",
                    f"data.path={data}",
                    f"data.vocab_size={VOCAB}",
                    "model=micro",
                    f"train.steps={args.steps}",
                    "train.progress=false",
                    f"hydra.run.dir={run}",
                ],
                check=True,
                capture_output=True,
            )
            summary = json.loads((run / "summary.json").read_text())
            print(
                f"{size / 1e6:,.0f}M tokens ({size * 2 / 1e6:,.0f} MB of shards): "
                f"peak {summary['peak_mem_mb']:,.0f} MB "
                f"({summary['peak_mem_kind']}; {summary['peak_mem_start_mb']:,.0f} MB at the run's start), "
                f"set-up {summary['time_s']['setup']:.1f} s, {summary['status']}"
            )


if __name__ == "__main__":
    main()
