"""The ray wheelhouse profile: a slimmed wheel stays installable by pip (synthetic wheel, no index)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import zipfile

import pytest

from perfkit import wheelhouse
from perfkit.wheelhouse import _record_hash, profile_roots, slim_wheel


def _wheel(path, files: dict[str, bytes], exe: set[str] = frozenset()):
    di = "ray-2.60.0.dist-info"
    files = {
        **files,
        f"{di}/METADATA": b"Metadata-Version: 2.1\nName: ray\nVersion: 2.60.0\n",
        f"{di}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: py3-none-any\n",
    }
    record = [f"{n},{_record_hash(d)},{len(d)}" for n, d in files.items()] + [f"{di}/RECORD,,"]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for n, d in files.items():
            info = zipfile.ZipInfo(n, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = ((0o755 if n in exe else 0o644) | stat.S_IFREG) << 16
            z.writestr(info, d)
        z.writestr(f"{di}/RECORD", "\n".join(record) + "\n")
    return path


def test_slim_wheel_drops_jars_keeps_record_and_modes_and_installs(tmp_path):
    w = _wheel(
        tmp_path / "ray-2.60.0-py3-none-any.whl",
        {
            "ray/__init__.py": b"X = 1\n",
            "ray/jars/ray_dist.jar": os.urandom(200_000),
            "ray/dashboard/client/build/static/js/main.js.map": b"{}" * 1000,
            "ray/dashboard/head.py": b"",
            "ray/rllib/__init__.py": b"",
            "ray/core/src/ray/raylet/raylet": b"#!/bin/sh\necho raylet\n",
        },
        exe={"ray/core/src/ray/raylet/raylet"},
    )
    before, after = slim_wheel(w)
    assert after < before - 150_000
    with zipfile.ZipFile(w) as z:
        names = set(z.namelist())
        record = z.read("ray-2.60.0.dist-info/RECORD").decode()
    assert not [n for n in names if n.startswith(("ray/jars/", "ray/dashboard/client/", "ray/rllib/"))]
    assert "ray/dashboard/head.py" in names and "ray-2.60.0.dist-info/PERFKIT_SLIM" in names
    assert "ray/jars" not in record and "PERFKIT_SLIM,sha256=" in record
    assert {ln.split(",")[0] for ln in record.splitlines()} == names
    assert slim_wheel(w) == (after, after)  # already slim: left as it is
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--no-deps",
            "--target",
            str(target),
            str(w),
        ],
        check=True,
    )
    assert (target / "ray" / "__init__.py").read_text() == "X = 1\n"
    assert not (target / "ray" / "jars").exists()
    assert os.access(target / "ray/core/src/ray/raylet/raylet", os.X_OK)  # executables stay executable


def test_profiles():
    assert profile_roots("ray") == ("ray",)
    assert profile_roots("measure+ray") == (*wheelhouse.MEASURE_ROOTS, "ray")
    with pytest.raises(ValueError, match="unknown wheelhouse profile 'gpu'"):
        profile_roots("measure+gpu")
