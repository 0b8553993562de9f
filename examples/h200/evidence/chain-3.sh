#!/usr/bin/env bash
# Issue 42 on one H200, fourth occasion (2026-12-02): consumer-12g's capped launch alone, unprofiled,
# so its bundle (host samples: the cgroup's memory.current) is written, then the same launch without
# the cap on the same occasion. Beside each, once a second, the engine's cgroup: memory.current,
# memory.stat (anon, file, reclaim scans and steals, refaults), memory and CPU pressure (PSI), CPU
# usage: was the recompile under the cap slowed by reclaim inside memory.max?
# Run from the repository root on the GPU host with PYTHONPATH=/tmp/site:$PWD/src; results under $EV.
set -uo pipefail
EV=${EV:-/tmp/ev4}
mkdir -p "$EV" /tmp/w
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=timestamp,utilization.gpu,clocks.sm,memory.used,power.draw,temperature.gpu \
    --format=csv -l 1 >"$EV/smi.csv" 2>&1 &
SMI=$!
watch_cgroup() {  # one line a second while an engine runs: time pid cgroup key=value...
    local pid cg d
    while :; do
        pid=$(pgrep -o -f 'perfkit[.]refengine --preset' || true)
        if [ -n "$pid" ] && cg=$(sed -n 's/^0:://p' "/proc/$pid/cgroup" 2>/dev/null) && [ -n "$cg" ]; then
            d=/sys/fs/cgroup$cg
            printf '%s pid=%s cgroup=%s current=%s max=%s %s mem_psi=%s cpu_psi=%s %s nprocs=%s host_mem_psi=%s\n' \
                "$(date +%s.%N)" "$pid" "$cg" "$(cat "$d/memory.current" 2>/dev/null)" \
                "$(cat "$d/memory.max" 2>/dev/null)" \
                "$(grep -E '^(anon|file|file_dirty|file_writeback|shmem|pgscan|pgsteal|pgmajfault|workingset_refault_anon|workingset_refault_file) ' "$d/memory.stat" 2>/dev/null | tr ' ' '=' | tr '\n' ' ')" \
                "$(head -1 "$d/memory.pressure" 2>/dev/null | tr ' ' ',')" \
                "$(head -1 "$d/cpu.pressure" 2>/dev/null | tr ' ' ',')" \
                "$(grep -E '^usage_usec ' "$d/cpu.stat" 2>/dev/null | tr ' ' '=')" \
                "$(wc -l <"$d/cgroup.procs" 2>/dev/null)" "$(head -1 /proc/pressure/memory 2>/dev/null | tr ' ' ',')"
        fi
        sleep 1
    done >>"$EV/cgroup.txt" 2>>"$EV/cgroup.err"
}
watch_cgroup &
WATCH=$!
{ nproc; cat /sys/fs/cgroup/cpu.max 2>/dev/null; free -m; cat /proc/self/cgroup; } >"$EV/host.txt" 2>&1
step() {  # name, command...
    local name=$1; shift
    local t0=$SECONDS
    "$@" >"$EV/$name.log" 2>&1
    echo "$name: exit $? in $((SECONDS - t0)) s" | tee -a "$EV/steps.txt"
}
step cap python3 -m perfkit.measure --params examples/h200/evidence/consumer-12g-4/cap-params.yaml \
    --out "$EV/cap" --work-dir /tmp/w/cap
step nocap python3 -m perfkit.measure --params examples/h200/evidence/consumer-12g/nocap-params.yaml \
    --out "$EV/nocap" --work-dir /tmp/w/nocap
kill $SMI $WATCH
echo done >>"$EV/steps.txt"
