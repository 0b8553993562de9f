"""environment.yml mirrors pyproject.toml's dependencies, optional stacks and test extra (what
``make setup`` installs: ``.[all,test]``)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _norm(req: str) -> str:
    name, rest = re.match(r"\s*([A-Za-z0-9_.\-]+)\s*(.*)", req).groups()
    return re.sub(r"[-_.]+", "-", name).lower() + rest.replace(" ", "")


def test_environment_yml_mirrors_pyproject():
    pp = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = pp["optional-dependencies"]
    want = {_norm(r) for r in pp["dependencies"]} | {
        _norm(r) for name, reqs in extras.items() for r in reqs if not r.startswith("perfkit[")
    }
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    have = {_norm(r) for r in pip if not r.startswith("-e")}
    assert have == want, (
        f"only in environment.yml: {sorted(have - want)}; only in pyproject: {sorted(want - have)}"
    )
    assert "-e ." in pip
    py = next(d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python"))
    assert py.startswith("python=3.1")


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in readme and "make suite" in readme
    assert "make test" in ci and "apt-get install -y -q chromium" in ci
