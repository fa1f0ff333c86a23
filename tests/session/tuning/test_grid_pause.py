"""``--grid-policy pause`` as a Session callback, driven by hand with a fake clock.

Each test plays a run of one rank: the fake clock advances by a fixed step time, each window carries the energy a
fixed power gives, a pause's sleep moves the clock on, and the energy callback's ``skip_gap`` and the heartbeat
are the real ones' stand-ins (the heartbeat is real). The callback measures the run's figures, then pauses and
resumes as :class:`PauseWhenDirty` decides on the same figures and the signal file replayed from its first
interval.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from dtpo.core.config import GridConfig
from dtpo.core.record import RankRecord
from dtpo.core.steps import Window
from dtpo.distributed.heartbeat import HeartbeatWriter
from dtpo.energy.monitor import WindowMeasurement
from dtpo.session.tuning.grid_pause import GridPauseCallback
from dtpo.tune.grid_policy import PAUSE, GridJob, GridSetting, PauseWhenDirty

INTERVAL_S = 1800.0
SPEEDUP = 900.0  # one half-hour interval per 2 s of the fake clock
WINDOW_STEPS = 5
STEP_S = 0.1
POWER_W = 200.0
IDLE_W = 40.0
SAMPLES = 8
STEPS = 100  # 10 fake seconds: 2.5 signal hours
START = datetime(2023, 3, 14, tzinfo=UTC)
DIRTY_MIDDLE = [100.0, 100.0, 400.0, 400.0, 400.0] + [100.0] * 19  # 12 h: dirty from 1 h to 2.5 h


def write_signal(path: Path, values: list[float]) -> Path:
    lines = ["time,value"] + [f"{(START + timedelta(seconds=k * INTERVAL_S)).isoformat()},{v}"
                              for k, v in enumerate(values)]
    path.write_text("\n".join(lines) + "\n")
    return path


class Energy:
    """The energy callback's part a pause uses: the span since the last window, at idle power."""

    def __init__(self, run: Run, idle_w: float = IDLE_W) -> None:
        self.run = run
        self.idle_w = idle_w
        self.mark = run.now
        self.gaps: list[float] = []

    def skip_gap(self) -> WindowMeasurement:
        seconds, self.mark = self.run.now - self.mark, self.run.now
        self.gaps.append(seconds)
        return WindowMeasurement("gap", seconds, {"gpu0": self.idle_w * seconds}, {"gpu0": "nvml-counter"}, False)


class Run:
    """A hand-driven run of one rank with its own clock."""

    def __init__(self, tmp_path: Path, steps: int = STEPS, checkpoints: bool = True, idle_w: float = IDLE_W) -> None:
        self.now = 1_000.0
        self.steps = self.measured = 0
        self.saved: list[int] = []
        self.slept_paused: list[bool] = []
        self.heartbeat = HeartbeatWriter(tmp_path / "beats", rank=0, local_rank=0, attempt=0, clock=self.clock)
        (tmp_path / "beats").mkdir(exist_ok=True)
        self.energy = Energy(self, idle_w)
        self.session = SimpleNamespace(
            rank=0, world_size=1, ctx=SimpleNamespace(distributed=False), start_step=0, target_steps=steps,
            energy=self.energy, callbacks=[SimpleNamespace(writer=self.heartbeat)],
            checkpoints=SimpleNamespace(enabled=checkpoints), save_checkpoint=lambda: self.saved.append(self.steps))
        self.rank = RankRecord(rank=0, local_rank=0, node="node", device="cpu")

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept_paused.append(self.heartbeat.paused)
        self.now += seconds

    def step(self, cb: GridPauseCallback, warmup: bool = False) -> None:
        self.now += STEP_S
        cb.on_step_end(self.session, SimpleNamespace(step=self.steps, warmup=warmup, samples=SAMPLES))
        self.steps += 1
        self.measured += not warmup
        if not warmup and self.measured % WINDOW_STEPS == 0:
            first = self.steps - WINDOW_STEPS
            window = Window(self.measured // WINDOW_STEPS - 1, first, self.steps - 1, WINDOW_STEPS * STEP_S,
                            SAMPLES * WINDOW_STEPS, STEP_S, energy_j={"gpu0": POWER_W * STEP_S * WINDOW_STEPS})
            self.energy.mark = self.now
            cb.on_window_end(self.session, window)

    def train(self, cb: GridPauseCallback, until: int | None = None) -> None:
        cb.on_train_start(self.session)
        self.step(cb, warmup=True)
        while self.steps < (until or self.session.target_steps):
            self.step(cb)

    def finish(self, cb: GridPauseCallback) -> dict[str, Any]:
        cb.on_rank_end(self.session, self.rank)
        out = self.rank.to_dict()
        assert RankRecord.from_dict(json.loads(json.dumps(out, allow_nan=False))).to_dict() == out
        return out["grid"]


