"""``--grid-signal``: the GPUs' power limit follows a grid signal (carbon intensity or a price) by a deadline.

The run first measures a few power limits (:func:`sweep_limits`: the GPUs' maximum and three below it, each held
for whole measurement windows of at least ``min_sweep_s`` wall seconds): every rank reads its own GPUs' energy
counters at window ends, and the ranks sum samples and energy and take the longest time (one all-reduce pair per
window, as the power tuner does per block), so every rank holds the same time and energy per sample at each
limit. From then on, whenever a window ends in a new signal interval, every rank runs the same
:class:`~dtpo.tune.grid_policy.Throttle` decision on the same figures and applies the limit it chooses to its own
GPUs through the journaled :class:`~dtpo.devices.knobs.KnobController`, in the run's knob mode; the original
limits come back when the rank stops, on SIGINT/SIGTERM, or with the next dtpo start after a crash.

Time: the run is mapped onto the signal by :class:`SignalClock`, either by the clock (UTC now) or, with
``--grid-replay SPEEDUP``, from the signal's first interval at ``SPEEDUP`` signal seconds per wall second (a
short demonstration: the job's time per sample is taken in signal seconds, its energy per sample as measured).
The deadline is in the signal's hours from the run's start. Interval boundaries are seen at window ends.

The record's ``grid`` section (:class:`~dtpo.core.record_sections.GridSection`) keeps the signal over the run,
the limit held in each interval with its GPU energy, the cost as measured (GPU energy x the signal), and, as an
*estimate*, the cost of the limits held against a signal-blind run at the maximum limit, both replayed
(:func:`~dtpo.tune.grid_policy.replay`) on the measured per-setting figures. Decisions are made on the file's
forecast where it has one; costs are accounted on its actual values.

A run resumed from a checkpoint (``--resume``, or a restart under ``--max-restarts``) goes on with the same
schedule: the run's start (so the deadline), the limits' measured figures and the intervals so far come back with
the checkpoint (a sweep cut short starts again). ``--grid-policy pause`` is :mod:`dtpo.session.tuning.grid_pause`.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from dtpo.core.callbacks import Callback
from dtpo.core.grid_config import GridConfig
from dtpo.core.record import RankRecord, StepRecord
from dtpo.core.record_sections import GridSection
from dtpo.core.steps import RunView, Window
from dtpo.core.tuner_status import ClockLock, TunerState
from dtpo.devices.base import Device, DeviceError, KnobError, KnobLimits
from dtpo.devices.knobs import KnobController, log_knob_action
from dtpo.energy.grid_signal import GridSignal, load_grid_signals
from dtpo.session.tuning.gpu_knobs import ranks_agree_on_limits
from dtpo.tune.cost import JOULES_PER_KWH
from dtpo.tune.grid_policy import GridJob, GridSetting, Throttle, blind_plan, replay

__all__ = ["GridCallback", "SignalClock", "against_blind", "decision_signals", "new_segment", "shared", "shared_min",
           "signal_section", "sweep_limits"]

log = logging.getLogger(__name__)

SWEEP_POINTS = 4
"""Power limits measured at the start."""
SWEEP_LOWEST_SHARE = 0.5
"""The lowest limit measured, as a share of the maximum (or the GPU's minimum, if higher)."""
MIN_SWEEP_S = 0.5
"""Wall seconds each limit is measured at least (NVML's energy counter updates every few tens of ms)."""


def sweep_limits(limits: KnobLimits, points: int = SWEEP_POINTS) -> list[float]:
    """The power limits measured at the start, highest first: the maximum and ``points - 1`` evenly below it, down to
    half the maximum (or the GPU's minimum), in whole watts."""
    top = limits.max_power_limit_w
    low = max(limits.min_power_limit_w, SWEEP_LOWEST_SHARE * top)
    out = sorted({float(round(w)) for w in np.linspace(top, low, points)}, reverse=True)
    return [min(max(w, limits.min_power_limit_w), top) for w in out]


def decision_signals(path: Path) -> tuple[GridSignal, GridSignal, str]:
    """The values costs are accounted on (the file's actual values, else its forecast), the values decisions are
    made on (its forecast, else its actual values), and which that is, from the file at ``path``.

    Raises:
        ConfigError: The file is not a signal dtpo reads (one line).
    """
    signals = load_grid_signals(path)
    actual, forecast = signals.get("actual"), signals.get("forecast")
    accounted = actual or forecast
    decided = forecast or actual
    assert accounted is not None and decided is not None
    return accounted, decided, "forecast" if forecast is not None else "actual"


@dataclass(frozen=True)
class SignalClock:
    """Where a run stands in a grid signal's time.

    The job's intervals are the signal's, counted from ``anchor`` (the one the run starts in): job time 0 is that
    interval's start, the run starts ``offset_s`` later.

    Attributes:
        signal: The signal (its first interval and interval length matter).
        wall_start: The clock's reading at the run's start.
        speedup: Signal seconds per wall second under ``--grid-replay`` (the run starts at the signal's first
            interval); ``None``: the clock is UTC (seconds since the epoch) and the run starts now.
    """

    signal: GridSignal
    wall_start: float
    speedup: float | None = None

    @property
    def run_start(self) -> datetime:
        """The run's start in the signal's time."""
        return self.signal.start if self.speedup is not None else datetime.fromtimestamp(self.wall_start, UTC)

    @property
    def anchor(self) -> int:
        """The signal interval the run starts in."""
        return self.signal.index_at(self.run_start)

    @property
    def offset_s(self) -> float:
        """Seconds from the start of the anchor interval to the run's start."""
        return (self.run_start - self.signal.times[0]).total_seconds() - self.anchor * self.signal.interval_s

    def elapsed_s(self, wall_now: float) -> float:
        """Signal seconds since the run's start."""
        return (wall_now - self.wall_start) * (self.speedup or 1.0)

    def job_time_s(self, wall_now: float) -> float:
        """Seconds since the start of the anchor interval (the job's time 0)."""
        return self.offset_s + self.elapsed_s(wall_now)

    def job_interval(self, job_time_s: float) -> int:
        """The job's interval (0: the anchor) at ``job_time_s``."""
        return int(job_time_s // self.signal.interval_s)

    def interval_start(self, job_interval: int) -> datetime:
        """When a job interval starts, in the signal's time."""
        return self.signal.times[0] + timedelta(seconds=(self.anchor + job_interval) * self.signal.interval_s)


def values_from(signal: GridSignal, first: datetime, count: int) -> np.ndarray:
    """``count`` consecutive values of ``signal`` from the interval holding ``first`` (the last value repeated past
    the signal's end)."""
    start = signal.index_at(first)
    return np.array([float(signal.values[min(max(start + k, 0), len(signal) - 1)]) for k in range(count)])


def signal_section(actual: GridSignal | None, clock: SignalClock | None, decided_on: str, replay: float | None,
                   job_time_s: float) -> dict[str, Any]:
    """The ``signal`` of a record's ``grid`` section: what the signal is, and its accounted values over the
    intervals the run spanned (up to ``job_time_s``), from the start of the one it started in."""
    if actual is None:
        return {}
    signal: dict[str, Any] = {"source": actual.source, "unit": actual.unit, "kind": actual.kind,
                              "interval_s": actual.interval_s, "decided_on": decided_on, "replay": replay}
    if clock is not None:
        signal["start"] = clock.run_start.isoformat()
        signal["values_from"] = clock.interval_start(0).isoformat()
        count = clock.job_interval(job_time_s) + 1
        signal["values"] = [float(v) for v in values_from(actual, clock.interval_start(0), count)]
    return signal


def new_segment(clock: SignalClock, actual: GridSignal, job_time_s: float, phase: str, power_limit_w: float | None,
                from_step: int, decision: dict[str, Any] | None = None) -> dict[str, Any]:
    """A stretch of a record's ``grid`` intervals, opening at ``job_time_s`` (signal seconds from the anchor
    interval's start) with step ``from_step``; its ``seconds`` and ``energy_j`` grow as the run goes on."""
    interval = clock.job_interval(job_time_s)
    segment: dict[str, Any] = {
        "interval": clock.anchor + interval,
        "start": (clock.interval_start(0) + timedelta(seconds=job_time_s)).isoformat(), "phase": phase,
        "signal": float(values_from(actual, clock.interval_start(interval), 1)[0]), "power_limit_w": power_limit_w,
        "from_step": from_step, "seconds": 0.0, "energy_j": 0.0}
    if decision is not None:
        segment["decision"] = decision
    return segment


def against_blind(policy: str, plan: list[int], settings: list[GridSetting], job: GridJob, default: int,
                  actual: GridSignal, clock: SignalClock, note: str) -> dict[str, Any]:
    """The ``estimated`` part of a ``grid`` section's outcome: ``plan`` (an action per interval from the anchor) and
    a signal-blind run at ``settings[default]``, both replayed on the measured figures and the actual signal."""
    blind = blind_plan(settings, job, default)
    count = max(len(plan), len(blind), job.intervals)
    values = values_from(actual, clock.interval_start(0), count)
    ours, theirs = replay(policy, plan, settings, job, values), replay("blind", blind, settings, job, values)
    return {"cost": ours.cost, "blind_cost": theirs.cost, "energy_j": ours.energy_j,
            "blind_energy_j": theirs.energy_j, "saving": 1 - ours.cost / theirs.cost if theirs.cost > 0 else 0.0,
            "blind_finished_h": theirs.time_s / 3600 if math.isfinite(theirs.time_s) else None, "note": note}


class GridCallback(Callback):
    """Holds, in each interval of a grid signal, the power limit :class:`Throttle` chooses; see the module docs.

    Args:
        config: The signal, the policy and the deadline.
        mode: The knob mode (``apply``, ``dry-run``, ``observe``).
        gpus: This rank's GPUs with knobs.
        clock: Seconds since the epoch (``time.time``; tests pass their own).
        min_sweep_s: Wall seconds each limit of the sweep is measured at least.
    """

    def __init__(self, config: GridConfig, mode: str, gpus: list[Device], clock: Callable[[], float] = time.time,
                 min_sweep_s: float = MIN_SWEEP_S) -> None:
        self.config = config
        self.mode = mode
        self.gpus = gpus
        self.clock = clock
        self.min_sweep_s = min_sweep_s
        self.controller: KnobController | None = None
        self.phase = "off"  # off | sweep | restored | throttle (the same on every rank)
        self.note = ""
        self.actual: GridSignal | None = None
        self.forecast: GridSignal | None = None
        self.decided_on = ""
        self.signal_clock: SignalClock | None = None
        self.candidates: list[float] = []
        self.settings: list[GridSetting] = []
        self.steps_measured: list[int] = []
        self.segments: list[dict[str, Any]] = []
        self.job: GridJob | None = None
        self.throttle: Throttle | None = None
        self.applied: float | None = None
        self.samples_per_step = 0.0
        self._block = [0.0, 0.0, 0.0, 0]  # sweep: samples, joules, wall seconds, steps at the current candidate
        self._energy_mark = 0.0
        self._clock_mark = 0.0
        self._job_time = 0.0
        self._interval = -1
        self._first_step = 0  # the step the schedule began at (kept across a resume): steps count from it
        self._attempt_step = 0  # the step this process began at
        self._warned_late = False

    # -- start --------------------------------------------------------------------------------------------------

    def on_train_start(self, session: RunView) -> None:
        """Read the signal, agree that every rank has GPU knobs, and start the sweep at the maximum limit."""
        assert self.config.signal is not None
        self.actual, self.forecast, self.decided_on = decision_signals(Path(self.config.signal))
        limits = self.gpus[0].knob_limits() if self.gpus else None
        if not ranks_agree_on_limits(session, limits) or limits is None:
            self._off(session, "not every rank has a GPU with power knobs (the same range on all): the limits were "
                      "not changed (`dtpo simulate grid` schedules simulated GPUs)")
            return
        if self.mode != "apply":
            self._off(session, f"{self.mode} mode: power limits are not changed, so no limit can be measured and "
                      "nothing was scheduled (`dtpo simulate grid` schedules simulated GPUs)")
            return
        self.controller = KnobController(self.mode, log=log_knob_action)
        self.controller.__enter__()
        self.candidates = sweep_limits(limits)
        self.signal_clock = SignalClock(self.actual, shared_min(session, self.clock()), self.config.replay)
        self.phase = "sweep"
        self._job_time = self.signal_clock.offset_s
        self._mark()
        self._first_step = self._attempt_step = getattr(session, "start_step", 0)
        self._set_limit(self.candidates[0], session, "sweep", 0)

    def _off(self, session: RunView, why: str) -> None:
        self.gpus, self.phase, self.note = [], "off", why
        if session.rank == 0:
            log.warning("grid: %s", why)

    # -- measuring -------------------------------------------------------------------------------------------

    def _energy(self) -> float:
        """This rank's GPU energy (``nan`` when a counter cannot be read: the ranks then stop together)."""
        try:
            return sum(gpu.energy_j() for gpu in self.gpus)
        except DeviceError as exc:
            log.warning("grid: %s", exc)
            return math.nan

    def _mark(self) -> None:
        self._energy_mark, self._clock_mark = self._energy(), self.clock()

    def on_step_end(self, session: RunView, step_record: StepRecord) -> None:
        """Warm-up steps are not measured: windows start after them."""
        if step_record.warmup and self.phase != "off":
            self._mark()

    def on_window_end(self, session: RunView, window: Window) -> None:
        """Agree on the window's figures across ranks; measure the next limit, or follow the signal."""
        if self.phase == "off":
            return
        assert self.signal_clock is not None
        now, energy = self.clock(), self._energy()
        (samples, joules), (wall_s, job_time) = shared(
            session, [float(window.samples), energy - self._energy_mark],
            [now - self._clock_mark, self.signal_clock.job_time_s(now)])
        self._energy_mark, self._clock_mark, self._job_time = energy, now, job_time
        if not math.isfinite(joules):  # a GPU's counter could not be read on some rank: every rank stops here
            self.phase = "off"
            self.note = "a GPU's energy counter could not be read: the GPUs went back to their limits"
            self.restore()
            return
        self._add_to_segment(wall_s, joules)
        done_steps = window.last_step + 1 - self._first_step
        if self.phase == "sweep":
            self._sweep(session, samples, joules, wall_s, window.steps, done_steps)
        elif self.phase == "restored":  # resumed from a checkpoint: the limits' figures came with it
            self._start_throttle(session, done_steps)
        else:
            self._follow(session, done_steps)

    def _add_to_segment(self, wall_s: float, joules: float) -> None:
        if self.segments:
            speedup = self.config.replay or 1.0
            self.segments[-1]["seconds"] += wall_s * speedup
            self.segments[-1]["energy_j"] += joules

    def _sweep(self, session: RunView, samples: float, joules: float, wall_s: float, steps: int,
               done_steps: int) -> None:
        block = self._block
        block[0] += samples
        block[1] += joules
        block[2] += wall_s
        block[3] += steps
        if block[2] < self.min_sweep_s or block[0] <= 0:
            return
        watts = self.candidates[len(self.settings)]
        speedup = self.config.replay or 1.0
        self.settings.append(GridSetting(f"{watts:g} W", watts, block[2] * speedup / block[0], block[1] / block[0]))
        self.steps_measured.append(int(block[3]))
        self.samples_per_step += block[0] / block[3] / len(self.candidates)
        self._block = [0.0, 0.0, 0.0, 0]
        if len(self.settings) < len(self.candidates):
            self._set_limit(self.candidates[len(self.settings)], session, "sweep", done_steps)
            return
        self._start_throttle(session, done_steps)

    def _start_throttle(self, session: RunView, done_steps: int) -> None:
        assert self.signal_clock is not None and self.forecast is not None
        target = getattr(session, "target_steps", None)
        if target is None:
            self.note = ("the run's length is unknown (no steps=... given to batches()): the GPUs went back to "
                         "their limits")
            self.phase = "off"
            self.restore()
            return
        start = self._first_step
        clock = self.signal_clock
        assert self.config.deadline_h is not None
        self.job = GridJob((target - start) * self.samples_per_step, clock.offset_s + self.config.deadline_h * 3600,
                           clock.signal.interval_s)
        self.throttle = Throttle(self.settings, self.job)
        self._forecast = values_from(self.forecast, clock.interval_start(0), self.job.intervals)
        self.phase = "throttle"
        self._follow(session, done_steps, force=True)

    # -- following the signal ------------------------------------------------------------------------------

    def _follow(self, session: RunView, done_steps: int, force: bool = False) -> None:
        assert self.signal_clock is not None and self.job is not None and self.throttle is not None
        interval = self.signal_clock.job_interval(self._job_time)
        if interval == self._interval and not force:
            return
        self._interval = interval
        fastest = min(range(len(self.settings)), key=lambda i: self.settings[i].time_per_sample_s)
        done = done_steps * self.samples_per_step
        if interval >= self.job.intervals:
            choice, decision = fastest, {"done": done, "past_deadline": True}
            if not self._warned_late and session.rank == 0:
                log.warning("grid: the deadline (%.3g h) has passed with %.0f of %.0f samples done: holding the "
                            "fastest limit", self.config.deadline_h, done, self.job.samples)
            self._warned_late = True
        else:
            # the part of this interval already spent is not available: count it as work still to do at the
            # fastest setting (conservative: the policy then plans for at least the work left)
            spent = self._job_time - interval * self.job.interval_s
            effective = done - spent / self.settings[fastest].time_per_sample_s
            choice = self.throttle.decide(interval, effective, self._forecast)
            decision = {"done": effective, "value_of_time": self.throttle.value_of_time}
            if math.isinf(self.throttle.value_of_time) and not self._warned_late:
                self._warned_late = True
                self.note = "the deadline could not be met even at the fastest limit; it was held instead"
                if session.rank == 0:
                    log.warning("grid: %s", self.note)
        self._set_limit(self.settings[choice].power_limit_w, session, "throttle", done_steps, decision)

    def _set_limit(self, watts: float, session: RunView, phase: str, done_steps: int,
                   decision: dict[str, Any] | None = None) -> None:
        """Hold ``watts`` from now, ``done_steps`` after the schedule began (every rank calls it with the same figures),
        and open a segment of the record."""
        self.segments.append(self._segment(phase, watts, done_steps, decision))
        if watts == self.applied or self.controller is None:
            self.applied = watts if self.controller is not None else self.applied
            return
        try:
            for gpu in self.gpus:
                self.controller.set_power_limit(gpu, watts)
        except KnobError as exc:
            self._stop_applying(f"{exc}: the GPUs went back to their limits")
            return
        if self.controller.mode != "apply":  # no permission: the controller said so and observes
            self._stop_applying("no permission to change the power limit: nothing was applied")
            return
        self.applied = watts

    def _segment(self, phase: str, watts: float, done_steps: int, decision: dict[str, Any] | None = None
                 ) -> dict[str, Any]:
        """A new stretch of the record, from now (``done_steps``: steps since the schedule began)."""
        assert self.signal_clock is not None and self.actual is not None
        return new_segment(self.signal_clock, self.actual, self._job_time, phase, watts,
                           self._first_step + done_steps, decision)

    def _stop_applying(self, why: str) -> None:
        """Keep deciding with the other ranks (the window all-reduces go on), but change nothing on this rank."""
        log.warning("grid: %s", why)
        self.note = why
        self.restore()

    # -- end -------------------------------------------------------------------------------------------------

    def on_rank_end(self, session: RunView, rank_record: RankRecord) -> None:
        """Put the GPUs' limits back, then write the ``grid`` section of this rank's record."""
        if self.phase != "off" and self.signal_clock is not None:
            now = self.clock()
            self._add_to_segment(now - self._clock_mark, self._energy() - self._energy_mark)
            self._job_time = self.signal_clock.job_time_s(now)
        self.restore()
        rank_record.grid = self.section()

    def section(self) -> GridSection:
        """The record's ``grid`` section as things stand."""
        config = self.config
        signal = signal_section(self.actual, self.signal_clock, self.decided_on, config.replay, self._job_time)
        estimated = any(gpu.info.estimated for gpu in self.gpus)
        settings = [{"power_limit_w": s.power_limit_w, "time_per_sample_s": s.time_per_sample_s,
                     "energy_per_sample_j": s.energy_per_sample_j, "steps": steps}
                    for s, steps in zip(self.settings, self.steps_measured, strict=True)]
        job = None if self.job is None else {"samples": self.job.samples, "deadline_s": self.job.deadline_s,
                                             "interval_s": self.job.interval_s}
        return GridSection(config.policy, signal, config.deadline_h, settings,
                           "simulated" if estimated else "measured", list(self.segments), self._outcome(), self.note,
                           job)

    def _outcome(self) -> dict[str, Any] | None:
        clock, actual = self.signal_clock, self.actual
        if clock is None or actual is None or not self.segments:
            return None
        finished_h = (self._job_time - clock.offset_s) / 3600
        energy = sum(s["energy_j"] for s in self.segments)
        cost = sum(s["energy_j"] / JOULES_PER_KWH * s["signal"] for s in self.segments)
        out: dict[str, Any] = {"finished_h": finished_h, "deadline_met": finished_h <= (self.config.deadline_h or 0),
                               "energy_j": energy, "cost": cost, "cost_unit": actual.per_kwh_name,
                               "energy_source": "GPU energy counters" + (
                                   " (virtual GPUs: simulated)" if any(g.info.estimated for g in self.gpus) else "")}
        if self.job is not None and len(self.settings) == len(self.candidates):
            out["estimated"] = self._against_blind()
        return out

    def _against_blind(self) -> dict[str, Any]:
        """The limits held and a signal-blind run at the maximum limit, both replayed on the measured per-setting
        figures and the actual signal from the anchor interval: an estimate."""
        assert self.job is not None and self.signal_clock is not None and self.actual is not None
        job, settings = self.job, self.settings
        index = {s.power_limit_w: i for i, s in enumerate(settings)}
        held: dict[int, dict[float, float]] = {}
        for segment in self.segments:
            k = segment["interval"] - self.signal_clock.anchor
            held.setdefault(k, {}).setdefault(segment["power_limit_w"], 0.0)
            held[k][segment["power_limit_w"]] += segment["seconds"]
        plan = [index[max(held[k], key=held[k].get)] if k in held else index[settings[0].power_limit_w]
                for k in range(max(held) + 1)]
        default = max(range(len(settings)), key=lambda i: settings[i].power_limit_w)
        return against_blind("throttle", plan, settings, job, default, self.actual, self.signal_clock,
                             "estimated: the limits held and a signal-blind run at the maximum limit replayed on the "
                             "measured per-setting figures and the actual signal")

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs to go on as the same schedule: the run's start in the signal, the limits'
        measured figures and the intervals so far."""
        clock = self.signal_clock
        return {"wall_start": None if clock is None else clock.wall_start, "phase": self.phase,
                "settings": [[s.power_limit_w, s.time_per_sample_s, s.energy_per_sample_j] for s in self.settings],
                "steps_measured": list(self.steps_measured), "samples_per_step": self.samples_per_step,
                "segments": [dict(s) for s in self.segments], "note": self.note, "first_step": self._first_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go on with the checkpointed schedule (after :meth:`on_train_start` read the signal and began the sweep):
        the deadline still counts from the first start, and limits measured before are not measured again."""
        if self.phase == "off" or self.actual is None or state.get("wall_start") is None:
            return
        self.signal_clock = SignalClock(self.actual, float(state["wall_start"]), self.config.replay)
        self._job_time = self.signal_clock.job_time_s(self.clock())
        self.segments = [dict(s) for s in state.get("segments") or []]
        self.note = str(state.get("note", ""))
        self._first_step = int(state.get("first_step", self._first_step))
        settings = state.get("settings") or []
        if state.get("phase") != "throttle" or len(settings) != len(self.candidates):
            self.segments.append(self._segment("sweep", self.applied or self.candidates[0],
                                               self._attempt_step - self._first_step))
            return  # the sweep had not ended: it starts again
        self.settings = [GridSetting(f"{w:g} W", float(w), float(t), float(e)) for w, t, e in settings]
        self.steps_measured = [int(n) for n in state.get("steps_measured") or []]
        self.samples_per_step = float(state["samples_per_step"])
        self.phase = "restored"  # the next window end schedules the rest of the job on the restored figures
        self._interval = -1
        self.segments.append(self._segment("resumed", self.applied or self.candidates[0],
                                           self._attempt_step - self._first_step))

    def restore(self) -> None:
        """Put the GPUs' original limits back (idempotent)."""
        if self.controller is not None:
            self.controller.__exit__(None, None, None)
            self.controller = None

    def tuner_state(self) -> TunerState:
        """``grid`` is ``off``, ``sweep`` (measuring the limits), ``restored`` (resumed, deciding at the next window
        end) or ``throttle`` (following the signal)."""
        return TunerState("grid", self.phase)

    def clock_lock(self) -> ClockLock | None:
        """The grid policy moves the power limit, never the SM clock."""
        return None


def shared(session: RunView, sums: list[float], maxima: list[float]) -> tuple[list[float], list[float]]:
    """``sums`` summed and ``maxima`` maximised over the ranks (one all-reduce each when distributed)."""
    if not session.ctx.distributed:
        return sums, maxima
    device, group = session.ctx.collective_device, session.ctx.group
    added = torch.tensor(sums, dtype=torch.float64, device=device)
    largest = torch.tensor(maxima, dtype=torch.float64, device=device)
    dist.all_reduce(added, op=dist.ReduceOp.SUM, group=group)
    dist.all_reduce(largest, op=dist.ReduceOp.MAX, group=group)
    return added.tolist(), largest.tolist()


def shared_min(session: RunView, value: float) -> float:
    """The smallest ``value`` of all ranks."""
    if not session.ctx.distributed:
        return value
    tensor = torch.tensor([value], dtype=torch.float64, device=session.ctx.collective_device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MIN, group=session.ctx.group)
    return float(tensor.item())


