"""A Session's GPU knobs: set for the run through the journal, restored at the end; CPU runs skip them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from fakes import FakeGpu

from dtpo.core.config import KnobConfig
from dtpo.core.errors import ConfigError
from dtpo.devices.base import Device, KnobLimits, KnobState
from dtpo.session.tuning.gpu_knobs import rank_gpus, start_knobs


@pytest.fixture(autouse=True)
def _state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DTPO_STATE_DIR", str(tmp_path / "state"))


def test_knobs_are_set_for_the_run_and_restored_after() -> None:
    gpu, lines = FakeGpu(), []
    controller = start_knobs(KnobConfig(power_limit_w=200, sm_clock_mhz=1200), [gpu], log=lines.append)
    assert controller is not None
    assert gpu.state == KnobState(200.0, (1200, 1200))
    assert controller.journal.original("fake:gpu0") == KnobState(300.0, None)
    controller.__exit__(None, None, None)
    assert gpu.state == KnobState(300.0, None)
    assert gpu.calls == ["limit 200", "lock 1200-1200", "limit 300", "unlock"]
    assert not controller.journal.path.exists()


def test_nothing_requested_touches_nothing() -> None:
    gpu = FakeGpu()
    assert start_knobs(KnobConfig(), [gpu]) is None
    assert gpu.calls == []


def test_a_cpu_run_says_knobs_are_not_applied() -> None:
    lines: list[str] = []
    assert rank_gpus(None, 0, cuda=False) == []
    assert start_knobs(KnobConfig(power_limit_w=200), [], log=lines.append) is None
    assert lines and "not applied" in lines[0]


def test_no_permission_falls_back_to_observe_and_goes_on() -> None:
    gpu, lines = FakeGpu(deny=True), []
    controller = start_knobs(KnobConfig(power_limit_w=200), [gpu], log=lines.append)
    assert controller is not None and controller.mode == "observe"
    assert gpu.state == KnobState(300.0, None)
    assert any("Insufficient Permissions; continuing in observe mode" in line for line in lines)
    controller.__exit__(None, None, None)


def test_dry_run_only_logs() -> None:
    gpu, lines = FakeGpu(), []
    controller = start_knobs(KnobConfig(power_limit_w=150, mode="dry-run"), [gpu], log=lines.append)
    assert controller is not None
    assert gpu.calls == [] and lines == ["dry run: would set gpu0 power limit 150 W"]


def test_an_unsupported_value_is_an_error_and_restores_earlier_gpus() -> None:
    first, second = FakeGpu("gpu0"), FakeGpu("gpu1")
    second.knob_limits = lambda: KnobLimits(100.0, 180.0, 180.0, ())  # type: ignore[method-assign]
    with pytest.raises(ConfigError, match="outside the range of gpu1"):
        start_knobs(KnobConfig(power_limit_w=200), [first, second], log=lambda _: None)
    assert first.state == KnobState(300.0, None) and second.calls == []


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"power_limit_w": -5}, "--power-limit"),
    ({"sm_clock_mhz": 0}, "--sm-clock"),
    ({"mode": "yolo"}, "unknown knob mode|knobs.mode must be one of"),
    ({"power_smoothing": "max"}, r"knobs.power_smoothing must be off or a preset profile 0-4 .*got 'max' "
                                 r"\(--power-smoothing\)"),
    ({"power_smoothing": "5"}, "preset profile must be 0-4, got 5"),
    ({"power_smoothing": "1:floor=120"}, "floor is a share of the GPU's total module power: 0-100 %, got 120"),
    ({"power_smoothing": "1:ramp_up=0"}, "ramp_up must be a rate in W/s above 0"),
    ({"power_smoothing": "1:ramp=5"}, "unknown parameter 'ramp=5'"),
    ({"power_smoothing": "1:floor=a"}, "floor must be a number, got 'a'"),
    ({"power_smoothing": "1:floor=10,floor=20"}, "names floor twice"),
    ({"power_smoothing": "off:floor=10"}, "off takes no parameters"),
])
def test_bad_knob_config_is_one_clear_error(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as raised:
        KnobConfig(**kwargs)
    assert "\n" not in str(raised.value)


def test_power_smoothing_is_set_for_the_run_and_restored_after(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = _virtual_gpu(tmp_path, monkeypatch, power_smoothing=True)
    before, lines = gpu.knob_state(), []
    config = KnobConfig(power_smoothing="3:ramp_down=80")
    assert config.requested and config.smoothing is not None and config.smoothing.profile == 3
    controller = start_knobs(config, [gpu], log=lines.append)
    assert controller is not None
    smoothing = gpu.knob_state().smoothing
    assert smoothing is not None and smoothing.enabled and smoothing.active_profile == 3
    assert smoothing.profiles[3].ramp_down_w_per_s == 80
    controller.__exit__(None, None, None)
    assert gpu.knob_state() == before
    assert lines[0].startswith("set gpu0") and lines[-1].startswith("restored gpu0")
    gpu.close()


@pytest.mark.parametrize(("smoothing", "mode", "said"), [
    (True, "dry-run", "dry run: would set gpu0 (NVIDIA H100 80GB HBM3) power smoothing profile 1"),
    (False, "apply", "gpu0 (NVIDIA H100 80GB HBM3) has no power smoothing (NVML's power floor and ramp limits, "
                     "GB200 and later): power smoothing profile 1 not applied"),
])
def test_dry_run_or_a_gpu_without_smoothing_only_logs(smoothing: bool, mode: str, said: str, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = _virtual_gpu(tmp_path, monkeypatch, power_smoothing=smoothing)
    before, lines = gpu.knob_state(), []
    controller = start_knobs(KnobConfig(power_smoothing="1", mode=mode), [gpu], log=lines.append)
    assert controller is not None
    controller.__exit__(None, None, None)
    assert lines == [said] and gpu.knob_state() == before
    gpu.close()


def _virtual_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **options: object) -> Device:
    pytest.importorskip("pynvml", reason="nvidia-ml-py (the dev extra) is not installed")
    if not any(shutil.which(c) for c in ("cc", "gcc", "clang")):
        pytest.skip("no C compiler to build the NVML stand-in")
    from dtpo.devices.nvml import open_nvml_gpus
    from dtpo.devices.virtual_nvml import ENV
    from dtpo.devices.virtual_nvml.make import create

    made = create(tmp_path / "vgpu", gpu="H100-SXM", root=True, **options)  # type: ignore[arg-type]
    monkeypatch.setenv(ENV, str(made.directory))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    (gpu,) = open_nvml_gpus()
    return gpu
