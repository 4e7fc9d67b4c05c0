#!/usr/bin/env bash
# Set up .venv from a bare python3 (with the dev extras) and run the tests.
#   ./scripts/test.sh          the fast tier: every test not marked slow (a few minutes on a 2-core CPU)
#   ./scripts/test.sh --all    every test, the slow ones too (real processes, kills, torchrun, Ray, a wheel
#                              build, longer trainings): what CI runs (.ci/run)
# Any other argument goes to pytest: ./scripts/test.sh tests/test_norms.py, ./scripts/test.sh --all -q -x,
# ./scripts/test.sh -m slow (a later -m replaces the fast tier's). The 15 slowest tests are listed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh dev
select=(-m "not slow")
args=()
for arg in "$@"; do
    if [ "$arg" = "--all" ]; then
        select=()
    else
        args+=("$arg")
    fi
done
exec .venv/bin/python -m pytest ${select[@]+"${select[@]}"} --durations=15 ${args[@]+"${args[@]}"}
