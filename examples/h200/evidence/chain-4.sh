#!/usr/bin/env bash
# Issue 42 on one H200, fourth occasion, second chain: is the capped recompile slowed by perfkit's own
# sampler? chain-3.sh found the capped engine's cgroup at 0.1-0.2 CPU cores through the recompile
# (2 cores without the cap), no reclaim (pgscan 0, memory PSI 0, memory.current 18.5 of 32 GiB), and
# the slowdown beginning when the memory sampler started (PSS from smaps_rollup every 0.1 s of a
# 17 GiB process tree). 1: the capped launch with the sampler reading statm (PERFKIT_SAMPLER_PSS=0);
# 2: the capped launch as before (PSS), with the engine main thread's state, syscall and wchan
# sampled twice a second. Run from the repository root with PYTHONPATH=/tmp/site:$PWD/src.
set -uo pipefail
EV=${EV:-/tmp/ev5}
mkdir -p "$EV" /tmp/w
export PYTHONUNBUFFERED=1
uname -a >"$EV/host.txt"
nvidia-smi --query-gpu=timestamp,utilization.gpu,clocks.sm,memory.used,power.draw,temperature.gpu \
    --format=csv -l 1 >"$EV/smi.csv" 2>&1 &
SMI=$!
watch_engine() {  # twice a second while an engine runs: time, cgroup CPU, main thread state/syscall/wchan
    local pid cg d
    while :; do
        pid=$(pgrep -o -f 'perfkit[.]refengine --preset' || true)
        if [ -n "$pid" ] && cg=$(sed -n 's/^0:://p' "/proc/$pid/cgroup" 2>/dev/null) && [ -n "$cg" ]; then
            d=/sys/fs/cgroup$cg
            printf '%s pid=%s cgroup=%s current=%s %s state=%s syscall=%s wchan=%s dstate=%s\n' \
                "$(date +%s.%N)" "$pid" "$cg" "$(cat "$d/memory.current" 2>/dev/null)" \
                "$(grep -E '^usage_usec ' "$d/cpu.stat" 2>/dev/null | tr ' ' '=')" \
                "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" \
                "$(awk '{print $1}' "/proc/$pid/syscall" 2>/dev/null)" \
                "$(cat "/proc/$pid/wchan" 2>/dev/null)" \
                "$(cat /proc/"$pid"/task/*/stat 2>/dev/null | awk '$3=="D"' | wc -l)"
        fi
        sleep 0.5
    done >>"$EV/engine.txt" 2>>"$EV/engine.err"
}
watch_engine &
WATCH=$!
step() {  # name, command...
    local name=$1; shift
    local t0=$SECONDS
    "$@" >"$EV/$name.log" 2>&1
    echo "$name: exit $? in $((SECONDS - t0)) s" | tee -a "$EV/steps.txt"
}
P=examples/h200/evidence/consumer-12g-4/cap-params.yaml
step cap-statm env PERFKIT_SAMPLER_PSS=0 python3 -m perfkit.measure --params $P --out "$EV/cap-statm" \
    --work-dir /tmp/w/cap-statm
step cap-pss python3 -m perfkit.measure --params $P --out "$EV/cap-pss" --work-dir /tmp/w/cap-pss
kill $SMI $WATCH
echo done >>"$EV/steps.txt"
