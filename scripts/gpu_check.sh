#!/usr/bin/env bash
# The CUDA path's device check, in under 7 minutes on one GPU, from a checkout, installing nothing:
#   1. the tests that need a GPU (pytest -k cuda: tests/test_cuda.py, the norms' CUDA tests)
#   2. normbench bench on cuda, fp32 and bf16 (the norms' GB/s and the device's copy bandwidth)
#   3. model=small trained in bf16, eager and with train.compile=true
#   4. model=small's seeds batched into one model (K = 1, 4, 16, fp32): tokens/s and MFU against one run
#   5. one table: tokens/s, MFU and its peak, the norms' GB/s against the copy bandwidth
#   6. gpt2: GPT-2 small (124M, context 1024), bf16, compiled, 64 sequences per update in micro-batches
#      of 16: benchmarks/gpt2_bare.py (nanoGPT's loop) and normbench train model=gpt2 train=gpt2 with
#      its default evals and checkpoints, on random GPT-2 token shards: tokens/s in steps and over the
#      wall clock, MFU. Goal: normbench >= 0.95x the bare loop's step tokens/s, >= 0.9x in wall clock;
#      then a statistics step's peak memory against a plain compiled step's at 16 x 1024 (goal <= 1.1x).
# Each stage has its own time limit, so one that hangs costs its limit and the next one runs.
# STAGES="gpt2" (names separated by spaces) runs only those; the default runs all but gpt2, which
# alone takes about 6 minutes: STAGES="tests bench train batched table gpt2" runs everything.
# Logs, CSV and run directories go to ${OUT:-/tmp/gpu_check}. Exit code 1 if any stage failed.
#
#   scripts/gpu_check.sh                            # python3 from PATH
#   PYTHON=.venv/bin/python scripts/gpu_check.sh
# The python needs torch (CUDA) and normbench's dependencies (hydra-core, omegaconf, typer, rich,
# pandas, scipy, tokenizers) with pytest and hypothesis; missing ones can come as wheels (WHEELS).
set -u

cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # python -m normbench from this checkout

if ! "$PY" -c 'import torch; assert torch.cuda.is_available()' >/dev/null 2>&1; then
    echo "no CUDA device here: gpu_check skipped"
    exit 0
fi

LOGS=${OUT:-/tmp/gpu_check}
mkdir -p "$LOGS"
export NORMBENCH_CACHE_DIR="$LOGS/cache"  # a measured MFU peak stays with this check
FAILED=()

