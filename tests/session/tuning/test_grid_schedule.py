"""``--grid-signal`` as a Session callback, on a fake NVML GPU driven by hand with a fake clock.

Each test plays a run: the fake clock and the fake GPU's energy counter advance by the step time and power that
the GPU's *current* power limit gives (a model written here: a lower limit is slower and spends less energy per
step), a window ends every few steps, and the callback sweeps the limits, then follows a signal file replayed
from its first interval. The knob calls it makes reach the fake pynvml, which logs them in order.
"""

from __future__ import annotations

import json
import os
import signal as signals
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from fakes import FakeNvml, FakeNvmlGpu

from dtpo.core.config import GridConfig
from dtpo.core.record import RankRecord
from dtpo.core.steps import Window
from dtpo.devices.base import KnobLimits
from dtpo.devices.nvml import NvmlGpu, open_nvml_gpus
from dtpo.energy.grid_signal import load_grid_signal
from dtpo.session.tuning.grid import GridCallback, SignalClock, sweep_limits
from dtpo.tune.grid_policy import GridJob, GridSetting, Throttle

UUID = "GPU-9a1d0000-0000-0000-0000-000000000000"
MAX_MW = 300_000
INTERVAL_S = 1800.0
SPEEDUP = 900.0  # one half-hour interval per 2 s of the fake clock
WINDOW_STEPS = 5
STEP_S = 0.1  # at the top limit
STEPS = 200  # 20 fake seconds at the top limit: 5 signal hours
START = datetime(2023, 3, 14, tzinfo=UTC)
DEADLINE_H = 5.9  # the job needs 5 h at the top limit, 6.4 h at the lowest: throttle must mix them


def step_model(limit_w: float) -> tuple[float, float]:
    """Step time and power at a power limit: power follows the cap below the GPU's own 280 W draw, and the step
    slows less than power falls, so a lower limit spends less energy per step."""
    power = min(limit_w, 280.0)
    return STEP_S * (280.0 / power) ** 0.4, power


def write_signal(path: Path, values: list[float]) -> Path:
    lines = ["time,value"] + [f"{(START + timedelta(seconds=k * INTERVAL_S)).isoformat()},{v}"
                              for k, v in enumerate(values)]
    path.write_text("\n".join(lines) + "\n")
    return path


DIRTY_CLEAN = [400.0 if k % 2 == 0 else 100.0 for k in range(24)]  # 12 h alternating dirty and clean


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch, state: Path) -> FakeNvml:
    fake = FakeNvml([FakeNvmlGpu(UUID, limit_mw=MAX_MW, limit_range_mw=(100_000, MAX_MW), default_limit_mw=MAX_MW)],
                    journal_path=state / "knobs-journal.json")
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return fake


@pytest.fixture
def gpus(nvml: FakeNvml) -> Iterator[list[NvmlGpu]]:
    opened = open_nvml_gpus()
    yield opened
    for gpu in opened:
        gpu.close()


class Run:
    """A hand-driven run of one rank on the fake GPU, with its own clock."""

    def __init__(self, nvml: FakeNvml, steps: int = STEPS) -> None:
        self.nvml = nvml
        self.now = 1_000.0
        self.steps = self.measured = 0
        self.session = SimpleNamespace(rank=0, world_size=1, ctx=SimpleNamespace(distributed=False), start_step=0,
                                       target_steps=steps)
        self.rank = RankRecord(rank=0, local_rank=0, node="node", device="cpu")

    def clock(self) -> float:
        return self.now

    def step(self, cb: GridCallback, warmup: bool = False) -> None:
        gpu = self.nvml.gpus[0]
        time_s, power_w = step_model(gpu.limit_mw / 1000)
        self.now += time_s
        assert gpu.energy_mj is not None
        gpu.energy_mj += int(round(power_w * time_s * 1000))
        cb.on_step_end(self.session, SimpleNamespace(step=self.steps, warmup=warmup, samples=8))
        self.steps += 1
        self.measured += not warmup
        if not warmup and self.measured % WINDOW_STEPS == 0:  # windows start at the first measured step
            first = self.steps - WINDOW_STEPS
            cb.on_window_end(self.session, Window(self.measured // WINDOW_STEPS - 1, first, self.steps - 1, 0.0,
                                                  8 * WINDOW_STEPS, STEP_S))

    def train(self, cb: GridCallback, until: int | None = None) -> None:
        cb.on_train_start(self.session)
        self.step(cb, warmup=True)
        while self.steps < (until or self.session.target_steps):
            self.step(cb)

    def finish(self, cb: GridCallback) -> dict:
        cb.on_rank_end(self.session, self.rank)
        out = self.rank.to_dict()
        json.dumps(out)  # it goes into record.json as it is
        assert RankRecord.from_dict(json.loads(json.dumps(out))).to_dict() == out  # and reads back the same
        return out["grid"]


