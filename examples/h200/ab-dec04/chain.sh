#!/usr/bin/env bash
# Issue 53 item 4 on one H200: the sequential A/B at ab-live's settings, one device call per arm.
#   chain.sh ab OUT    A = examples/ab/h200-ltx2b.yaml, B = A + DenoisingStage +2 %
#   chain.sh aa OUT    A against A
#   chain.sh prof OUT  as ab at 2 launches a side, then a profiled launch a side (2 denoising
#                      steps of 2 warm requests, sglang's N_steps traces): the kernel diff
# Run from the repository root on the GPU host; carried wheels in $WHL. The A/B ends inside the
# call's limit (SIGINT at its deadline: exit 2, its launches kept); its run directory is packed
# as OUT/<arm>.tar.gz, nvidia-smi once a second as OUT/smi-<arm>.csv.gz.
set -uo pipefail
arm=$1 out=$2 WHL=${WHL:-.h200carry/whl} A=examples/ab/h200-ltx2b.yaml
mkdir -p "$out" /tmp/ab
[ -f /tmp/site/.ok ] || { python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$WHL"/*.whl && touch /tmp/site/.ok; }
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
B=$A; [ "$arm" != aa ] && B=examples/ab/h200-ltx2b-den2.yaml
opts=(-n 3 --max-launches 6 -m 10)
[ "$arm" = prof ] && opts=(-n 2 --max-launches 2 -m 5 --profile --profile-steps 2 --profile-warm 2)
nvidia-smi --query-gpu=timestamp,utilization.gpu,clocks.sm,memory.used,power.draw,temperature.gpu,clocks_event_reasons.active \
    --format=csv -l 1 >"$out/smi-$arm.csv" 2>&1 &
SMI=$!
t0=$SECONDS
timeout -s INT "${DEADLINE:-560}" python3 -m perfkit.cli ab --a "$A" --b "$B" "${opts[@]}" \
    --gate-metrics DenoisingStage --threshold 0.01 --out "/tmp/ab/$arm" >"/tmp/ab/$arm.log" 2>&1
echo "$arm: exit $? in $((SECONDS - t0)) s" | tee -a "$out/steps.txt"
kill $SMI; gzip -f "$out/smi-$arm.csv"
cp "/tmp/ab/$arm.log" "/tmp/ab/$arm/ab.log" 2>/dev/null
tar -czf "$out/$arm.tar.gz" -C /tmp/ab "$arm"
tail -25 "/tmp/ab/$arm.log"
