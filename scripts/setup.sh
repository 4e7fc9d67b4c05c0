#!/usr/bin/env bash
# Create .venv (if missing) and install normbench into it. Sourced by demo.sh and test.sh.
# PyTorch's build fits the machine (scripts/torch_choice.sh): the CUDA one where nvidia-smi finds an NVIDIA GPU,
# the CPU one elsewhere. NORMBENCH_TORCH overrides the requirement, e.g. NORMBENCH_TORCH="torch==2.13.0".
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
extras="${1:-}"
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
py=.venv/bin/python
stamp=".venv/.normbench-installed${extras:+-$extras}"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    "$py" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
    if ! "$py" -c "import torch" 2>/dev/null; then
        mapfile -t torch_args < <(scripts/torch_choice.sh)
        "$py" -m pip install -q "${torch_args[@]}"
    fi
    "$py" -m pip install -q -e ".${extras:+[$extras]}"
    # The fused CPU norm kernels, built now (once per machine, about 30 s) rather than in a first run;
    # without a compiler this says why, and the norms run eager.
    "$py" -m normbench.model.kernels || true
    touch "$stamp"
fi
