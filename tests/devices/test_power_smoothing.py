"""NVML power smoothing through the journaled knob controller, on virtual GPUs with and without the feature."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dtpo.core.errors import ConfigError
from dtpo.core.power_smoothing import parse_power_smoothing
from dtpo.devices.journal import JournalError, KnobJournal, restore_pending
from dtpo.devices.knobs import KnobController
from dtpo.devices.nvml import NvmlGpu, open_nvml_gpus
from dtpo.devices.virtual_nvml import ENV, VirtualGpus
from dtpo.devices.virtual_nvml.make import create

pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py (the dev extra) is not installed")
if not any(shutil.which(c) for c in ("cc", "gcc", "clang")):
    pytest.skip("no C compiler to build the NVML stand-in (install gcc)", allow_module_level=True)

PROFILE_2 = "2:floor=60,ramp_up=300,ramp_down=120,hysteresis=250"
SETTERS = ("nvmlDevicePowerSmoothingSetState", "nvmlDevicePowerSmoothingActivatePresetProfile",
           "nvmlDevicePowerSmoothingUpdatePresetProfileParam")


def _gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **options: object) -> tuple[NvmlGpu, VirtualGpus]:
    options = {"gpu": "H100-SXM", "root": True, "utilization": 0.1, "log_calls": True, **options}
    made = create(tmp_path / "vgpu", **options)  # type: ignore[arg-type]
    monkeypatch.setenv(ENV, str(made.directory))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    (gpu,) = open_nvml_gpus()
    return gpu, made


def _setter_calls(made: VirtualGpus) -> list[str]:
    return [line.split()[1] for line in made.call_log.read_text().splitlines() if line.split()[1] in SETTERS]


@pytest.fixture
def journal(tmp_path: Path) -> KnobJournal:
    return KnobJournal(tmp_path / "state" / "knobs-journal.json")


def test_a_profile_is_journaled_first_applied_and_restored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           journal: KnobJournal) -> None:
    gpu, _ = _gpu(tmp_path, monkeypatch, power_smoothing=True)
    before = gpu.knob_state()
    assert before.smoothing is not None and not before.smoothing.enabled
    idle_power = gpu.power_w()
    lines: list[str] = []
    with KnobController("apply", journal=journal, log=lines.append) as controller:
        assert controller.set_power_smoothing(gpu, parse_power_smoothing(PROFILE_2))
        smoothing = gpu.knob_state().smoothing
        assert smoothing is not None and smoothing.enabled and smoothing.active_profile == 2
        profile = smoothing.profiles[2]
        assert (profile.floor_pct, profile.ramp_up_w_per_s, profile.ramp_down_w_per_s,
                profile.ramp_down_hysteresis_ms) == (60, 300, 120, 250)
        assert smoothing.profiles[1] == before.smoothing.profiles[1]  # the other profiles untouched
        assert gpu.power_w() == pytest.approx(0.6 * 700)  # the floor holds a 10 %-busy H100 at 60 % of 700 W
        assert idle_power < 0.6 * 700
        assert journal.original(gpu.knob_key) == before  # what was there before the change
    assert gpu.knob_state() == before and gpu.power_w() == pytest.approx(idle_power)
    assert not journal.path.exists()
    assert lines[0] == ("set gpu0 (NVIDIA H100 80GB HBM3) power smoothing profile 2 (floor 60 %, ramp up 300 W/s, "
                        "ramp down 120 W/s, hysteresis 250 ms)")
    assert "power smoothing off" in lines[-1] and lines[-1].startswith("restored gpu0")
    gpu.close()


@pytest.mark.parametrize(("mode", "said"), [("dry-run", "dry run: would set gpu0"),
                                            ("observe", "observe mode: gpu0")])
def test_dry_run_and_observe_log_and_change_nothing(mode: str, said: str, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch, journal: KnobJournal) -> None:
    gpu, made = _gpu(tmp_path, monkeypatch, power_smoothing=True)
    before = gpu.knob_state()
    lines: list[str] = []
    with KnobController(mode, journal=journal, log=lines.append) as controller:
        assert not controller.set_power_smoothing(gpu, parse_power_smoothing(PROFILE_2))
    assert gpu.knob_state() == before and not journal.path.exists() and _setter_calls(made) == []
    assert len(lines) == 1 and lines[0].startswith(said) and "power smoothing profile 2 (floor 60 %" in lines[0]
    gpu.close()


def test_a_gpu_without_power_smoothing_is_a_logged_no_op(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         journal: KnobJournal) -> None:
    gpu, made = _gpu(tmp_path, monkeypatch)
    assert gpu.power_smoothing_limits() is None and gpu.knob_state().smoothing is None
    lines: list[str] = []
    for mode in ("apply", "dry-run"):
        with KnobController(mode, journal=journal, log=lines.append) as controller:
            assert not controller.set_power_smoothing(gpu, parse_power_smoothing("1"))
    assert lines == ["gpu0 (NVIDIA H100 80GB HBM3) has no power smoothing (NVML's power floor and ramp limits, "
                     "GB200 and later): power smoothing profile 1 not applied"] * 2
    assert not journal.path.exists() and _setter_calls(made) == []
    gpu.close()


def test_an_nvidia_ml_py_without_the_api_is_a_gpu_without_power_smoothing(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    gpu, _ = _gpu(tmp_path, monkeypatch, power_smoothing=True)
    monkeypatch.delattr(pynvml, "nvmlDevicePowerSmoothingSetState")
    assert gpu.power_smoothing_limits() is None and gpu.knob_state().smoothing is None
    gpu.close()


def test_no_permission_falls_back_to_observe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             journal: KnobJournal) -> None:
    gpu, _ = _gpu(tmp_path, monkeypatch, power_smoothing=True, root=False)
    before = gpu.knob_state()
    lines: list[str] = []
    with KnobController("apply", journal=journal, log=lines.append) as controller:
        assert not controller.set_power_smoothing(gpu, parse_power_smoothing("off"))  # already off: nothing to do
        assert not controller.set_power_smoothing(gpu, parse_power_smoothing("3"))
        assert controller.mode == "observe"
    assert gpu.knob_state() == before and not journal.path.exists()
    assert lines[0] == "gpu0 (NVIDIA H100 80GB HBM3) power smoothing off: already so, nothing to change"
    assert "Insufficient Permissions" in lines[1] and lines[1].endswith("continuing in observe mode")
    gpu.close()


@pytest.mark.parametrize(("value", "message"), [("2:floor=95", "floor 95 % is outside the range of gpu0.*0-90 %")])
def test_a_floor_the_gpu_does_not_take_changes_nothing(value: str, message: str, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch, journal: KnobJournal) -> None:
    gpu, made = _gpu(tmp_path, monkeypatch, power_smoothing=True)
    with KnobController("apply", journal=journal, log=lambda _: None) as controller, \
            pytest.raises(ConfigError, match=message):
        controller.set_power_smoothing(gpu, parse_power_smoothing(value))
    assert _setter_calls(made) == [] and not journal.path.exists()
    gpu.close()


def test_smoothing_left_by_a_killed_run_is_restored_at_the_next_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                      journal: KnobJournal) -> None:
    gpu, _ = _gpu(tmp_path, monkeypatch, power_smoothing=True)
    before = gpu.knob_state()
    controller = KnobController("apply", journal=journal, log=lambda _: None)  # no `with`: as if killed
    controller.set_power_smoothing(gpu, parse_power_smoothing(PROFILE_2))
    assert gpu.knob_state() != before
    saved = json.loads(journal.path.read_text())["entries"][gpu.knob_key]["original"]["smoothing"]
    assert saved["enabled"] is False and saved["profiles"][2]["floor_pct"] == 40  # in the file before the change
    lines = restore_pending(journal)  # what the next dtpo start (or `dtpo restore`) does
    assert len(lines) == 1 and "power smoothing off" in lines[0]
    assert gpu.knob_state() == before and not journal.path.exists()
    gpu.close()


def test_a_journal_with_unreadable_smoothing_is_a_clear_error(journal: KnobJournal) -> None:
    journal.path.parent.mkdir(mode=0o700, parents=True)
    entry = {"device": "gpu0", "original": {"power_limit_w": 700.0, "locked_sm_clocks_mhz": None,
                                            "smoothing": {"enabled": "yes", "active_profile": 0, "profiles": []}}}
    journal.path.write_text(json.dumps({"schema": "dtpo.knobs-journal/1", "entries": {"nvml:GPU-1": entry}}))
    with pytest.raises(JournalError, match="no usable original settings"):
        journal.entries()
