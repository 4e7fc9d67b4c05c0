#!/usr/bin/env bash
# The pip arguments that install PyTorch on this machine, one a line, and one line on stderr saying which
# build and why. setup.sh installs with them.
#   NORMBENCH_TORCH set:            that requirement, from pip's default index (no index chosen here)
#   an NVIDIA GPU (nvidia-smi -L):  the default index's build, which is the CUDA one
#   no NVIDIA GPU:                  the CPU build from NORMBENCH_TORCH_CPU_INDEX (PyTorch's CPU index): a
#                                   fraction of the download, and no CUDA libraries that find no GPU;
#                                   the default index's build when that index cannot be reached
set -euo pipefail
requirement="${NORMBENCH_TORCH:-torch>=2.4}"
cpu_index="${NORMBENCH_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"

reachable() {  # a HEAD request that gets any answer within 10 s
    python3 - "$1" <<'PY' >/dev/null 2>&1
import sys, urllib.error, urllib.request
try:
    urllib.request.urlopen(urllib.request.Request(sys.argv[1], method="HEAD"), timeout=10)
except urllib.error.HTTPError:
    pass  # the server answered
PY
}

if [ -n "${NORMBENCH_TORCH:-}" ]; then
    echo "torch: $requirement, as NORMBENCH_TORCH asks" >&2
    echo "$requirement"
elif nvidia-smi -L >/dev/null 2>&1; then
    echo "torch: the CUDA build ($requirement), for the NVIDIA GPU that nvidia-smi lists" >&2
    echo "$requirement"
elif reachable "$cpu_index"; then
    echo "torch: the CPU build ($requirement) from $cpu_index: no NVIDIA GPU here" >&2
    printf '%s\n' --index-url "$cpu_index" "$requirement"
else
    echo "torch: the default index's build ($requirement): no NVIDIA GPU here, but $cpu_index cannot be reached" >&2
    echo "$requirement"
fi
