"""EngineSpec: how to start an engine (the reference engine, sglang's server, any command) and reach it.

Three kinds:

- ``reference``: perfkit's own engine, ``python -m perfkit.refengine`` with typed options.
- ``sglang``: ``<executable> serve --model-path M --port P --host H --num-gpus N``, then the
  startup warmup and compile settings mapped to sglang's flags (below), then ``server_args`` and
  ``extra_args``. ``executable`` is ``["sglang"]`` (the console script) or the ``python -m``
  form ``[sys.executable, "-m", "sglang.cli.main"]`` (``sglang.cli.main`` is the module behind
  the console script). Its environment turns on sglang's per-request records
  (``SGLANG_DIFFUSION_STAGE_LOGGING=1``, ``SGLANG_PERF_LOG_DIR=<perf_log_dir>``); memory caps
  add ``SGLANG_DIFFUSION_TEST_CAP_DEVICE_MEMORY_GIB`` / ``..._FORCE_HOST_AVAILABLE_GIB``
  (:meth:`perfkit.engine.caps.MemoryCaps.env`). Ready when ``GET /health`` answers 200.

  Flags checked against sglang 0.5.23: its diffusion parser (``sglang/multimodal_gen/runtime/
  server_args/server_args.py``), ``sglang serve --model-type diffusion --help``, and argvs built
  here parsed by that parser with no unknown argument (a throwaway venv, not a dependency of
  perfkit or its tests). In that version ``sglang serve``
  warms up with one synthetic request at startup (``--warmup-mode server``, video frames capped
  at 17, 25 for multi-GPU LTX-2 two-stage):

  ==============================  ==========================================================
  EngineSpec                      sglang serve
  ==============================  ==========================================================
  ``warmup_frames=0``             ``--warmup-mode off``
  ``warmup_frames=N`` (N != 17)   ``--warmup-num-frames N`` (17, the default, adds nothing:
                                  sglang's own frame choice stays)
  ``warmup_resolution="HxW"``     ``--warmup-resolutions WxH`` (sglang writes width first)
  ``warmup_steps=N``              ``--warmup-steps N``
  ``warmup_mode``                 ``--warmup-mode off|request|server``
  ``compile=True``                ``--enable-torch-compile``
  ==============================  ==========================================================

  Offload, parallelism and pipeline flags go in ``server_args`` as sglang spells them, e.g.
  ``[--dit-layerwise-offload, --text-encoder-cpu-offload, --vae-cpu-offload, --pin-cpu-memory,
  --pipeline-class-name, LTX2TwoStagePipeline, --ulysses-degree, "2"]``.
- ``command``: any argv (``command``), with ``{port}``, ``{host}`` and ``{perf_log_dir}``
  placeholders substituted at launch.

A spec is data: :meth:`EngineSpec.command` gives the exact argv, :meth:`EngineSpec.env_for` the
environment additions, :meth:`EngineSpec.to_dict`/:meth:`EngineSpec.from_dict` round-trip it
through params YAML. Validation errors name the field, e.g.
``EngineSpec.warmup_frames must be >= 0, got -1``.

Note: the argv template of the ``command`` kind lives in the field ``command_template`` (the name
``command`` is the method); :meth:`from_dict` accepts the key ``command`` for it.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KINDS = ("reference", "sglang", "command")
#: Startup warmup modes (sglang's ``--warmup-mode`` choices).
WARMUP_MODES = ("off", "request", "server")
#: The default ``warmup_frames``; for kind ``sglang`` it adds no flag (sglang's own default).
DEFAULT_WARMUP_FRAMES = 17

_RESOLUTION = re.compile(r"^\d+x\d+$")


def _err(name: str, msg: str) -> ValueError:
    return ValueError(f"EngineSpec.{name} {msg}")


@dataclass
class EngineSpec:
    """How to start one engine.

    Attributes (reference kind):
        preset: reference engine preset (``tiny`` by default).
        model_path: local model directory (reference: optional; sglang: required, a local path or
            a hub id ``org/name``).
        compile, compile_backend, compile_vae: torch.compile the transformer (and the VAE).
        two_stage: run the two-stage (upsample + refinement) pipeline.
        warmup_frames: frames of the startup warmup (17 -> 3 latent frames); 0 disables it.
        warmup_resolution: ``"HxW"`` of the startup warmup (None: the serving default).
        warmup_steps: denoising steps of the startup warmup (None: the engine's default).
        warmup_mode: ``off``, ``server`` (a synthetic warmup request at startup) or, sglang only,
            ``request`` (warm on the first real requests); None: the engine's default.
        height, width, steps: serving defaults (None: the engine's own).
        dtype, device: torch dtype / device strings (None: the engine's default).
        num_gpus: GPUs to use.
        keep_outputs: keep generated videos on disk.
        debug_leak_mib: the reference engine leaks this many MiB per request (tests of leak checks).
        max_frames: refuse requests above this many frames.

    Attributes (sglang kind):
        executable: argv prefix that runs sglang (``["sglang"]``; e.g.
            ``[sys.executable, "-m", "sglang.cli.main"]``).
        server_args: extra ``sglang serve`` arguments (offload, parallelism, pipeline class, ...).
        model_path, num_gpus, warmup_*, compile: mapped as in the module doc.

    Attributes (command kind):
        command_template: argv with ``{port}``, ``{host}``, ``{perf_log_dir}`` placeholders
            (key ``command`` in :meth:`from_dict`).

    Common:
        extra_args: appended to the argv of every kind (placeholders substituted).
        env: extra environment (values may use ``{perf_log_dir}``/``{port}``/``{host}``).
        health_path: ready when ``GET health_path`` answers 200.
        host: address the engine binds and perfkit reaches.
        port: fixed port (None: a free one is picked at launch).
        startup_timeout_s: how long launch waits for health.
        share_compile_cache: share compile caches between the launches of one run directory
            instead of giving each launch its own.
    """

    kind: str = "reference"
    # reference engine
    preset: str = "tiny"
    model_path: str | None = None
    compile: bool = False
    compile_backend: str = "inductor"
    compile_vae: bool = False
    two_stage: bool = False
    warmup_frames: int = 17
    warmup_resolution: str | None = None
    warmup_steps: int | None = None
    warmup_mode: str | None = None
    height: int | None = None
    width: int | None = None
    steps: int | None = None
    dtype: str | None = None
    device: str | None = None
    num_gpus: int = 1
    keep_outputs: bool = False
    debug_leak_mib: int = 0
    max_frames: int | None = None
    # sglang
    executable: list[str] = field(default_factory=lambda: ["sglang"])
    server_args: list[str] = field(default_factory=list)
    # command
    command_template: list[str] | None = None
    # common
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    health_path: str = "/health"
    host: str = "127.0.0.1"
    port: int | None = None
    startup_timeout_s: float = 600.0
    share_compile_cache: bool = False

    def __post_init__(self) -> None:
        self.validate()

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        """Check every field; raises ValueError naming the first bad field."""
        if self.kind not in KINDS:
            raise _err("kind", f"must be one of {', '.join(KINDS)}, got {self.kind!r}")
        for name in ("compile", "compile_vae", "two_stage", "keep_outputs", "share_compile_cache"):
            v = getattr(self, name)
            if not isinstance(v, bool):
                raise _err(name, f"must be a bool, got {v!r}")
        for name, lo in (("warmup_frames", 0), ("num_gpus", 1), ("debug_leak_mib", 0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise _err(name, f"must be an int, got {v!r}")
            if v < lo:
                raise _err(name, f"must be >= {lo}, got {v}")
        for name in ("height", "width", "steps", "max_frames", "warmup_steps"):
            v = getattr(self, name)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int):
                raise _err(name, f"must be an int or None, got {v!r}")
            if v < 1:
                raise _err(name, f"must be >= 1, got {v}")
        if self.port is not None:
            if isinstance(self.port, bool) or not isinstance(self.port, int) or not 1 <= self.port <= 65535:
                raise _err("port", f"must be an int in 1..65535 or None, got {self.port!r}")
        if self.warmup_resolution is not None and not (
            isinstance(self.warmup_resolution, str) and _RESOLUTION.match(self.warmup_resolution)
        ):
            raise _err("warmup_resolution", f"must look like '64x64', got {self.warmup_resolution!r}")
        for name in ("preset", "compile_backend", "health_path", "host"):
            v = getattr(self, name)
            if not isinstance(v, str) or not v:
                raise _err(name, f"must be a non-empty string, got {v!r}")
        if not self.health_path.startswith("/"):
            raise _err("health_path", f"must start with '/', got {self.health_path!r}")
        if self.warmup_mode is not None and self.warmup_mode not in WARMUP_MODES:
            raise _err(
                "warmup_mode", f"must be one of {', '.join(WARMUP_MODES)} or None, got {self.warmup_mode!r}"
            )
        if self.warmup_mode == "request" and self.kind == "reference":
            raise _err("warmup_mode", "'request' is only supported by kind 'sglang'")
        if self.warmup_frames == 0 and self.warmup_mode not in (None, "off"):
            raise _err(
                "warmup_mode",
                f"{self.warmup_mode!r} contradicts warmup_frames=0 (which turns the startup warmup off)",
            )
        for name in ("model_path", "dtype", "device"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, str) or not v):
                raise _err(name, f"must be a non-empty string or None, got {v!r}")
        try:
            timeout = float(self.startup_timeout_s)
        except (TypeError, ValueError):
            raise _err("startup_timeout_s", f"must be a number, got {self.startup_timeout_s!r}") from None
        if not timeout > 0:
            raise _err("startup_timeout_s", f"must be > 0, got {self.startup_timeout_s!r}")
        for name in ("executable", "server_args", "extra_args"):
            v = getattr(self, name)
            if not isinstance(v, list) or not all(isinstance(a, str) for a in v):
                raise _err(name, f"must be a list of strings, got {v!r}")
        if not self.executable:
            raise _err("executable", "must not be empty")
        if not isinstance(self.env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.env.items()
        ):
            raise _err("env", f"must map strings to strings, got {self.env!r}")
        if self.command_template is not None and (
            not isinstance(self.command_template, list)
            or not all(isinstance(a, str) for a in self.command_template)
        ):
            raise _err("command", f"must be a list of strings, got {self.command_template!r}")
        if self.kind == "command" and not self.command_template:
            raise _err("command", "is required (a non-empty argv list) for kind 'command'")
        if self.kind == "sglang" and not self.model_path:
            raise _err("model_path", "is required for kind 'sglang'")

    def check(self) -> None:
        """Checks that need the host, run before any launch.

        For ``sglang``: the executable must be on PATH and a local-looking ``model_path`` must
        exist (a bare hub id ``org/name`` that is not a local directory is accepted). For
        ``command``: the program must be found. Raises FileNotFoundError with a clear message.
        """
        self.validate()
        if self.kind == "sglang":
            exe = self.executable[0]
            if _which(exe) is None:
                raise FileNotFoundError(
                    f"EngineSpec.executable: {exe!r} is not on PATH (kind 'sglang'); install sglang "
                    f"(pip install 'sglang[diffusion]') or set executable, e.g. "
                    f"[{sys.executable!r}, '-m', 'sglang.cli.main']"
                )
            module = _module_of(self.executable)
            if module is not None and not _module_importable(_which(exe) or exe, module):
                raise FileNotFoundError(
                    f"EngineSpec.executable: {' '.join(self.executable)!r}: module {module!r} "
                    f"cannot be imported by {exe} (kind 'sglang'); install sglang into that "
                    f"Python (pip install 'sglang[diffusion]') or point executable elsewhere"
                )
            mp = self.model_path or ""
            if not _is_hub_id(mp) and not Path(mp).expanduser().exists():
                raise FileNotFoundError(
                    f"EngineSpec.model_path: {mp!r} does not exist (kind 'sglang' needs a local "
                    f"model directory or a hub id 'org/name')"
                )
        elif self.kind == "command":
            exe = (self.command_template or [""])[0]
            if "{" not in exe and _which(exe) is None:
                raise FileNotFoundError(f"EngineSpec.command: program {exe!r} not found")
        elif self.kind == "reference" and self.model_path is not None:
            if not Path(self.model_path).expanduser().exists() and not _is_hub_id(self.model_path):
                raise FileNotFoundError(f"EngineSpec.model_path: {self.model_path!r} does not exist")

    # ------------------------------------------------------------------ argv / env
    def command(self, port: int, perf_log_dir: str | Path) -> list[str]:
        """The exact argv to start this engine on ``port``, writing records to ``perf_log_dir``."""
        d = str(perf_log_dir)
        if self.kind == "reference":
            argv = [
                sys.executable,
                "-m",
                "perfkit.refengine",
                "--preset",
                self.preset,
                "--host",
                self.host,
                "--port",
                str(port),
                "--perf-log-dir",
                d,
            ]
            if self.model_path:
                argv += ["--model-path", self.model_path]
            if self.compile:
                argv += ["--compile", "--compile-backend", self.compile_backend]
            if self.compile_vae:
                argv += ["--compile-vae"]
            if self.two_stage:
                argv += ["--two-stage"]
            frames = 0 if self.warmup_mode == "off" else self.warmup_frames
            argv += ["--warmup-frames", str(frames)]
            if self.warmup_resolution:
                argv += ["--warmup-resolution", self.warmup_resolution]
            if self.warmup_steps is not None:
                argv += ["--warmup-steps", str(self.warmup_steps)]
            for name in ("height", "width", "steps"):
                v = getattr(self, name)
                if v is not None:
                    argv += [f"--{name}", str(v)]
            if self.dtype:
                argv += ["--dtype", self.dtype]
            if self.device:
                argv += ["--device", self.device]
            argv += ["--num-gpus", str(self.num_gpus)]
            if self.keep_outputs:
                argv += ["--keep-outputs"]
            if self.debug_leak_mib > 0:
                argv += ["--debug-leak-mib", str(self.debug_leak_mib)]
            if self.max_frames is not None:
                argv += ["--max-frames", str(self.max_frames)]
            tail = list(self.extra_args)
        elif self.kind == "sglang":
            argv = list(self.executable) + [
                "serve",
                "--model-path",
                str(self.model_path),
                "--port",
                str(port),
                "--host",
                self.host,
                "--num-gpus",
                str(self.num_gpus),
            ]
            argv += self.sglang_warmup_args()
            if self.compile:
                argv += ["--enable-torch-compile"]
            tail = list(self.server_args) + list(self.extra_args)
        else:
            argv = list(self.command_template or [])
            tail = list(self.extra_args)
        return [self._subst(a, port, d) for a in argv + tail]

    def sglang_warmup_args(self) -> list[str]:
        """``sglang serve`` flags for the startup warmup settings (see the module doc)."""
        out: list[str] = []
        mode = "off" if self.warmup_frames == 0 else self.warmup_mode
        if mode is not None:
            out += ["--warmup-mode", mode]
        if self.warmup_frames not in (0, DEFAULT_WARMUP_FRAMES):
            out += ["--warmup-num-frames", str(self.warmup_frames)]
        if self.warmup_resolution:
            h, w = self.warmup_resolution.split("x")
            out += ["--warmup-resolutions", f"{w}x{h}"]
        if self.warmup_steps is not None:
            out += ["--warmup-steps", str(self.warmup_steps)]
        return out

    def startup_warmup_frames(self) -> int | None:
        """Frames of the synthetic startup warmup this spec asks for: 0 when off (or, sglang,
        warmed on requests), None for kind ``command`` (unknown)."""
        if self.kind == "command":
            return None
        if self.warmup_mode in ("off", "request"):
            return 0
        return self.warmup_frames

    def env_for(self, perf_log_dir: str | Path, port: int | None = None) -> dict[str, str]:
        """Environment additions for a launch (``spec.env`` included, placeholders substituted).

        Every kind gets ``PERFKIT_PERF_LOG_DIR``; ``sglang`` and ``command`` kinds also get
        ``SGLANG_DIFFUSION_STAGE_LOGGING=1`` and ``SGLANG_PERF_LOG_DIR``.
        """
        d = str(perf_log_dir)
        out = {"PERFKIT_PERF_LOG_DIR": d}
        if self.kind in ("sglang", "command"):
            out["SGLANG_DIFFUSION_STAGE_LOGGING"] = "1"
            out["SGLANG_PERF_LOG_DIR"] = d
        for k, v in self.env.items():
            out[k] = self._subst(v, port, d)
        return out

    def command_str(self, port: int, perf_log_dir: str | Path) -> str:
        """The argv as one shell-quoted string (for logs and reports)."""
        return shlex.join(self.command(port, perf_log_dir))

    def _subst(self, s: str, port: int | None, perf_log_dir: str) -> str:
        s = s.replace("{perf_log_dir}", perf_log_dir).replace("{host}", self.host)
        if port is not None:
            s = s.replace("{port}", str(port))
        return s

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict[str, Any]:
        """Plain dict (JSON/YAML-ready); :meth:`from_dict` reads it back."""
        d = dataclasses.asdict(self)
        d["command"] = d.pop("command_template")
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "EngineSpec":
        """Build from a dict (e.g. params YAML).

        Accepts ``command`` (or ``command_template``) for the command kind's argv, and strings for
        list fields (split with shlex). Unknown keys raise ValueError naming them.
        """
        if not isinstance(d, dict):
            raise ValueError(f"EngineSpec.from_dict expects a mapping, got {type(d).__name__}")
        d = dict(d)
        if "command" in d:
            if "command_template" in d and d["command_template"] is not None:
                raise ValueError("EngineSpec: give either 'command' or 'command_template', not both")
            d["command_template"] = d.pop("command")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"EngineSpec: unknown field(s) {', '.join(unknown)}")
        for key in ("executable", "server_args", "extra_args", "command_template"):
            if isinstance(d.get(key), str):
                d[key] = shlex.split(d[key])
            elif isinstance(d.get(key), (list, tuple)):
                d[key] = [str(a) for a in d[key]]
        if isinstance(d.get("env"), dict):
            d["env"] = {str(k): str(v) for k, v in d["env"].items()}
        if d.get("startup_timeout_s") is not None and not isinstance(d["startup_timeout_s"], bool):
            try:
                d["startup_timeout_s"] = float(d["startup_timeout_s"])
            except (TypeError, ValueError):
                raise _err("startup_timeout_s", f"must be a number, got {d['startup_timeout_s']!r}") from None
        return cls(**d)

    def replace(self, **changes: Any) -> "EngineSpec":
        """A validated copy with some fields changed."""
        return dataclasses.replace(self, **changes)


def _which(exe: str) -> str | None:
    if os.sep in exe:
        return exe if os.path.isfile(exe) and os.access(exe, os.X_OK) else None
    return shutil.which(exe)


def _module_of(argv: list[str]) -> str | None:
    """The module of a ``python -m module`` argv prefix, else None."""
    if len(argv) >= 3 and argv[1] == "-m":
        return argv[2]
    return None


def _module_importable(python: str, module: str) -> bool:
    """Whether ``python`` finds the top-level package of ``module`` (not imported: only
    located, so this is quick even for heavy packages)."""
    import importlib.util
    import subprocess

    top = module.split(".")[0]
    try:
        same = Path(python).resolve() == Path(sys.executable).resolve()
    except OSError:
        same = False
    if same:
        return importlib.util.find_spec(top) is not None
    try:
        r = subprocess.run(
            [
                python,
                "-c",
                f"import importlib.util, sys; sys.exit(importlib.util.find_spec({top!r}) is None)",
            ],
            capture_output=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def _is_hub_id(s: str) -> bool:
    """``org/name`` (one slash, no leading ./ ~ /) and not an existing local path."""
    if not s or s.startswith(("/", ".", "~")) or Path(s).exists():
        return False
    return re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", s) is not None
