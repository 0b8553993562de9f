"""Record allocator snapshots of the tiny reference engine on request boundaries (the fixture
under tests/fixtures/memory-snapshots/, recorded on an H200).

Two engines, one after the other: the injected leak on (``--debug-leak-mib``) and off. Each
serves ``--requests`` measured requests and dumps a snapshot after the cold request (0) and the
last one (k = requests - 1). Written to OUT: ``leak<MiB>-request-<i>.pickle.gz`` and
``noleak-request-<i>.pickle.gz``, each engine's ``performance.log`` records
(``<run>-records.jsonl``) and ``meta.json`` (GPU, torch, command, sizes). Printed: each file's
size and the live bytes per run. On a CPU device the records say "not available on cpu" and no
file is written.

    python benchmarks/record_memory_snapshots.py OUT --leak-mib 64 --requests 4
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from refengine_helpers import running_engine, spec  # noqa: E402


def run(out: Path, name: str, leak_mib: int, a: argparse.Namespace) -> list[dict]:
    last = a.requests - 1
    args = ["--device", a.device, "--memory-snapshot-after", f"0,{last}"]
    args += ["--memory-snapshot-entries", str(a.entries)]
    if leak_mib:
        args += ["--debug-leak-mib", str(leak_mib)]
    work = Path(a.work) / name
    recs = []
    with running_engine(work, *args) as eng, eng.client() as c:
        for i in range(a.requests):
            o = c.generate(spec(num_frames=a.frames, steps=a.steps, height=a.size, width=a.size, seed=i))
            if not o.ok or o.record is None:
                raise SystemExit(f"{name}: request {i} failed: {o.status} {o.error}")
            recs.append(o.record.raw)
    with open(out / f"{name}-records.jsonl", "w") as fh:
        for r in recs:
            fh.write(json.dumps(r, default=str) + "\n")
    for r in recs:
        snap = (r.get("perfkit") or {}).get("memory_snapshot")
        print(f"{name}: request {(r.get('perfkit') or {}).get('request_index')}: {snap}")
        if snap and snap.get("path"):
            dst = out / f"{name}-request-{snap['request_index']}.pickle.gz"
            with open(snap["path"], "rb") as src, gzip.open(dst, "wb", compresslevel=9) as fh:
                shutil.copyfileobj(src, fh)
            print(
                f"  {dst.name}: {dst.stat().st_size / 2**20:.2f} MiB gzip ({snap['bytes'] / 2**20:.2f} MiB raw)"
            )
    return recs


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--leak-mib", type=int, default=64)
    p.add_argument("--requests", type=int, default=4)
    p.add_argument("--entries", type=int, default=5000)
    p.add_argument("--frames", type=int, default=25)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--device", default="auto")
    p.add_argument("--work", default="/tmp/memsnap-work")
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    meta: dict = {"date": dt.datetime.now(dt.timezone.utc).isoformat(), "argv": sys.argv}
    try:
        import torch

        meta["torch"] = torch.__version__
        if torch.cuda.is_available():
            meta["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    run(out, f"leak{a.leak_mib}", a.leak_mib, a)
    run(out, "noleak", 0, a)
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
