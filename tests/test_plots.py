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


def test_stage_breakdown_stacks_and_labels():
    req = _requests(n=4)
    fig = plots.stage_breakdown(_stages(req))
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    bars = _bars(ax)
    assert len(bars) == len(STAGES)  # one container per stage
    assert all(len(c) == 4 for c in bars)  # warmup excluded: cold + 3 warm
    assert [t.get_text() for t in ax.get_xticklabels()] == ["cold", "warm #1", "warm #2", "warm #3"]
    assert "ms" in ax.get_ylabel()
    assert [c.get_label() for c in bars] == STAGES
    # stacking: top of the last segment of the cold bar = total cold stage ms
    cold_top = bars[-1][0].get_y() + bars[-1][0].get_height()
    assert cold_top == pytest.approx(2.2 * sum(STAGE_MS.values()))
    _png_ok(fig)


def test_stage_breakdown_warmup_and_multi_launch():
    req = _requests(launches=("L0", "L1"), n=3)
    st = _stages(req)
    fig = plots.stage_breakdown(st, include_warmup=True)
    bars = _bars(fig.axes[0])
    assert all(len(c) == 2 * 4 for c in bars)
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert labels[0] == "L0\nwarmup" and labels[1] == "L0\ncold" and labels[4] == "L1\nwarmup"
    fig = plots.stage_breakdown(st, launch="L1")
    assert all(len(c) == 3 for c in _bars(fig.axes[0]))


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
    assert any("3100 ms" in t and "not covered" in t for t in texts)
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
    assert "host RSS" in labels and "host anon" in labels
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