def make(tmp_path: Path, run: Run, gpus: list[NvmlGpu], deadline_h: float, mode: str = "apply",
         values: list[float] = DIRTY_CLEAN) -> GridCallback:
    config = GridConfig(signal=str(write_signal(tmp_path / "signal.csv", values)), deadline_h=deadline_h,
                        replay=SPEEDUP)
    return GridCallback(config, mode, list(gpus), clock=run.clock)


def set_limits_w(nvml: FakeNvml) -> list[float]:
    return [call[1] / 1000 for call in nvml.calls if call[0] == "set_limit"]  # type: ignore[index]


# -- the signal's clock -----------------------------------------------------------------------------------------


def test_a_replayed_run_maps_wall_seconds_onto_the_signals_intervals(tmp_path: Path) -> None:
    signal = load_grid_signal(write_signal(tmp_path / "s.csv", DIRTY_CLEAN))
    clock = SignalClock(signal, wall_start=50.0, speedup=SPEEDUP)
    assert clock.run_start == START and clock.anchor == 0 and clock.offset_s == 0.0
    assert clock.job_interval(clock.job_time_s(50.0)) == 0
    assert clock.job_interval(clock.job_time_s(51.999)) == 0  # 1799.1 signal seconds
    assert clock.job_interval(clock.job_time_s(52.0)) == 1  # 2 wall s x 900 = one interval
    assert clock.job_interval(clock.job_time_s(57.5)) == 3
    assert clock.interval_start(3) == START + timedelta(hours=1.5)


def test_a_run_on_the_clock_starts_in_the_interval_holding_now(tmp_path: Path) -> None:
    signal = load_grid_signal(write_signal(tmp_path / "s.csv", DIRTY_CLEAN))
    now = (START + timedelta(hours=2, minutes=10)).timestamp()
    clock = SignalClock(signal, wall_start=now)
    assert clock.anchor == 4 and clock.offset_s == 600.0  # 10 minutes into the 2:00 interval
    assert clock.job_interval(clock.job_time_s(now + 1199)) == 0
    assert clock.job_interval(clock.job_time_s(now + 1200)) == 1  # 2:30
    assert clock.interval_start(1) == START + timedelta(hours=2, minutes=30)


def test_the_sweep_measures_the_top_limit_and_three_below_it() -> None:
    assert sweep_limits(KnobLimits(100.0, 300.0, 300.0, ())) == [300.0, 250.0, 200.0, 150.0]
    assert sweep_limits(KnobLimits(200.0, 700.0, 700.0, ())) == [700.0, 583.0, 467.0, 350.0]
    assert sweep_limits(KnobLimits(250.0, 300.0, 300.0, ())) == [300.0, 283.0, 267.0, 250.0]


# -- a run following the signal -----------------------------------------------------------------------------------


