"""``--grid-policy pause``: training stops while a grid signal is dirty (or dear), and resumes when it falls.

The run first measures its own time and energy per sample over whole windows of at least ``min_measure_s`` wall
seconds (the ranks sum samples and energy and take the longest time, one all-reduce pair per window, so every rank
holds the same figures). From then on, whenever a window ends in a new signal interval, every rank runs the same
:class:`~dtpo.tune.grid_policy.PauseWhenDirty` decision on the same figures and the forecast: run on, or pause.

A pause, on every rank together, between two optimizer steps:

1. saves a checkpoint (``dtpo train`` keeps them in ``RUN_DIR/checkpoints`` unless told otherwise), so a node
   lost or a job cancelled during the pause loses no step: ``--resume latest`` continues the same run, with this
   callback's state (the figures, the run's start and deadline, the intervals so far) restored from the
   checkpoint;
2. holds still until the next signal interval begins (the heartbeat tells the launcher's stall watch so), then
   decides again: pausing on, or resuming. Nothing is reloaded: the process keeps its state in memory.

The pause's time and energy (the devices idle, the checkpoint's save) are kept out of the run's training time and
energy (:meth:`~dtpo.session.callbacks.energy.EnergyCallback.skip_gap`), and recorded in the ``grid`` section as
intervals of phase ``paused`` with their own measured energy, which the run's grid cost includes. A pause that keeps
the devices is not free: the policy weighs their idle power (``GridJob.idle_power_w``), measured once by holding
still for ``idle_probe_s`` right after the run's own figures, then from the pauses themselves; where idle power is
close to the power of training (a CPU, say), no pause pays and the run never pauses. The cost of a resume the policy
weighs is the checkpoint's save, as measured at the last pause (before the first, none).

Time is mapped onto the signal by :class:`~dtpo.session.tuning.grid.SignalClock` as for throttling: the clock, or
``--grid-replay SPEEDUP`` (a pause then lasts ``interval / SPEEDUP`` wall seconds). No GPU knob is touched, so
the policy runs on any device whose energy dtpo measures (a modelled CPU's is labelled estimated).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from dtpo.core.callbacks import Callback
from dtpo.core.grid_config import GridConfig
from dtpo.core.record import RankRecord, StepRecord
from dtpo.core.record_sections import GridSection
from dtpo.core.steps import RunView, Window
from dtpo.core.tuner_status import ClockLock, TunerState
from dtpo.distributed.heartbeat import HeartbeatWriter
from dtpo.energy.grid_signal import GridSignal
from dtpo.session.tuning.grid import (
    MIN_SWEEP_S,
    SignalClock,
    against_blind,
    decision_signals,
    new_segment,
    shared,
    shared_min,
    signal_section,
    values_from,
)
from dtpo.tune.cost import JOULES_PER_KWH
from dtpo.tune.grid_policy import PAUSE, GridJob, GridSetting, PauseWhenDirty

__all__ = ["GridPauseCallback"]

log = logging.getLogger(__name__)

RUNNING = "running"
"""The name of the one setting a paused run measures: its own, as it runs."""
IDLE_PROBE_S = 0.5
"""Wall seconds the job holds still once, after measuring, to measure its power while paused."""
SLEEP_CHUNK_S = 1.0
"""Longest single sleep of a pause (the wait is cut into these, so a clock that jumps is followed)."""


class GridPauseCallback(Callback):
    """Pauses training while a grid signal is above the threshold :class:`PauseWhenDirty` chooses; see the module
    docs.

    Args:
        config: The signal, the policy (``pause``) and the deadline.
        clock: Seconds since the epoch (``time.time``; tests pass their own).
        sleep: Waits a number of seconds (``time.sleep``; tests pass their own).
        min_measure_s: Wall seconds the run's own figures are measured over at least, before the first decision.
        idle_probe_s: Wall seconds the job holds still after measuring, to measure what a pause costs.
    """

    def __init__(self, config: GridConfig, clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep, min_measure_s: float = MIN_SWEEP_S,
                 idle_probe_s: float = IDLE_PROBE_S) -> None:
        self.config = config
        self.idle_probe_s = idle_probe_s
        self.clock = clock
        self.sleep = sleep
        self.min_measure_s = min_measure_s
        self.phase = "off"  # off | measure | restored | run | paused (the same on every rank)
        self.note = ""
        self.actual: GridSignal | None = None
        self.forecast: GridSignal | None = None
        self.decided_on = ""
        self.signal_clock: SignalClock | None = None
        self.setting: GridSetting | None = None
        self.steps_measured = 0
        self.samples_per_step = 0.0
        self.segments: list[dict[str, Any]] = []
        self.job: GridJob | None = None
        self.policy: PauseWhenDirty | None = None
        self.energy_source = ""
        self.pauses = 0
        self._block = [0.0, 0.0, 0.0, 0]  # measuring: samples, joules, wall seconds, steps
        self._clock_mark = 0.0
        self._job_time = 0.0
        self._first_step = 0  # the step the schedule began at (kept across a resume): steps count from it
        self._attempt_step = 0  # the step this process began at
        self._interval = -1
        self._resume_s = 0.0  # signal seconds: the last pause's checkpoint save
        self._idle_w = 0.0  # the job's power while it holds still, in the setting's units (J per signal second)
        self._forecast_values: Any = None
        self._warned_late = False

    # -- start ---------------------------------------------------------------------------------------------------

    def on_train_start(self, session: RunView) -> None:
        """Read the signal, agree on the run's start, and measure the run's own figures."""
        assert self.config.signal is not None
        self.actual, self.forecast, self.decided_on = decision_signals(Path(self.config.signal))
        self.signal_clock = SignalClock(self.actual, shared_min(session, self.clock()), self.config.replay)
        self._job_time = self.signal_clock.offset_s
        self._first_step = self._attempt_step = getattr(session, "start_step", 0)
        self.phase = "measure"
        self._clock_mark = self.clock()
        self._open_segment("measure", 0)

    def on_step_end(self, session: RunView, step_record: StepRecord) -> None:
        """Warm-up steps are not measured: windows start after them."""
        if step_record.warmup and self.phase != "off":
            self._clock_mark = self.clock()

    def on_window_end(self, session: RunView, window: Window) -> None:
        """Agree on the window's figures across ranks; measure, or decide whether to pause (and pause)."""
        if self.phase == "off":
            return
        clock = self.signal_clock
        assert clock is not None
        now = self.clock()
        # a node's shared devices (CPU, DRAM) are counted on one rank only: the others add nothing
        (samples, energy), (wall_s, job_time, measured, estimated) = shared(
            session, [float(window.samples), sum(window.energy_j.values())],
            [now - self._clock_mark, clock.job_time_s(now), float(bool(window.energy_j)), float(window.estimated)])
        self._clock_mark, self._job_time = now, job_time
        if not measured:
            energy = math.nan
        if not self.energy_source:
            self.energy_source = "not measured" if not measured else \
                "estimated (modelled devices)" if estimated else "measured"
        self._add(wall_s, energy)
        done_steps = window.last_step + 1 - self._first_step
        if self.phase == "measure":
            self._measure(session, samples, energy, wall_s, window.steps, done_steps)
        elif self.phase == "restored":  # resumed from a checkpoint: the figures came with it
            self._start(session, done_steps)
        else:
            self._follow(session, done_steps)

    def _add(self, wall_s: float, joules: float) -> None:
        if self.segments:
            self.segments[-1]["seconds"] += wall_s * (self.config.replay or 1.0)
            self.segments[-1]["energy_j"] += joules if math.isfinite(joules) else 0.0

    def _measure(self, session: RunView, samples: float, joules: float, wall_s: float, steps: int,
                 done_steps: int) -> None:
        block = self._block
        block[0] += samples
        block[1] += joules if math.isfinite(joules) else 0.0
        block[2] += wall_s
        block[3] += steps
        if block[2] < self.min_measure_s or block[0] <= 0:
            return
        speedup = self.config.replay or 1.0
        self.setting = GridSetting(RUNNING, math.nan, block[2] * speedup / block[0], block[1] / block[0])
        self.steps_measured = int(block[3])
        self.samples_per_step = block[0] / block[3]
        self._probe_idle(session)
        self._start(session, done_steps)

    def _probe_idle(self, session: RunView) -> None:
        """Hold still for ``idle_probe_s`` and measure the job's power meanwhile: what a pause that keeps the
        devices costs (every rank together; nothing where energy is not measured)."""
        energy = _energy_callback(session)
        if energy is None or self.energy_source == "not measured":
            return
        started = self.clock()
        until = started + self.idle_probe_s
        while (left := until - self.clock()) > 0:
            self.sleep(left)
        gap = energy.skip_gap()
        now = self.clock()
        (joules,), (wall_s,) = shared(session, [gap.total_j if gap is not None else 0.0], [now - started])
        self._clock_mark = now
        if wall_s > 0:
            self._idle_w = joules / (wall_s * (self.config.replay or 1.0))

    def _start(self, session: RunView, done_steps: int) -> None:
        """Schedule the job on the measured figures, and decide for the interval the run stands in."""
        target = getattr(session, "target_steps", None)
        if target is None:
            self._stop("the run's length is unknown (no steps=... given to batches()): it was not paused")
            return
        start = self._first_step
        clock = self.signal_clock
        assert clock is not None and self.forecast is not None and self.config.deadline_h is not None
        self.job = GridJob((target - start) * self.samples_per_step, clock.offset_s + self.config.deadline_h * 3600,
                           clock.signal.interval_s, resume_s=self._resume_s, idle_power_w=self._idle_w)
        self.policy = PauseWhenDirty([self.setting], self.job, 0)
        self._forecast_values = values_from(self.forecast, clock.interval_start(0), self.job.intervals)
        self.phase = "run"
        self._follow(session, done_steps, force=True)

    def _stop(self, why: str) -> None:
        self.phase, self.note = "off", why
        log.warning("grid: %s", why)

    # -- deciding and pausing ------------------------------------------------------------------------------------

    def _follow(self, session: RunView, done_steps: int, force: bool = False) -> None:
        clock, job, policy, setting = self.signal_clock, self.job, self.policy, self.setting
        assert clock is not None and job is not None and policy is not None and setting is not None
        interval = clock.job_interval(self._job_time)
        if interval == self._interval and not force:
            return
        done = done_steps * self.samples_per_step
        while True:
            self._interval = interval
            if interval >= job.intervals:
                if not self._warned_late and session.rank == 0:
                    log.warning("grid: the deadline (%.3g h) has passed with %.0f of %.0f samples done: running on",
                                self.config.deadline_h, done, job.samples)
                self._warned_late = True
                self._run_segment(done_steps, {"done": done, "past_deadline": True})
                return
            # the part of this interval already spent is not available: count it as work still to do
            spent = self._job_time - interval * job.interval_s
            effective = done - spent / setting.time_per_sample_s
            policy.job = replace(job, resume_s=self._resume_s, idle_power_w=self._idle_w)
            action = policy.decide(interval, effective, self._forecast_values)
            decision = {"done": effective, "expected_saving": policy.expected_saving, "resume_s": self._resume_s,
                        "idle_power_w": self._idle_w,
                        "threshold": policy.threshold if math.isfinite(policy.threshold) else None}
            if action != PAUSE:
                self._run_segment(done_steps, decision)
                return
            self._pause(session, done_steps, interval, decision)
            interval = clock.job_interval(self._job_time)

    def _run_segment(self, done_steps: int, decision: dict[str, Any]) -> None:
        """Run on: a segment for each signal interval run."""
        self.phase = "run"
        self._open_segment("run", done_steps, decision)

    def _pause(self, session: RunView, done_steps: int, interval: int, decision: dict[str, Any]) -> None:
        """Hold still, every rank together, until ``interval`` ends (a checkpoint first, on entering a pause)."""
        clock = self.signal_clock
        assert clock is not None
        speedup = self.config.replay or 1.0
        first = self.phase != "paused"
        self.phase = "paused"
        self._open_segment("paused", done_steps, decision)
        beat = _heartbeat(session)
        if beat is not None:
            beat.pause()
        if first:
            self.pauses += 1
            saved_s = self._checkpoint(session)
            if saved_s is not None:
                self._resume_s = saved_s * speedup
            if session.rank == 0:
                log.info("grid: paused at step %d: the forecast %.4g is above the threshold %.4g",
                         self._first_step + done_steps,
                         float(self._forecast_values[interval]), _threshold(decision))
        until = clock.wall_start + ((interval + 1) * clock.signal.interval_s - clock.offset_s) / speedup
        while (left := until - self.clock()) > 0:
            self.sleep(min(left, SLEEP_CHUNK_S))
        energy = _energy_callback(session)
        gap = energy.skip_gap() if energy is not None else None
        now = self.clock()
        (total,), (job_time,) = shared(session, [gap.total_j if gap is not None else 0.0], [clock.job_time_s(now)])
        self.segments[-1]["seconds"] += (now - self._clock_mark) * speedup
        self.segments[-1]["energy_j"] += total if math.isfinite(total) else 0.0
        self._clock_mark, self._job_time = now, job_time
        paused = [s for s in self.segments if s["phase"] == "paused"]
        held_s = sum(s["seconds"] for s in paused)
        if held_s > 0 and gap is not None:  # what holding still costs, as the pauses so far measured it
            self._idle_w = sum(s["energy_j"] for s in paused) / held_s
        if beat is not None:
            beat.resume()

    def _checkpoint(self, session: RunView) -> float | None:
        """Save a checkpoint where the run has them; its wall seconds (``None``: none saved)."""
        checkpoints = getattr(session, "checkpoints", None)
        if checkpoints is None or not checkpoints.enabled:
            if not self.note:
                self.note = "no checkpoints configured: the pauses saved none"
            return None
        started = time.monotonic()
        session.save_checkpoint()  # type: ignore[attr-defined]
        return time.monotonic() - started

    def _open_segment(self, phase: str, done_steps: int, decision: dict[str, Any] | None = None) -> None:
        """A new stretch of the record, from now (``done_steps``: steps since the schedule began)."""
        assert self.signal_clock is not None and self.actual is not None
        self.segments.append(new_segment(self.signal_clock, self.actual, self._job_time, phase, None,
                                         self._first_step + done_steps, decision))

    # -- checkpoints ---------------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs to go on as the same schedule: the run's start in the signal, its measured
        figures, the intervals so far, and the resume cost."""
        clock = self.signal_clock
        return {"wall_start": None if clock is None else clock.wall_start, "phase": self.phase,
                "setting": None if self.setting is None else [self.setting.time_per_sample_s,
                                                              self.setting.energy_per_sample_j],
                "steps_measured": self.steps_measured, "samples_per_step": self.samples_per_step,
                "segments": [dict(s) for s in self.segments], "pauses": self.pauses, "resume_s": self._resume_s,
                "idle_power_w": self._idle_w,
                "energy_source": self.energy_source, "note": self.note, "first_step": self._first_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go on with the checkpointed schedule (after :meth:`on_train_start` read the signal): the deadline still
        counts from the first start, and the figures are not measured again."""
        if self.actual is None or state.get("wall_start") is None:
            return
        self.signal_clock = SignalClock(self.actual, float(state["wall_start"]), self.config.replay)
        self.segments = [dict(s) for s in state.get("segments") or []]
        self.pauses, self._resume_s = int(state.get("pauses", 0)), float(state.get("resume_s", 0.0))
        self._idle_w = float(state.get("idle_power_w", 0.0))
        self.energy_source, self.note = str(state.get("energy_source", "")), str(state.get("note", ""))
        self._first_step = int(state.get("first_step", self._first_step))
        self._job_time = self.signal_clock.job_time_s(self.clock())
        if state.get("setting") is None or state.get("phase") == "off":
            return
        time_per_sample, energy_per_sample = state["setting"]
        self.setting = GridSetting(RUNNING, math.nan, float(time_per_sample), float(energy_per_sample))
        self.steps_measured, self.samples_per_step = int(state["steps_measured"]), float(state["samples_per_step"])
        self.phase = "restored"  # the next window end schedules the rest of the job on the restored figures
        self._interval = -1
        self._clock_mark = self.clock()
        self._open_segment("resumed", self._attempt_step - self._first_step)

    # -- end -----------------------------------------------------------------------------------------------------

    def on_rank_end(self, session: RunView, rank_record: RankRecord) -> None:
        """Write the ``grid`` section of this rank's record."""
        if self.phase != "off" and self.signal_clock is not None:
            now = self.clock()
            self._add(now - self._clock_mark, math.nan)
            self._job_time = self.signal_clock.job_time_s(now)
        rank_record.grid = self.section()

    def section(self) -> GridSection:
        """The record's ``grid`` section as things stand."""
        config = self.config
        signal = signal_section(self.actual, self.signal_clock, self.decided_on, config.replay, self._job_time)
        settings = [] if self.setting is None else [
            {"name": RUNNING, "power_limit_w": None, "time_per_sample_s": self.setting.time_per_sample_s,
             "energy_per_sample_j": self.setting.energy_per_sample_j, "steps": self.steps_measured}]
        job = None if self.job is None else {"samples": self.job.samples, "deadline_s": self.job.deadline_s,
                                             "interval_s": self.job.interval_s, "resume_s": self._resume_s,
                                             "idle_power_w": self._idle_w * (self.config.replay or 1.0)}
        source = "simulated" if "estimated" in self.energy_source else "measured"
        return GridSection(config.policy, signal, config.deadline_h, settings, source, list(self.segments),
                           self._outcome(), self.note, job)

    def _outcome(self) -> dict[str, Any] | None:
        clock, actual = self.signal_clock, self.actual
        if clock is None or actual is None or not self.segments:
            return None
        finished_h = (self._job_time - clock.offset_s) / 3600
        paused = [s for s in self.segments if s["phase"] == "paused"]
        out: dict[str, Any] = {
            "finished_h": finished_h, "deadline_met": finished_h <= (self.config.deadline_h or 0),
            "energy_j": sum(s["energy_j"] for s in self.segments),
            "cost": sum(s["energy_j"] / JOULES_PER_KWH * s["signal"] for s in self.segments),
            "cost_unit": actual.per_kwh_name, "energy_source": f"the run's devices ({self.energy_source})",
            "pauses": self.pauses, "paused_h": sum(s["seconds"] for s in paused) / 3600,
            "paused_energy_j": sum(s["energy_j"] for s in paused)}
        if self.job is not None and self.setting is not None:
            out["estimated"] = self._against_blind()
        return out

    def _against_blind(self) -> dict[str, Any]:
        """The intervals run and paused, and a signal-blind run, both replayed on the measured figures and the actual
        signal from the anchor interval, the pauses charged their measured (idle) energy: an estimate."""
        clock, job, setting, actual = self.signal_clock, self.job, self.setting, self.actual
        assert clock is not None and job is not None and setting is not None and actual is not None
        held: dict[int, dict[str, float]] = {}
        for segment in self.segments:
            if segment["phase"] in ("run", "paused"):
                k = segment["interval"] - clock.anchor
                held.setdefault(k, {}).setdefault(segment["phase"], 0.0)
                held[k][segment["phase"]] += segment["seconds"]
        plan = [(PAUSE if max(held[k], key=held[k].get) == "paused" else 0) if k in held else 0
                for k in range(max(held, default=0) + 1)]
        out = against_blind("pause", plan, [setting], replace(job, idle_power_w=0.0), 0, actual, clock,
                            "estimated: the intervals run and paused and a signal-blind run replayed on the run's "
                            "measured figures and the actual signal; the pauses at their measured energy")
        paused = [s for s in self.segments if s["phase"] == "paused"]  # the devices idle: not free
        out["energy_j"] += sum(s["energy_j"] for s in paused)
        out["cost"] += sum(s["energy_j"] / JOULES_PER_KWH * s["signal"] for s in paused)
        out["saving"] = 1 - out["cost"] / out["blind_cost"] if out["blind_cost"] > 0 else 0.0
        return out

    def tuner_state(self) -> TunerState:
        """``grid`` is ``off``, ``measure``, ``run`` or ``paused``."""
        return TunerState("grid", self.phase)

    def clock_lock(self) -> ClockLock | None:
        """Pausing moves no GPU knob."""
        return None


def _threshold(decision: dict[str, Any]) -> float:
    """The threshold a decision chose (``inf``: none, run throughout)."""
    threshold = decision.get("threshold")
    return math.inf if threshold is None else float(threshold)


def _energy_callback(session: RunView) -> Any:
    """The producer's energy callback, where it measures energy and can keep a pause out of the run (``skip_gap``);
    else ``None``."""
    energy = getattr(session, "energy", None)
    return energy if energy is not None and hasattr(energy, "skip_gap") else None


def _heartbeat(session: RunView) -> HeartbeatWriter | None:
    """This rank's heartbeat to its launcher, where it beats one."""
    for callback in session.callbacks:
        writer = getattr(callback, "writer", None)
        if isinstance(writer, HeartbeatWriter):
            return writer
    return None
