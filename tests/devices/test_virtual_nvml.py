"""Virtual GPUs: dtpo's NVML stand-in, read and set through the real nvidia-ml-py binding, unmodified."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dtpo.core.errors import ConfigError
from dtpo.devices.base import DeviceError, KnobError
from dtpo.devices.knobs import KnobController
from dtpo.devices.nvml import open_nvml_gpus
from dtpo.devices.physics.gpu_model import load_model
from dtpo.devices.physics.power_specs import POWER_SPECS, PowerSpec, match_power_spec
from dtpo.devices.virtual_nvml import ENV, VirtualGpus, preload
from dtpo.devices.virtual_nvml import state as st
from dtpo.devices.virtual_nvml.make import create, inject
from dtpo.energy.monitor import Monitor

pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py (the dev extra) is not installed")
if not any(shutil.which(c) for c in ("cc", "gcc", "clang")):
    pytest.skip("no C compiler to build the NVML stand-in (install gcc)", allow_module_level=True)


def _make(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **options: object) -> VirtualGpus:
    made = create(tmp_path / "vgpu", **options)  # type: ignore[arg-type]
    monkeypatch.setenv(ENV, str(made.directory))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return made


def _calls(made: VirtualGpus) -> list[list[str]]:
    return [line.split() for line in made.call_log.read_text().splitlines()]


def test_the_real_binding_reads_them_in_nvml_units(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made = _make(tmp_path, monkeypatch, gpu="A40", count=2, log_calls=True)
    gpus = open_nvml_gpus()
    try:
        assert [g.info.name for g in gpus] == ["gpu0 (NVIDIA A40)", "gpu1 (NVIDIA A40)"]
        assert gpus[0].uuid != gpus[1].uuid and gpus[0].uuid.startswith("GPU-")
        info = gpus[0].info
        assert (info.source, info.estimated) == ("simulated", True)  # never a measurement
        assert "simulated, not measured" in info.detail and "energy counter" in info.detail
        limits = gpus[0].knob_limits()
        assert (limits.min_power_limit_w, limits.max_power_limit_w, limits.default_power_limit_w) == (100, 300, 300)
        assert limits.sm_clocks_mhz[0] == 210 and limits.sm_clocks_mhz[-1] == 1740  # the A40's clocks
        assert 30 < gpus[0].power_w() <= 300  # milliwatts read as watts: a unit slip would be 1000x off
    finally:
        for gpu in gpus:
            gpu.close()
    # the binding called the versioned entry points, as it does on a real driver
    names = [call[1] for call in _calls(made)]
    assert "nvmlDeviceGetHandleByIndex" in names and "dtpoVirtualGpuDescribe" in names


def test_the_counter_advances_at_the_power_in_force(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _make(tmp_path, monkeypatch, gpu="A40", root=True)
    (gpu,) = open_nvml_gpus()
    drawn = {}
    try:
        for limit in (300.0, 150.0):
            gpu.set_power_limit(limit)
            power = drawn[limit] = gpu.power_w()
            t0 = time.monotonic()
            first = gpu.counter_mj()
            t1 = time.monotonic()
            while time.monotonic() - t1 < 0.05:
                pass
            t2 = time.monotonic()
            second = gpu.counter_mj()
            t3 = time.monotonic()
            assert first is not None and second is not None
            joules = (second - first) / 1000.0
            # the readings were taken inside [t0, t1] and [t2, t3]: energy lies between power x the two spans
            assert power * (t2 - t1) * 0.99 - 0.002 <= joules <= power * (t3 - t0) * 1.01 + 0.002
        assert drawn[150.0] < drawn[300.0]
    finally:
        gpu.close()


def test_a_lower_limit_or_clock_lock_draws_less(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _make(tmp_path, monkeypatch, gpu="V100", root=True)
    (gpu,) = open_nvml_gpus()
    try:
        full, full_clock = gpu.power_w(), gpu.sm_clock_mhz()
        gpu.set_power_limit(150)
        capped, capped_clock = gpu.power_w(), gpu.sm_clock_mhz()
        assert capped <= 150 < full and capped_clock < full_clock
        gpu.set_power_limit(250)
        gpu.lock_sm_clocks(135, 900)
        assert gpu.sm_clock_mhz() <= 900 and gpu.power_w() < full
        gpu.unlock_sm_clocks()
        assert gpu.power_w() == pytest.approx(full)
    finally:
        gpu.close()


def test_slow_steps_give_the_simulators_time_factor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _make(tmp_path, monkeypatch, gpu="A40", root=True, slow_steps=True)
    (gpu,) = open_nvml_gpus()
    try:
        assert gpu.virtual_time_factor() == pytest.approx(1.0)  # the default setting
        gpu.set_power_limit(100)
        slowed = gpu.virtual_time_factor()
        model = load_model("A40", "resnet50")
        assert slowed == pytest.approx(model.at(100.0).time_per_sample_s / model.at().time_per_sample_s, rel=1e-3)
        assert slowed > 1.2  # an A40 at a third of its power is much slower
    finally:
        gpu.close()


def test_a_slow_fault_multiplies_the_time_factor_and_1_clears_it(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    made = _make(tmp_path, monkeypatch, gpu="A40", count=2, root=True, slow_steps=True)
    gpus = open_nvml_gpus()
    try:
        gpus[0].set_power_limit(150)
        before, other = gpus[0].virtual_time_factor(), gpus[1].virtual_time_factor()
        power = gpus[0].power_w()
        inject(made.directory, 0, slow_factor=1.5)  # seen at the next call, without reopening
        assert gpus[0].virtual_time_factor() == pytest.approx(before * 1.5, rel=1e-6)  # on top of the setting's
        assert gpus[1].virtual_time_factor() == pytest.approx(other)  # the other GPU keeps its pace
        assert gpus[0].power_w() == pytest.approx(power)  # power stays the setting's
        inject(made.directory, 0, slow_factor=1)
        assert gpus[0].virtual_time_factor() == pytest.approx(before)
    finally:
        for gpu in gpus:
            gpu.close()
    with st.locked(made.state_path) as state:
        assert [state.gpus[i].slow_factor for i in range(state.count)] == [1.0, 1.0]


@pytest.mark.parametrize("factor", [0.5, 0.0, -2.0, float("nan"), float("inf"), 1e39])
def test_a_bad_slow_factor_is_a_one_line_error(factor: float, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    made = _make(tmp_path, monkeypatch, slow_steps=True)
    with pytest.raises(ConfigError, match="finite number of 1 or more") as raised:
        inject(made.directory, 0, slow_factor=factor)
    assert "\n" not in str(raised.value)
    with st.locked(made.state_path) as state:
        assert state.gpus[0].slow_factor == 1.0  # nothing written


def test_a_slow_fault_needs_slow_steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made = _make(tmp_path, monkeypatch)
    with pytest.raises(ConfigError, match="--slow needs virtual GPUs made with --slow-steps; ") as raised:
        inject(made.directory, 0, slow_factor=2.0)
    assert "\n" not in str(raised.value)
    with st.locked(made.state_path) as state:
        assert state.gpus[0].slow_factor == 1.0


def test_without_slow_steps_there_is_no_time_factor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _make(tmp_path, monkeypatch, gpu="A40")
    (gpu,) = open_nvml_gpus()
    try:
        assert gpu.virtual_time_factor() is None
    finally:
        gpu.close()


def test_setting_without_root_is_refused_and_tuning_falls_back_to_observing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DTPO_STATE_DIR", str(tmp_path / "state"))
    _make(tmp_path, monkeypatch, gpu="A40", root=False)
    (gpu,) = open_nvml_gpus()
    try:
        with pytest.raises(KnobError, match="Insufficient Permissions") as refused:
            gpu.set_power_limit(200)
        assert refused.value.permission
        lines: list[str] = []
        controller = KnobController("apply", log=lines.append)
        assert controller.set_power_limit(gpu, 200) is False
        assert controller.mode == "observe" and "continuing in observe mode" in lines[-1]
        assert gpu.knob_state().power_limit_w == 300  # nothing changed
        assert not (tmp_path / "state" / "knobs-journal.json").exists()  # and nothing left to restore
    finally:
        gpu.close()


def test_limits_outside_the_constraints_are_invalid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _make(tmp_path, monkeypatch, gpu="A40", root=True)
    (gpu,) = open_nvml_gpus()
    try:
        for watts in (99.0, 301.0):
            with pytest.raises(KnobError, match="Invalid Argument"):
                gpu.set_power_limit(watts)
        assert gpu.knob_state().power_limit_w == 300
    finally:
        gpu.close()


def test_a_lost_gpu_is_reported_lost_and_the_others_go_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made = _make(tmp_path, monkeypatch, gpu="A40", count=2)
    gpus = open_nvml_gpus()
    lost_lines: list[str] = []
    monitor = Monitor(gpus, sample_interval_s=None, on_lost=lost_lines.append)
    try:
        monitor.begin_window("run")
        inject(made.directory, 1, lost=True)
        with pytest.raises(DeviceError, match="GPU is lost"):
            gpus[1].energy_j()
        window = monitor.end_window("run")
        assert window.lost == ("gpu1 (NVIDIA A40)",) and "gpu0 (NVIDIA A40)" in window.energy_j
        assert lost_lines and "GPU is lost" in lost_lines[0]
        with pytest.raises(DeviceError, match="GPU is lost"):  # every call: the GPU stays lost
            gpus[1].power_w()
    finally:
        monitor.close()
        for gpu in gpus:
            gpu.close()


def test_a_counter_that_wraps_is_counted_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made = _make(tmp_path, monkeypatch, gpu="A40")
    with st.locked(made.state_path) as state:
        used_mj = state.gpus[0].energy_mj  # as of the last reading (none yet: 0)
    offset = 2**64 - int(used_mj) - 50_000  # 50 J below the top: about 0.2 s at the A40's 235 W
    inject(made.directory, 0, energy_offset_mj=offset)
    (gpu,) = open_nvml_gpus()  # dtpo's first reading is just below the top
    try:
        raw_before = gpu.counter_mj()
        deadline = time.monotonic() + 30  # a guard against a hang, not a timing: it wraps within milliseconds
        while (raw := gpu.counter_mj()) >= raw_before and time.monotonic() < deadline:
            pass
        assert raw < raw_before < 2**64
        assert 0 < gpu.energy_j() < 10_000  # counted on across the wrap, not a figure near -2**64 mJ
    finally:
        gpu.close()


def test_a_counter_that_goes_back_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made = _make(tmp_path, monkeypatch, gpu="A40")
    inject(made.directory, 0, energy_offset_mj=10**9)  # a driver that has counted 1 MJ already
    (gpu,) = open_nvml_gpus()
    try:
        assert gpu.energy_j() >= 0
        inject(made.directory, 0, energy_offset_mj=10**9 - 10_000_000)  # 10 kJ back: a reset or a reload
        with pytest.raises(DeviceError, match="went backwards"):
            gpu.energy_j()
    finally:
        gpu.close()


def test_a_lost_gpu_leaves_the_others_listed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made = _make(tmp_path, monkeypatch, gpu="A40", count=3)
    inject(made.directory, 1, lost=True)
    gpus = open_nvml_gpus()
    try:
        assert [g.index for g in gpus] == [0, 2]
    finally:
        for gpu in gpus:
            gpu.close()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    with pytest.raises(DeviceError, match="names GPU 1, which NVML reports lost"):
        open_nvml_gpus()


def test_pre_volta_gpus_have_no_counter_and_no_clock_locks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _make(tmp_path, monkeypatch, gpu="P100", root=True)
    (gpu,) = open_nvml_gpus(poll_interval_s=0.01)
    try:
        assert gpu.info.source == "simulated" and "power polled" in gpu.info.detail
        assert gpu.counter_mj() is None
        with pytest.raises(KnobError, match="Not Supported"):
            gpu.lock_sm_clocks(500, 800)
    finally:
        gpu.close()


@pytest.mark.slow
def test_two_processes_share_one_virtual_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made = _make(tmp_path, monkeypatch, gpu="A40", root=True, log_calls=True)
    child = textwrap.dedent("""
        from dtpo.devices.nvml import open_nvml_gpus
        (gpu,) = open_nvml_gpus()
        gpu.set_power_limit(175)
        print(gpu.counter_mj())
        gpu.close()
    """)
    (gpu,) = open_nvml_gpus()
    try:
        before = gpu.counter_mj()
        done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        in_child = int(done.stdout.split()[-1])
        after = gpu.counter_mj()
        assert before <= in_child <= after  # one counter, whoever reads it
        assert gpu.knob_state().power_limit_w == 175  # the limit the other process set
    finally:
        gpu.close()
    setters = {call[0] for call in _calls(made) if call[1] == "nvmlDeviceSetPowerManagementLimit"}
    assert len(setters) == 1 and str(done.stdout) != ""  # the child's pid, not ours


@pytest.mark.parametrize("spec", [s for s in POWER_SPECS if not s.name.startswith("MI")], ids=lambda s: s.name)
def test_every_nvidia_gpu_is_named_as_nvml_names_it_and_found_again(
        spec: PowerSpec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _make(tmp_path, monkeypatch, gpu=spec.name)
    (gpu,) = open_nvml_gpus(poll_interval_s=0.01)
    try:
        assert match_power_spec(gpu.info.name) == spec  # dtpo's tuner finds the model of the GPU it reads
        limits = gpu.knob_limits()
        assert (limits.min_power_limit_w, limits.max_power_limit_w) == (spec.min_power_w, spec.max_power_w)
        assert spec.idle_power_w < gpu.power_w() <= spec.max_power_w
    finally:
        gpu.close()


def _set_in_forked_child(limit_w: float) -> None:
    (gpu,) = open_nvml_gpus()  # the library and its state were inherited from the parent, already initialised
    try:
        gpu.set_power_limit(limit_w)
        for _ in range(200):
            gpu.counter_mj()
    finally:
        gpu.close()


@pytest.mark.slow
def test_a_forked_child_uses_the_gpu_beside_its_parent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import multiprocessing

    _make(tmp_path, monkeypatch, gpu="A40", root=True)
    (gpu,) = open_nvml_gpus()
    try:
        child = multiprocessing.get_context("fork").Process(target=_set_in_forked_child, args=(150.0,))
        child.start()
        readings = [gpu.counter_mj() for _ in range(200)]  # at the same time as the child
        child.join(timeout=60)
        assert child.exitcode == 0
        assert readings == sorted(readings)
        assert gpu.knob_state().power_limit_w == 150
    finally:
        gpu.close()


def test_the_state_layouts_agree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made = _make(tmp_path, monkeypatch)
    library = ctypes.CDLL(str(made.library))
    library.dtpoVirtualGpuStateSize.restype = ctypes.c_ulonglong
    assert library.dtpoVirtualGpuStateSize() == ctypes.sizeof(st.State) == made.state_path.stat().st_size


@pytest.mark.parametrize("options, message", [
    (dict(gpu="MI250X"), "AMD GPU"),
    (dict(gpu="Z9000"), "unknown GPU model"),
    (dict(count=0), "count must be 1-16"),
    (dict(count=17), "count must be 1-16"),
    (dict(utilization=1.5), "utilization must be between 0 and 1"),
])
def test_bad_options_are_one_line_errors(tmp_path: Path, options: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        create(tmp_path / "vgpu", **options)


def test_an_empty_directory_is_named_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(DeviceError, match="holds no virtual GPUs: make them with `dtpo virtual-gpus create"):
        preload({ENV: str(tmp_path)})


@pytest.mark.parametrize("loosen", ["folder", "library"])
def test_a_stand_in_others_could_have_planted_is_not_loaded(loosen: str, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    made = create(tmp_path / "vgpu")
    target = made.directory if loosen == "folder" else made.library
    target.chmod(target.stat().st_mode | 0o022)  # group- and world-writable: anyone could swap the library
    with pytest.raises(DeviceError, match=f"refusing to load .*: {target} is writable by others"):
        preload({ENV: str(made.directory)})
    monkeypatch.setenv(ENV, str(made.directory))
    with pytest.raises(DeviceError, match="refusing to load"):  # and dtpo's NVML path says so in one line
        open_nvml_gpus()


def test_a_fault_on_a_missing_gpu_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made = _make(tmp_path, monkeypatch, count=1)
    with pytest.raises(ConfigError, match="no virtual GPU 3"):
        inject(made.directory, 3, lost=True)
    with pytest.raises(ConfigError, match="no virtual GPUs in"):
        inject(tmp_path / "nowhere", 0, lost=True)