def make(tmp_path: Path, run: Run, deadline_h: float, values: list[float] = DIRTY_MIDDLE) -> GridPauseCallback:
    config = GridConfig(signal=str(write_signal(tmp_path / "signal.csv", values)), policy="pause",
                        deadline_h=deadline_h, replay=SPEEDUP)
    return GridPauseCallback(config, clock=run.clock, sleep=run.sleep)


def test_it_pauses_while_dirty_resumes_when_clean_and_meets_the_deadline(tmp_path: Path) -> None:
    run = Run(tmp_path)
    cb = make(tmp_path, run, deadline_h=5.0)
    run.train(cb)
    section = run.finish(cb)

    # the run's own figures, measured over its first windows
    (setting,) = section["settings"]
    assert setting["time_per_sample_s"] == pytest.approx(STEP_S * SPEEDUP / SAMPLES, rel=1e-6)
    assert setting["energy_per_sample_j"] == pytest.approx(POWER_W * STEP_S / SAMPLES, rel=1e-6)

    # paused through the dirty intervals only, every decision PauseWhenDirty's on the recorded figures
    phases = {s["interval"]: s["phase"] for s in section["intervals"] if s["phase"] in ("run", "paused")}
    assert {k for k, phase in phases.items() if phase == "paused"} == {2, 3, 4}
    assert all(phases[k] == "run" for k in phases if DIRTY_MIDDLE[k] == 100.0)
    job = section["job"]
    forecast = np.array(DIRTY_MIDDLE)
    for segment in section["intervals"]:
        if "decision" not in segment or segment["decision"].get("past_deadline"):
            continue
        policy = PauseWhenDirty([GridSetting("running", 0.0, setting["time_per_sample_s"],
                                             setting["energy_per_sample_j"])],
                                GridJob(job["samples"], job["deadline_s"], job["interval_s"],
                                        resume_s=segment["decision"]["resume_s"],
                                        idle_power_w=segment["decision"]["idle_power_w"]), 0)
        expected = policy.decide(segment["interval"], segment["decision"]["done"], forecast)
        assert (expected == PAUSE) == (segment["phase"] == "paused"), segment

    # idle power measured first by holding still (not a pause), then from the pause itself
    probe, *pauses = run.energy.gaps
    assert probe == pytest.approx(0.5) and job["idle_power_w"] == pytest.approx(IDLE_W)
    # one checkpoint as the pause began; the heartbeat said "paused" throughout, and resumed after
    assert run.slept_paused[0] is False  # the probe: too short to matter to the stall watch
    assert len(run.saved) == 1 and all(run.slept_paused[1:]) and not run.heartbeat.paused
    outcome = section["outcome"]
    assert outcome["pauses"] == 1 and outcome["deadline_met"]
    assert outcome["paused_h"] == pytest.approx(sum(pauses) * SPEEDUP / 3600, rel=1e-6)
    assert outcome["paused_energy_j"] == pytest.approx(IDLE_W * sum(pauses), rel=1e-6)
    assert outcome["energy_j"] == pytest.approx(sum(s["energy_j"] for s in section["intervals"]))
    # it ran in clean intervals, so it costs less than a run that never paused would have
    estimate = outcome["estimated"]
    assert estimate["note"].startswith("estimated") and estimate["cost"] < estimate["blind_cost"]
    assert 0 < estimate["saving"] < 1
    # the replay charges the pauses what they measured (idle devices are not free)
    work_j = STEPS * SAMPLES * setting["energy_per_sample_j"]
    assert estimate["energy_j"] == pytest.approx(work_j + outcome["paused_energy_j"], rel=1e-3)
    assert estimate["blind_energy_j"] == pytest.approx(work_j, rel=1e-3)


