"""Serving under load: one launch of a trace, warm-up requests, closed-loop levels and an open
loop; queueing, throughput, p99, SLO attainment, memory, a trace's warmup coverage (docs/load.md)."""

from __future__ import annotations

import itertools
from typing import Any, Literal, Mapping, Optional

import pandas as pd
from pydantic import Field, field_validator, model_validator

from perfkit import stats
from perfkit.bundle import ResultBundle
from perfkit.checks import Check, check_max, check_min
from perfkit.common.numfmt import fmt, json_float
from perfkit.common.slugs import md_text
from perfkit.engine.spec import DEFAULT_REQUEST_TIMEOUT_S
from perfkit.investigations import common, registry
from perfkit.investigations.common import code, md
from perfkit.investigations.load_measure import per_request_rows, read_trace, run_phases
from perfkit.investigations.load_stats import check_rows, summarise
from perfkit.investigations.registry import KeyNumber
from perfkit.measuring.assemble import assemble
from perfkit.measuring.launch_rows import measure_launch

NAME = "load"
_INTERVAL = "order-statistic (binomial) 95 % interval"


class LoadParams(registry.InvestigationParams):
    """``load`` section: one launch; the phases run in the order of docs/load.md."""

    enabled: bool = False
    tier: Literal["per-commit", "extra"] = "extra"
    #: requests of the params' shape sent one at a time before measuring (SLO base)
    warmup_requests: int = Field(3, ge=1, le=1000)
    #: closed-loop levels (requests in flight); [] skips the sweep
    concurrency: list[int] = Field(default_factory=lambda: [1, 2, 4])
    #: measured requests per level
    requests_per_level: int = Field(8, ge=2, le=100_000)
    #: open loop: arrivals per second (Poisson); None: see rate_over_capacity
    rate_rps: Optional[float] = Field(None, gt=0, allow_inf_nan=False)
    #: open loop at this multiple of the capacity (the largest throughput a closed level
    #: delivered; 2.0: twice that); None and rate_rps None: no open loop
    rate_over_capacity: Optional[float] = Field(None, gt=0, allow_inf_nan=False)
    #: requests of the open loop
    open_loop_requests: int = Field(12, ge=3, le=100_000)
    #: seed of the Poisson arrivals (numpy.random.default_rng takes no negative seed)
    seed: int = Field(0, ge=0)
    #: SLO in ms; None: slo_scale x the steady warm-up median (bench_serving --slo --slo-scale)
    slo_ms: Optional[float] = Field(None, gt=0, allow_inf_nan=False)
    #: SLO as a multiple of the median e2e of the warm-up requests that compiled nothing
    slo_scale: float = Field(3.0, gt=0, allow_inf_nan=False)
    #: a JSONL request trace (vllm-omni's fields) sent first; None: no trace
    trace: Optional[str] = Field(None, min_length=1)
    #: the memory sampler's interval (s)
    sample_interval_s: float = Field(0.05, gt=0, le=60)
    #: the client's polling interval of ``GET /v1/videos/{id}`` (s): at concurrency 1 the
    #: engine idles about this long plus one HTTP round trip between requests
    poll_s: float = Field(0.02, gt=0, le=5)

    @field_validator("concurrency")
    @classmethod
    def _levels(cls, v: list[int]) -> list[int]:
        if any(k < 1 for k in v) or len(set(v)) != len(v):
            raise ValueError(f"levels must be distinct integers >= 1, got {v}")
        return v

    @model_validator(mode="after")
    def _levels_fill(self) -> "LoadParams":
        over = [k for k in self.concurrency if k > self.requests_per_level]
        if over:
            raise ValueError(
                f"concurrency {over} above requests_per_level {self.requests_per_level}: "
                "such a level never has that many requests in flight"
            )
        if self.rate_rps is not None and self.rate_over_capacity is not None:
            raise ValueError("rate_rps and rate_over_capacity both set: the open loop runs at one rate")
        return self


