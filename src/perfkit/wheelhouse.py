"""Offline wheelhouse for air-gapped GPU hosts.

``perfkit wheelhouse download DIR --have HOST_FREEZE.txt --python-version 3.12`` resolves what
perfkit needs (the closure of its requirements, read from this environment's installed metadata),
leaves out what the target host already has (names from its ``pip list --format=freeze``), and
downloads binary wheels of the rest for the target's Python and platform with ``pip download``.
On the host, ``perfkit wheelhouse install DIR`` (or plain ``pip install --no-index --no-deps
DIR/*.whl``) installs them without a network.
"""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

log = logging.getLogger(__name__)

#: manylinux tags pip must be told explicitly (it matches each exactly), newest first.
DEFAULT_PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
    "any",
)


def canonical(name: str) -> str:
    """PEP 503 normalised project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


#: What a measuring host needs (no Jupyter stack: notebooks render from bundles elsewhere).
MEASURE_ROOTS = (
    "diffusers",
    "transformers",
    "tokenizers",
    "accelerate",
    "fastapi",
    "uvicorn",
    "pydantic",
    "httpx",
    "psutil",
    "nvidia-ml-py",
    "pandas",
    "pyarrow",
    "numpy",
    "scipy",
    "tqdm",
    "click",
    "PyYAML",
    "matplotlib",
    "packaging",
)


def requirement_closure(
    roots: tuple[str, ...] | list[str] = ("perfkit",),
    have: set[str] = frozenset(),
    extras: tuple[str, ...] = (),
) -> dict[str, str]:
    """Project name -> installed version for the dependency closure of ``roots`` here.

    The walk does not descend into packages in ``have`` (the host's own copy brings its own
    dependencies). Environment markers are evaluated for this interpreter; extras of
    dependencies are followed only when a requirement names them. ``perfkit`` itself is left out
    (it travels as source).

    Raises:
        metadata.PackageNotFoundError: a root is not installed here.
    """
    seen: dict[str, str] = {}
    root_keys = {canonical(r) for r in roots}
    stack: list[tuple[str, tuple[str, ...]]] = [(r, extras) for r in roots]
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
    """The part of ``closure`` the host lacks (torch/triton are never shipped: the host's own build
    is the one that matches its driver)."""
    return {n: v for n, v in closure.items() if n not in have and n not in {canonical(s) for s in skip}}


def download(
    dest: str | Path,
    have_file: str | Path | None,
    python_version: str = "3.12",
    platforms: tuple[str, ...] = DEFAULT_PLATFORMS,
    pin: bool = True,
    profile: str = "full",
) -> list[str]:
    """Download wheels of what the host lacks into ``dest``. Returns the requirement strings.

    ``profile``: ``full`` (everything perfkit needs, Jupyter stack included) or ``measure``
    (engine + scenarios only: :data:`MEASURE_ROOTS`).

    Raises:
        RuntimeError: pip could not find a binary wheel for a requirement (its output included).
    """
    d = Path(dest)
    d.mkdir(parents=True, exist_ok=True)
    have = read_have(have_file) if have_file else set()
    roots = MEASURE_ROOTS if profile == "measure" else ("perfkit",)
    need = missing(requirement_closure(roots, have), have)
    reqs = [f"{n}=={v}" if pin else n for n, v in sorted(need.items())]
    log.info("%d packages to download for Python %s: %s", len(reqs), python_version, " ".join(reqs))
    for r in reqs:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            python_version,
            "--implementation",
            "cp",
            "-d",
            str(d),
            "-q",
        ]
        for p in platforms:
            cmd += ["--platform", p]
        out = subprocess.run(cmd + [r], capture_output=True, text=True)
        if out.returncode != 0 and pin:
            # the exact version may have no wheel for that Python: take the newest that has one
            out = subprocess.run(cmd + [r.split("==")[0]], capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"pip download {r} failed:\n{out.stdout}\n{out.stderr}")
    return reqs


def install_command(wheel_dir: str | Path, target: str | Path | None = None) -> list[str]:
    """The offline pip command that installs a wheelhouse (into ``target`` when given)."""
    wheels = sorted(str(p) for p in Path(wheel_dir).glob("*.whl"))
    if not wheels:
        raise FileNotFoundError(f"{wheel_dir}: no .whl files")
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "-q",
        "--no-index",
        "--no-deps",
        "--no-compile",
        "--upgrade",
    ]
    if target:
        cmd += ["--target", str(target)]
    return cmd + wheels


def install(wheel_dir: str | Path, target: str | Path | None = None) -> None:
    """Install a wheelhouse offline.

    Raises:
        subprocess.CalledProcessError: pip failed.
    """
    subprocess.run(install_command(wheel_dir, target), check=True)
