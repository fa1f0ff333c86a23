"""NVML backend against a fake pynvml: counter and polled energy, CUDA_VISIBLE_DEVICES masks, MIG, errors."""

from __future__ import annotations

import sys
import time

import pytest
from fakes import FakeMig, FakeNvml
from fakes import FakeNvmlGpu as FakeGpu

from dtpo.devices.base import DeviceError
from dtpo.devices.integrator import PowerIntegrator
from dtpo.devices.nvml import NOT_INSTALLED, NvmlGpu, open_nvml_gpus, visible_gpus

UUIDS = ["GPU-8a3c1111-0000-0000-0000-000000000000", "GPU-8a3c2222-0000-0000-0000-000000000000",
         "GPU-5d5b3333-0000-0000-0000-000000000000"]


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    fake = FakeNvml([FakeGpu(UUIDS[0]), FakeGpu(UUIDS[1]), FakeGpu(UUIDS[2])])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    return fake


def one_line(exc: pytest.ExceptionInfo[DeviceError]) -> str:
    text = str(exc.value)
    assert text and "\n" not in text
    return text


def test_counter_mode_reports_the_counter_delta_in_joules(nvml: FakeNvml) -> None:
    gpu = NvmlGpu(0)
    assert gpu.info.source == "nvml-counter"
    assert gpu.info.name == "gpu0 (NVIDIA H100 80GB HBM3)"
    assert (gpu.info.kind, gpu.info.estimated, gpu.info.node_shared) == ("gpu", False, False)
    assert UUIDS[0] in gpu.info.detail
    assert gpu.energy_j() == 0.0
    nvml.gpus[0].energy_mj += 12_345
    assert gpu.energy_j() == pytest.approx(12.345)
    assert gpu.power_w() == pytest.approx(300.0)
    gpu.close()
    gpu.close()
    assert nvml.refs == 0
    assert gpu.energy_j() == pytest.approx(12.345)  # the final reading stands after close


def test_counter_going_backwards_raises_instead_of_going_negative(nvml: FakeNvml) -> None:
    gpu = NvmlGpu(1)
    nvml.gpus[1].energy_mj -= 1
    with pytest.raises(DeviceError, match="went backwards") as exc:
        gpu.energy_j()
    one_line(exc)
    gpu.close()


def test_counter_read_error_raises(nvml: FakeNvml) -> None:
    gpu = NvmlGpu(0)
    nvml.gpus[0].energy_mj = None
    with pytest.raises(DeviceError, match="energy counter unreadable"):
        gpu.energy_j()
    gpu.close()


def test_polled_mode_integrates_power_over_time(nvml: FakeNvml) -> None:
    nvml.gpus[0].energy_mj = None
    t = [100.0]
    gpu = NvmlGpu(0, poll_interval_s=3600, clock=lambda: t[0])  # the thread never fires: the test drives time
    assert gpu.info.source == "nvml-polled"
    for _ in range(10):  # 10 s at 300 W
        t[0] += 1.0
        gpu._integrator.sample_once()
    assert gpu.energy_j() == pytest.approx(3000.0)
    nvml.gpus[0].power_mw = 100_000  # ramps 300 W -> 100 W over 2 s: the trapezoid gives 400 J
    t[0] += 2.0
    assert gpu.energy_j() == pytest.approx(3400.0)
    gpu.close()
    assert nvml.refs == 0


def test_polled_read_errors_are_counted_and_bridged(nvml: FakeNvml) -> None:
    nvml.gpus[0].energy_mj = None
    t = [0.0]
    gpu = NvmlGpu(0, poll_interval_s=3600, clock=lambda: t[0])
    nvml.gpus[0].fail_power = True
    t[0] += 1.0
    gpu._integrator.sample_once()
    assert gpu.read_errors == 1
    nvml.gpus[0].fail_power = False
    t[0] += 1.0
    assert gpu.energy_j() == pytest.approx(600.0)  # the failed poll's second is bridged, not lost
    gpu.close()


def test_integrator_raises_when_reads_keep_failing() -> None:
    t, fail = [0.0], [False]

    def read() -> float:
        if fail[0]:
            raise OSError("gone")
        return 50.0

    integ = PowerIntegrator(read, 3600, clock=lambda: t[0], name="fake", max_consecutive_errors=3)
    integ.start()
    t[0] = 2.0
    assert integ.energy_j() == pytest.approx(100.0)
    fail[0] = True
    integ.sample_once()
    integ.sample_once()
    with pytest.raises(DeviceError, match="fake: power unreadable for the last 3 polls: gone"):
        integ.energy_j()
    integ.stop()


def test_integrator_thread_polls_and_stops() -> None:
    integ = PowerIntegrator(lambda: 10.0, 0.001)
    integ.start()
    deadline = time.monotonic() + 5
    while integ.samples < 5 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert integ.samples >= 5
    integ.stop()
    assert integ._thread is None
    frozen = integ.energy_j()
    assert frozen > 0 and integ.energy_j() == frozen


def test_unset_mask_sees_every_gpu(nvml: FakeNvml) -> None:
    assert [i for i, _ in visible_gpus({})] == [0, 1, 2]
    assert nvml.refs == 0


