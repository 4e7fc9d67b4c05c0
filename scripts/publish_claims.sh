#!/usr/bin/env bash
# Publish the claims registry from one clean commit, claim by claim, resumably:
#   ./scripts/publish_claims.sh [ID...]      (default: every claim, cheapest first)
# Each claim's sweep runs in a clean checkout of HEAD (a git worktree beside this one, so nothing edited
# here later can enter its runs: their provenance names that commit, clean, and every run of a claim is
# trained there, none reused from a record published before). As each claim finishes, its
# run records (config.yaml, summary.json, metrics.jsonl; no checkpoints) are copied into
# results/claims/ID/, the published claims.csv, claims.md, docs/claims.md and the README's headline
# are recomputed from every record there, and they are committed together. Run it again to go on: the
# worktree's finished runs are reused, interrupted ones resume. NORMBENCH_PUBLISH_JOBS (default 2) runs
# that many jobs of a sweep at once.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh dev
root=$(pwd)
py="$root/.venv/bin/python"
commit=$(git rev-parse --short HEAD)
tree="${NORMBENCH_PUBLISH_TREE:-$root/../normbench-publish-$commit}"
if [ ! -d "$tree" ]; then
    git worktree add --detach -q "$tree" "$commit"
fi
if [ "$#" -gt 0 ]; then
    ids=("$@")
else
    # every claim, cheapest first (its cost_s), so the most verdicts land soonest
    mapfile -t ids < <(cd "$root" && "$py" -c "
from normbench.claims.schema import load_registry
for c in sorted(load_registry(), key=lambda c: c.cost_s or 0): print(c.id)")
fi
# Not the checkout's results/claims: that holds the records published before, of other commits, which
# a sweep would reuse (same config) and a changed grid would leave beside its own runs.
runs="$tree/results/publish"
for id in "${ids[@]}"; do
    echo "== $id ($(date -u +%H:%M:%S))"
    # the clean checkout's code, configs and plugins: PYTHONPATH puts them before this checkout's install
    (cd "$tree" && PYTHONPATH="$tree" "$py" -m normbench claims run "$id" --out "$runs" \
        "hydra.launcher.n_jobs=${NORMBENCH_PUBLISH_JOBS:-2}")
    rm -rf "results/claims/$id"
    rsync -a --prune-empty-dirs --exclude='.hydra/' --include='*/' --include='config.yaml' \
        --include='summary.json' --include='metrics.jsonl' --include='claim.yaml' --include='overrides.yaml' \
        --exclude='*' "$runs/$id/" "results/claims/$id/"
    "$py" -m normbench claims report results/claims >/dev/null
    "$py" -m normbench claims report --markdown results/claims/claims.csv > docs/claims.md
    "$py" - <<'EOF'
from pathlib import Path

from normbench.claims import output

readme = Path("README.md")
lines = readme.read_text().split("\n")
start = next(i for i, line in enumerate(lines) if "claims reproduced at this scale" in line)
end = next(i for i in range(start + 3, len(lines)) if not lines[i].startswith("|"))
table = output.headline_table(output.read_csv(Path("results/claims/claims.csv"))).rstrip("\n").split("\n")
readme.write_text("\n".join([*lines[:start], *table, *lines[end:]]))
EOF
    git add results/claims docs/claims.md README.md
    git commit -q -m "claims: $id run at $commit; the published verdicts recomputed" \
        -- results/claims docs/claims.md README.md
    echo "   committed: $(du -sh "results/claims/$id" | cut -f1) of records"
done
