"""Tests for perfkit.report.plots on small DataFrames with the bundle.py columns."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.container import BarContainer  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from perfkit.report import plots  # noqa: E402

T0 = 1_700_000_000.0
STAGES = ["TextEncodingStage", "LatentPreparationStage", "DenoisingStage", "DecodingStage"]
STAGE_MS = {
    "TextEncodingStage": 40.0,
    "LatentPreparationStage": 5.0,
    "DenoisingStage": 900.0,
    "DecodingStage": 150.0,
}


def _requests(launches=("L0",), n=4) -> pd.DataFrame:
    rows = []
    for li, launch in enumerate(launches):
        t = T0 + 100.0 * li
        for idx in range(-1, n):
            e2e = 2600.0 if idx == 0 else (1200.0 if idx < 0 else 1100.0 + 5 * idx + 10 * li)
            rows.append(
                dict(
                    launch=launch,
                    request_id=f"{launch}-r{idx}",
                    index=idx,
                    status="ok",
                    error=None,
                    num_frames=25,
                    effective_num_frames=25,
                    latent_frames=4,
                    height=512,
                    width=768,
                    steps=4,
                    client_ms=e2e + 30.0,
                    e2e_ms=e2e,
                    compiles=1 if idx == 0 else 0,
                    compile_ms=0.0,
                    recompile_limit_hit=False,
                    peak_allocated_mib=9000.0,
                    peak_reserved_mib=9500.0,
                    host_rss_mib=4000.0 + idx,
                    host_anon_mib=3000.0,
                    placement="cuda",
                    t_start_s=t,
                    t_end_s=t + e2e / 1000.0,
                )
            )
            t += e2e / 1000.0 + 1.0
    return pd.DataFrame(rows)


def _stages(requests: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for _, r in requests.iterrows():
        t = r["t_start_s"]
        for st in STAGES:
            ms = STAGE_MS[st] * (2.2 if r["index"] == 0 else 1.0)
            rows.append(
                dict(
                    launch=r["launch"],
                    request_id=r["request_id"],
                    index=r["index"],
                    stage=st,
                    ms=ms,
                    peak_allocated_mib=8000.0,
                    t_start_s=t,
                    t_end_s=t + ms / 1000.0,
                )
            )
            t += ms / 1000.0
    return pd.DataFrame(rows)


def _steps(requests: pd.DataFrame, n_steps=4) -> pd.DataFrame:
    rows = []
    for _, r in requests.iterrows():
        for s in range(n_steps):
            ms = 225.0 + (800.0 if (r["index"] == 0 and s == 0) else 0.0)
            rows.append(
                dict(
                    launch=r["launch"],
                    request_id=r["request_id"],
                    index=r["index"],
                    stage="DenoisingStage",
                    step=s,
                    ms=ms,
                )
            )
    return pd.DataFrame(rows)


def _memory(requests: pd.DataFrame, device=True) -> pd.DataFrame:
    t = np.arange(T0 - 2.0, float(requests["t_end_s"].max()) + 2.0, 0.5)
    return pd.DataFrame(
        dict(
            launch="L0",
            t_s=t,
            device_used_mib=(8000.0 + 10 * np.arange(t.size)) if device else np.nan,
            host_rss_mib=4000.0 + np.arange(t.size),
            host_anon_mib=3000.0 + np.arange(t.size),
            gpu_util_fraction=0.5 if device else np.nan,
        )
    )


def _png_ok(fig: Figure) -> None:
    data = plots.figure_to_png_bytes(fig)
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000


def _bars(ax) -> list[BarContainer]:
    return [c for c in ax.containers if isinstance(c, BarContainer)]


def test_stage_breakdown_cold_beside_warm_median_per_stage():
    req = _requests(n=4)
    fig = plots.stage_breakdown(_stages(req), requests=req)
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    bars = _bars(ax)
    # one series for the cold request and one for the warm median, one bar per stage each
    assert [c.get_label() for c in bars] == ["cold · 25 frames", "warm median · 25 frames (n=3)"]
    assert all(len(c) == len(STAGES) for c in bars)
    assert [t.get_text() for t in ax.get_xticklabels()] == STAGES
    cold, warm = bars
    assert [r.get_height() for r in cold] == pytest.approx([2.2 * STAGE_MS[s] for s in STAGES])
    assert [r.get_height() for r in warm] == pytest.approx([STAGE_MS[s] for s in STAGES])
    assert ax.get_yscale() == "log"  # 5 ms beside 1980 ms: more than 30x
    assert fig._suptitle.get_text() and "latency" in ax.get_ylabel()
    assert plots.alt_text(fig).startswith("Per-stage latency")
    _png_ok(fig)


def test_stage_breakdown_log_axis_roles_and_launches():
    """A 60 s cold denoise beside ms-scale warm stages: log axis; a later request of a new
    shape is its own series, named by role and shape; one panel per launch, named."""
    req = _requests(launches=("L0", "L1"), n=4)
    req.loc[req["index"] >= 2, ["num_frames", "effective_num_frames"]] = 17
    st = _stages(req)
    st.loc[(st["index"] == 0) & (st["stage"] == "DenoisingStage"), "ms"] = 60_000.0
    launches = pd.DataFrame({"launch": ["L0", "L1"], "warmup_frames": [17, 25]})
    fig = plots.stage_breakdown(st, requests=req, launches=launches)
    assert len(fig.axes) == 2
    ax0 = fig.axes[0]
    assert ax0.get_yscale() == "log"
    assert ax0.get_title() == "launch: warmup 17 frames"
    labels = [c.get_label() for c in _bars(ax0)]
    assert labels == [
        "cold · 25 frames",
        "warm median · 25 frames (n=1)",
        "first of a new shape · 17 frames",
        "warm median · 17 frames (n=1)",
    ]
    tick = ax0.yaxis.get_major_formatter()(1000.0, 0)
    assert tick == "1 s"  # readable tick labels on the log axis
    fig = plots.stage_breakdown(st, requests=req, launch="L1", include_warmup=True)
    assert len(fig.axes) == 1
    assert [c.get_label() for c in _bars(fig.axes[0])][0] == "startup warmup · 25 frames"


def test_request_roles_by_shape():
    req = _requests(n=5)
    req.loc[req["index"] >= 3, ["num_frames", "effective_num_frames"]] = 17
    roles = plots.request_roles(req)
    assert roles["label"].tolist() == [
        "startup warmup · 25 frames",
        "cold · 25 frames",
        "warm #1 · 25 frames",
        "warm #2 · 25 frames",
        "first of a new shape · 17 frames",
        "warm #1 · 17 frames",
    ]
    assert roles["new_shape"].tolist() == [False, False, False, False, True, False]
    # without the warmup row, the launch's warmup shape still counts as run
    no_wu = req[req["index"] >= 0].assign(latent_shape="4x8")
    no_wu.loc[no_wu["index"] == 0, "latent_shape"] = "3x8"
    r = plots.request_roles(no_wu, pd.DataFrame({"launch": ["L0"], "warmup_latent_shape": ["4x8"]}))
    assert r["label"].iloc[0] == "cold · 25 frames (new shape)"
    assert r["label"].iloc[1] == "warm #1 · 25 frames"
    assert plots.request_roles(None).empty


def test_launch_names():
    caps = pd.DataFrame(
        {
            "launch": ["cap0", "cap1", "cap2"],
            "device_cap_gib": [np.nan, 12, np.nan],
            "host_cap_gib": [np.nan, 32, 8],
        }
    )
    assert plots.launch_names(caps) == {
        "cap0": "unlimited",
        "cap1": "12 GiB GPU + 32 GiB host",
        "cap2": "8 GiB host",
    }
    assert plots.launch_names(pd.DataFrame({"launch": ["a", "b"], "warmup_frames": [17, 25]})) == {
        "a": "warmup 17 frames",
        "b": "warmup 25 frames",
    }
    assert plots.launch_names(pd.DataFrame({"launch": ["session"]})) == {"session": "session"}


def test_stage_breakdown_empty():
    fig = plots.stage_breakdown(pd.DataFrame(columns=["launch", "request_id", "index", "stage", "ms"]))
    assert isinstance(fig, Figure)
    _png_ok(fig)


def test_e2e_per_request_lines_per_launch_and_cold():
    req = _requests(launches=("L0", "L1"), n=4)
    fig = plots.e2e_per_request(req)
    ax = fig.axes[0]
    assert len(ax.lines) == 2
    assert len(ax.collections) == 2  # one highlighted cold marker per launch
    np.testing.assert_allclose(ax.collections[0].get_offsets()[0], [0, 2600.0])
    assert "ms" in ax.get_ylabel()
    assert len(ax.lines[0].get_xdata()) == 4  # warmup excluded
    fig = plots.e2e_per_request(req[req["launch"] == "L0"], include_warmup=True)
    assert len(fig.axes[0].lines) == 1 and len(fig.axes[0].lines[0].get_xdata()) == 5
    _png_ok(fig)


def test_step_times_one_line_per_request_cold_highlighted():
    req = _requests(n=3)
    fig = plots.step_times(_steps(req))
    ax = fig.axes[0]
    assert len(ax.lines) == 3
    cold = [ln for ln in ax.lines if ln.get_label() == "cold"]
    assert len(cold) == 1
    assert matplotlib.colors.same_color(cold[0].get_color(), plots.COLD_COLOR)
    assert cold[0].get_ydata()[0] == pytest.approx(1025.0)
    assert "ms" in ax.get_ylabel() and "step" in ax.get_xlabel()
    _png_ok(fig)


def test_coverage_heatmap_annotations():
    cov = pd.DataFrame(
        dict(
            warmup_frames=[17, 17, 25, 25],
            request_frames=[17, 25, 17, 25],
            covered=[True, False, False, True],
            penalty_ms=[12.0, 3100.0, 2900.0, 15.0],
            ratio=[1.01, 3.8, 3.6, 1.02],
        )
    )
    fig = plots.coverage_heatmap(cov)
    ax = fig.axes[0]
    assert len(ax.images) == 1
    texts = [t.get_text() for t in ax.texts]
    assert len(texts) == 4
    assert any("3,100 ms" in t and "not covered" in t for t in texts)
    assert sum(t.endswith("\ncovered") for t in texts) == 2
    assert any("ms" in a.get_ylabel() for a in fig.axes)  # colour bar in ms
    assert "frames" in ax.get_xlabel()
    _png_ok(fig)


def test_memory_timeline_caps_spans_and_stage_marks():
    req = _requests(n=3)
    st = _stages(req)
    mem = _memory(req)
    fig = plots.memory_timeline(mem, requests=req, stages=st, caps={"device_cap_gib": 12, "host_cap_gib": 32})
    assert len(fig.axes) == 2
    ax_dev, ax_host = fig.axes
    assert "MiB" in ax_dev.get_ylabel() and "MiB" in ax_host.get_ylabel()
    assert "s" in ax_host.get_xlabel()
    dev_caps = [ln for ln in ax_dev.lines if ln.get_gid() == "cap:device"]
    host_caps = [ln for ln in ax_host.lines if ln.get_gid() == "cap:host"]
    assert len(dev_caps) == 1 and dev_caps[0].get_ydata()[0] == pytest.approx(12 * 1024)
    assert len(host_caps) == 1 and host_caps[0].get_ydata()[0] == pytest.approx(32 * 1024)
    n_req = len(req)  # warmup spans shaded by default
    for ax in (ax_dev, ax_host):
        spans = [p for p in ax.patches if p.get_gid() == "request-span"]
        assert len(spans) == n_req
        marks = [ln for ln in ax.lines if ln.get_gid() == "stage-mark"]
        assert len(marks) == len(st)
    # time axis starts at the first sample
    dev_line = [ln for ln in ax_dev.lines if ln.get_label() == "device used"][0]
    assert dev_line.get_xdata()[0] == pytest.approx(0.0)
    _png_ok(fig)


def test_memory_timeline_cpu_host_only():
    req = _requests(n=2)
    mem = _memory(req, device=False)
    assert mem["device_used_mib"].isna().all()
    fig = plots.memory_timeline(mem, requests=req, caps={"device_cap_gib": 12, "host_cap_gib": 32})
    assert len(fig.axes) == 1
    ax = fig.axes[0]
    labels = [ln.get_label() for ln in ax.lines]
    assert "host RSS" in labels and "host anonymous (summed per process)" in labels
    assert [ln.get_gid() for ln in ax.lines].count("cap:host") == 1
    assert "cap:device" not in [ln.get_gid() for ln in ax.lines]
    assert "MiB" in ax.get_ylabel()
    assert len([p for p in ax.patches if p.get_gid() == "request-span"]) == len(req)
    _png_ok(fig)


def test_memory_timeline_without_context():
    req = _requests(n=2)
    fig = plots.memory_timeline(_memory(req))
    assert len(fig.axes) == 2
    assert not any(p.get_gid() == "request-span" for ax in fig.axes for p in ax.patches)
    _png_ok(fig)


def test_baseline_vs_actual_bars_band_and_status_colours():
    v = pd.DataFrame(
        [
            dict(
                case="ltx_t2v_25f", metric="e2e", expected=2000.0, actual=2100.0, bound=2200.0, status="pass"
            ),
            dict(
                case="ltx_t2v_25f",
                metric="denoise_stage",
                expected=1500.0,
                actual=1900.0,
                bound=1800.0,
                status="fail",
            ),
            dict(
                case="ltx_t2v_25f",
                metric="DecodingStage",
                expected=300.0,
                actual=200.0,
                bound=570.0,
                status="improved",
            ),
            dict(
                case="ltx_t2v_25f",
                metric="denoise_step_3",
                expected=np.nan,
                actual=60.0,
                bound=np.nan,
                status="new",
            ),
            dict(
                case="ltx_t2v_25f",
                metric="runtime_peak_vram",
                expected=9000.0,
                actual=9100.0,
                bound=9900.0,
                status="pass",
            ),
        ]
    )
    fig = plots.baseline_vs_actual(v)
    assert len(fig.axes) == 2  # ms panel and MiB panel
    ax_ms, ax_mib = fig.axes
    assert "ms" in ax_ms.get_xlabel() and "MiB" in ax_mib.get_xlabel()
    band, actual = _bars(ax_ms)
    assert len(actual) == 3 and len(band) == 3  # NaN-expected row skipped
    colours = [b.get_facecolor() for b in actual]
    for c, name in zip(colours, ["tab:green", "tab:red", "tab:blue"]):
        assert matplotlib.colors.same_color(c[:3], matplotlib.colors.to_rgb(name))
    # band spans expected..bound
    assert band[0].get_x() == pytest.approx(2000.0)
    assert band[0].get_width() == pytest.approx(200.0)
    assert actual[1].get_width() == pytest.approx(1900.0)
    assert len(_bars(ax_mib)[1]) == 1
    _png_ok(fig)


def test_baseline_vs_actual_all_nan_expected():
    v = pd.DataFrame([dict(case="c", metric="e2e", expected=np.nan, actual=1.0, bound=np.nan, status="new")])
    fig = plots.baseline_vs_actual(v)
    assert isinstance(fig, Figure)
    _png_ok(fig)


def test_request_label():
    assert plots.request_label(0) == "cold"
    assert plots.request_label(2) == "warm #2"
    assert plots.request_label(-1) == "warmup"


def test_step_times_integer_ticks_log_axis_and_role_labels():
    req = _requests(n=3)
    steps = _steps(req, n_steps=5)
    steps.loc[(steps["index"] == 0) & (steps["step"] == 0), "ms"] = 57_000.0
    fig = plots.step_times(steps, requests=req)
    ax = fig.axes[0]
    assert ax.get_yscale() == "log"  # one 57 s step beside 225 ms steps
    fig.canvas.draw()
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    assert ticks and all(float(t).is_integer() for t in ticks)
    labels = [ln.get_label() for ln in ax.lines]
    assert "cold · 25 frames" in labels and "warm requests (one line each)" in labels
    assert sum(not lab.startswith("_") for lab in labels) == 2  # warm lines share one entry


def test_e2e_per_request_marks_roles():
    req = _requests(n=4)
    req.loc[req["index"] == 3, ["num_frames", "effective_num_frames"]] = 17
    req.loc[req["index"] == 3, "e2e_ms"] = 60_000.0
    fig = plots.e2e_per_request(req)
    ax = fig.axes[0]
    assert ax.get_yscale() == "log"
    notes = [t.get_text() for t in ax.texts]
    assert any(n.startswith("first of a new shape · 17 frames") and "60.0 s" in n for n in notes), notes
    assert any(n.startswith("cold · 25 frames") for n in notes)
    assert not any("warm #3" in n for n in notes)


def test_memory_timeline_from_launch_with_phases_peaks_and_compiles():
    req = _requests(n=3)
    req["compile_ms"] = np.where(req["index"] <= 0, 1500.0, 0.0)
    req["compiles"] = np.where(req["index"] <= 0, 1, 0)
    mem = _memory(req)
    mem = mem[mem["t_s"] >= req.loc[req["index"] == 0, "t_start_s"].iloc[0]]  # sampler starts at ready
    launches = pd.DataFrame(
        {
            "launch": ["L0"],
            "ready_s": [20.0],
            "process_start_s": [0.5],
            "models_loaded_s": [12.0],
            "warmup_s": [8.0],
            "load_peak_mib": [7000.0],
            "warmup_peak_mib": [8500.0],
            "device_cap_gib": [12.0],
            "host_cap_gib": [32.0],
        }
    )
    fig = plots.memory_timeline(mem, req, _stages(req), launches=launches, device_name="NVIDIA H200")
    ax_dev, ax_host = fig.axes
    assert ax_host.get_xlabel() == "time since launch (s)"
    assert ax_dev.get_xlim()[0] == pytest.approx(0.0)
    phases = [p for p in ax_dev.patches if p.get_gid() == "phase-span"]
    assert len(phases) == 2  # model load, startup warmup
    texts = [t.get_text() for t in ax_host.texts]
    assert "model load" in texts and "startup warmup" in texts
    assert any("no memory samples" in t for t in texts)
    peaks = {c.get_gid() for c in ax_dev.collections}
    assert {"peak:load", "peak:warmup"} <= peaks
    # the warmup request is the warmup phase; cold + 2 warm requests are shaded
    assert len([p for p in ax_dev.patches if p.get_gid() == "request-span"]) == 3
    marks = [ln for ln in ax_dev.lines if ln.get_gid() == "compile-mark"]
    assert len(marks) == 2  # warmup and cold compiled
    assert any(t.get_text() == "compile 1.5 s" for t in ax_dev.texts)
    legend = [t.get_text() for t in ax_dev.get_legend().get_texts()]
    assert "device used (NVIDIA H200)" in legend and "cold request" in legend
    assert (
        fig.axes[0].get_title() == "Memory timeline · 12 GiB GPU + 32 GiB host (device and host, from launch)"
    )
    _png_ok(fig)


def test_plots_take_a_bundle(tmp_path):
    """``plots.X(bundle)`` reads the bundle's tables: the notebooks pass the bundle."""
    from perfkit.bundle import ResultBundle

    b = ResultBundle.load("examples/h200/bundles/warmup_shapes")
    fig = plots.stage_breakdown(b)
    assert [ax.get_title() for ax in fig.axes] == ["launch: warmup 17 frames", "launch: warmup 25 frames"]
    fig = plots.e2e_per_request(b)
    assert any("first of a new shape · 25 frames" in t.get_text() for t in fig.axes[0].texts)
    fig = plots.memory_timeline(b, launch="warmup17")
    assert "warmup 17 frames" in fig.axes[0].get_title()
    assert "NVIDIA H200" in " ".join(t.get_text() for t in fig.axes[0].get_legend().get_texts())
    alt = plots.alt_text(fig)
    assert "Memory timeline" in alt and "MiB" in alt and "time since launch (s)" in alt