def test_index_mask(nvml: FakeNvml) -> None:
    assert [i for i, _ in visible_gpus({"CUDA_VISIBLE_DEVICES": "2, 0"})] == [2, 0]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "-1"}) == []  # the usual way to hide every GPU


def test_uuid_mask_with_unique_prefixes(nvml: FakeNvml) -> None:
    env = {"CUDA_VISIBLE_DEVICES": f"GPU-5d5b,{UUIDS[1]}"}
    found = visible_gpus(env)
    assert [i for i, _ in found] == [2, 1]
    assert UUIDS[2] in found[0][1]


def test_unknown_or_ambiguous_ids_are_errors(nvml: FakeNvml) -> None:
    for mask, match in [("GPU-ffff", "matches no GPU"), ("GPU-8a3c", "ambiguous"), ("7", "NVML sees 3 GPU"),
                        ("0,0", "twice"), ("gpu0", "not a GPU index")]:
        with pytest.raises(DeviceError, match=match) as exc:
            visible_gpus({"CUDA_VISIBLE_DEVICES": mask})
        one_line(exc)
    assert nvml.refs == 0


def test_mixed_models_without_pci_order_are_flagged(nvml: FakeNvml) -> None:
    nvml.gpus[2].model = "NVIDIA A100-SXM4-40GB"
    assert "CUDA_DEVICE_ORDER" in visible_gpus({"CUDA_VISIBLE_DEVICES": "0"})[0][1]
    pci_order = {"CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert "CUDA_DEVICE_ORDER" not in visible_gpus(pci_order)[0][1]


def test_mig_instances_map_to_their_parent_once(nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    nvml.gpus[1].mig = [FakeMig("MIG-c6d4f1ef-42e4"), FakeMig("MIG-cba663e8-9bed")]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-c6d4,MIG-cba663e8-9bed")
    assert [i for i, _ in visible_gpus()] == [1, 1]
    gpus = open_nvml_gpus()
    assert len(gpus) == 1 and gpus[0].index == 1
    detail = gpus[0].info.detail
    assert "mig" in detail and "whole GPU" in detail and UUIDS[1] in detail
    assert "MIG-c6d4" in detail and "MIG-cba663e8-9bed" in detail
    assert gpus[0].energy_j() == 0.0
    gpus[0].close()
    with pytest.raises(DeviceError, match="twice"):  # a prefix and the full id name one instance
        visible_gpus({"CUDA_VISIBLE_DEVICES": "MIG-c6d4,MIG-c6d4f1ef-42e4"})
    assert nvml.refs == 0


def test_old_mig_format_and_mig_mode_without_mig_ids(nvml: FakeNvml) -> None:
    nvml.gpus[0].mig = [FakeMig("MIG-aaaa")]
    env = {"CUDA_VISIBLE_DEVICES": f"MIG-{UUIDS[2]}/1/0"}
    assert [i for i, _ in visible_gpus(env)] == [2]
    (index, detail), *_ = visible_gpus({})
    assert index == 0 and "mig" in detail


def test_local_rank_opens_only_its_gpu(nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,1")
    (gpu,) = open_nvml_gpus(local_rank=1)
    assert gpu.index == 1 and gpu.info.name.startswith("gpu1 ")
    gpu.close()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    (gpu,) = open_nvml_gpus(local_rank=5)  # a launcher gave each rank one GPU
    assert gpu.index == 2
    gpu.close()
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    gpus = open_nvml_gpus()
    assert [g.index for g in gpus] == [0, 1, 2]
    for g in gpus:
        g.close()
    assert nvml.refs == 0


def test_no_gpu_visible(nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(DeviceError, match="no GPU visible") as exc:
        open_nvml_gpus()
    one_line(exc)
    nvml.gpus.clear()
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    with pytest.raises(DeviceError, match="NVML sees no GPU"):
        open_nvml_gpus()
    assert nvml.refs == 0


@pytest.mark.parametrize(("error", "match"), [("NVMLError_LibraryNotFound", "libnvidia-ml"),
                                              ("NVMLError_DriverNotLoaded", "driver is not loaded"),
                                              ("NVMLError_NoPermission", "no permission")])
def test_init_failures_are_one_line(nvml: FakeNvml, error: str, match: str) -> None:
    nvml.init_error = getattr(nvml, error)()
    with pytest.raises(DeviceError, match=match) as exc:
        open_nvml_gpus()
    one_line(exc)


def test_permission_denied_on_a_gpu_is_one_line(nvml: FakeNvml) -> None:
    nvml.gpus[0].fail_handle = nvml.NVMLError_NoPermission
    with pytest.raises(DeviceError, match="no permission") as exc:
        open_nvml_gpus(local_rank=0)
    one_line(exc)
    assert nvml.refs == 0


def test_no_counter_and_no_power_is_an_error(nvml: FakeNvml) -> None:
    nvml.gpus[0].energy_mj = None
    nvml.gpus[0].fail_power = True
    with pytest.raises(DeviceError, match="gpu0: no energy counter, and power unreadable") as exc:
        NvmlGpu(0)
    one_line(exc)
    assert nvml.refs == 0


def test_pynvml_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    with pytest.raises(DeviceError) as exc:
        open_nvml_gpus()
    assert one_line(exc) == NOT_INSTALLED == "nvidia-ml-py is not installed (pip install 'dtpo[nvidia]')"
