#!/usr/bin/env bash
# Set up .venv from a bare python3 and run the main job on the embedded corpus:
# LayerNorm vs RMSNorm, pre vs post, then a comparison.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
py=.venv/bin/python
out=results/demo
for norm in ln rms; do
    for placement in pre post; do
        "$py" -m normbench train norm=$norm placement=$placement train.steps=${DEMO_STEPS:-200} \
            hydra.run.dir=$out/$norm-$placement "$@"
    done
done
echo "runs in $out"