class LoadInvariants(registry.InvariantParams):
    """Within-run limits of serving under load (None: reported, not gated)."""

    #: peak device or host memory (MiB) of any level above the first level's (seed 000)
    load_memory_growth_max_mib: Optional[float] = 256.0
    #: |median queue wait − (k − 1) × median service| / ((k − 1) × median service), per level
    #: k >= 2 (one-at-a-time serving); set it for an engine that should queue, not batch
    load_queue_model_max_rel_err: Optional[float] = None
    #: throughput at each level / throughput at the first level, at least
    load_throughput_min_ratio: Optional[float] = None
    #: share of each level's requests within the SLO, at least
    load_slo_attainment_min: Optional[float] = Field(None, le=1.0)
    #: requests of any phase that did not complete (failed, rejected, timed out, engine lost)
    load_failed_requests_max: Optional[int] = 0


def _queue_verdict(ol: dict[str, Any]) -> str:
    """The open loop's queue verdict (bundles before ``queue_verdict``: grows or not shown)."""
    v = ol.get("queue_verdict") or ("grows" if ol.get("queue_grows") else "not shown")
    if v == "not shown":
        rho = ol.get("queue_wait_rho")
        return f"not shown ({ol.get('n')} requests, rho {fmt(rho, '.2f')})"
    return v


def run(ctx: registry.RunContext, p: LoadParams) -> ResultBundle:
    """One launch: trace, warm-up, closed-loop levels, open loop. Raises InvestigationError:
    the trace file cannot be read (naming the file, line and key)."""
    trace = read_trace(p.trace, ctx.request) if p.trace else []
    timeout_s = float(ctx.engine.request_timeout_s or DEFAULT_REQUEST_TIMEOUT_S)
    holder: dict[str, Any] = {}

    def after(h, client, sampler) -> dict[str, Any]:
        holder["sent"], holder["stalled"] = run_phases(h.base_url, p, ctx.request, trace, timeout_s, h.alive)
        return {}

    data = measure_launch(
        ctx.engine, [], ctx.work_dir / NAME, "session", sample_interval_s=p.sample_interval_s, after=after
    )
    sent = holder.get("sent") or []
    rows, req_rows, (st_rows, sp_rows) = per_request_rows(sent, data.record_lines, data.label)
    lost = engine_lost(data.launch_row, rows, holder.get("stalled"))
    if lost and data.error is None:
        data.error = data.launch_row["error"] = lost
        data.launch_row["failed_request"] = next(r["i"] for r in rows if r["status"] != "completed")
    data.requests += req_rows
    data.stages += st_rows
    data.steps += sp_rows
    results: dict[str, Any] = {
        "error": data.error,
        "per_request": rows,
        "slo_ms_given": p.slo_ms,
        "slo_scale": p.slo_scale,
        "trace_slo_ms": [s for _, s in trace],
        "warmup_latent_shape": data.launch_row.get("warmup_latent_shape"),
        "engine_warmup_frames": ctx.engine.startup_warmup_frames(),
    }
    if (p.rate_rps or p.rate_over_capacity) and not any(ph == "open" for ph, *_ in sent):
        results["open_loop_note"] = (
            "open loop not run: no capacity measured (no request of the first level completed)"
            if data.error is None
            else f"open loop not run: {data.error}"
        )
    results.update(summarise(results, data.memory))
    params = {
        "spec": ctx.engine.to_dict(),
        "request": ctx.request.payload(),
        **p.model_dump(exclude={"enabled", "tier"}),
    }
    return assemble(NAME, [data], params, results)


def engine_lost(
    launch: Mapping[str, Any], rows: list[Mapping[str, Any]], stalled: str | None = None
) -> str | None:
    """The error of an engine that ended by itself or stopped answering (``stalled``) with
    requests not completed: how, then each level's by index (``concurrency 2: requests 3-7``)."""
    bad = [r for r in rows if r.get("status") != "completed"]
    if (launch.get("end_by_perfkit") is not False and not stalled) or not bad:
        return None
    parts = [
        f"{_where(ph, lv).removeprefix('the ')}: requests {_ranges([int(r.get('slot') or 0) for r in g])}"
        for (ph, lv), g in _by_level(bad).items()
    ]
    how = stalled or f"the engine {launch.get('ended') or 'ended by itself'}"
    return (
        f"{how} during the load phases; "
        f"{len(bad)} of {len(rows)} requests not completed, by level and index: {'; '.join(parts)} "
        f"(the first: {bad[0].get('status')}: {bad[0].get('error') or 'no error given'})"
    )


