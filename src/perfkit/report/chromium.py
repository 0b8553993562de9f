"""Headless Chromium: a PNG screenshot of a report page (:func:`screenshot`)."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

from perfkit.engine.owner import run_bounded

log = logging.getLogger(__name__)


CHROMIUM_FLAGS = (
    "--headless --no-sandbox --disable-gpu --disable-background-networking --disable-component-update "
    "--disable-sync --disable-quic --no-first-run --hide-scrollbars --disable-extensions"
).split()


def chromium_binary() -> str | None:
    """Path of a Chromium/Chrome binary (``$PERFKIT_CHROMIUM`` first), or None."""
    for name in (os.environ.get("PERFKIT_CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def screenshot(
    html_path: str | Path,
    png_path: str | Path,
    *,
    width: int = 1280,
    height: int = 2400,
    timeout_s: float = 90,
) -> Path:
    """Save a PNG of the page with headless Chromium. Raises RuntimeError when it cannot."""
    exe = chromium_binary()
    if exe is None:
        raise RuntimeError("chromium not found")
    png = Path(png_path).resolve()
    with tempfile.TemporaryDirectory(prefix="perfkit-chromium-") as prof:
        cmd = [
            exe,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={prof}",
            f"--window-size={width},{height}",
            f"--screenshot={png}",
            Path(html_path).resolve().as_uri(),
        ]
        proc = run_bounded(cmd, timeout_s, capture_output=True, text=True)  # its helpers too
    if not png.exists():
        raise RuntimeError(f"chromium wrote no screenshot (exit {proc.returncode}): {proc.stderr[-500:]}")
    return png
