#!/usr/bin/env bash
# Run the claims registry from a clean commit, claim by claim, resumably:
#   ./scripts/publish_claims.sh [ID...]            pilots (default: every row, cheapest first)
#   ./scripts/publish_claims.sh --confirm ID...    the pre-registered confirmations of these rows
# A row's rule is committed before its pilot: a pilot runs at HEAD, which must be clean, and records the
# rule it ran under (ID/rule.yaml); a confirmation runs at a clean HEAD holding its pre-registration
# (normbench claims preregister ID --out results/claims, committed first). Each runs in a git worktree
# of HEAD beside this checkout, so nothing edited here later can enter its runs. As each row finishes, its records
# (config.yaml, summary.json, metrics.jsonl, claim.yaml, rule.yaml, prereg.yaml; no checkpoints) are
# copied into results/claims/, the registry's pages (claims.csv, claims.md, claims.html, README.md)
# and the README's headline are recomputed from every record, and they are committed
# together. Run it again to go on: finished runs are reused, interrupted ones resume.
# NORMBENCH_PUBLISH_JOBS (default 2) runs that many jobs of a sweep at once.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh dev
root=$(pwd)
py="$root/.venv/bin/python"
if [ -n "$(git status --porcelain -- conf normbench hydra_plugins)" ]; then
    echo "error: conf/, normbench/ or hydra_plugins/ has uncommitted changes: commit the rules first" >&2
    exit 2
fi
commit=$(git rev-parse --short HEAD)
tree="${NORMBENCH_PUBLISH_TREE:-$root/../normbench-publish-$commit}"
[ -d "$tree" ] || git worktree add --detach -q "$tree" "$commit"
confirm=0
if [ "${1:-}" = "--confirm" ]; then confirm=1; shift; fi
if [ "$#" -gt 0 ]; then
    ids=("$@")
else  # every row, cheapest first (its cost_s), so the most verdicts land soonest
    mapfile -t ids < <("$py" -c "
from normbench.claims.schema import load_registry
for c in sorted(load_registry(), key=lambda c: c.cost_s or 0): print(c.id)")
fi
jobs="hydra.launcher.n_jobs=${NORMBENCH_PUBLISH_JOBS:-2}"
for id in "${ids[@]}"; do
    echo "== $id ($(date -u +%H:%M:%S))"
    # the clean checkout's code, configs and plugins: PYTHONPATH puts them before this checkout's install
    if [ "$confirm" = 1 ]; then
        (cd "$tree" && PYTHONPATH="$tree" "$py" -m normbench claims confirm "$id" --out "$tree/results/claims" "$jobs")
        from="$tree/results/claims/confirmations/$id" to="results/claims/confirmations/$id"
    else
        (cd "$tree" && PYTHONPATH="$tree" "$py" -m normbench claims run "$id" --out "$tree/results/publish" "$jobs")
        from="$tree/results/publish/$id" to="results/claims/$id"
    fi
    "$py" - "$from" "$to" <<'PY'
import shutil
import sys
from pathlib import Path

source, target = Path(sys.argv[1]), Path(sys.argv[2])
KEPT = {"config.yaml", "summary.json", "metrics.jsonl", "claim.yaml", "overrides.yaml", "rule.yaml", "prereg.yaml"}
shutil.rmtree(target, ignore_errors=True)
for path in sorted(source.rglob("*")):
    if path.is_file() and path.name in KEPT and ".hydra" not in path.relative_to(source).parts:
        (target / path.relative_to(source)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target / path.relative_to(source))
PY
    "$py" -m normbench claims report results/claims >/dev/null
    "$py" - <<'PY'
from pathlib import Path

from normbench.claims import output

readme = Path("README.md")
lines = readme.read_text().split("\n")
start = next(i for i, line in enumerate(lines) if line.startswith("**") and "reproduced at this scale" in line)
end = next(i for i in range(start + 3, len(lines)) if not lines[i].startswith("|"))
table = output.headline_table(output.read_csv(Path("results/claims/claims.csv"))).rstrip("\n").split("\n")
readme.write_text("\n".join([*lines[:start], *table, *lines[end:]]))
PY
    git add results/claims README.md
    git commit -q -m "claims: $id $([ "$confirm" = 1 ] && echo confirmed || echo piloted) at $commit; the published verdicts recomputed" \
        -- results/claims README.md
    echo "   committed: $(du -sh "$to" | cut -f1) of records"
done
