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
"$PY" -m venv "$VENV"
# --no-deps: the lock is complete; sglang's metadata names GPU-only packages a CPU run never imports
# (a machine's pip config may name file:// indexes without these packages: pip warns once per name)
"$VENV/bin/python" -m pip install --quiet --no-compile --no-deps --disable-pip-version-check -r "$REQ" \
  2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
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
