"""Scheduling a job against a grid signal: which power setting (or a pause) to hold in each signal interval.

The job is ``samples`` samples to train by a deadline; each measured setting trains a sample in
``time_per_sample_s`` for ``energy_per_sample_j`` (all GPUs). In each signal interval a policy holds one setting
or pauses; a pause stops the job (checkpoint and stop: no energy where the devices are freed, their idle power,
``idle_power_w``, where the job holds them), and resuming costs ``resume_s`` seconds at the setting's power without
progress. The cost of an interval is its energy (kWh) times the signal (g CO2e/kWh or a
price per kWh).

* ``blind``: the default setting (the fastest) throughout, from the start: what a signal-blind run does.
* ``throttle`` (:class:`Throttle`): in each interval, the setting that minimises ``forecast x energy + value of
  time x time`` per sample, the value of time the smallest that still finishes by the deadline on the forecast
  (re-chosen every interval from the progress made), after Chase (arXiv 2303.02508).
* ``pause`` (:class:`PauseWhenDirty`): the default setting while the forecast is at most a threshold, paused above
  it; the threshold is re-chosen every interval as the one that, played out on the forecast to the deadline with
  each resume's cost, finishes in time at the least cost, so it rises as the slack is spent and stays above
  everything where no pause pays for its resume ("Let's Wait Awhile", Middleware '21).
* ``oracle`` (:func:`oracle_plan`): dynamic programming over intervals x actions x progress on the actual signal,
  over the actions a policy may take (settings, and pauses where allowed): the best any policy could have done.

:func:`replay` runs a plan on the actual signal, exactly, and is the only accounting every policy is judged by.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from dtpo.core.errors import ConfigError
from dtpo.tune.cost import JOULES_PER_KWH

__all__ = ["GRID_POLICIES", "PAUSE", "GridJob", "GridOutcome", "GridSetting", "PauseWhenDirty", "Throttle",
           "blind_plan", "check_feasible", "oracle_plan", "plan_online", "replay"]

PAUSE = -1  # the action "paused" in a plan
GRID_POLICIES: tuple[str, ...] = ("blind", "throttle", "pause")
DEFAULT_RESUME_S = 300.0  # checkpoint, stop, restart, restore, warm up: about five minutes of GPU time
_BINS_PER_INTERVAL = 200  # oracle: progress resolution, per interval at the fastest setting
_MAX_BINS = 30_000


@dataclass(frozen=True)
class GridSetting:
    """One measured setting: its name and what a sample costs there.

    Attributes:
        name: Readable setting, e.g. ``"175 W"``.
        power_limit_w: Power limit (per GPU).
        time_per_sample_s: Wall time per sample (whole job).
        energy_per_sample_j: Energy per sample, all GPUs.
    """

    name: str
    power_limit_w: float
    time_per_sample_s: float
    energy_per_sample_j: float

    @property
    def power_w(self) -> float:
        """Power of the whole job at this setting."""
        return self.energy_per_sample_j / self.time_per_sample_s


@dataclass(frozen=True)
class GridJob:
    """A job to schedule: how much work, by when, and what a pause costs.

    Attributes:
        samples: Samples to train.
        deadline_s: Seconds from the start by which it must be done.
        interval_s: Length of one signal interval.
        resume_s: Seconds lost (at the setting's power) each time the job resumes after a pause.
        idle_power_w: Power drawn while paused, in the settings' units (energy per sample over time per sample):
            ``0`` where a pause stops the job and frees its devices; a pause that holds them idle draws their
            idle power.
    """

    samples: float
    deadline_s: float
    interval_s: float
    resume_s: float = DEFAULT_RESUME_S
    idle_power_w: float = 0.0

    @property
    def intervals(self) -> int:
        """Signal intervals before the deadline (the last may be partial)."""
        return math.ceil(self.deadline_s / self.interval_s - 1e-9)

    def available_s(self) -> np.ndarray:
        """Seconds usable in each interval before the deadline."""
        starts = np.arange(self.intervals) * self.interval_s
        return np.minimum(self.interval_s, self.deadline_s - starts)


@dataclass
class GridOutcome:
    """A plan replayed on the actual signal.

    Attributes:
        policy: Which policy made it.
        plan: The action in each interval: a setting's index, or :data:`PAUSE`.
        time_s: When the job finished, from its start (``inf`` if it did not).
        energy_j: Energy of the job, all GPUs.
        cost: Energy times the signal: g CO2e, or the price's currency.
        pauses: How many times it paused and resumed.
        deadline_s: The deadline it ran under.
    """

    policy: str
    plan: list[int]
    time_s: float
    energy_j: float
    cost: float
    pauses: int
    deadline_s: float
    settings_used: dict[str, float] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        """Whether it trained every sample by the deadline."""
        return self.time_s <= self.deadline_s * (1 + 1e-9)


def check_feasible(settings: Sequence[GridSetting], job: GridJob) -> None:
    """Refuse, in one line, a deadline the fastest setting cannot meet.

    Raises:
        ConfigError: The job needs more time than the deadline gives at the fastest setting.
    """
    fastest = min(s.time_per_sample_s for s in settings)
    needed = job.samples * fastest
    if needed > job.deadline_s * (1 + 1e-9):
        raise ConfigError(f"the deadline is already impossible: the job needs {needed / 3600:.3g} h at its fastest "
                          f"setting, the deadline gives {job.deadline_s / 3600:.3g} h")


def replay(policy: str, plan: Sequence[int], settings: Sequence[GridSetting], job: GridJob,
           actual: np.ndarray) -> GridOutcome:
    """Run ``plan`` on the ``actual`` signal (one value per interval from the start) and account for it exactly."""
    done = energy = cost = 0.0
    pauses = 0
    running = True  # the job starts running: no resume cost in the first interval it runs
    used: dict[str, float] = {}
    finish = math.inf
    for k, action in enumerate(plan):
        if done >= job.samples * (1 - 1e-9):
            break
        start = k * job.interval_s
        available = min(job.interval_s, job.deadline_s - start) if start < job.deadline_s else job.interval_s
        if action == PAUSE:
            running = False
            joules = job.idle_power_w * available
            energy += joules
            cost += joules / JOULES_PER_KWH * float(actual[k])
            continue
        setting = settings[action]
        overhead = 0.0 if running else job.resume_s
        if not running:
            pauses += 1
        running = True
        usable = max(0.0, available - overhead)
        gained = usable / setting.time_per_sample_s
        seconds = available
        if done + gained >= job.samples * (1 - 1e-9):
            seconds = min(available, overhead + (job.samples - done) * setting.time_per_sample_s)
            gained = job.samples - done
            finish = start + seconds
        done += gained
        joules = setting.power_w * seconds
        energy += joules
        cost += joules / JOULES_PER_KWH * float(actual[k])
        used[setting.name] = used.get(setting.name, 0.0) + seconds
    return GridOutcome(policy, list(plan), finish if done >= job.samples * (1 - 1e-9) else math.inf, energy, cost,
                       pauses, job.deadline_s, used)


def blind_plan(settings: Sequence[GridSetting], job: GridJob, default: int) -> list[int]:
    """The signal-blind plan: ``default`` in every interval until the work is done (and past the deadline if
    it must)."""
    needed = math.ceil(job.samples * settings[default].time_per_sample_s / job.interval_s - 1e-9)
    return [default] * max(needed, 1)


class Throttle:
    """In each interval, the setting with the least ``forecast x energy + value of time x time`` per sample, the
    value of time the smallest that still finishes by the deadline on the forecast.

    Args:
        settings: The measured settings.
        job: The job.
    """

    def __init__(self, settings: Sequence[GridSetting], job: GridJob) -> None:
        self.settings = settings
        self.job = job
        self._time = np.array([s.time_per_sample_s for s in settings])
        self._kwh = np.array([s.energy_per_sample_j for s in settings]) / JOULES_PER_KWH
        self.value_of_time = 0.0

    def _choices(self, forecast: np.ndarray, value_of_time: float) -> np.ndarray:
        per_sample = forecast[:, None] * self._kwh[None, :] + value_of_time * self._time[None, :]
        return np.argmin(per_sample, axis=1)

    def decide(self, interval: int, done: float, forecast: np.ndarray) -> int:
        """The setting for ``interval`` given the samples ``done`` and the forecast of every interval from the start.
        """
        available = self.job.available_s()[interval:]
        ahead = np.asarray(forecast[interval:interval + len(available)], dtype=float)
        remaining = self.job.samples - done

        def enough(value_of_time: float) -> bool:
            return float(np.sum(available / self._time[self._choices(ahead, value_of_time)])) >= remaining * (1 - 1e-9)

        fastest = int(np.argmin(self._time))
        if enough(0.0):
            self.value_of_time = 0.0
        else:
            high = float(np.max(ahead) * np.max(self._kwh) / np.min(self._time)) + 1.0
            while not enough(high) and high < 1e12:
                high *= 4
            if not enough(high):
                self.value_of_time = math.inf
                return fastest
            low = 0.0
            for _ in range(50):
                middle = (low + high) / 2
                low, high = (low, middle) if enough(middle) else (middle, high)
            self.value_of_time = high
        return int(self._choices(ahead[:1], self.value_of_time)[0])


class PauseWhenDirty:
    """The default setting while the forecast is at most a threshold, paused above it; the threshold is chosen from
    the forecast and the slack left, re-chosen every interval.

    Each candidate threshold (every forecast value ahead) is played out on the forecast from this interval to the
    deadline: run while the forecast is at most the threshold, pause above it, run regardless once pausing would
    leave too little time for the work and one resume; every resume after a pause costs its seconds at the
    setting's power. The threshold chosen is the one whose play-out finishes by the deadline at the least forecast
    cost, so it pauses only where a pause pays for its resume on the forecast, and not at all where none does.

    Args:
        settings: The measured settings.
        job: The job.
        default: Index of the setting it runs at (the signal-blind one).
    """

    def __init__(self, settings: Sequence[GridSetting], job: GridJob, default: int) -> None:
        self.job = job
        self.default = default
        self._time = settings[default].time_per_sample_s
        self._power_w = settings[default].power_w
        self.threshold = math.inf
        self.expected_saving = 0.0  # on the forecast, against running from now on: what the threshold is worth
        self._running = True

    def decide(self, interval: int, done: float, forecast: np.ndarray) -> int:
        """Run (the default setting's index) or :data:`PAUSE` in ``interval``."""
        job = self.job
        available = job.available_s()[interval:]
        ahead = np.asarray(forecast[interval:interval + len(available)], dtype=float)
        work_s = (job.samples - done) * self._time
        if float(available[1:].sum()) < (work_s + job.resume_s) * (1 + 1e-9):
            self.threshold, self.expected_saving = math.inf, 0.0  # no slack left for a pause and its resume
            return self._run()
        candidates = np.unique(ahead)
        costs, finished = _play_thresholds(candidates, ahead, available, work_s, job.resume_s, self._running,
                                           job.idle_power_w / self._power_w if self._power_w > 0 else 0.0)
        never = costs[-1]  # the highest candidate: run throughout
        feasible = np.nonzero(finished)[0]
        best = int(feasible[np.argmin(costs[feasible])]) if len(feasible) else len(candidates) - 1
        self.threshold = float(candidates[best])
        self.expected_saving = float(1 - costs[best] / never) if never > 0 else 0.0
        if ahead[0] <= self.threshold:
            return self._run()
        self._running = False
        return PAUSE

    def _run(self) -> int:
        self._running = True
        return self.default


def _play_thresholds(thresholds: np.ndarray, ahead: np.ndarray, available: np.ndarray, work_s: float,
                     resume_s: float, running: bool, idle_share: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Play out "run while the signal is at most the threshold" for every threshold at once on ``ahead`` (with a run
    forced once pausing would leave less than the work and a resume): the cost per kW of each (signal x seconds
    run, and x ``idle_share`` of the seconds paused before it finished), and whether it finished."""
    count = len(thresholds)
    left = np.full(count, work_s)  # work seconds still to do
    was_running = np.full(count, running)
    cost = np.zeros(count)
    after = np.concatenate([np.cumsum(available[::-1])[::-1][1:], [0.0]])  # seconds after each interval
    for j, value in enumerate(ahead):
        busy = left > 0
        forced = after[j] < (left + resume_s) * (1 + 1e-9)
        run = busy & ((value <= thresholds) | forced)
        overhead = np.where(was_running, 0.0, resume_s)
        seconds = np.where(run, np.minimum(available[j], overhead + left), 0.0)
        cost += seconds * value + np.where(busy & ~run, available[j] * value * idle_share, 0.0)
        left = np.where(run, left - np.maximum(0.0, seconds - overhead), left)
        was_running = np.where(busy, run, was_running)
    return cost, left <= work_s * 1e-9


def plan_online(policy: Throttle | PauseWhenDirty, settings: Sequence[GridSetting], job: GridJob,
                forecast: np.ndarray) -> list[int]:
    """Run an online policy interval by interval on the forecast: the plan it makes, each decision knowing only
    the progress so far and the forecast."""
    plan: list[int] = []
    done = 0.0
    running = True
    available = job.available_s()
    for k in range(job.intervals):
        if done >= job.samples * (1 - 1e-12):
            break
        action = policy.decide(k, done, forecast)
        plan.append(action)
        if action == PAUSE:
            running = False
            continue
        overhead = 0.0 if running else job.resume_s
        running = True
        done += max(0.0, available[k] - overhead) / settings[action].time_per_sample_s
    return plan


def oracle_plan(settings: Sequence[GridSetting], job: GridJob, actual: np.ndarray, *, actions: Sequence[int],
                pause: bool) -> list[int]:
    """The plan of least cost on the ``actual`` signal that finishes by the deadline: dynamic programming over
    intervals x actions (``actions``, the settings' indices allowed, and pauses where ``pause``) x progress
    (discretised, rounded down: the plan it finds is feasible, and within a progress step of the best).

    Raises:
        ConfigError: No plan over these actions finishes by the deadline.
    """
    available = job.available_s()
    fastest = min(settings[a].time_per_sample_s for a in actions)
    bins = int(min(_MAX_BINS, _BINS_PER_INTERVAL * math.ceil(job.samples * fastest / job.interval_s)))
    per_bin = job.samples / bins
    intervals = job.intervals
    inf = math.inf
    # cost[p, r]: least cost to have p bins done, r = whether the job ran in the interval before
    cost = np.full((bins + 1, 2), inf)
    cost[0, 1] = 0.0
    choice = np.full((intervals, bins + 1, 2), -9, dtype=np.int16)
    origin = np.zeros((intervals, bins + 1, 2), dtype=np.int32)  # the progress it came from
    came_running = np.zeros((intervals, bins + 1, 2), dtype=bool)
    p_index = np.arange(bins + 1)
    for k in range(intervals):
        new = np.full((bins + 1, 2), inf)
        for was_running in (0, 1):
            row = cost[:, was_running]
            if not np.isfinite(row).any():
                continue
            if pause:  # pause: progress unchanged, at idle power; a finished job stays finished at no cost
                held = row + np.where(p_index < bins, available[k] * job.idle_power_w / JOULES_PER_KWH
                                      * float(actual[k]), 0.0)
                better = held < new[:, 0]
                new[better, 0] = held[better]
                choice[k, better, 0] = PAUSE
                origin[k, better, 0] = p_index[better]
                came_running[k, better, 0] = bool(was_running)
            overhead = 0.0 if was_running else job.resume_s
            for action in actions:
                setting = settings[action]
                gain_s = max(0.0, available[k] - overhead)
                gain = int(gain_s / setting.time_per_sample_s / per_bin)
                seconds = np.where(p_index + gain >= bins,
                                   np.minimum(available[k], overhead + (bins - p_index) * per_bin
                                              * setting.time_per_sample_s), available[k])
                seconds = np.where(p_index >= bins, 0.0, seconds)
                total = row + seconds * setting.power_w / JOULES_PER_KWH * float(actual[k])
                cut = max(0, bins - gain)  # from p = cut on, the job finishes in this interval
                moved = np.nonzero(total[:cut] < new[gain:gain + cut, 1])[0]
                new[gain + moved, 1] = total[moved]
                choice[k, gain + moved, 1] = action
                origin[k, gain + moved, 1] = moved
                came_running[k, gain + moved, 1] = bool(was_running)
                last = cut + int(np.argmin(total[cut:]))
                if total[last] < new[bins, 1]:
                    new[bins, 1] = total[last]
                    choice[k, bins, 1] = action
                    origin[k, bins, 1] = last
                    came_running[k, bins, 1] = bool(was_running)
        cost = new
    end = int(np.argmin(cost[bins]))
    if not np.isfinite(cost[bins, end]):
        raise ConfigError("no plan over these settings finishes by the deadline (the deadline is already impossible)")
    plan: list[int] = []
    p, r = bins, end
    for k in range(intervals - 1, -1, -1):
        plan.append(int(choice[k, p, r]))
        p, r = int(origin[k, p, r]), int(came_running[k, p, r])
    plan.reverse()
    while plan and plan[-1] == PAUSE:
        plan.pop()
    return plan
