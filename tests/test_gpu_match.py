"""GPUs matched by UUID: NVML does not follow CUDA_VISIBLE_DEVICES, the launch and its sampler do
(a fake NVML with two GPUs; a real fake-engine process)."""

from __future__ import annotations

import sys
from pathlib import Path

import psutil
import pytest

from perfkit.engine.launch import launch
from perfkit.engine.spec import EngineSpec
from perfkit.readings.sampler.nvml import (
    DeviceReading,
    GpuRef,
    GpuResolveError,
    resolve_visible_gpus,
)

MIB = 2**20
FAKE = str(Path(__file__).with_name("fake_engine.py"))


class TwoGpus:
    """An NVML source with two GPUs: per-index used memory (MiB) and per-index processes."""

    def __init__(self) -> None:
        self.inv = [GpuRef(0, "GPU-aaaa-0000", "NVIDIA H200"), GpuRef(1, "GPU-bbbb-1111", "NVIDIA H200")]
        self.used = {0: 50_000.0, 1: 1_000.0}
        self.procs: dict[int, list[tuple[int, int | None]]] = {0: [], 1: []}
        self.opened: list[list[int]] = []

    def inventory(self):
        return list(self.inv)

    def open(self, indices):
        self.opened.append(list(indices))
        return True

    def close(self):
        pass

    def device(self, index):
        return DeviceReading(int(self.used[index] * MIB), 141_000 * MIB, 10.0 * (index + 1))

    def processes(self, index):
        return list(self.procs[index])


def test_resolve_integers_uuids_and_limits():
    nv = TwoGpus()
    assert [g.index for g in resolve_visible_gpus("1", nvml=nv)] == [1]
    assert [g.index for g in resolve_visible_gpus("1,0", nvml=nv)] == [1, 0]
    assert [g.index for g in resolve_visible_gpus(None, nvml=nv)] == [0, 1]
    assert resolve_visible_gpus("GPU-bbbb", nvml=nv) == [nv.inv[1]]  # a unique prefix, as CUDA takes
    assert resolve_visible_gpus("", nvml=nv) == [] and resolve_visible_gpus("-1", nvml=nv) == []
    assert [g.index for g in resolve_visible_gpus("0,-1,1", nvml=nv)] == [0]  # CUDA stops at -1
    with pytest.raises(GpuResolveError, match="NVML sees 2"):
        resolve_visible_gpus("2", nvml=nv)
    with pytest.raises(GpuResolveError, match="no NVML device"):
        resolve_visible_gpus("GPU-cccc", nvml=nv)
    with pytest.raises(GpuResolveError, match="MIG"):
        resolve_visible_gpus("MIG-1234", nvml=nv)
    assert resolve_visible_gpus("1", nvml=object()) == []  # no inventory: no NVML


def test_cuda_visible_devices_1_samples_the_second_gpu(tmp_path, monkeypatch):
    nv = TwoGpus()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # what Ray sets for a task on GPU 1
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    spec = EngineSpec(
        kind="command",
        command_template=[sys.executable, FAKE, "--port", "{port}", "--perf-log-dir", "{perf_log_dir}"],
        startup_timeout_s=20,
    )
    with launch(spec, run_dir=tmp_path, label="g1", nvml=nv) as h:
        assert h.gpus == [{"index": 1, "uuid": "GPU-bbbb-1111", "name": "NVIDIA H200"}]
        assert h.gpu_indices == [1] and h.device_baseline_mib == 1000.0  # read from GPU 1
        # CUDA ordinal 1 = NVML index 1
        assert psutil.Process(h.pid).environ()["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        nv.used[1] = 4000.0  # the engine allocates on its GPU; GPU 0 stays busy with others
        s = h.sampler(interval_s=0.05)
        s._nvml_ok = s.nvml.open(s.gpu_indices)
        assert s.sample_once()
        nv.procs[1] = [(h.pid, 2500 * MIB)]  # NVML lists the engine on GPU 1
        assert s.sample_once()
    df = s.to_frame()
    assert list(df["device_used_mib"]) == [3000.0, 2500.0]
    assert list(df["device_source"]) == ["nvml-device-delta", "nvml-process"]
    assert (df["gpu_util_pct"] == 20.0).all()  # GPU 1's utilisation, not GPU 0's
    assert nv.opened[-1] == [1]


def test_uuid_entry_and_bad_entry_fall_back(tmp_path, monkeypatch):
    nv = TwoGpus()
    spec = EngineSpec(
        kind="command",
        command_template=[sys.executable, FAKE, "--port", "{port}", "--perf-log-dir", "{perf_log_dir}"],
        startup_timeout_s=20,
        env={"CUDA_VISIBLE_DEVICES": "GPU-bbbb-1111"},
    )
    with launch(spec, run_dir=tmp_path, label="uuid", nvml=nv) as h:
        assert h.gpu_indices == [1] and h.gpus[0]["uuid"] == "GPU-bbbb-1111"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    with launch(spec.model_copy(update={"env": {}}), run_dir=tmp_path, label="bad", nvml=nv) as h:
        assert h.gpus == [] and h.gpu_indices == [0]  # warned, the old behaviour


def test_bundle_meta_records_each_launchs_gpus():
    from perfkit.measuring.assemble import assemble
    from perfkit.measuring.launch_rows import LaunchData

    g = {"index": 1, "uuid": "GPU-bbbb-1111", "name": "NVIDIA H200"}
    b = assemble("cold_warm", [LaunchData(label="session", gpus=[g])], params={}, results={})
    assert b.meta["launch_gpus"] == {"session": [g]}
