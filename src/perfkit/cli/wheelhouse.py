"""``perfkit wheelhouse download|install``: offline wheels for air-gapped GPU hosts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from perfkit.cli._common import EXIT_CODES, choice, done, fail
from perfkit.common.exitcodes import EXIT_OK

_ERRORS = (RuntimeError, FileNotFoundError, OSError, ValueError)


@click.group("wheelhouse")
def wheelhouse_group() -> None:
    """Offline wheels for air-gapped GPU hosts."""


@wheelhouse_group.command("download", epilog=EXIT_CODES)
@click.argument("dir")
@click.option("--have", default=None, help="the host's `pip list --format=freeze` (names it already has)")
@click.option("--python-version", default="3.12", show_default=True, help="the host's Python")
@click.option("--platform", multiple=True, help="pip platform tag (repeatable; default manylinux x86_64)")
@choice(
    "--profile",
    ["full", "measure", "ray", "measure+ray"],
    "full: everything perfkit needs; measure: engine + investigations only; ray: Ray (slimmed: "
    "Ray Core: no Java worker, dashboard web UI or AI libraries) and its missing requirements",
    default="full",
)
def wheelhouse_download_command(**kw: Any) -> None:
    """Download wheels of what a host lacks, for its Python."""
    from perfkit import wheelhouse

    dir = kw["dir"]  # noqa: A001 - the argument's name
    platforms = tuple(kw["platform"]) or wheelhouse.DEFAULT_PLATFORMS
    try:
        reqs = wheelhouse.download(
            dir, kw["have"], python_version=kw["python_version"], profile=kw["profile"], platforms=platforms
        )
        print(f"{len(reqs)} wheels in {dir}: {' '.join(reqs)}")
        print(f"wheelhouse size: {sum(f.stat().st_size for f in Path(dir).glob('*.whl')) / 2**20:.1f} MiB")
        print(
            "on the host: python3 -m pip install --no-index --no-deps "
            f"{dir}/*.whl   (or: perfkit wheelhouse install {dir})"
        )
    except _ERRORS as exc:
        done(fail(str(exc), prefix="error"))
    done(EXIT_OK)


@wheelhouse_group.command("install", epilog=EXIT_CODES)
@click.argument("dir")
@click.option("--target", default=None, help="install into this folder (then add it to PYTHONPATH)")
def wheelhouse_install_command(dir: str, target: str | None) -> None:  # noqa: A002
    """Install a wheelhouse offline (on the host)."""
    from perfkit import wheelhouse

    try:
        wheelhouse.install(dir, target)
    except _ERRORS as exc:
        done(fail(str(exc), prefix="error"))
    done(EXIT_OK)
