"""What an engine spec's fields turn into: normalised field input, the reference engine's argv,
the checks that what a spec names exists, and the package versions in the engine's own Python.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: the reference engine's components with their own offload mode (``--offload-<component>``)
OFFLOAD_COMPONENTS = ("transformer", "text_encoder", "vae")


def argv_list(v: Any) -> Any:
    """An argv field's input: a string split like a shell would, numbers in a list as strings."""
    if isinstance(v, str):
        return shlex.split(v)
    if isinstance(v, (list, tuple)):
        return [str(a) if isinstance(a, (int, float)) and not isinstance(a, bool) else a for a in v]
    return v


def env_strings(v: Any) -> Any:
    """An ``env`` field's input: scalar keys and values as strings (YAML reads ``1`` as an int)."""
    if not isinstance(v, Mapping):
        return v
    scalar = (str, int, float, bool)
    return {
        (str(k) if isinstance(k, scalar) else k): (str(x) if isinstance(x, scalar) else x)
        for k, x in v.items()
    }


def percent_map(v: Any) -> Any:
    """A name -> percent mapping's input: ``"30%"``, ``"30"``, ``30`` -> ``30.0``; ValueError naming it."""
    if not isinstance(v, Mapping):
        return v
    out: dict[Any, Any] = {}
    for k, x in v.items():
        if isinstance(x, str):
            try:
                x = float(x.strip().rstrip("%"))
            except ValueError:
                raise ValueError(f"{k}: expected a percent like 30 or '30%', got {x!r}") from None
        elif isinstance(x, int) and not isinstance(x, bool):
            x = float(x)
        out[k] = x
    return out


def reference_argv(spec: Any, port: int, d: str) -> list[str]:
    """``python -m perfkit.refengine ...``: each set field as its flag, ``extra_args`` last."""

    def valued(*names: str) -> list[str]:
        return [
            x
            for n in names
            if (v := getattr(spec, n)) is not None
            for x in (f"--{n.replace('_', '-')}", str(v))
        ]

    def on(*names: str) -> list[str]:
        return [f"--{n.replace('_', '-')}" for n in names if getattr(spec, n)]

    argv = [sys.executable, "-m", "perfkit.refengine", "--preset", spec.preset, "--host", spec.host]
    argv += ["--port", str(port), "--perf-log-dir", d, *valued("model_path")]
    if spec.compile:
        argv += ["--compile", "--compile-backend", spec.compile_backend]
    argv += on("compile_vae") + valued("recompile_limit") + on("two_stage")
    argv += ["--warmup-frames", str(0 if spec.warmup_mode == "off" else spec.warmup_frames)]
    argv += valued(
        "warmup_resolution", "warmup_steps", "height", "width", "steps", "dtype", "device", "num_gpus"
    )
    argv += valued("cpu_threads") + on("keep_outputs")
    if spec.debug_leak_mib > 0:
        argv += valued("debug_leak_mib")
    if spec.memory_snapshot_after:
        argv += ["--memory-snapshot-after", ",".join(map(str, sorted(set(spec.memory_snapshot_after))))]
        argv += ["--memory-snapshot-entries", str(spec.memory_snapshot_entries)]
    for stage, pct in spec.debug_stage_delay.items():
        argv += ["--debug-stage-delay", f"{stage}={pct:g}%"]
    if spec.debug_stage_delay and spec.debug_stage_delay_from:
        argv += ["--debug-stage-delay-from", str(spec.debug_stage_delay_from)]
    argv += valued("max_frames", "offload")
    for comp in OFFLOAD_COMPONENTS:
        if comp in spec.offload_components:
            argv += [f"--offload-{comp.replace('_', '-')}", spec.offload_components[comp]]
    return argv + list(spec.extra_args)


def check_model_path(spec: Any) -> None:
    """A reference spec's ``model_path`` that is not a hub id must exist (FileNotFoundError)."""
    model_path = spec.model_path
    if model_path is not None and not Path(model_path).expanduser().exists() and not _is_hub_id(model_path):
        raise FileNotFoundError(f"EngineSpec.model_path: {model_path!r} does not exist")