def test_the_limits_follow_throttles_choices_by_the_deadline_and_come_back(
        tmp_path: Path, nvml: FakeNvml, gpus: list[NvmlGpu], state: Path) -> None:
    run = Run(nvml)
    cb = make(tmp_path, run, gpus, deadline_h=DEADLINE_H)
    run.train(cb)
    assert cb.phase == "throttle"
    section = run.finish(cb)

    # the sweep measured each limit's time and energy per sample as the model gives them
    measured = {s["power_limit_w"]: s for s in section["settings"]}
    assert list(measured) == [300.0, 250.0, 200.0, 150.0] and section["source"] == "measured"
    for watts, setting in measured.items():
        time_s, power_w = step_model(watts)
        assert setting["time_per_sample_s"] == pytest.approx(time_s * SPEEDUP / 8, rel=1e-3)
        assert setting["energy_per_sample_j"] == pytest.approx(time_s * power_w / 8, rel=1e-3)

    # every limit held after the sweep is the one Throttle chooses from the same figures
    settings = [GridSetting(f"{w:g} W", w, s["time_per_sample_s"], s["energy_per_sample_j"])
                for w, s in measured.items()]
    job = GridJob(STEPS * 8, DEADLINE_H * 3600, INTERVAL_S)
    forecast = np.array(DIRTY_CLEAN[:job.intervals])
    held = [s for s in section["intervals"] if s["phase"] == "throttle"]
    assert len(held) >= 6
    for segment in held:
        expected = Throttle(settings, job).decide(segment["interval"], segment["decision"]["done"], forecast)
        assert segment["power_limit_w"] == settings[expected].power_limit_w, segment
    dirty = [s["power_limit_w"] for s in held if s["signal"] == 400.0]
    clean = [s["power_limit_w"] for s in held if s["signal"] == 100.0]
    assert dirty and clean and max(dirty) < min(clean)  # it spends energy while the grid is clean

    # the GPU got exactly those limits, in order, and its own limit back at the end, with nothing left to restore
    changes = [segment["power_limit_w"] for segment in section["intervals"]]
    distinct = [w for i, w in enumerate(changes) if i == 0 or w != changes[i - 1]]  # the sweep starts at the top
    assert set_limits_w(nvml)[:-1] == distinct and set_limits_w(nvml)[-1] == 300.0
    assert nvml.gpus[0].limit_mw == MAX_MW and not (state / "knobs-journal.json").exists()

    # finished by the deadline; cost as measured, and the estimate against a signal-blind run says it is one
    outcome = section["outcome"]
    assert outcome["deadline_met"] and outcome["finished_h"] <= DEADLINE_H
    assert outcome["energy_j"] == pytest.approx(sum(s["energy_j"] for s in section["intervals"]))
    estimate = outcome["estimated"]
    assert estimate["note"].startswith("estimated") and 0 < estimate["saving"] < 1
    assert estimate["cost"] < estimate["blind_cost"]
    assert section["signal"]["values"][:4] == DIRTY_CLEAN[:4] and section["signal"]["replay"] == SPEEDUP


def test_a_tighter_deadline_holds_higher_limits_and_still_meets_it(
        tmp_path: Path, nvml: FakeNvml, gpus: list[NvmlGpu]) -> None:
    results = {}
    for deadline_h in (5.3, 6.6):
        run = Run(nvml)
        cb = make(tmp_path, run, gpus, deadline_h=deadline_h)
        run.train(cb)
        section = run.finish(cb)
        assert section["outcome"]["deadline_met"], (deadline_h, section["outcome"])
        results[deadline_h] = section["outcome"]["energy_j"]
    assert results[5.3] > results[6.6]  # less slack, more time at the faster (hungrier) limits


def test_an_interrupt_restores_the_limit(tmp_path: Path, nvml: FakeNvml, gpus: list[NvmlGpu], state: Path) -> None:
    run = Run(nvml)
    cb = make(tmp_path, run, gpus, deadline_h=7.0)
    run.train(cb, until=80)
    assert nvml.gpus[0].limit_mw != MAX_MW  # a lower limit is in force when the interrupt comes
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signals.SIGINT)
    assert nvml.gpus[0].limit_mw == MAX_MW and not (state / "knobs-journal.json").exists()
    cb.restore()


