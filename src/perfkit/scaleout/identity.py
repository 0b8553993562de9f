"""What a part or shard was measured with (:func:`part_identity`: commit, perfkit version,
params, engine, request, engine program, plan) and the differences between them, named
(:func:`identity_problems`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

#: what every part and shard of one merged run must share (see :func:`part_identity`)
IDENTITY_KEYS = ("commit", "perfkit version", "engine spec", "request", "engine program")


def _program(argv: Any) -> str | None:
    """The engine program of an argv: the executable's file name and the tokens before the first
    ``--option`` (``python -m perfkit.refengine``, ``sglang serve``); values and ports, which
    a scenario varies per launch, are left out."""
    if not isinstance(argv, list) or not argv:
        return None
    out = [Path(str(argv[0])).name]
    for tok in argv[1:]:
        if str(tok).startswith("--"):
            break
        out.append(str(tok))
    return " ".join(out)


def _canon(v: Any) -> str:
    return json.dumps(v, sort_keys=True, default=str)


def part_identity(meta: Mapping[str, Any]) -> dict[str, Any]:
    """What a part bundle's ``meta.json`` says it was measured with: ``commit``, ``perfkit
    version``, ``engine spec`` and ``request`` (``meta.params.spec``/``request``: every scenario
    records the unit's engine and request there), ``engine program`` (:func:`_program` of
    each launch's argv, sorted, unique) and ``plan`` (the unit's engine, request and part params
    that :func:`perfkit.scaleout.executor.run_unit` stamped in ``meta.scaleout.planned``, which
    merge compares with the manifest's unit, not across parts)."""
    params = meta.get("params") if isinstance(meta.get("params"), Mapping) else {}
    cmds = meta.get("commands") if isinstance(meta.get("commands"), Mapping) else {}
    so = meta.get("scaleout") if isinstance(meta.get("scaleout"), Mapping) else {}
    return {
        "commit": meta.get("git_commit"),
        "perfkit version": meta.get("perfkit_version"),
        "engine spec": params.get("spec"),
        "request": params.get("request"),
        "engine program": sorted({p for p in map(_program, cmds.values()) if p}),
        "plan": so.get("planned"),
    }


def _differences(a: Any, b: Any, prefix: str = "") -> list[str]:
    """``key: A ≠ B`` for each leaf that differs (at most 5 named)."""
    out: list[str] = []
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        for k in sorted(set(a) | set(b), key=str):
            out += _differences(a.get(k), b.get(k), f"{prefix}.{k}" if prefix else str(k))
    elif _canon(a) != _canon(b):
        out.append(f"{prefix or 'value'} {_short(a)} ≠ {_short(b)}")
    return out


def _short(v: Any) -> str:
    t = _canon(v)
    return t if len(t) <= 60 else t[:57] + "…"


def identity_problems(
    items: list[tuple[str, Mapping[str, Any]]], *, allow_mixed_commits: bool = False
) -> list[str]:
    """Every way the parts or shards in ``items`` (``(name, identity)``, the first the
    reference) differ from the first: one named problem per item and key of
    :data:`IDENTITY_KEYS` (``part cold_warm (shard 2/2, DIR): measured at another commit than
    part X: abc ≠ def``). ``allow_mixed_commits`` accepts other commits (the page then shows each
    part's). A key the reference lacks (None) is not compared; an item lacking what the
    reference has is named."""
    if not items:
        return []
    ref_name, ref = items[0]
    out: list[str] = []
    for name, ident in items[1:]:
        for key in IDENTITY_KEYS:
            if key not in ref or ref[key] in (None, []):
                continue
            if key == "commit" and allow_mixed_commits:
                continue
            got = ident.get(key)
            if got == [] and key == "engine program":
                continue  # a part that launched nothing (it reused a launch, or was refused)
            if got in (None, []):
                out.append(f"{name}: records no {key} ({ref_name} has {_short(ref[key])})")
                continue
            diff = _differences(got, ref[key])
            if diff:
                more = f" (+{len(diff) - 5} more)" if len(diff) > 5 else ""
                hint = " (pass --allow-mixed-commits to merge builds on purpose)" if key == "commit" else ""
                out.append(
                    f"{name}: measured with another {key} than {ref_name}: {'; '.join(diff[:5])}{more}{hint}"
                )
    return out
