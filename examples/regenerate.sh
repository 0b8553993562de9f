#!/usr/bin/env bash
# Re-render every committed example report from its committed bundles with the current code
# (the commands each example's README gives), then copy back only the files that example keeps
# (those git tracks in its report directory). Run from the repository root:
#   bash examples/regenerate.sh            # all
#   bash examples/regenerate.sh h200/failing/report   # one
# Exit codes of the commands are printed, not fatal: the failing example exits 1 on purpose.
set -uo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d /tmp/perfkit-regen.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# target directory | command (OUT is the temporary run directory)
jobs=(
  "examples/h200/report|perfkit suite --params params/h200.yaml --replay examples/h200/bundles --out OUT"
  "examples/h200/failing/report|perfkit suite --params examples/h200/failing/params.yaml --replay examples/h200/bundles --out OUT"
  "examples/h200/report-two-stage|perfkit suite --params params/h200-two-stage.yaml --replay examples/h200/bundles-two-stage --out OUT"
  "examples/h200/report-memory|perfkit suite --params params/h200-memory.yaml --replay examples/h200/bundles-memory --out OUT --no-screenshot"
  "examples/h200/report-offload-block|perfkit suite --params params/h200-offload-block.yaml --replay examples/h200/bundles-offload-block --out OUT --no-screenshot"
  "examples/h200/consumer-12g/launch1/report|perfkit suite --params params/consumer-12g.yaml --replay examples/h200/consumer-12g/launch1 --out OUT"
  "examples/h200/consumer-12g/launch2/report|perfkit suite --params params/consumer-12g.yaml --replay examples/h200/consumer-12g/launch2 --out OUT --no-screenshot"
  "examples/h200/consumer-12g/launch3/report|perfkit suite --params params/consumer-12g.yaml --replay examples/h200/consumer-12g/launch3 --out OUT --no-screenshot"
  "examples/h200/evidence/consumer-12g-4/pss-or-statm/cap-pss/report|perfkit suite --params examples/h200/evidence/consumer-12g-4/cap-params.yaml --replay examples/h200/evidence/consumer-12g-4/pss-or-statm/cap-pss --out OUT"
  "examples/h200/evidence/consumer-12g-4/pss-or-statm/cap-statm/report|perfkit suite --params examples/h200/evidence/consumer-12g-4/cap-params.yaml --replay examples/h200/evidence/consumer-12g-4/pss-or-statm/cap-statm --out OUT --no-screenshot"
  "examples/h200x2/report|perfkit suite --params params/h200x2-two-stage.yaml --replay examples/h200x2/bundles --out OUT"
  "examples/h200x2/report-1gpu|perfkit suite --params params/h200x2-two-stage-1gpu.yaml --replay examples/h200x2/bundles-1gpu --out OUT"
  "examples/h200/load/report|perfkit suite --params params/h200-load.yaml --replay examples/h200/load/bundles --out OUT"
  "examples/h200/sglang-traces/report|perfkit suite --params params/h200-sglang-traces.yaml --replay examples/h200/sglang-traces/bundles --out OUT --no-screenshot"
  "examples/h200/load-trace/report-w25|perfkit suite --params params/h200-load-trace.yaml --replay examples/h200/load-trace/bundles-w25 --out OUT --no-screenshot"
  "examples/h200/load-trace/report-w17|perfkit suite --params params/h200-load-trace.yaml --set engine.warmup_frames=17 --set load.concurrency=[4] --set load.requests_per_level=4 --set load.rate_over_capacity=null --replay examples/h200/load-trace/bundles-w17 --out OUT --no-screenshot"
  "examples/h200x2/scaleout/report|perfkit merge examples/h200x2/scaleout/ray --out OUT --params params/h200-scaleout.yaml"
)
for job in "${jobs[@]}"; do
  target=${job%%|*}
  cmd=${job#*|}
  if [ $# -gt 0 ] && [[ " $* " != *" ${target#examples/} "* ]]; then continue; fi
  out="$tmp/$(echo "$target" | tr / _)"
  ${cmd//OUT/$out} -q >"$out.log" 2>&1
  echo "exit $? : ${cmd//OUT/<tmp>}  ->  $target"
  keep=$(git ls-files "$target")
  [ -n "$keep" ] || keep=$(printf '%s\n' "$target/report.html" "$target/summary.md" "$target/run.json")
  for f in $keep; do
    rel=${f#"$target"/}
    [ -f "$out/$rel" ] && mkdir -p "$(dirname "$f")" && cp "$out/$rel" "$f"
  done
done
