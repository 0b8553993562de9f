#!/usr/bin/env bash
# Record A/B power pools on a GPU host (issue 23), one pool per GPU, side by side, in the
# background (setsid: a pool outlives the 10-minute command that started it), then poll and pack.
#
#   deploy/gpu-ab-pool.sh start OUT SPEC LAUNCHES WARM name:gpu:slowdown[,slowdown...]...   # start, poll
#   deploy/gpu-ab-pool.sh poll OUT SECONDS                                                  # poll, pack
#
# Each pool runs benchmarks/ab_power.py --pool LAUNCHES --warm WARM --slowdown PCT... on its GPU
# (one B arm per slowdown, all against the same A launches; POOL_ARGS adds arguments, e.g.
# "--pool-b 10 8 --target DenoisingStage warm_e2e");
# the pool's bundles (a/, b/: saved after every launch) and log are packed into OUT/<name>.tar.gz
# at every poll, without the launch dirs (compile caches). A pool is done when its log ends
# with "rc=N".
set -uo pipefail
mode=$1; out=$2; shift 2
pools=/tmp/pools
if [ -d .whl ] && [ ! -f /tmp/site/.done ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 2
    touch /tmp/site/.done
fi
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
mkdir -p "$out" "$pools"
pack() {
    for d in "$pools"/*/; do
        [ -d "$d" ] || continue
        n=$(basename "$d")
        cp "$pools/$n.log" "$d/pool.log" 2>/dev/null
        tar -czf "$out/$n.tar.gz" -C "$pools" --exclude="$n/launches" "$n" 2>/dev/null
    done
    nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total --format=csv >"$out/gpus.csv" 2>&1
}
if [ "$mode" = start ]; then
    spec=$1 launches=$2 warm=$3; shift 3
    for job in "$@"; do
        IFS=: read -r name gpu slow <<<"$job"
        slow=${slow//,/ }
        mkdir -p "$pools/$name"
        setsid nohup bash -c "CUDA_VISIBLE_DEVICES=$gpu python3 benchmarks/ab_power.py --spec $spec \
            --pool $launches --warm $warm --slowdown $slow ${POOL_ARGS:-} --n 2 3 4 5 --m 1 3 5 \
            --pool-dir $pools/$name \
            >$pools/$name.log 2>&1; echo rc=\$? >>$pools/$name.log" >/dev/null 2>&1 &
        echo "started $name on GPU $gpu: slowdown $slow %"
    done
    secs=${POLL_S:-540}
else
    secs=$1
fi
t0=$SECONDS
while [ $((SECONDS - t0)) -lt "$secs" ]; do
    sleep 20
    running=0
    for l in "$pools"/*.log; do tail -n1 "$l" | grep -q '^rc=' || running=1; done
    pack
    [ $running = 0 ] && break
done
pack
for l in "$pools"/*.log; do
    echo "== $l: $(grep -c 'launch [AB][0-9]* (' "$l") launches logged"
    grep -E 'launch [AB][0-9]+ \(|rc=' "$l" | tail -n 3
done