def _ranges(ix: list[int], most: int = 20) -> str:
    """``[3, 4, 5, 7]`` -> ``"3-5, 7"`` (at most ``most`` runs, then how many more)."""
    step = itertools.count()
    runs = [list(g) for _, g in itertools.groupby(sorted(set(ix)), lambda i: i - next(step))]
    text = ", ".join(f"{g[0]}" if len(g) == 1 else f"{g[0]}-{g[-1]}" for g in runs[:most])
    return text + (f" and {len(runs) - most} more runs" if len(runs) > most else "")


def _by_level(rows: list[Mapping[str, Any]]) -> dict[tuple[Any, Any], list[Mapping[str, Any]]]:
    groups: dict[tuple[Any, Any], list[Mapping[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r.get("phase"), r.get("level")), []).append(r)
    return groups


def _where(phase: str, level: Any) -> str:
    return {"closed": f"concurrency {level}", "open": "the open loop"}.get(phase, f"the {phase}")


def not_completed(r: Mapping[str, Any]) -> list[str]:
    """One sentence per level with requests that did not complete, naming the first of them."""
    out = []
    for (phase, level), rows in _by_level(r.get("per_request") or []).items():
        bad = [x for x in rows if x.get("status") != "completed"]
        if bad:
            b = bad[0]
            out.append(
                f"At {_where(phase, level)}, {len(bad)} of {len(rows)} requests did not complete "
                f"(the first: request {b.get('slot')} of the level, id {md_text(b.get('request_id') or 'none')}, "
                f"{md_text(b.get('status'))}: {md_text(b.get('error') or 'no error given')}); its figures are over "
                f"the {len(rows) - len(bad)} that did"
            )
    return out


def _failed(r: Mapping[str, Any]) -> int | None:
    """Requests not completed (older bundles: counted from ``per_request``); None for a bad count."""
    if r.get("failed_requests") is not None:
        return None if _bad_count(r) else int(r["failed_requests"])
    rows = r.get("per_request") or []
    return sum(1 for x in rows if x.get("status") != "completed") if rows else None


def _bad_count(r: Mapping[str, Any]) -> str | None:
    v, n = r.get("failed_requests"), r.get("requests") or len(r.get("per_request") or [])
    ok = isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= n
    return None if v is None or ok else f"results.failed_requests: {v!r} is not a count of 0..{n} requests"


def check_bundle(bundle: ResultBundle) -> None:
    """Raises InvestigationError: an error, a bad row or count, or no request completed."""
    r = bundle.results or {}
    check_rows(r.get("per_request") or [], source=f"{NAME} ({bundle.path or 'bundle'}): results")
    if r.get("error"):
        raise registry.bundle_error(bundle, r["error"])
    if why := _bad_count(r):
        raise registry.bundle_error(bundle, why)
    if not any(x.get("status") == "completed" for x in r.get("per_request") or []):
        raise registry.bundle_error(bundle, "nothing measured: no request completed")


def checks(r: Mapping[str, Any], inv: Mapping[str, Any]) -> list[Check]:
    """The gate's checks of a ``load`` results dict (each only when its invariant is set)."""
    rows: list[Check] = []
    inv = {k: v for k, v in inv.items() if v is not None}
    levels = r.get("levels") or []
    if "load_memory_growth_max_mib" in inv:
        host = (
            " (host: RSS, no PSS read in every level)" if r.get("memory_growth_host_source") == "rss" else ""
        )
        what = "peak device or host memory of a level above the first level's" + host
        lim = float(inv["load_memory_growth_max_mib"])
        rows.append(check_max(NAME, "memory_growth_mib", r.get("memory_growth_mib"), lim, what))
    if "load_failed_requests_max" in inv:
        what = f"requests not completed of {r.get('requests') or len(r.get('per_request') or [])}"
        lim = float(inv["load_failed_requests_max"])
        rows.append(check_max(NAME, "failed_requests", _failed(r), lim, what))
    for lv in levels:
        k = lv["concurrency"]
        if k > 1 and "load_queue_model_max_rel_err" in inv:
            what = f"steady queue wait {fmt(lv['queue_wait_steady_ms'], '.0f')} ms vs (k-1) x service {fmt(lv['queue_wait_expected_ms'], '.0f')} ms"
            lim = float(inv["load_queue_model_max_rel_err"])
            err = lv.get("queue_model_rel_err")
            rows.append(check_max(NAME, f"queue_model_rel_err[c{k}]", err, lim, what))
        if lv is not levels[0] and "load_throughput_min_ratio" in inv:
            what = f"vs concurrency {levels[0]['concurrency']}"
            lim = float(inv["load_throughput_min_ratio"])
            rows.append(check_min(NAME, f"throughput_ratio[c{k}]", lv.get("throughput_ratio"), lim, what))
        if "load_slo_attainment_min" in inv:
            lim = float(inv["load_slo_attainment_min"])
            rows.append(check_min(NAME, f"slo_attainment[c{k}]", lv.get("slo_attainment"), lim))
    if not levels and any(k in inv for k in ("load_queue_model_max_rel_err", "load_slo_attainment_min")):
        rows.append(check_max(NAME, "queue_model_rel_err", None, 0.0))
    return rows


def key_numbers(r: Mapping[str, Any]) -> list[KeyNumber]:
    """The key numbers of a ``load`` results dict: throughput (videos/min), p99, SLO (ms), growth (MiB)."""
    levels = r.get("levels") or []
    out = []
    for lv in levels[:1] + levels[1:][-1:]:
        k = lv["concurrency"]
        vpm = json_float(lv.get("throughput_vpm"))
        out.append(KeyNumber(f"throughput at concurrency {k}", vpm, "videos/min", ".1f"))
        out.append(KeyNumber(f"p99 e2e at concurrency {k}", p99_text(lv)))
    n, failed = r.get("requests") or len(r.get("per_request") or []), _failed(r)
    out.append(KeyNumber("requests completed", f"{n - failed} of {n}" if failed is not None else None))
    out.append(KeyNumber("SLO", json_float(r.get("slo_ms")), "ms"))
    if levels:
        found = "; ".join(r.get("findings") or []) or "none beyond noise"
        out.append(KeyNumber("concurrency findings", found))
    growth = json_float(r.get("memory_growth_mib"))
    out.append(KeyNumber("memory growth under concurrency", growth, "MiB", ".1f"))
    ol = r.get("open_loop")
    if ol:
        out.append(KeyNumber("open loop queue", _queue_verdict(ol)))
    tr = r.get("trace")
    if tr:
        share = json_float(tr.get("uncovered_share"))
        out.append(KeyNumber("trace requests of uncovered shapes", share, "", ".0%"))
    return out


def p99_text(lv: Mapping[str, Any]) -> str:
    """``"3,358 ms [3,352, 3,380] of 400 requests"``, or ``"not bounded by 8 requests ..."``."""
    n, (lo, hi) = lv.get("completed"), (lv.get("p99_ci") or [None, None])[:2]
    if lv.get("p99_ms") is not None and lo is not None and hi is not None:
        return f"{lv['p99_ms']:,.0f} ms {_ci_text([lo, hi])} of {n} requests"
    return (
        f"not bounded by {n} requests ({stats.quantile_bounded_from(0.99)} needed); p50 "
        f"{fmt(lv.get('p50_ms'), '.0f', ' ms')} {_ci_text(lv.get('p50_ci'))}"
    )


def _ci_text(ci: Any) -> str:
    lo, hi = (ci or [None, None])[:2]
    return f"[{fmt(lo, '.0f')}, {fmt(hi, '.0f', missing='unbounded')}]"


#: summary_table's columns after ``level`` and ``requests``
_SUMMARY_COLUMNS = (
    "completed queue_wait_ms queue_wait_steady_ms queue_wait_expected_ms service_ms p50_ms p90_ms p99_ms "
    "p99_interval_ms throughput_vpm engine_idle_share goodput_vpm slo_attainment device_peak_mib host_peak_mib"
).split()


def summary_table(r: Mapping[str, Any]) -> pd.DataFrame:
    """One row per closed-loop level and the open loop (ms, videos/min, MiB)."""
    rows = []
    for lv in [*(r.get("levels") or []), *([r["open_loop"]] if r.get("open_loop") else [])]:
        level = f"c{lv['concurrency']}" if "concurrency" in lv else f"open {lv['rate_rps']:.2f}/s"
        row = {"level": level, "requests": lv["n"], **{c: lv.get(c) for c in _SUMMARY_COLUMNS}}
        rows.append({**row, "p99_interval_ms": _ci_text(lv.get("p99_ci"))})
    return pd.DataFrame(rows)


def reading(r: Mapping[str, Any]) -> str:
    """The Markdown reading of a ``load`` results dict: the levels, the open loop and the trace."""
    lines = [f"- **{md_text(k.label)}**: {md_text(k.text)}" for k in key_numbers(r)]
    lines += [
        "",
        f"SLO: {fmt(r.get('slo_ms'), '.0f', ' ms')} ({r.get('slo_source')}); quantile intervals: {_INTERVAL} "
        f"(a p99's is bounded from {stats.quantile_bounded_from(0.99)} requests).",
    ]
    levels = r.get("levels") or []
    src = sorted({s for lv in levels for s in lv.get("start_source") or []})
    if src:
        lines.append(f"Queue wait and service time from: {', '.join(src)}.")
    for lv in levels[1:]:
        lines.append(
            f"At concurrency {lv['concurrency']} requests waited {fmt(lv.get('queue_wait_steady_ms'), '.0f', ' ms')} "
            f"in the queue once {lv['concurrency'] - 1} were ahead of them ({lv.get('steady_requests')} requests; "
            f"one-at-a-time serving predicts {fmt(lv['queue_wait_expected_ms'], '.0f', ' ms')}) "
            f"for {fmt(lv['service_ms'], '.0f', ' ms')} of service; throughput "
            f"{fmt(lv.get('throughput_ratio'), '.2f')} x the first level's."
        )
    lines += [f"{x}." for x in not_completed(r)]
    growth = r.get("memory_growth_mib")
    if growth is not None:
        host = (
            " (host memory as RSS: PSS was not read in every level)"
            if r.get("memory_growth_host_source") == "rss"
            else ""
        )
        lines.append(
            f"Peak memory under concurrency rose at most {fmt(growth, '.1f', ' MiB')} above the first level's{host}."
            if growth > 0
            else f"Peak memory under concurrency did not rise above the first level's ({fmt(growth, '+.2f', ' MiB')}){host}."
        )
    ol = r.get("open_loop")
    if ol:
        verdict = {"grows": "the queue grows", "does not grow": "the queue does not grow"}.get(
            _queue_verdict(ol), f"growth of the queue is {_queue_verdict(ol)}"
        )
        cap, drawn = ol.get("capacity_rps"), ol.get("arrival_rate_rps")
        side = {
            (True, True): "both above it",
            (False, False): "neither above it",
            (True, False): "the asked rate above it, the drawn one not",
            (False, True): "the drawn rate above it, the asked one not",
        }.get(
            (ol["rate_rps"] > cap, drawn > cap) if cap and drawn is not None else (None, None),
            "above it" if ol.get("above_capacity") else "not above it",
        )
        lines.append(
            f"Open loop at {ol['rate_rps']:.2f} requests/s asked, "
            f"{fmt(drawn, '.2f', '/s')} drawn "
            f"(capacity {fmt(cap, '.2f', '/s')}"
            + (f", delivered at {r['capacity_at']}" if r.get("capacity_at") else "")
            + f", {side}): {verdict}: queue wait "
            f"{fmt(ol['queue_wait_first_third_ms'], '.0f', ' ms')} in the first third of arrivals, "
            f"{fmt(ol['queue_wait_last_third_ms'], '.0f', ' ms')} in the last "
            f"({fmt(ol['queue_wait_slope_ms_per_request'], '+.0f', ' ms')} per request)."
        )
    if r.get("open_loop_note"):
        lines.append(r["open_loop_note"] + ".")
    tr = r.get("trace")
    if tr:
        lines.append(tr.get("sentence") or "")
        f = lambda sh, k, spec=",.0f": fmt(sh.get(k), spec, " ms")  # noqa: E731
        lines += [
            f"- {md_text(sh['shape'])} ({'' if sh.get('covered') else 'not '}covered, {sh['requests']} requests): first hit "
            f"{f(sh, 'first_hit_ms')} ({sh.get('first_hit_compiles')} compiles), later median {f(sh, 'later_median_ms')}: "
            f"first-hit penalty {f(sh, 'first_hit_penalty_ms', '+,.0f')}"
            for sh in tr.get("shapes") or []
        ]
    return "\n".join(lines)


def plan(p: LoadParams) -> list[int]:
    """Requests of the one launch (the trace's not counted)."""
    opened = p.open_loop_requests if (p.rate_rps or p.rate_over_capacity) else 0
    return [p.warmup_requests + len(p.concurrency) * p.requests_per_level + opened]


NOTEBOOK = common.headline(
    NAME, "Levels: queue wait, service time, percentiles, throughput, SLO", transpose=False
) + (
    md("## Gate (memory stays flat, every request completed; queue model, throughput and SLO when set)"),
    code(common.GATE_CELL),
    md("## Latency vs concurrency"),
    code('show(plots.latency_vs_concurrency(results.get("levels") or []))'),
    md("## Queue wait vs service time per level"),
    code(
        'show(plots.queue_vs_service([*(results.get("levels") or []), '
        '*([results["open_loop"]] if results.get("open_loop") else [])]))'
    ),
    md("## Memory under concurrency"),
    code(
        'show(plots.memory_under_concurrency(bundle.memory, [*(results.get("levels") or []), '
        '*([results["open_loop"]] if results.get("open_loop") else [])]))'
    ),
    md("## Trace: first hit per shape and warmup coverage"),
    code("""trace = results.get("trace")
if trace:
    show_table(pd.DataFrame(trace["shapes"]), transpose=False)
    display(Markdown(trace["sentence"]))
else:
    display(Markdown("No trace: set `trace` to a JSONL of requests (vllm-omni's fields)."))"""),
    md(
        "## How to read this\n\n"
        "At concurrency k a server that runs one request at a time (sglang's diffusion server "
        "per worker, the reference engine) makes each request wait about (k − 1) × the service "
        "time once k − 1 are ahead of it, while throughput stays flat: latency grows, "
        "videos per minute do not. A batching server would show queue wait below that and "
        "throughput rising. At concurrency 1 the engine idles while the client turns around "
        "(`engine_idle_share`). An open loop above capacity has no steady state: the queue, and "
        "with it e2e, grows with every arrival. Memory should stay flat across levels (the "
        "5090 consumer-budget case checked two concurrent requests for exactly that). In the "
        "trace, a shape whose latent shape the startup warmup did not run pays its shape setup "
        "(recompilation) on its first hit; the share of p99 it causes is p99 minus the p99 "
        "with those first hits replaced by their shape's later median."
    ),
)

SECTION_INTRO = (
    "One launch after a warm-up: closed-loop levels of requests in flight, an open loop of Poisson "
    "arrivals and, when given, a request trace. Queue wait (submitted → started) and service time "
    "(started → completed) come from the engine's job clock; e2e is what the client saw. Quantile "
    "intervals are order-statistic (binomial) 95 % intervals; the SLO is fixed or a multiple of the "
    "median e2e of the warm-up requests that compiled nothing, as sglang's bench_serving `--slo "
    "--slo-scale`. A p99 is headlined only when its interval is bounded (368 requests); a throughput "
    "fall or service-time rise against the first level beyond noise is a finding."
)


# no ``cases``: overlapping requests' stage times are not sglang's baseline cases
INVESTIGATION = registry.register_module(
    globals(),
    order=80,
    title="Serving under load",
    question="Under concurrent requests, how long do they queue, what throughput, p99 and SLO "
    "attainment does the engine reach, does memory stay flat, and does the warmup cover a real trace?",
    params_model=LoadParams,
    invariants_model=LoadInvariants,
    notebook_intro="Under concurrent requests, how long do they queue, what throughput, p99 and SLO "
    "attainment does the engine reach, does memory stay flat, and does the startup warmup cover a "
    "real request trace?",
)
