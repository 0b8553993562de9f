#!/usr/bin/env bash
# Issue 42 on one H200, one device session (2026-12-01, evening): the commands that measured
# run 1's A/A, run 2's traces (first 25-frame request after a 17-frame warmup; a profiled +2 % A/B)
# and run 4's teardown of an engine hung on the GPU. Run from the repository root on the GPU host
# after the carried wheels are installed (PYTHONPATH=/tmp/site:$PWD/src); results under $EV.
set -uo pipefail
EV=${EV:-/tmp/ev}
mkdir -p "$EV" /tmp/w
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=timestamp,utilization.gpu,clocks.sm,memory.used,power.draw,temperature.gpu \
    --format=csv -l 1 >"$EV/smi.csv" 2>&1 &
SMI=$!
step() {  # name, command...
    local name=$1; shift
    local t0=$SECONDS
    "$@" >"$EV/$name.log" 2>&1
    echo "$name: exit $? in $((SECONDS - t0)) s" | tee -a "$EV/steps.txt"
}
A=examples/ab/h200-ltx2b.yaml
B=examples/ab/h200-ltx2b-den2.yaml
# run 1: the A/A with the sequential procedure, the options of ab-live/ab-2pct
step aa python3 -m perfkit ab --a $A --b $A -n 3 --max-launches 6 -m 10 \
    --gate-metrics DenoisingStage --threshold 0.01 --out "$EV/aa"
# run 2: the first 25-frame request after a 17-frame warmup and warm ones, profiled
step traces python3 -m perfkit.measure --params params/h200-traces.yaml --out "$EV/traces" \
    --work-dir /tmp/w/traces
# run 2: the +2 % DenoisingStage A/B, profiled (a cold and two warm requests a side)
step abprof python3 -m perfkit ab --a $A --b $B -n 2 --max-launches 4 -m 5 \
    --gate-metrics DenoisingStage --threshold 0.01 --profile --profile-steps 2 --profile-warm 2 \
    --out "$EV/abprof"
# run 4: an engine hung on the GPU inside request 1; the GPU's processes every second meanwhile
nvidia-smi --query-compute-apps=timestamp,pid,process_name,used_memory --format=csv -l 1 \
    >"$EV/hang-apps.csv" 2>&1 &
APPS=$!
step hang python3 -m perfkit.measure --params params/h200-hang.yaml --out "$EV/hang" --work-dir /tmp/w/hang
sleep 3
kill $APPS
{ date -u +%FT%TZ; nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv;
  nvidia-smi --query-gpu=memory.used,memory.total --format=csv; ps -eo pid,etimes,cmd | grep -c "[p]erfkit.refengine"; } \
    >"$EV/hang-after.txt" 2>&1
kill $SMI
echo done >>"$EV/steps.txt"