def test_dry_run_changes_nothing_and_says_why(tmp_path: Path, nvml: FakeNvml, gpus: list[NvmlGpu]) -> None:
    run = Run(nvml)
    cb = make(tmp_path, run, gpus, deadline_h=7.0, mode="dry-run")
    run.train(cb)
    section = run.finish(cb)
    assert set_limits_w(nvml) == [] and section["intervals"] == [] and "dry-run mode" in section["note"]


def test_a_deadline_that_cannot_be_met_holds_the_fastest_limit_and_says_so(
        tmp_path: Path, nvml: FakeNvml, gpus: list[NvmlGpu]) -> None:
    run = Run(nvml)
    cb = make(tmp_path, run, gpus, deadline_h=4.0)  # the job needs 5 h at the top limit
    run.train(cb)
    section = run.finish(cb)
    assert {s["power_limit_w"] for s in section["intervals"] if s["phase"] == "throttle"} == {300.0}
    assert "could not be met" in section["note"] and not section["outcome"]["deadline_met"]


def _checkpointed(cb: GridCallback) -> dict[str, Any]:
    """The callback's state as a checkpoint keeps it (through JSON), its GPUs' limits put back (the process ends)."""
    state = json.loads(json.dumps(cb.state_dict()))
    cb.restore()
    return state


def _resumed(tmp_path: Path, later: Run, gpus: list[NvmlGpu], state: dict[str, Any]) -> GridCallback:
    """A new callback on ``later``'s run, started, then given the checkpointed ``state``."""
    resumed = make(tmp_path, later, gpus, deadline_h=DEADLINE_H)
    resumed.on_train_start(later.session)
    resumed.load_state_dict(state)
    return resumed


def test_a_resumed_run_goes_on_with_the_same_schedule_without_sweeping_again(
        tmp_path: Path, nvml: FakeNvml, gpus: list[NvmlGpu]) -> None:
    run = Run(nvml)
    cb = make(tmp_path, run, gpus, deadline_h=DEADLINE_H)
    run.train(cb, until=120)
    assert cb.phase == "throttle"
    state = _checkpointed(cb)

    later = Run(nvml)
    later.now = run.now + 1.0  # restarted a fake second (15 signal minutes) later, from step 120
    later.steps = later.measured = 120
    later.session.start_step = 120
    resumed = _resumed(tmp_path, later, gpus, state)
    assert resumed.phase == "restored" and resumed.signal_clock.wall_start == cb.signal_clock.wall_start
    while later.steps < STEPS:
        later.step(resumed)
    assert resumed.phase == "throttle" and resumed.settings == cb.settings  # not measured again
    section = later.finish(resumed)
    assert section["intervals"][:len(state["segments"])] == state["segments"]
    phases = [s["phase"] for s in section["intervals"][len(state["segments"]):]]
    assert phases[0] == "resumed" and set(phases[1:]) == {"throttle"}
    assert section["intervals"][len(state["segments"])]["from_step"] == 120  # steps count from the run's start
    assert section["job"]["samples"] == STEPS * 8  # the whole job, as the first attempt scheduled it
    outcome = section["outcome"]
    assert outcome["deadline_met"] and outcome["finished_h"] == pytest.approx(
        (later.now - cb.signal_clock.wall_start) * SPEEDUP / 3600, rel=1e-6)


def test_a_sweep_cut_short_starts_again_after_a_resume(tmp_path: Path, nvml: FakeNvml, gpus: list[NvmlGpu]) -> None:
    run = Run(nvml)
    cb = make(tmp_path, run, gpus, deadline_h=DEADLINE_H)
    run.train(cb, until=8)
    assert cb.phase == "sweep"
    state = _checkpointed(cb)
    later = Run(nvml)
    resumed = _resumed(tmp_path, later, gpus, state)
    assert resumed.phase == "sweep" and not resumed.settings
    resumed.restore()
