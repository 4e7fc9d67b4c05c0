#!/usr/bin/env bash
# Set up .venv from a bare python3 and run the main job on the embedded corpus:
# LayerNorm vs RMSNorm x pre vs post, two seeds each, as a sweep (two jobs at a time), then a report.
# Extra arguments are passed to the sweep as Hydra overrides (e.g. train.steps=500 model=mini); those runs
# go to a directory of their own, results/sweeps/demo-<checksum of the overrides>, beside the plain demo's.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh joblib
py=.venv/bin/python
sweep_dir=results/sweeps/demo
if [ $# -gt 0 ]; then
    sweep_dir="$sweep_dir-$(printf '%08x' "$(printf '%s\n' "$@" | cksum | cut -d' ' -f1)")"
fi
"$py" -m normbench sweep norm=ln,rms placement=pre,post seed=0,1 model=micro train.steps=300 \
    hydra/launcher=joblib hydra.launcher.n_jobs=2 hydra.sweep.dir=$sweep_dir "$@"
"$py" -m normbench report $sweep_dir
echo "open $sweep_dir/report/report.html to see the comparison"
