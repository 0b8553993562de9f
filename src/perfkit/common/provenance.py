"""Where a measurement came from: perfkit's own git commit."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def git_commit() -> str | None:
    """HEAD of perfkit's checkout (not of the working directory's repository), or None when
    perfkit is not installed from a checkout. ``PERFKIT_GIT_COMMIT`` overrides (copies without
    ``.git``, e.g. a GPU host that received a tarball)."""
    if os.environ.get("PERFKIT_GIT_COMMIT"):
        return os.environ["PERFKIT_GIT_COMMIT"]
    try:
        here = Path(__file__).resolve().parent
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def repo_root() -> Path:
    """The checkout perfkit runs from (where ``notebooks/``, ``params/`` and ``baselines/`` live)."""
    return Path(__file__).resolve().parents[3]
