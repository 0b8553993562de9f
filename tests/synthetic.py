"""Synthetic ResultBundles (the documented tables and results) for report/suite/CLI tests.

``make_run(dir)`` writes ``dir/<investigation>/`` bundles for the three investigations, so the suite
can replay them (``perfkit suite --replay dir``) without launching an engine.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pandas as pd

from perfkit.bundle import ResultBundle

STAGES = [
    ("TextEncodingStage", 20.0),
    ("LatentPreparationStage", 2.0),
    ("DenoisingStage", 200.0),
    ("DecodingStage", 60.0),
]
_ids = itertools.count()


def _session(
    launch: str,
    frames: int,
    n: int,
    cold_extra: float = 400.0,
    t0: float = 1000.0,
    warmup_frames: int = 17,
    slow: float = 1.0,
    leak_mib: float = 0.0,
):
    req, stg, stp, mem = [], [], [], []
    t = t0
    for idx in range(-1, n):
        rid = f"req-{next(_ids)}"
        extra = cold_extra if idx == 0 else 0.0
        nf = warmup_frames if idx == -1 else frames
        ts = t
        total = 0.0
        for name, ms in STAGES:
            ms = ms * slow + (extra if name == "DenoisingStage" else 0.0)
            stg.append(
                {
                    "launch": launch,
                    "request_id": rid,
                    "index": idx,
                    "stage": name,
                    "ms": ms,
                    "peak_allocated_mib": 0.0,
                    "t_start_s": t,
                    "t_end_s": t + ms / 1000,
                }
            )
            if name == "DenoisingStage":
                for i in range(4):
                    sm = ms / 4 + (extra * 0.5 if i == 0 else 0)
                    stp.append(
                        {
                            "launch": launch,
                            "request_id": rid,
                            "index": idx,
                            "stage": name,
                            "step": i,
                            "ms": sm,
                        }
                    )
            t += ms / 1000
            total += ms
        req.append(
            {
                "launch": launch,
                "request_id": rid,
                "index": idx,
                "status": "completed",
                "error": None,
                "num_frames": nf,
                "effective_num_frames": nf,
                "latent_frames": (nf - 1) // 8 + 1,
                "height": 64,
                "width": 64,
                "steps": 4,
                "client_ms": total + 5,
                "e2e_ms": total,
                "compiles": 1 if idx == 0 and frames != warmup_frames else 0,
                "compile_ms": extra,
                "recompile_limit_hit": False,
                "peak_allocated_mib": None,
                "peak_reserved_mib": None,
                "host_rss_mib": 900.0 + leak_mib * max(idx, 0),
                "host_anon_mib": 700.0 + leak_mib * max(idx, 0),
                "placement": "cpu",
                "t_start_s": ts,
                "t_end_s": t,
            }
        )
        t += 0.05
    for k in range(int((t - t0) / 0.1)):
        mem.append(
            {
                "launch": launch,
                "t_s": t0 + k * 0.1,
                "device_used_mib": float("nan"),
                "host_rss_mib": 900.0 + k,
                "host_anon_mib": 700.0 + k,
                "gpu_util_fraction": None,
            }
        )
    return req, stg, stp, mem


def _launch_row(launch: str, label: str, warmup_frames: int = 17, device_cap=None, host_cap=None):
    return {
        "launch": launch,
        "label": label,
        "ready_s": 8.5,
        "process_start_s": 0.4,
        "models_loaded_s": 5.0,
        "warmup_s": 3.1,
        "warmup_frames": warmup_frames,
        "device_cap_gib": device_cap,
        "host_cap_gib": host_cap,
        "enforcement": "watchdog",
        "cap_exceeded": False,
        "command": "python -m perfkit.refengine --preset tiny",
        "exit_code": 0,
        "load_peak_mib": None,
        "warmup_peak_mib": None,
    }


def _bundle(investigation: str, sessions, launches, results) -> ResultBundle:
    cols = list(zip(*sessions))
    tables = {
        name: pd.DataFrame([r for part in cols[i] for r in part])
        for i, name in enumerate(("requests", "stages", "steps", "memory"))
    }
    tables["launches"] = pd.DataFrame(launches)
    meta = {
        "perfkit_version": "0.1.0",
        "git_commit": "0" * 40,
        "torch_version": "2.13.0",
        "diffusers_version": "0.42.1",
        "cpu_count": 2,
        "host": "synthetic",
        "gpu_name": None,
    }
    return ResultBundle(investigation=investigation, meta=meta, results=results, tables=tables)


def cold_warm(*, slow_warm: bool = False, leak_mib: float = 0.0) -> ResultBundle:
    ratio = 1.3 if slow_warm else 0.4
    results = {
        "cold_ms": 682.0,
        "warm_median_ms": 682.0 * ratio,
        "warm_cold_ratio": ratio,
        "warm_cold_ratio_ci": [ratio - 0.05, ratio + 0.05],
        "penalty_ms": {"DenoisingStage": 400.0, "DecodingStage": 0.0},
        "penalty_stage": "DenoisingStage",
        "cold_start": {"ready_s": 8.5, "process_start_s": 0.4, "models_loaded_s": 5.0, "warmup_s": 3.1},
        "leak_checks": [
            {
                "name": "host_anon_slope_mib_per_request",
                "value": leak_mib,
                "threshold": 16.0,
                "passed": leak_mib <= 16,
            },
            {"name": "latency_drift", "value": 0.01, "threshold": 0.25, "passed": True},
        ],
    }
    s = _session("L0", 25, 5, slow=1.3 if slow_warm else 1.0, leak_mib=leak_mib)
    return _bundle("cold_warm", [s], [_launch_row("L0", "cold_warm")], results)


def warmup_shapes() -> ResultBundle:
    sessions, launches, cov = [], [], []
    for i, w in enumerate((17, 25)):
        la = f"w{w}"
        sessions.append(
            _session(la, 25, 3, cold_extra=0.0 if w == 25 else 3000.0, t0=2000.0 + 100 * i, warmup_frames=w)
        )
        launches.append(_launch_row(la, f"warmup {w}f", warmup_frames=w))
        cov.append(
            {
                "warmup_frames": w,
                "request_frames": 25,
                "covered": w == 25,
                "first_ms": 282.0 + (0 if w == 25 else 3000),
                "warm_median_ms": 282.0,
                "penalty_ms": 0.0 if w == 25 else 3000.0,
                "ratio": 1.0 if w == 25 else 11.6,
                "ratio_ci": [0.95, 1.05],
                "compiles": 0 if w == 25 else 1,
                "penalty_stage": None if w == 25 else "DenoisingStage",
            }
        )
    return _bundle("warmup_shapes", sessions, launches, {"coverage": cov})


def memory_budget(cap_held: bool = True) -> ResultBundle:
    sessions, launches, caps = [], [], []
    for i, (label, host) in enumerate((("unlimited", None), ("8GiB host", 8.0))):
        la = f"cap{i}"
        sessions.append(_session(la, 25, 2, t0=3000.0 + 100 * i))
        launches.append(_launch_row(la, label, host_cap=host))
        caps.append(
            {
                "label": label,
                "device_cap_gib": None,
                "host_cap_gib": host,
                "completed": True,
                "cap_held": cap_held if host else True,
                "enforcement": "watchdog" if host else "none",
                "peak_reserved_mib": None,
                "host_anon_peak_mib": 1200.0,
                "placement": "cpu",
                "warm_degrades": False,
            }
        )
    return _bundle("memory_budget", sessions, launches, {"caps": caps, "min_budget_gib": None})


def make_run(d: str | Path, **kw) -> Path:
    d = Path(d)
    cold_warm(**{k: v for k, v in kw.items() if k in ("slow_warm", "leak_mib")}).save(d / "cold_warm")
    warmup_shapes().save(d / "warmup_shapes")
    memory_budget(cap_held=kw.get("cap_held", True)).save(d / "memory_budget")
    return d
