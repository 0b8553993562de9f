#!/usr/bin/env bash
# Issue 53 on one H200 (2026-12-04): params/h200-sglang-traces.yaml (= params/h200.yaml plus
# sglang-shaped profiled extra launches) measured in two device calls of at most 10 minutes:
#   chain.sh 1 OUT   cold_warm (+ its full_stages launch), then memory_budget if time is left
#   chain.sh 2 OUT   warmup_shapes (+ its 2_steps first-of-new-shape launch)
# Run from the repository root on the GPU host; the carried wheels in $WHL are installed first.
# Each step has a deadline so the call ends inside its limit with whatever was measured; each
# step's bundle is packed as OUT/<step>.tar.gz, nvidia-smi once a second beside as OUT/smi-<phase>.csv.
set -uo pipefail
phase=$1 out=$2 WHL=${WHL:-.h200carry/whl} P=${P:-params/h200-sglang-traces.yaml}
mkdir -p "$out" /tmp/b /tmp/w
if [ ! -f /tmp/site/.ok ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$WHL"/*.whl && touch /tmp/site/.ok
fi
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=timestamp,utilization.gpu,clocks.sm,memory.used,power.draw,temperature.gpu,clocks_event_reasons.active \
    --format=csv -l 1 >"$out/smi-$phase.csv" 2>&1 &
SMI=$!
t_start=$SECONDS
step() {  # name, seconds, investigation
    local name=$1 secs=$2 only=$3 t0=$SECONDS
    timeout -s INT "$secs" python3 -m perfkit.measure --params "$P" --out "/tmp/b/$name" \
        --work-dir "/tmp/w/$name" --only "$only" >"/tmp/b/$name.log" 2>&1
    echo "$name: exit $? in $((SECONDS - t0)) s" | tee -a "$out/steps.txt"
    cp "/tmp/b/$name.log" "/tmp/b/$name/measure.log"
    tar -czf "$out/$name.tar.gz" -C /tmp/b "$name"
}
if [ "$phase" = 1 ]; then
    step cold_warm 420 cold_warm
    left=$((545 - (SECONDS - t_start)))
    if [ "$left" -gt 150 ]; then step memory_budget "$left" memory_budget; else echo "memory_budget: not run ($left s left)" | tee -a "$out/steps.txt"; fi
else
    step warmup_shapes 545 warmup_shapes
fi
kill $SMI
gzip -f "$out/smi-$phase.csv"
nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total --format=csv >"$out/gpus.csv" 2>&1
python3 -c 'import torch, diffusers; print(torch.__version__, diffusers.__version__)' >>"$out/gpus.csv" 2>&1
