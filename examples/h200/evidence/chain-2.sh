#!/usr/bin/env bash
# Issue 42 on one H200, second device session (2026-12-02): the runs the first session left.
# Run 2's profiled +2 % A/B (is the injected slowdown the top changed kernel on a GPU?) and
# consumer-12g's first 25-frame request after a 17-frame warmup, under the 12 GiB + 32 GiB cap and
# without it, profiled (what is the recompile under the cap made of?). Run from the repository root
# on the GPU host after the carried wheels are installed (PYTHONPATH=/tmp/site:$PWD/src); results
# under $EV, one step after the other (no two launches share the GPU or the host's CPUs).
set -uo pipefail
EV=${EV:-/tmp/ev2}
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
# run 2: the +2 % DenoisingStage A/B with the sequential procedure, then a profiled launch a side
# (a cold and two warm requests, 2 denoising steps recorded)
step abprof python3 -m perfkit ab --a $A --b $B -n 2 --max-launches 4 -m 5 \
    --gate-metrics DenoisingStage --threshold 0.01 --profile --profile-steps 2 --profile-warm 2 \
    --out "$EV/abprof"
# run 2: consumer-12g's recompile under the cap, then the same without it (fresh caches each launch)
step cap python3 -m perfkit.measure --params params/h200-consumer-12g-traces.yaml --out "$EV/cap" \
    --work-dir /tmp/w/cap
step nocap python3 -m perfkit.measure --params params/h200-consumer-12g-traces-nocap.yaml \
    --out "$EV/nocap" --work-dir /tmp/w/nocap
kill $SMI
echo done >>"$EV/steps.txt"