# Python packages the machine lacks travel as wheels in $WHEELS (default .whl/): installed from
# there alone (--no-index), into the logs folder, never from the network.
WHEELS=${WHEELS:-.whl}
if compgen -G "$WHEELS/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$LOGS/site" "$WHEELS"/*.whl || { echo "gpu_check: the wheels in $WHEELS did not install"; exit 1; }
    export PYTHONPATH="$PYTHONPATH:$LOGS/site"
fi
MISSING=$("$PY" -c 'import importlib.util as u; print(*[m for m in ("hydra", "omegaconf", "yaml", "antlr4",
    "typer", "rich", "pandas", "scipy", "tokenizers", "pytest", "hypothesis") if u.find_spec(m) is None])')
if [ -n "$MISSING" ]; then
    echo "gpu_check: python modules missing: $MISSING (put their wheels in $WHEELS/)"
    exit 1
fi

STAGES=" ${STAGES:-tests bench train batched table} "

# stage NAME SECONDS COMMAND...: run COMMAND under a time limit, its output in $LOGS/NAME.log, when
# NAME (or the group before its "_": train_eager is in "train") is among $STAGES.
stage() {
    local name=$1 limit=$2 start rc
    shift 2
    [[ $STAGES == *" $name "* || $STAGES == *" ${name%%_*} "* ]] || return 0
    echo "== $name (at most ${limit}s): $*"
    start=$(date +%s)
    timeout --kill-after=10 "$limit" "$@" >"$LOGS/$name.log" 2>&1
    rc=$?
    echo "   exit $rc after $(($(date +%s) - start))s; log: $LOGS/$name.log"
    if [ "$rc" -ne 0 ]; then
        [ "$rc" -eq 124 ] && echo "   TIMED OUT"
        tail -n 15 "$LOGS/$name.log" | sed 's/^/   | /'
        FAILED+=("$name")
    fi
}

"$PY" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, "on", torch.cuda.get_device_name())'

stage tests 130 "$PY" -m pytest -q -m "not slow" -k cuda -p no:cacheprovider \
    tests/test_cuda.py tests/test_norms.py tests/test_norm_kernels.py tests/test_bench.py

stage bench 60 "$PY" -m normbench bench --device cuda --dtype fp32,bf16 --dims 1024,4096 \
    --tokens 16384 --no-compile --repeats 10 --out "$LOGS/bench.csv"

TRAIN=(model=small train.device=cuda train.precision=bf16 train.steps=200 train.eval_every=100
    train.log_every=20 train.progress=false train.resume=never)
stage train_eager 70 "$PY" -m normbench train "${TRAIN[@]}" "hydra.run.dir=$LOGS/runs/eager"
stage train_compiled 130 "$PY" -m normbench train "${TRAIN[@]}" train.compile=true \
    "hydra.run.dir=$LOGS/runs/compiled"

stage batched 150 "$PY" benchmarks/batched_throughput.py --device cuda --model small --ks 1,4,16 \
    --steps 60 --attention

stage table 15 "$PY" - "$LOGS" <<'EOF'
"""The check's figures in one table: training throughput and MFU, then the norms' bandwidth."""
import json
import sys
from pathlib import Path

import pandas as pd

logs = Path(sys.argv[1])
print(f"{'run':<10} {'compiled':>8} {'tokens/s':>10} {'step ms':>8} {'MFU':>6} {'peak mem MB':>11}  MFU peak")
for name in ("eager", "compiled"):
    path = logs / "runs" / name / "summary.json"
    if not path.exists():
        print(f"{name:<10} (no summary.json)")
        continue
    s = json.loads(path.read_text())
    mfu = f"{100 * s['mfu']:.1f}%" if s.get("mfu") is not None else "-"
    print(
        f"{name:<10} {s['compiled']!s:>8} {s['tokens_per_s']:>10,.0f} {s['step_ms_p50']:>8.1f} {mfu:>6} "
        f"{s['peak_mem_mb']:>11,.0f}  {s['peak_flops'] / 1e12:.4g} TFLOP/s ({s['peak_flops_source']})"
    )
bench = logs / "bench.csv"
if bench.exists():
    df = pd.read_csv(bench)
    rows = df[(df.impl == "normbench") & (df.dim == df.dim.max()) & (df.norm != "none")].copy()
    rows["of_copy"] = (100 * rows.gb_per_s / rows.copy_gb_per_s).round().astype("Int64").astype(str) + "%"
    print(f"\nnorms at dim {df.dim.max()}, {rows.tokens.iloc[0]} tokens: GB/s and % of the device's copy GB/s")
    table = rows.pivot_table(index="norm", columns=["dtype", "pass"], values="gb_per_s", aggfunc="first")
    share = rows.pivot_table(index="norm", columns=["dtype", "pass"], values="of_copy", aggfunc="first")
    print((table.round(0).astype("Int64").astype(str) + " (" + share + ")").to_string())
    copy = df.groupby("dtype").copy_gb_per_s.median().round(0)
    print("device copy GB/s (x.clone, median):", ", ".join(f"{k} {v:,.0f}" for k, v in copy.items()))
else:
    print("(no bench.csv)")
EOF
[[ $STAGES == *" table "* ]] && cat "$LOGS/table.log" "$LOGS/batched.log"

# GPT-2 small: random tokens below GPT-2's 50,257 as a nanoGPT-style headerless uint16 shard.
GPT2_DATA=(data=tokens "data.path=$LOGS/gpt2_tokens" data.dtype=uint16 data.vocab_size=50257)
stage gpt2_data 30 "$PY" -c "import numpy as np, pathlib, sys
d = pathlib.Path(sys.argv[1]); d.mkdir(parents=True, exist_ok=True); r = np.random.default_rng(0)
for name, n in (('train', 50_000_000), ('val', 2_000_000)):
    r.integers(0, 50257, n, dtype=np.uint16).tofile(d / f'{name}.bin')
" "$LOGS/gpt2_tokens"
stage gpt2_bare 150 "$PY" benchmarks/gpt2_bare.py --micro 16 --accum 4 --steps 30 --warmup 5
stage gpt2_normbench 240 "$PY" -m normbench train model=gpt2 train=gpt2 "${GPT2_DATA[@]}" train.device=cuda \
    train.batch_size=64 train.micro_batch_size=16 train.steps=60 train.warmup_steps=10 train.eval_every=30 \
    train.log_every=10 train.progress=false train.resume=never "hydra.run.dir=$LOGS/runs/gpt2"
stage gpt2_memory 200 "$PY" benchmarks/statistics_memory.py model.block_size=1024 train.batch_size=16 \
    train.device=cuda train.precision=bf16
stage gpt2_table 15 "$PY" - "$LOGS" <<'EOF'
"""GPT-2 small: the bare nanoGPT-style loop against normbench, in steps and over the wall clock."""
import json
import sys
from pathlib import Path

logs = Path(sys.argv[1])
bare_lines = [line for line in (logs / "gpt2_bare.log").read_text().splitlines() if line.startswith("{")]
bare = json.loads(bare_lines[-1]) if bare_lines else None
path = logs / "runs" / "gpt2" / "summary.json"
nb = json.loads(path.read_text()) if path.exists() else None
print(f"{'GPT-2 small':<12} {'tokens/s steps':>14} {'wall clock':>11} {'MFU':>6} {'peak mem MB':>11}")
for name, s in (("bare", bare), ("normbench", nb)):
    if s is None:
        print(f"{name:<12} (no result)")
        continue
    wall = s.get("wall_tokens_per_s")
    print(
        f"{name:<12} {s['tokens_per_s']:>14,.0f} {'-' if wall is None else format(wall, ',.0f'):>11} "
        f"{100 * s['mfu']:>5.1f}% {s['peak_mem_mb'] or 0:>11,.0f}"
    )
if bare and nb:
    print(f"normbench / bare: steps {nb['tokens_per_s'] / bare['tokens_per_s']:.2f}x (goal 0.95), wall clock "
          f"{nb['wall_tokens_per_s'] / bare['tokens_per_s']:.2f}x (goal 0.9); MFU peak "
          f"{bare['peak_flops'] / 1e12:.4g} TFLOP/s ({bare['peak_flops_source']})")
    print("normbench time_s:", ", ".join(f"{k} {v:.1f}" for k, v in nb["time_s"].items()))
EOF
[[ $STAGES == *" gpt2 "* ]] && cat "$LOGS/gpt2_table.log" "$LOGS/gpt2_memory.log"

if [ ${#FAILED[@]} -gt 0 ]; then
    echo "gpu_check: FAILED: ${FAILED[*]}"
    exit 1
fi
echo "gpu_check: all stages passed"
