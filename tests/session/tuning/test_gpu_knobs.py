"""A Session's GPU knobs: set for the run through the journal, restored at the end; CPU runs skip them."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes import FakeGpu

from dtpo.core.config import KnobConfig
from dtpo.core.errors import ConfigError
from dtpo.devices.base import KnobLimits, KnobState
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


@pytest.mark.parametrize(("kwargs", "message"), [({"power_limit_w": -5}, "--power-limit"),
                                                 ({"sm_clock_mhz": 0}, "--sm-clock"),
                                                 ({"mode": "yolo"}, "unknown knob mode|knobs.mode must be one of")])
def test_bad_knob_config_is_one_clear_error(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        KnobConfig(**kwargs)