def test_without_slack_it_never_pauses(tmp_path: Path) -> None:
    run = Run(tmp_path)
    cb = make(tmp_path, run, deadline_h=2.6)  # the job needs 2.5 h: no room for a pause and its resume
    run.train(cb)
    section = run.finish(cb)
    assert all(s["phase"] != "paused" for s in section["intervals"]) and not run.saved
    assert run.slept_paused == [False]  # the idle probe only
    assert section["outcome"]["pauses"] == 0


def test_where_holding_still_costs_nearly_as_much_as_training_it_never_pauses(tmp_path: Path) -> None:
    run = Run(tmp_path, idle_w=0.9 * POWER_W)  # devices kept busy-hot while paused (a CPU, say)
    cb = make(tmp_path, run, deadline_h=5.0)
    run.train(cb)
    section = run.finish(cb)
    assert all(s["phase"] != "paused" for s in section["intervals"]) and not run.saved
    assert section["job"]["idle_power_w"] == pytest.approx(0.9 * POWER_W)


def test_without_checkpoints_it_still_pauses_and_says_none_was_saved(tmp_path: Path) -> None:
    run = Run(tmp_path, checkpoints=False)
    cb = make(tmp_path, run, deadline_h=5.0)
    run.train(cb)
    section = run.finish(cb)
    assert section["outcome"]["pauses"] == 1 and not run.saved
    assert section["note"] == "no checkpoints configured: the pauses saved none"


def test_a_resumed_run_keeps_its_start_figures_and_intervals(tmp_path: Path) -> None:
    run = Run(tmp_path)
    cb = make(tmp_path, run, deadline_h=5.0)
    run.train(cb, until=60)  # past the pause
    assert cb.pauses == 1 and cb.phase == "run"
    state = json.loads(json.dumps(cb.state_dict()))

    later = Run(tmp_path)
    later.now = run.now + 1.0  # restarted 1 s (15 signal minutes) later, from step 60
    later.steps = later.measured = 60
    later.session.start_step = 60
    resumed = make(tmp_path, later, deadline_h=5.0)
    resumed.on_train_start(later.session)
    resumed.load_state_dict(state)
    assert resumed.signal_clock is not None and resumed.signal_clock.wall_start == cb.signal_clock.wall_start
    while later.steps < STEPS:
        later.step(resumed)
    assert resumed.phase in ("run", "paused") and resumed.setting == cb.setting  # not measured again
    section = later.finish(resumed)
    assert section["intervals"][:len(state["segments"])] == state["segments"]
    after = section["intervals"][len(state["segments"]):]
    assert after[0]["phase"] == "resumed" and after[0]["from_step"] == 60  # steps count from the run's start
    assert all(s["from_step"] > 60 for s in after[1:])
    assert section["job"]["samples"] == STEPS * SAMPLES  # the whole job, as the first attempt scheduled it
    assert section["outcome"]["pauses"] == 1 and section["outcome"]["deadline_met"]
    assert section["outcome"]["finished_h"] == pytest.approx((later.now - cb.signal_clock.wall_start) * SPEEDUP
                                                             / 3600, rel=1e-6)


def test_the_paused_phase_shows_in_the_tuner_state(tmp_path: Path) -> None:
    run = Run(tmp_path)
    cb = make(tmp_path, run, deadline_h=5.0)
    phases: list[str] = []
    cb.sleep = lambda seconds: (phases.append(cb.tuner_state().state), setattr(run, "now", run.now + seconds))
    run.train(cb)
    assert phases[0] == "measure" and set(phases[1:]) == {"paused"} and cb.clock_lock() is None  # the probe first
