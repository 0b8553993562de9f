#!/usr/bin/env bash
# A bisect that runs on a 2-core CPU in minutes: a throwaway git repository of 8 commits whose
# engine.args (options of the reference engine, one a line) gain a TEST-ONLY +100 % DenoisingStage
# slowdown at commit 5. `perfkit bisect --paired` must find commit 5 (exit 0; else its exit code).
# Usage: examples/bisect/run.sh [OUT]   (OUT default outputs/bisect/example; perfkit on PATH, e.g.
# after `make setup`: PERFKIT=.venv/bin/perfkit, or `. .venv/bin/activate`)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-outputs/bisect/example}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
repo=$tmp/engine
git init -q -b main "$repo"
for k in 1 2 3 4 5 6 7 8; do
  echo "change $k" >>"$repo/CHANGES"
  if [ "$k" -ge 5 ]; then printf -- '--debug-stage-delay\nDenoisingStage=100%%\n' >"$repo/engine.args"; fi
  touch "$repo/engine.args"
  subject="commit $k"; [ "$k" -eq 5 ] && subject="commit 5: DenoisingStage +100 %"
  git -C "$repo" add CHANGES engine.args
  git -C "$repo" -c user.name=example -c user.email=example@example.org commit -q -m "$subject"
done
good=$(git -C "$repo" rev-list --max-parents=0 main)  # no pipe: head could SIGPIPE git under pipefail
bad_at=$(git -C "$repo" rev-parse main~3)  # commit 5 of 8
code=0
${PERFKIT:-perfkit} bisect --repo "$repo" --good "$good" --bad main --spec "$here/spec.yaml" \
  --paired --threshold 30% -m 5 --out "$out" -q || code=$?
[ -f "$out/bisect.json" ] || exit "$code"
found=$(python3 -c 'import json, sys; print((json.load(open(sys.argv[1])).get("found") or {}).get("sha"))' "$out/bisect.json")
if [ "$code" -eq 0 ] && [ "$found" != "$bad_at" ]; then
  echo "run.sh: found another commit than commit 5 ($bad_at): see $out/summary.md" >&2
  exit 1
fi
exit "$code"
