"""What the engine really ran: its effective config as the engine reports it (the reference
engine's records, sglang's ``server_args`` startup line), else ``not reported``; never filled in
from the spec that asked. Sources: docs/sglang.md, "Readers".
"""

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
    """The engine's effective config (one launch); ``None``: the engine did not report it.
    ``config_source``: ``engine record``, ``engine log (server_args JSON)``, ``engine log
    (ServerArgs repr)`` or ``not reported``; ``compile_requested`` as the engine understood its
    flags, ``compile_disabled_reason`` why compile was asked but is not active; ``offload``
    component -> mode as ``"transformer=none, vae=model"``; ``device`` ``cuda:0``/``cpu``."""

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
    """The effective config in a reference-engine record's ``perfkit`` object (older records:
    ``compile`` for ``compile_active``), or None when it carries none."""
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


# sglang's ServerArgs line (docs/sglang.md, "Readers"): found with str methods; the repr's field
# pattern never backtracks (docs/robustness.md, "Input limits").
_ARGS_TAG = "server_args"
_ARGS_OPEN = "ServerArgs("
_FIELD = re.compile(r"(?<!\w)(?P<key>\w++)=(?P<val>'[^']*+'|\"[^\"]*+\"|[\w.+-]++)")
_REPR_WORDS = {"True": True, "False": False, "None": None}
# component -> the ServerArgs flag that offloads it to the CPU (server_args.py)
_OFFLOAD_FLAGS = (
    ("transformer", "dit_cpu_offload"),
    ("text_encoder", "text_encoder_cpu_offload"),
    ("image_encoder", "image_encoder_cpu_offload"),
    ("vae", "vae_cpu_offload"),
)
# what sglang logs beside its args: the attention backend it picked (layers/attention/selector.py),
# the device (distributed/parallel_state.py), the weights dtype (transformer_loader.py; the
# diffusers backend: pipelines/diffusers_pipeline.py)
_PICKED_ATTENTION = re.compile(r"Using (\w++) attention backend")
_DEVICE = re.compile(r"Initializing distributed environment with world_size=\d++, device=([\w:]++)")
_DTYPE = re.compile(r"(?:param_dtype: |Loading diffusers pipeline with dtype=)(?:torch\.)?(\w++)")


def server_args(text: str) -> tuple[dict[str, Any], str] | None:
    """sglang's logged ServerArgs: (name -> value, its form), or None when the log has none.

    The form is ``"server_args JSON"`` (sglang 0.5.23's line) or ``"ServerArgs repr"`` (its
    fallback, and older sglang's ``server_args=ServerArgs(...)``; scalar fields only:
    ``True``/``False``/``None``, quoted strings, else the text). The last such line wins (a
    restart logs again); a JSON line that does not parse is skipped with a warning.
    """
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
    """The effective config from an sglang log (:func:`server_args` and the startup lines beside
    it), or None when it logged no ServerArgs. ``enable_torch_compile`` is what sglang runs (it
    logs its args after adjusting them; what was asked is not logged: compile_requested None); a
    null ``attention_backend`` is named with the pick sglang logged."""
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
    """The launch's effective config: :func:`from_record`, else :func:`from_sglang_log` of its
    logs, else :data:`NOT_REPORTED` with every field None."""
    cfg = from_record(record_perfkit) if record_perfkit else None
    if cfg is not None:
        return cfg
    for text in logs.values():
        cfg = from_sglang_log(text)
        if cfg is not None:
            return cfg
    return EngineConfig()