def check_sglang(spec: Any) -> None:
    """An sglang spec's executable must be on PATH (its ``-m`` module importable) and a
    ``model_path`` not a hub id must exist; FileNotFoundError naming the field."""
    executable, model_path = spec.executable, spec.model_path
    exe = executable[0]
    if shutil.which(exe) is None:
        where = "does not exist or is not executable" if os.sep in exe else "is not on PATH"
        raise FileNotFoundError(
            f"EngineSpec.executable: {exe!r} {where} (kind 'sglang'); install sglang "
            f"(`make sglang-env` builds .sglang-venv/bin/sglang; or pip install "
            f"'sglang[diffusion]') or set executable to an sglang environment's "
            f"['<venv>/bin/python', '-m', 'sglang.cli.main']"
        )
    module = executable[2] if len(executable) >= 3 and executable[1] == "-m" else None
    if module is not None and not _module_importable(shutil.which(exe) or exe, module):
        raise FileNotFoundError(
            f"EngineSpec.executable: {' '.join(executable)!r}: module {module!r} "
            f"cannot be imported by {exe} (kind 'sglang'); install sglang into that "
            f"Python (pip install 'sglang[diffusion]') or point executable elsewhere"
        )
    if not _is_hub_id(model_path) and not Path(model_path).expanduser().exists():
        raise FileNotFoundError(
            f"EngineSpec.model_path: {model_path!r} does not exist (kind 'sglang' needs a local "
            f"model directory or a hub id 'org/name')"
        )


def check_command(spec: Any) -> None:
    """A command spec's program (unless a placeholder) must be found (FileNotFoundError)."""
    exe = spec.command_template[0]
    if "{" not in exe and shutil.which(exe) is None:
        raise FileNotFoundError(f"EngineSpec.command: program {exe!r} not found")


def _module_importable(python: str, module: str) -> bool:
    """Whether ``python`` locates ``module``'s top-level package (without importing it)."""
    import importlib.util
    import subprocess

    from perfkit.engine.owner import run_bounded

    top = module.split(".")[0]
    try:
        same = Path(python).resolve() == Path(sys.executable).resolve()
    except OSError:
        same = False
    if same:
        return importlib.util.find_spec(top) is not None
    code = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({top!r}) is None)"
    try:
        r = run_bounded([python, "-c", code], 60, capture_output=True)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def _is_hub_id(s: str) -> bool:
    if not s or s.startswith(("/", ".", "~")) or Path(s).exists():
        return False
    return re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", s) is not None


#: the distributions whose versions :func:`engine_versions` reads in the engine's Python
ENGINE_PACKAGES = ("sglang", "torch", "diffusers", "transformers")


def engine_python(command: list[str]) -> str | None:
    """The Python an engine command runs in: a ``python*`` first item, else its ``#!`` line's; or None."""
    exe = shutil.which(command[0]) if command else None
    if exe is None:
        return None
    if Path(exe).name.startswith("python"):
        return exe
    try:
        with open(exe, "rb") as f:
            first = f.readline(512).decode("utf-8", "replace").strip()
    except OSError:
        return None
    if first.startswith("#!"):
        words = first[2:].split()
        if words and Path(words[0]).name.startswith("python"):
            return words[0]
    return None


def engine_versions(command: list[str], timeout_s: float = 30.0) -> dict[str, Any]:
    """``{"python": path, "sglang": "0.5.23", ...}`` (None: not installed) from the metadata of the
    Python an engine command runs in, or with ``"error": why`` when unknown or failed."""
    import json
    import subprocess

    from perfkit.engine.owner import run_bounded

    py = engine_python(command)
    if py is None:
        return {"error": f"no Python interpreter found for {command[:1]}"}
    code = (
        "import importlib.metadata as m, json\n"
        "def v(p):\n"
        "    try: return m.version(p)\n"
        "    except m.PackageNotFoundError: return None\n"
        f"print(json.dumps({{p: v(p) for p in {list(ENGINE_PACKAGES)!r}}}))"
    )
    try:
        r = run_bounded([py, "-c", code], timeout_s, capture_output=True, text=True)
        out = json.loads(r.stdout) if r.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError) as exc:
        return {"python": py, "error": f"version query failed: {exc!r}"}
    if not isinstance(out, dict):
        return {"python": py, "error": f"version query exited {r.returncode}: {r.stderr[-300:]}"}
    return {"python": py, **out}
