#!/usr/bin/env bash
# Measure on a GPU host with the library alone (no Jupyter): install the carried wheels next to
# the host's torch, run `python -m perfkit.measure` for each JOB, pack each job's bundles and
# measure log into OUT/<name>.tar.gz. Render anywhere afterwards with `perfkit suite --replay`.
#
#   deploy/gpu-measure.sh OUT JOB...      JOB = name:gpus:params[:extra measure args, comma-separated]
#
# gpus is a CUDA_VISIBLE_DEVICES value ("0", "1", "0,1"). Jobs separated by "--" run one after
# the other; jobs within a group run at the same time (e.g. two 1-GPU jobs on a 2-GPU host).
# Independent lanes (one chain of jobs per GPU) are instances started side by side with their own
# OUT; the carried wheels are installed once:
#
#   deploy/gpu-measure.sh "$OUT/gpu0" a:0:P -- b:0:P & deploy/gpu-measure.sh "$OUT/gpu1" c:1:P & wait
#
#
#   deploy/gpu-measure.sh "$OUT" x2:0,1:params/h200x2-two-stage.yaml -- \
#       one:0:params/h200x2-two-stage-1gpu.yaml mem:1:params/h200-memory.yaml:--only,offload_modes
set -uo pipefail
out=$1; shift
mkdir -p "$out"
if [ -d .whl ]; then
    # several instances may start at once (one per GPU lane): the first installs, the rest wait
    ( flock 9
      [ -f /tmp/site/.perfkit-installed ] || {
          python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
              --target /tmp/site .whl/*.whl && touch /tmp/site/.perfkit-installed; }
    ) 9>/tmp/site.lock
    [ -f /tmp/site/.perfkit-installed ] || exit 2
    export PYTHONPATH=/tmp/site:$PWD/src
else
    export PYTHONPATH=$PWD/src
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total --format=csv >"$out/gpus.csv" 2>&1

run_job() {  # name gpus params extra
    local name=$1 gpus=$2 params=$3 extra=${4:-}
    local args=()
    [ -n "$extra" ] && IFS=, read -r -a args <<<"$extra"
    local t0=$SECONDS
    CUDA_VISIBLE_DEVICES=$gpus python3 -m perfkit.measure --params "$params" --out "/tmp/b/$name" \
        --work-dir "/tmp/w/$name" "${args[@]}" >"/tmp/b/$name.log" 2>&1
    local rc=$?
    echo "job $name (gpus $gpus, $params ${args[*]}): exit $rc in $((SECONDS - t0)) s" | tee -a "$out/jobs.txt"
    cp "/tmp/b/$name.log" "/tmp/b/$name/measure.log" 2>/dev/null
    # engine logs of every launch (per-rank output included) next to the bundles
    tar -czf "$out/$name.tar.gz" -C /tmp/b "$name" 2>/dev/null
}

mkdir -p /tmp/b /tmp/w
group=()
flush() {
    local pids=()
    for job in "${group[@]}"; do
        IFS=: read -r name gpus params extra <<<"$job"
        mkdir -p "/tmp/b/$name"
        run_job "$name" "$gpus" "$params" "$extra" &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p"; done
    group=()
}
for arg in "$@"; do
    if [ "$arg" = "--" ]; then flush; else group+=("$arg"); fi
done
flush
cat "$out/jobs.txt"