def test_plots_package_is_small_rooms_and_roles_live_with_the_bundle():
    """Issue 32: one module per family of figures, none over 600 lines, no function over 120 lines;
    request roles are :mod:`perfkit.roles`' (the plots re-export them for notebook code)."""
    import ast
    import re
    from pathlib import Path

    import perfkit.roles

    files = [*Path(plots.__file__).parent.glob("*.py"), Path(perfkit.roles.__file__)]
    assert len(files) >= 8  # 7 modules of plots and roles
    for path in files:
        text = path.read_text(encoding="utf-8")
        assert len(text.splitlines()) <= 600, path
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert node.end_lineno - node.lineno + 1 <= 120, f"{path}: {node.name}"
    assert plots.request_roles is perfkit.roles.request_roles
    # every plots.<name> the generated notebooks call is exported by the package (their cells
    # come from the generator and the investigations' declarations: read what it generates)
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "notebooks" / "make_notebooks.py"
    spec = importlib.util.spec_from_file_location("make_notebooks", path)
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    generator = "\n".join(c.source for make in gen.notebooks().values() for c in make().cells)
    used = set(re.findall(r"\bplots\.([A-Za-z_]\w*)", generator))
    assert used and used <= set(plots.__all__), used - set(plots.__all__)


def test_queue_vs_service_draws_no_bar_for_times_not_reported():
    """load's figure: a level without start times gets no bar (never a bar of 0 ms) and says
    "not reported"; a level whose queue wait was derived from the record's duration says so."""
    from perfkit.report.plots.concurrency import queue_vs_service

    levels = [
        {"concurrency": 1, "service_ms": 300.0, "queue_wait_ms": 0.5, "start_source": ["engine"]},
        {"concurrency": 2, "service_ms": None, "queue_wait_ms": None, "start_source": ["not reported"]},
        {
            "concurrency": 4,
            "service_ms": 290.0,
            "queue_wait_ms": 870.0,
            "start_source": ["derived (start not reported)"],
        },
    ]
    fig = queue_vs_service(levels)
    ax = fig.axes[0]
    heights = sorted(round(p.get_height(), 1) for p in ax.patches)
    assert heights == [0.5, 290.0, 300.0, 870.0]  # two levels drawn, service + wait each
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels == ["c1", "c2\n(not reported)", "c4\n(derived)"]


def test_a_lone_pss_read_shows_as_a_dot_in_both_memory_plots():
    """PSS is read on a few samples only (readings.memory.PSS_DUTY; on the H200 4 reads in 652
    samples): each read is drawn as a dot, so a single read is visible (a line through one
    point draws nothing) and the segments between reads are not taken for readings; RSS,
    read at every sample, stays a plain line."""
    req = _requests(n=2)
    mem = _memory(req)
    mem["host_pss_mib"] = np.nan
    mem.loc[len(mem) // 2, "host_pss_mib"] = 2500.0
    for fig in (
        plots.memory_timeline(mem, requests=req),
        plots.memory_under_concurrency(mem, []),
    ):
        lines = [ln for ax in fig.axes for ln in ax.lines if "PSS" in str(ln.get_label())]
        assert len(lines) == 1
        pss = lines[0]
        assert list(pss.get_ydata()) == [2500.0]
        assert pss.get_marker() not in (None, "None", "", " ") and pss.get_markersize() > 0
        rss = [ln for ax in fig.axes for ln in ax.lines if ln.get_label() == "host RSS"]
        assert all(ln.get_marker() in (None, "None", "", " ") for ln in rss)
        _png_ok(fig)
