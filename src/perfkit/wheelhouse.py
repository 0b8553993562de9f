"""Offline wheelhouse for air-gapped GPU hosts (``perfkit wheelhouse download|install``): the
closure of a profile's requirements less what the host has, as binary wheels for its Python.
See docs/gpu-hosts.md.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import re
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name as canonical

from perfkit.engine.owner import run_bounded

log = logging.getLogger(__name__)

#: manylinux tags pip must be told explicitly (it matches each exactly), newest first
DEFAULT_PLATFORMS = tuple(
    "manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 "
    "manylinux2014_x86_64 manylinux1_x86_64 any".split()
)
#: what a measuring host needs (no Jupyter stack)
MEASURE_ROOTS = tuple(
    "diffusers transformers tokenizers accelerate fastapi uvicorn pydantic httpx psutil nvidia-ml-py "
    "pandas pyarrow numpy scipy tqdm click PyYAML matplotlib packaging".split()
)
RAY_ROOTS = ("ray",)
PROFILES = {"full": ("perfkit",), "measure": MEASURE_ROOTS, "ray": RAY_ROOTS}

#: left out of the ray wheel: the Java worker, the dashboard's web UI, Ray's AI libraries
RAY_SLIM_DROP = tuple(
    "ray/jars/ ray/dashboard/client/build/ ray/rllib/ ray/llm/ ray/serve/ ray/tune/ ray/train/ "
    "ray/data/".split()
)
SLIM_NOTE = "PERFKIT_SLIM"


def profile_roots(profile: str) -> tuple[str, ...]:
    """Roots of a profile name (``measure``, ``measure+ray``, ...); ValueError when unknown."""
    roots: list[str] = []
    for part in profile.split("+"):
        if part not in PROFILES:
            raise ValueError(f"unknown wheelhouse profile {part!r} (known: {', '.join(PROFILES)})")
        roots += [r for r in PROFILES[part] if r not in roots]
    return tuple(roots)


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def slim_wheel(path: str | Path, drop: tuple[str, ...] = RAY_SLIM_DROP) -> tuple[int, int]:
    """Rewrite a wheel in place without the members under ``drop`` (RECORD too), noting them in
    ``<dist-info>/PERFKIT_SLIM``; (size before, size after) in bytes. ValueError: not a wheel."""
    p = Path(path)
    before = p.stat().st_size
    with zipfile.ZipFile(p) as zin:
        names = zin.namelist()
        record = next((n for n in names if n.count("/") == 1 and n.endswith(".dist-info/RECORD")), None)
        if record is None:
            raise ValueError(f"{p}: not a wheel (no *.dist-info/RECORD)")
        dist_info = record.rsplit("/", 1)[0]
        note_name = f"{dist_info}/{SLIM_NOTE}"
        if note_name in names:
            return before, before
        dropped = [n for n in names if n.startswith(drop)]
        note = ("perfkit wheelhouse left out:\n" + "".join(f"{d}\n" for d in drop)).encode()
        kept_record = [
            ln
            for ln in zin.read(record).decode().splitlines()
            if ln.strip() and not ln.split(",", 1)[0].startswith(drop) and ln.split(",", 1)[0] != record
        ]
        kept_record += [f"{note_name},{_record_hash(note)},{len(note)}", f"{record},,"]
        tmp = p.with_name(p.name + ".slim")
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zout:
            for info in zin.infolist():
                if info.filename in dropped or info.filename == record:
                    continue
                zout.writestr(info, zin.read(info), compress_type=zipfile.ZIP_DEFLATED)
            zout.writestr(zipfile.ZipInfo(note_name, date_time=(2020, 1, 1, 0, 0, 0)), note)
            rec = zipfile.ZipInfo(record, date_time=(2020, 1, 1, 0, 0, 0))
            zout.writestr(rec, ("\n".join(kept_record) + "\n").encode(), compress_type=zipfile.ZIP_DEFLATED)
    os.replace(tmp, p)
    log.info("%s: %d members left out (%s)", p.name, len(dropped), ", ".join(drop))
    return before, p.stat().st_size


def requirement_closure(
    roots: tuple[str, ...] | list[str] = ("perfkit",),
    have: set[str] = frozenset(),
) -> dict[str, str]:
    """Project name -> installed version for the dependency closure of ``roots`` here, not
    descending into ``have``, ``perfkit`` left out; PackageNotFoundError: a root not installed."""
    seen: dict[str, str] = {}
    root_keys = {canonical(r) for r in roots}
    stack: list[tuple[str, tuple[str, ...]]] = [(r, ()) for r in roots]
    while stack:
        name, ex = stack.pop()
        key = canonical(name)
        if key in seen or (key in have and key not in root_keys):
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            if key in root_keys:
                raise
            log.warning("%s is required but not installed here; skipped", name)
            continue
        seen[key] = dist.version
        if key in have:
            continue
        for raw in dist.requires or []:
            req = Requirement(raw)
            envs = [{"extra": e} for e in (ex or ("",))]
            if req.marker is not None and not any(req.marker.evaluate(env) for env in envs):
                continue
            stack.append((req.name, tuple(req.extras)))
    seen.pop("perfkit", None)
    return seen


def read_have(path: str | Path) -> set[str]:
    """Canonical names from a ``pip list --format=freeze`` (or one name per line) file."""
    names = set()
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        names.add(canonical(re.split(r"[=<>~! @;]", line, maxsplit=1)[0]))
    return names


def missing(
    closure: dict[str, str], have: set[str], skip: set[str] = frozenset({"torch", "triton"})
) -> dict[str, str]:
    """The part of ``closure`` the host lacks, never torch/triton (the host's build matches its driver)."""
    skip = {canonical(s) for s in skip}
    return {n: v for n, v in closure.items() if n not in have and n not in skip}


def download(
    dest: str | Path,
    have_file: str | Path | None,
    python_version: str = "3.12",
    platforms: tuple[str, ...] = DEFAULT_PLATFORMS,
    profile: str = "full",
) -> list[str]:
    """Download wheels of what the host lacks for ``profile`` into ``dest``; the requirement
    strings. Raises RuntimeError (no binary wheel, a root not installed here), ValueError."""
    roots = profile_roots(profile)
    d = Path(dest)
    d.mkdir(parents=True, exist_ok=True)
    have = read_have(have_file) if have_file else set()
    try:
        closure = requirement_closure(roots, have)
    except metadata.PackageNotFoundError as exc:
        raise RuntimeError(
            f"{exc.name} is not installed here: its version and requirements are read from this "
            "environment (for the ray profile: pip install 'perfkit[ray]')"
        ) from exc
    need = missing(closure, have)
    reqs = [f"{n}=={v}" for n, v in sorted(need.items())]
    log.info("%d packages to download for Python %s: %s", len(reqs), python_version, " ".join(reqs))
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    cmd += ["--python-version", python_version, "--implementation", "cp", "-d", str(d), "-q"]
    cmd += [a for p in platforms for a in ("--platform", p)]
    for r in reqs:
        out = run_bounded(cmd + [r], capture_output=True, text=True)
        if out.returncode != 0:
            # no wheel of that version for that Python: the newest that has one
            out = run_bounded(cmd + [r.split("==")[0]], capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"pip download {r} failed:\n{out.stdout}\n{out.stderr}")
    if "ray" in need:
        for w in d.glob("ray-*.whl"):
            b, a = slim_wheel(w)
            log.info("%s slimmed: %.1f -> %.1f MiB", w.name, b / 2**20, a / 2**20)
    return reqs


def install(wheel_dir: str | Path, target: str | Path | None = None) -> None:
    """Install a wheelhouse offline with pip. Raises FileNotFoundError (no wheel), ValueError (a
    wheel that is not a zip, named), RuntimeError (pip failed)."""
    wheels = sorted(str(p) for p in Path(wheel_dir).glob("*.whl"))
    if not wheels:
        raise FileNotFoundError(f"{wheel_dir}: no .whl files")
    for w in wheels:
        if not zipfile.is_zipfile(w):
            raise ValueError(f"{w}: not a wheel (not a zip file: truncated or corrupt)")
    cmd = [sys.executable, "-m", "pip", "install", *"-q --no-index --no-deps --no-compile --upgrade".split()]
    rc = subprocess.run(cmd + (["--target", str(target)] if target else []) + wheels).returncode
    if rc:
        raise RuntimeError(f"pip install of {wheel_dir} failed (exit {rc}; pip's message above)")
