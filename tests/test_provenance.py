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


def test_an_installed_perfkit_finds_the_checkout_it_runs_from(tmp_path):
    """A non-editable install (``pip install .``: the package in site-packages, no notebooks/
    beside it) run from a checkout takes that checkout's notebooks/, params/ and baselines/
    (the current directory, exported as PERFKIT_ROOT for the kernels it starts, which may give
    it too), while its provenance stays unknown: the checkout's HEAD is not what ran."""
    site = tmp_path / "venv" / "lib" / "python3" / "site-packages"
    shutil.copytree(ROOT / "src" / "perfkit", site / "perfkit", ignore=shutil.ignore_patterns("__pycache__"))
    probe = (
        "import os; from perfkit.common.provenance import repo_root, git_commit, source_digest\n"
        "print(repo_root(), os.environ['PERFKIT_ROOT'], git_commit(), source_digest(), sep='|')"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PERFKIT_GIT_COMMIT", "PERFKIT_ROOT")}
    env["PYTHONPATH"] = str(site)

    def run(cwd: Path, **more: str) -> list[str]:
        out = subprocess.run(
            [sys.executable, "-c", probe],
            cwd=cwd,
            capture_output=True,
            text=True,
            env={**env, **more},
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        return out.stdout.strip().split("|")

    assert run(ROOT) == [str(ROOT), str(ROOT), "None", "None"]
    kernel_dir = tmp_path / "run"
    kernel_dir.mkdir()
    assert run(kernel_dir, PERFKIT_ROOT=str(ROOT))[:2] == [str(ROOT), str(ROOT)]
    assert _commit_of(ROOT / "src") not in ("None", "")  # the editable checkout's own commit, as before


def test_source_digest_names_the_files_not_the_checkout(tmp_path):
    """Two copies of the same files give the same digest, whatever their .git says; one changed
    byte under src/perfkit changes it; a tree without src/perfkit has none."""
    from perfkit.common.provenance import source_digest

    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        shutil.copytree(ROOT / "src", d / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        shutil.copy(ROOT / "pyproject.toml", d / "pyproject.toml")
    _git(b, "init", "-q")  # a stale or foreign .git does not enter
    first = source_digest(a)
    assert first is not None and len(first) == 16 and first == source_digest(b)
    with (b / "src" / "perfkit" / "stats.py").open("a") as fh:
        fh.write("\n")
    assert source_digest(b) != first
    assert source_digest(tmp_path) is None


def test_report_header_keeps_dirty_and_the_source_digest(tmp_path):
    """The H200 consumer bundles ran from a tree newer than its .git: the report says +dirty."""
    import json

    from perfkit.report.render import _engine_facts
    from perfkit.report.runinfo import load_bundles

    meta = json.loads((ROOT / "examples/h200/consumer-12g/launch1/cold_warm/meta.json").read_text())
    assert meta["git_commit"].endswith("+dirty")
    (tmp_path / "cold_warm").mkdir()
    (tmp_path / "cold_warm" / "meta.json").write_text(
        json.dumps({**meta, "source_digest": "0123456789abcdef"})
    )
    line = _engine_facts(load_bundles([tmp_path / "cold_warm"]))[0]
    assert f"commit {meta['git_commit'][:10]}+dirty" in line and "source 0123456789abcdef" in line
    assert "NVIDIA H200" in line


def test_report_header_names_the_engines_versions_apart_from_perfkits(tmp_path):
    """A new user's sglang run: the header named perfkit's torch (2.13 CPU) as if sglang ran it
    (2.14.1). An old bundle without the engine's versions says so."""
    import json

    from perfkit.report.render import _engine_facts
    from perfkit.report.runinfo import load_bundles

    meta = json.loads((ROOT / "examples/h200/consumer-12g/launch1/cold_warm/meta.json").read_text())
    (tmp_path / "cold_warm").mkdir()
    (tmp_path / "cold_warm" / "meta.json").write_text(json.dumps(meta))
    old = _engine_facts(load_bundles([tmp_path / "cold_warm"]))[0]
    assert f"engine versions not recorded; perfkit's torch {meta['torch_version']}" in old
    ev = {"python": "/v/bin/python", "sglang": "0.5.23", "torch": "2.14.1+cu130", "diffusers": "0.37.0"}
    meta["engine_versions"] = {"cold": ev}
    (tmp_path / "cold_warm" / "meta.json").write_text(json.dumps(meta))
    line = _engine_facts(load_bundles([tmp_path / "cold_warm"]))[0]
    assert "engine: sglang 0.5.23, torch 2.14.1+cu130, diffusers 0.37.0" in line
    assert f"(torch {meta['torch_version']})" in line  # perfkit's own, said as such
