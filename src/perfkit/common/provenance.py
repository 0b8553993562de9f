"""Where a measurement came from: perfkit's own git commit and a digest of its source."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path


def git_commit() -> str | None:
    """HEAD of perfkit's own checkout (``+dirty`` when its tracked files differ), or None when perfkit
    does not run from its own checkout; ``PERFKIT_GIT_COMMIT`` overrides (copies without ``.git``)."""
    if os.environ.get("PERFKIT_GIT_COMMIT"):
        return os.environ["PERFKIT_GIT_COMMIT"]
    root = _source_root()

    def git(*args: str) -> str:
        out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10)
        return out.stdout.strip() if out.returncode == 0 else ""

    try:
        top = git("rev-parse", "--show-toplevel")
        if not top or Path(top).resolve() != root.resolve():
            return None  # not perfkit's own checkout
        head = git("rev-parse", "HEAD")
        if not head:
            return None
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", "src", "pyproject.toml")
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def source_digest(root: Path | None = None) -> str | None:
    """SHA-256 (first 16 hex digits) of every ``*.py`` under ``src/perfkit`` and ``pyproject.toml``
    by sorted path and content; None when ``root`` (default: perfkit's checkout) has no ``src/perfkit``."""
    root = _source_root() if root is None else Path(root)
    pkg = root / "src" / "perfkit"
    if not pkg.is_dir():
        return None
    h = hashlib.sha256()
    files = sorted(pkg.rglob("*.py")) + [root / "pyproject.toml"]
    for f in files:
        if f.is_file():
            h.update(f.relative_to(root).as_posix().encode() + b"\0")
            h.update(f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _source_root() -> Path:
    return Path(__file__).resolve().parents[3]


def repo_root() -> Path:
    """The checkout perfkit runs from (``notebooks/``, ``params/``): its source's, else ``$PERFKIT_ROOT``
    or the current directory, exported as ``PERFKIT_ROOT`` for the kernels and engines it starts."""
    here = _source_root()
    if (here / "notebooks").is_dir():
        return here
    root = Path(os.environ.get("PERFKIT_ROOT") or Path.cwd()).resolve()
    os.environ["PERFKIT_ROOT"] = str(root)
    return root
