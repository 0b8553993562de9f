#!/usr/bin/env bash
# Issue 53 item 2 on one H200: load's trace mode on ltx-2b, one device call.
#   chain.sh OUT     run from the repository root on the GPU host; carried wheels in $WHL
# Two launches of params/h200-load-trace.yaml, each under a deadline:
#   w25: startup warmup at 25 frames; the trace, the levels 1, 2, 4, the open loop
#   w17: startup warmup at 17 frames (--set); the trace and one level of 4 requests
# Each bundle is packed as OUT/<name>.tar.gz; nvidia-smi once a second as OUT/smi.csv.gz.
set -uo pipefail
out=$1 WHL=${WHL:-.h200carry/whl} P=params/h200-load-trace.yaml
mkdir -p "$out" /tmp/b /tmp/w
[ -f /tmp/site/.ok ] || { python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$WHL"/*.whl && touch /tmp/site/.ok; }
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=timestamp,utilization.gpu,clocks.sm,memory.used,power.draw,temperature.gpu,clocks_event_reasons.active \
    --format=csv -l 1 >"$out/smi.csv" 2>&1 &
SMI=$!
step() {  # name, seconds, extra args...
    local name=$1 secs=$2 t0=$SECONDS; shift 2
    timeout -s INT "$secs" python3 -m perfkit.measure --params "$P" --out "/tmp/b/$name" \
        --work-dir "/tmp/w/$name" --only load "$@" >"/tmp/b/$name.log" 2>&1
    echo "$name: exit $? in $((SECONDS - t0)) s" | tee -a "$out/steps.txt"
    cp "/tmp/b/$name.log" "/tmp/b/$name/measure.log"
    tar -czf "$out/$name.tar.gz" -C /tmp/b "$name"
}
step w25 300
step w17 $((540 - SECONDS)) --set engine.warmup_frames=17 --set load.concurrency=[4] \
    --set load.requests_per_level=4 --set load.rate_over_capacity=null
kill $SMI
gzip -f "$out/smi.csv"
nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total --format=csv >"$out/gpus.csv" 2>&1
python3 -c 'import torch, diffusers; print(torch.__version__, diffusers.__version__)' >>"$out/gpus.csv" 2>&1
