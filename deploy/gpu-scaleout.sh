#!/usr/bin/env bash
# Issue 24 on a 2-GPU host: the units of PARAMS through a local Ray (1-GPU units side by side),
# then the same units one after another in process on GPU 0, while EXTRA (a shell command, may
# be empty) runs on GPU 1. Each run is one shard (--partition 1/1: bundles and shard.json, no
# Jupyter on the host); render here with `perfkit merge`. Compile caches are left behind.
#
#   deploy/gpu-scaleout.sh OUT PARAMS [EXTRA]
set -uo pipefail
out=$1 params=$2 extra=${3:-}
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 2
fi
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
mkdir -p "$out" /tmp/so
nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total --format=csv >"$out/gpus.csv" 2>&1
pack() {  # name
    tar -czf "$out/$1.tar.gz" -C /tmp/so --exclude=cache --exclude=shared-cache "$1" "$1.log" 2>/dev/null
}
t0=$SECONDS
python3 -m perfkit.cli suite --params "$params" --partition 1/1 --executor ray --out /tmp/so/ray -q \
    >/tmp/so/ray.log 2>&1
echo "ray (both GPUs): exit $? in $((SECONDS - t0)) s" | tee -a "$out/times.txt"
pack ray
if [ -n "$extra" ]; then
    CUDA_VISIBLE_DEVICES=1 bash -c "$extra" >/tmp/so/extra.log 2>&1 &
fi
t1=$SECONDS
left=$((${DEADLINE_S:-575} - SECONDS))
CUDA_VISIBLE_DEVICES=0 timeout "$left" python3 -m perfkit.cli suite --params "$params" --partition 1/1 \
    --executor inprocess --out /tmp/so/inprocess -q >/tmp/so/inprocess.log 2>&1
echo "in process (GPU 0): exit $? in $((SECONDS - t1)) s" | tee -a "$out/times.txt"
pack inprocess
wait
[ -n "$extra" ] && tar -czf "$out/extra.tar.gz" -C /tmp/so --exclude=launches extra.log $(cd /tmp/so && ls -d extra-* 2>/dev/null)
cat "$out/times.txt"
