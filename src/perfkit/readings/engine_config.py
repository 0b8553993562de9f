"""What the engine really ran: its effective config, as the engine itself reports it.

perfkit asks an engine for a config (compile, offload, dtype, ...) but the engine decides: the
reference engine drops torch.compile when the transformer is offloaded, sglang may fall back to
another attention backend. The bundle records what the engine *reports*, never what was asked:

- the reference engine writes its effective config into every ``performance.log`` record
  (``perfkit.compile_active``, ``compile_disabled_reason``, ``attention_backend``, ...);
- sglang logs its ``ServerArgs`` at startup (``server_args=ServerArgs(...)``); what can be read
  from that line is taken from there (source ``engine log``);
- anything else is ``not reported``.

Every field here is either the engine's value or absent (``None``): nothing is filled in from
the spec that asked for it.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any, Mapping

__all__ = ["EngineConfig", "NOT_REPORTED", "from_record", "from_sglang_log", "effective_config"]

#: ``config_source`` when the engine reported nothing readable
NOT_REPORTED = "not reported"


@dataclass(frozen=True)
class EngineConfig:
    """The engine's effective config (one launch). ``None``: the engine did not report it.

    Attributes:
        config_source: ``engine record`` (performance.log), ``engine log`` (startup log line) or
            ``not reported``.
        compile_requested: torch.compile was asked for (as the engine understood its flags).
        compile_active: torch.compile is in force for the denoiser.
        compile_backend: torch.compile backend in force (``inductor``, ...).
        compile_disabled_reason: the engine's reason when compile was asked but not active.
        recompile_limit: torch._dynamo's recompile limit in force.
        attention_backend: attention implementation (diffusers' dispatch name, sglang's flag).
        dtype: weights dtype (``bfloat16``, ...).
        offload: component -> offload mode (``none``, ``model``, ``group-block``, ...), as
            ``"transformer=none, vae=model"``.
        device: the engine's device (``cuda:0``, ``cpu``).
    """

    config_source: str = NOT_REPORTED
    compile_requested: bool | None = None
    compile_active: bool | None = None
    compile_backend: str | None = None
    compile_disabled_reason: str | None = None
    recompile_limit: int | None = None
    attention_backend: str | None = None
    dtype: str | None = None
    offload: str | None = None
    device: str | None = None

    def to_row(self) -> dict[str, Any]:
        """The ``launches`` table columns (see :mod:`perfkit.bundle_schema`)."""
        return asdict(self)


def _offload_text(value: Any) -> str | None:
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={v}" for k, v in sorted(value.items())) or None
    return str(value) if value is not None else None


def _opt_bool(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _opt_int(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def _opt_str(value: Any) -> str | None:
    return str(value) if value not in (None, "") else None


def from_record(perfkit: Mapping[str, Any]) -> EngineConfig | None:
    """The effective config in a reference-engine record's ``perfkit`` object, or None when
    the record carries none (an older engine, another engine).

    Keys read: ``compile_requested``, ``compile_active`` (older records: ``compile``),
    ``compile_backend``, ``compile_disabled_reason``, ``recompile_limit``,
    ``attention_backend``, ``dtype``, ``offload`` (component -> mode), ``device``.
    """
    if "compile_active" not in perfkit and "compile" not in perfkit:
        return None
    active = perfkit.get("compile_active", perfkit.get("compile"))
    return EngineConfig(
        config_source="engine record",
        compile_requested=_opt_bool(perfkit.get("compile_requested")),
        compile_active=_opt_bool(active),
        compile_backend=_opt_str(perfkit.get("compile_backend")),
        compile_disabled_reason=_opt_str(perfkit.get("compile_disabled_reason")),
        recompile_limit=_opt_int(perfkit.get("recompile_limit")),
        attention_backend=_opt_str(perfkit.get("attention_backend")),
        dtype=_opt_str(perfkit.get("dtype")),
        offload=_offload_text(perfkit.get("offload")),
        device=_opt_str(perfkit.get("device")),
    )


# sglang prints its dataclass ServerArgs at startup: ``server_args=ServerArgs(model_path=...,
# enable_torch_compile=True, attention_backend='fa3', ...)`` (sglang/srt and multimodal_gen alike)
# Linear on any log (docs/DESIGN.md, "Input limits"): lines are found with str methods, and the
# field pattern starts only at the start of a word and never backtracks (possessive repeats).
_ARGS_OPEN = "ServerArgs("
_FIELD = re.compile(r"(?<!\w)(?P<key>\w++)=(?P<val>'[^']*+'|\"[^\"]*+\"|[\w.+-]++)")
_SGLANG_KEYS = {
    "enable_torch_compile": "compile_active",
    "attention_backend": "attention_backend",
    "dtype": "dtype",
    "dit_cpu_offload": "offload",
}


def from_sglang_log(text: str) -> EngineConfig | None:
    """The effective config from sglang's startup ``ServerArgs(...)`` log line, or None when the
    log has no such line. Only the keys present are filled: ``enable_torch_compile`` →
    compile_active, ``attention_backend``, ``dtype``, ``dit_cpu_offload`` → offload of the DiT.
    """
    body = None
    for line in text.splitlines():  # the last ServerArgs line (a restart logs again)
        i = line.find(_ARGS_OPEN)
        end = len(line.rstrip())
        if i >= 0 and end > i + len(_ARGS_OPEN) and line[end - 1] == ")":
            body = line[i + len(_ARGS_OPEN) : end - 1]
    if body is None:
        return None
    found: dict[str, str] = {}
    for f in _FIELD.finditer(body):
        found[f.group("key")] = f.group("val").strip("'\"")
    if not any(k in found for k in _SGLANG_KEYS):
        return None

    def flag(key: str) -> bool | None:
        v = found.get(key)
        return {"True": True, "False": False}.get(v) if v is not None else None

    offload = flag("dit_cpu_offload")
    return EngineConfig(
        config_source="engine log",
        compile_active=flag("enable_torch_compile"),
        attention_backend=None
        if found.get("attention_backend") in (None, "None")
        else found["attention_backend"],
        dtype=_opt_str(found.get("dtype")),
        offload=None if offload is None else f"transformer={'cpu' if offload else 'none'}",
    )


def effective_config(record_perfkit: Mapping[str, Any] | None, logs: Mapping[str, str]) -> EngineConfig:
    """The launch's effective config: from its records first, else from its logs (sglang's
    ServerArgs line), else :data:`NOT_REPORTED` with every field None."""
    if record_perfkit:
        cfg = from_record(record_perfkit)
        if cfg is not None:
            return cfg
    for text in logs.values():
        cfg = from_sglang_log(text)
        if cfg is not None:
            return cfg
    return EngineConfig()
