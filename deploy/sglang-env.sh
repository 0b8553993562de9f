#!/bin/bash
# Real sglang 0.5.23 (diffusion server, CPU platform) in its own venv: `make sglang-env`.
# Usage: deploy/sglang-env.sh [VENV]  (default $SGLANG_VENV, else .sglang-venv in the repo root).
# Cached: a stamp in the venv holds the sha256 of deploy/sglang-requirements.txt and this script; a change
# rebuilds the venv from scratch. About 6 GB (torch 2.14.1 with its CUDA wheels, which run on a CPU).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
REQ=$ROOT/deploy/sglang-requirements.txt
VENV=${1:-${SGLANG_VENV:-$ROOT/.sglang-venv}}
PY=${PYTHON:-python3}
STAMP=$VENV/.sglang-env-stamp
want=$(cat "$REQ" "$0" | sha256sum | cut -d' ' -f1)  # the pins and this recipe
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  echo "sglang env up to date: $VENV"; exit 0
fi
t0=$(date +%s)
rm -rf "$VENV"
mkdir -p "$(dirname "$VENV")"
# the venv is about 6.4 GiB; pip holds one downloaded wheel beside it (torch's is about 1 GiB)
need_kib=$((7 * 1024 * 1024))
free_kib=$(df -Pk "$(dirname "$VENV")" | awk 'NR==2 {print $4}')
if [ "$free_kib" -lt "$need_kib" ]; then
  echo "sglang-env: $((free_kib / 1024)) MiB free under $(dirname "$VENV"), needs about 7 GiB (SGLANG_VENV=path puts it elsewhere)" >&2
  exit 1
fi
"$PY" -m venv "$VENV"
# --no-deps: the lock is complete; sglang's metadata names GPU-only packages a CPU run never imports.
# --no-cache-dir, and the CUDA wheels one per pip call: a cached copy of every wheel beside the venv
# filled CI's disk. (A machine's pip config may name file:// indexes without these packages: pip
# warns once per name.)
pipi() {
  "$VENV/bin/python" -m pip install --quiet --no-compile --no-deps --no-cache-dir --disable-pip-version-check "$@" \
    2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}
heavy='^(torch|triton|nvidia-|cuda-)'
for pin in $(grep -E "$heavy" "$REQ"); do pipi "$pin"; done
pipi -r <(grep -v -E "$heavy" "$REQ")
# bytecode once, here: with PYTHONDONTWRITEBYTECODE set (CI images often set it) every sglang launch
# would compile its imports from source, twice (server and worker): 11.7 -> 5.3 s a process measured
# on the 2-core runner. Vendored files of other Python versions fail to compile: not an error.
"$VENV/bin/python" -m compileall -q -j 0 "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
  >/dev/null 2>&1 || true
# import smoke: torchvision's ops against this torch, and the `sglang` entry point
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md, torch, torchvision.ops  # fails on a torch mismatch
assert torch.ops.torchvision.nms  # "operator torchvision::nms does not exist" with torch 2.13.0+cpu
import sglang.cli.main  # noqa: F401  (the `sglang` entry point)
assert md.version("sglang") == "0.5.23", md.version("sglang")
print("sglang", md.version("sglang"), "torch", torch.__version__)
PY
test -x "$VENV/bin/sglang"
echo "$want" >"$STAMP"
echo "sglang env ready in $(( $(date +%s) - t0 )) s: $VENV"
