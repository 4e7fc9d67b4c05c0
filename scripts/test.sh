#!/usr/bin/env bash
# Set up .venv from a bare python3 (with the dev extras) and run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh dev
exec .venv/bin/python -m pytest "$@"
