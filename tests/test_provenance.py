"""perfkit's commit comes from perfkit's own checkout, never from an enclosing repository."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROBE = "from perfkit.common.provenance import git_commit; print(git_commit())"


def _commit_of(src: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PERFKIT_GIT_COMMIT"}
    env["PYTHONPATH"] = str(src)
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def _git(cwd: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    return subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, check=True, env=env
    ).stdout.strip()


def test_own_checkout_gives_its_head_and_says_dirty(tmp_path):
    clone = tmp_path / "perfkit"
    _git(tmp_path, "clone", "-q", str(ROOT), str(clone))
    head = _git(clone, "rev-parse", "HEAD")
    assert _commit_of(clone / "src") == head
    with (clone / "src" / "perfkit" / "common" / "provenance.py").open("a") as fh:
        fh.write("\n# local change\n")
    assert _commit_of(clone / "src") == head + "+dirty"


def test_copy_inside_another_repository_is_unknown(tmp_path):
    outer = tmp_path / "other"
    outer.mkdir()
    _git(outer, "init", "-q")
    (outer / "x.txt").write_text("x")
    _git(outer, "add", "x.txt")
    _git(outer, "commit", "-qm", "other project")
    copy = outer / "vendor" / "perfkit"
    shutil.copytree(ROOT / "src", copy / "src")
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    assert _commit_of(copy / "src") == "None"
