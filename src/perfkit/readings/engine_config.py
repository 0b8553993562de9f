"""The engine's effective config as it reports it (reference-engine records, sglang's
``server_args`` line), else ``not reported``, never from the spec. Sources: docs/sglang.md."""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from typing import Any, Mapping

log = logging.getLogger(__name__)

#: ``config_source`` when the engine reported nothing readable
NOT_REPORTED = "not reported"


@dataclass(frozen=True)
class EngineConfig:
    """One launch's effective config; None: not reported. ``config_source``: ``engine record``,
    ``engine log (<form>)`` or ``not reported``; ``offload`` as ``"transformer=none, vae=model"``."""

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


def _offload_text(value: Any) -> str | None:
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={v}" for k, v in sorted(value.items())) or None
    return str(value) if value is not None else None


def _opt_bool(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _opt_str(value: Any) -> str | None:
    return str(value) if value not in (None, "") else None


def from_record(perfkit: Mapping[str, Any]) -> EngineConfig | None:
    """The config in a reference-engine record's ``perfkit`` object, or None when it has none."""
    if "compile_active" not in perfkit and "compile" not in perfkit:
        return None
    limit = perfkit.get("recompile_limit")
    strs = ("compile_backend", "compile_disabled_reason", "attention_backend", "dtype", "device")
    return EngineConfig(
        config_source="engine record",
        compile_requested=_opt_bool(perfkit.get("compile_requested")),
        compile_active=_opt_bool(perfkit.get("compile_active", perfkit.get("compile"))),
        recompile_limit=limit if type(limit) is int else None,
        offload=_offload_text(perfkit.get("offload")),
        **{k: _opt_str(perfkit.get(k)) for k in strs},
    )


# the repr's field pattern never backtracks (docs/robustness.md, "Input limits")
_ARGS_TAG = "server_args"
_ARGS_OPEN = "ServerArgs("
_FIELD = re.compile(r"(?<!\w)(?P<key>\w++)=(?P<val>'[^']*+'|\"[^\"]*+\"|[\w.+-]++)")
_REPR_WORDS = {"True": True, "False": False, "None": None}
# component -> its ServerArgs CPU-offload flag
_OFFLOAD_FLAGS = (
    ("transformer", "dit_cpu_offload"),
    ("text_encoder", "text_encoder_cpu_offload"),
    ("image_encoder", "image_encoder_cpu_offload"),
    ("vae", "vae_cpu_offload"),
)
# sglang's log lines naming its picked attention backend, device and weights dtype
_PICKED_ATTENTION = re.compile(r"Using (\w++) attention backend")
_DEVICE = re.compile(r"Initializing distributed environment with world_size=\d++, device=([\w:]++)")
_DTYPE = re.compile(r"(?:param_dtype: |Loading diffusers pipeline with dtype=)(?:torch\.)?(\w++)")


def server_args(text: str) -> tuple[dict[str, Any], str] | None:
    """sglang's last logged ServerArgs: (name -> value, ``"server_args JSON"`` or ``"ServerArgs
    repr"`` (scalar fields only)), or None. A JSON line that does not parse is skipped, warned."""
    found: tuple[dict[str, Any], str] | None = None
    for line in text.splitlines():
        i = line.find(_ARGS_TAG)
        if i < 0:
            continue
        rest = line[i + len(_ARGS_TAG) :].lstrip(":= ")
        if rest.startswith("{"):
            try:
                args = json.loads(rest)
            except ValueError as exc:
                log.warning("server_args line is not JSON (%s): %.120s", exc, rest)
                continue
            if isinstance(args, dict):
                found = (args, "server_args JSON")
        elif rest.startswith(_ARGS_OPEN) and rest.rstrip().endswith(")"):
            body = rest.rstrip()[len(_ARGS_OPEN) : -1]
            args = {}
            for f in _FIELD.finditer(body):
                val = f.group("val")
                args[f.group("key")] = val[1:-1] if val[:1] in "'\"" else _REPR_WORDS.get(val, val)
            found = (args, "ServerArgs repr")
    return found


def _last(pattern: re.Pattern[str], text: str, marker: str) -> str | None:
    found = [m.group(1) for line in text.splitlines() if marker in line and (m := pattern.search(line))]
    return found[-1] if found else None


def from_sglang_log(text: str) -> EngineConfig | None:
    """The config from an sglang log (:func:`server_args` and the lines beside it), or None when
    it logged no ServerArgs; ``compile_requested`` is not logged (None)."""
    got = server_args(text)
    if got is None:
        return None
    args, form = got
    attention = _opt_str(args.get("attention_backend"))
    if attention is None and "attention_backend" in args:
        picked = _last(_PICKED_ATTENTION, text, "attention backend")
        attention = (
            f"{picked} (sglang's pick: attention_backend null)"
            if picked
            else "not set (attention_backend null: sglang picks per platform; no pick logged)"
        )
    offload = {c: "cpu" if args[k] else "none" for c, k in _OFFLOAD_FLAGS if isinstance(args.get(k), bool)}
    if args.get("dit_layerwise_offload") is True:
        offload["transformer"] = "layerwise"
    dtype = _opt_str(args.get("dtype")) or _last(_DTYPE, text, "dtype")
    return EngineConfig(
        config_source=f"engine log ({form})",
        compile_active=_opt_bool(args.get("enable_torch_compile")),
        attention_backend=attention,
        dtype=dtype,
        offload=_offload_text(offload),
        device=_last(_DEVICE, text, "Initializing distributed environment"),
    )


def effective_config(record_perfkit: Mapping[str, Any] | None, logs: Mapping[str, str]) -> EngineConfig:
    """:func:`from_record`, else :func:`from_sglang_log` of ``logs``, else not reported."""
    cfg = from_record(record_perfkit) if record_perfkit else None
    return cfg or next(filter(None, map(from_sglang_log, logs.values())), EngineConfig())
