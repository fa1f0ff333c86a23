"""A training job on simulated GPUs scheduled against a grid signal: signal-blind, throttle, pause and the oracle.

The simulated job is swept over its power limits once, noise-free (:func:`measure_settings`: the simulated GPUs'
time and energy per sample at each limit, read from their energy counters as on real GPUs). A job of
``job_hours`` at the default setting (the maximum limit) then runs from ``start`` under a deadline on the
signal's intervals: each policy of :mod:`dtpo.tune.grid_policy` decides on the forecast (the actual values where
the file has no forecast), and every plan is accounted on the actual values (:func:`run_grid_job`). Everything is
simulated: the job is never stepped for hours, its per-sample figures are.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from dtpo.core.errors import ConfigError
from dtpo.energy.grid_signal import GridSignal
from dtpo.simulation.data_parallel import SimulatedJob
from dtpo.simulation.job import JobConfig
from dtpo.tune.grid_policy import (
    GRID_POLICIES,
    PAUSE,
    GridJob,
    GridOutcome,
    GridSetting,
    PauseWhenDirty,
    Throttle,
    blind_plan,
    check_feasible,
    oracle_plan,
    plan_online,
    replay,
)

__all__ = ["GridRun", "default_setting", "measure_settings", "run_grid_job", "settings_over_time"]


def measure_settings(config: JobConfig) -> list[GridSetting]:
    """The simulated job's time and energy per sample at each power limit (a noise-free sweep of ``config``)."""
    with SimulatedJob(replace(config, noise=0.0)) as job:
        results = job.sweep("power-limit")
    return [GridSetting(f"{r.power_limit_w:g} W", r.power_limit_w, r.time_s / r.samples, r.energy_j / r.samples)
            for r in results]


def default_setting(settings: Sequence[GridSetting]) -> int:
    """The signal-blind setting: the highest power limit (the GPUs' default)."""
    return max(range(len(settings)), key=lambda i: settings[i].power_limit_w)


@dataclass
class GridRun:
    """Every policy's outcome on one job.

    Attributes:
        job: The job scheduled.
        start: When it starts (UTC).
        outcomes: By policy name (``blind``, ``throttle``, ``pause``, ``oracle-throttle``, ``oracle-pause``,
            ``oracle``).
        forecast_source: What the policies decided on: ``forecast`` or ``actual`` (no forecast in the file).
    """

    job: GridJob
    start: datetime
    outcomes: dict[str, GridOutcome]
    forecast_source: str

    def saving(self, policy: str) -> float:
        """The policy's cost saved against the signal-blind run, as a fraction."""
        blind = self.outcomes["blind"].cost
        return 1 - self.outcomes[policy].cost / blind if blind > 0 else 0.0

    def slowdown(self, policy: str) -> float:
        """The policy's finish time against the signal-blind run's, as a fraction more."""
        return self.outcomes[policy].time_s / self.outcomes["blind"].time_s - 1


def run_grid_job(settings: Sequence[GridSetting], actual: GridSignal, *, job_hours: float, deadline_hours: float,
                 start: datetime | None = None, forecast: GridSignal | None = None,
                 policies: Sequence[str] = GRID_POLICIES, oracle: bool = True,
                 resume_s: float | None = None) -> GridRun:
    """Schedule a job of ``job_hours`` (at the default setting) by ``deadline_hours`` from ``start`` (default: the
    signal's start) with each of ``policies``, and the oracles where ``oracle``.

    Raises:
        ConfigError: A deadline shorter than the job, an unknown policy, a start off the signal's intervals, a
            forecast on other intervals than the actual values, or a signal that does not cover the deadline.
    """
    unknown = [p for p in policies if p not in GRID_POLICIES]
    if unknown:
        raise ConfigError(f"--grid-policy must be one of {', '.join(GRID_POLICIES)}, got {unknown[0]!r}")
    if not (math.isfinite(job_hours) and job_hours > 0):
        raise ConfigError(f"--job-hours must be a finite number > 0, got {job_hours:g}")
    if not (math.isfinite(deadline_hours) and deadline_hours > 0):
        raise ConfigError(f"--deadline must be a finite number of hours > 0, got {deadline_hours:g}")
    if forecast is not None and not forecast.like(actual):
        raise ConfigError(f"{forecast.source}: the forecast's intervals differ from the actual values'")
    start = actual.start if start is None else start
    offset = (start - actual.start).total_seconds() / actual.interval_s
    if abs(offset - round(offset)) > 1e-9:
        raise ConfigError(f"--start must be the start of one of the signal's {actual.interval_s:g} s intervals")
    default = default_setting(settings)
    samples = job_hours * 3600 / settings[default].time_per_sample_s
    job = GridJob(samples, deadline_hours * 3600, actual.interval_s,
                  **({} if resume_s is None else {"resume_s": resume_s}))
    check_feasible(settings, job)
    blind_s = samples * settings[default].time_per_sample_s
    window = max(job.intervals, math.ceil(blind_s / job.interval_s - 1e-9))
    actual.check_covers(start, window * job.interval_s, "the job with its deadline")
    first = actual.index_at(start)
    real = actual.values[first:first + window]
    seen = real if forecast is None else forecast.values[first:first + window]
    outcomes = {"blind": replay("blind", blind_plan(settings, job, default), settings, job, real)}
    if "throttle" in policies:
        plan = plan_online(Throttle(settings, job), settings, job, seen)
        outcomes["throttle"] = replay("throttle", plan, settings, job, real)
    if "pause" in policies:
        plan = plan_online(PauseWhenDirty(settings, job, default), settings, job, seen)
        outcomes["pause"] = replay("pause", plan, settings, job, real)
    if oracle:
        everything = range(len(settings))
        for name, actions, pause in (("oracle-throttle", everything, False), ("oracle-pause", [default], True),
                                     ("oracle", everything, True)):
            if name == "oracle-throttle" and "throttle" not in policies or name == "oracle-pause" and \
                    "pause" not in policies:
                continue
            outcomes[name] = replay(name, oracle_plan(settings, job, real, actions=actions, pause=pause),
                                    settings, job, real)
    return GridRun(job, start, outcomes, "actual" if forecast is None else "forecast")


def settings_over_time(outcome: GridOutcome, settings: Sequence[GridSetting]) -> list[str]:
    """The plan as readable settings, one per interval (``pause`` for a pause)."""
    return ["pause" if a == PAUSE else settings[a].name for a in outcome.plan]

