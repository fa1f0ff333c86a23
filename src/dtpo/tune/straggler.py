"""Per-rank slowdown for stragglers: ranks that only wait for the slowest one run at a lower SM clock.

In data-parallel training every step ends in a collective, so a step lasts as long as its slowest rank. The
others finish early and wait at full clock. :class:`StragglerSlowdown` looks at one window at a time (every
rank's mean time per step to become ready, and the clock it actually ran at) and moves every rank that is
not the critical one toward the lowest supported clock at which it still becomes ready a ``margin`` before
the critical rank; the critical rank runs free (full speed). When the straggler moves or goes away, the rank
that has become critical is unlocked in the next decision, i.e. within one window, and a rank whose slack
has shrunk below half the margin is sped up.

What a rank's time at another clock will be comes from what the ranks measured, pooled so that noise averages
out (each rank's windows at one clock are pooled until it changes speed, and a shared curve is fitted over all
ranks, :func:`fleet_curve`: the ranks of one job run one workload on one GPU model, so the shape of time against
clock is common while each rank keeps its own level). Where nothing is known yet, the step is taken from the
rank's own current point with ``time ~ 1 / clock``: the compute-bound part of a step scales with the clock and the
rest (memory-bound kernels, data loading) does not, so a GPU whose clock is all that changes slows down no more
than this predicts, with no model of the workload. Measured curves can bend more steeply than that (voltage,
thermals, a calibrated trace that maps clocks through power limits), so one decision lowers a clock by at most
``max_step``, never to a clock measured (by the rank or the fleet) too slow for the aim, a clock that once made a
rank the pace setter is not used again for a while, and a one-step move down is not worth a relock. A rank that
meets its aim tries one clock a little lower when its local slope says it will still meet it.

The shared curve is fitted on each window's odd-numbered steps and each rank's level, on which its clock is
decided, on the even-numbered ones. Fitted on the same steps, the curve would bend too steeply: a rank moves down
after windows that read fast by chance, so the step below would look slower than it is, by that chance.

Noise: every step lasts as long as its slowest rank, so with step-to-step noise a waiting rank brought close to
the pace lengthens the steps in which the noise makes it the slowest, and the more ranks, the more often. The
waiting ranks therefore aim at the latest common ready time at which the expected step time, the expected
maximum over all ranks (each normal, with its pooled mean and spread, :func:`expected_max`), rises by at most
``time_budget`` (:func:`noisy_aim`), and never later than ``margin`` before the pace. A locked rank counts there at
the time the fleet's curve gives it at its free clock.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

MIN_SLOPE = 0.25
"""The least slope of log step time against log clock an exploring rank assumes for its next step down (a window's
noise can make the slope look flat)."""


@dataclass(frozen=True)
class RankWindow:
    """One rank over one window.

    Attributes:
        ready_s: Mean seconds per step until the rank's gradients were ready (its own work, no waiting).
        clock_mhz: The SM clock it actually ran at (under a power limit that binds, below any lock).
        locked: Whether its clock was locked (``False``: it ran at the clock the GPU settles at by itself).
        spread: Relative standard deviation of its per-step ready times in the window (step-to-step noise).
        energy_j: Its GPUs' energy per step over the window, waiting included (``None`` when not measured).
        steps: Steps in the window.
        holdout_s: Mean seconds per step until ready over the window's odd-numbered steps only (``None``: not
            given). The policy fits the curve it shares across ranks on these and decides each rank's clock on
            the other steps, so the noise that made a rank move does not bend the curve (a rank moves down after
            windows that read fast by chance; fitted on the same windows, every step down would look steeper
            than it is).
    """

    ready_s: float
    clock_mhz: float
    locked: bool = False
    spread: float = 0.0
    energy_j: float | None = None
    steps: int = 1
    holdout_s: float | None = None

    def split(self) -> tuple[float, float]:
        """``(mean over the even-numbered steps, mean over the odd-numbered ones)``; both the window's mean when
        there is no hold-out half."""
        odd = self.steps // 2
        if self.holdout_s is None or odd == 0:
            return self.ready_s, self.ready_s
        return (self.ready_s * self.steps - self.holdout_s * odd) / (self.steps - odd), self.holdout_s


class Pooled(NamedTuple):
    """One window as a rank's pool keeps it: mean ready time, steps, window index, spread, and the means over its
    even- and odd-numbered steps (:meth:`RankWindow.split`)."""

    mean: float
    steps: int
    window: int
    spread: float
    even: float
    odd: float


@dataclass
class StragglerSlowdown:
    """Chooses a clock lock per rank from the last window; see the module docs.

    Args:
        clocks_mhz: Supported SM clocks (any order).
        margin: A slowed rank aims to be ready this share of the critical rank's time early.
        min_gain: Leave a rank alone unless the clock it would drop by is at least this share.
        time_budget: Step-to-step noise: every step lasts as long as its slowest rank, so slowed ranks that come
            close to the pace lengthen steps in which the noise makes one of them the slowest. The waiting ranks
            aim no later than the common ready time at which the expected step time (the expected maximum over
            all ranks, each a normal variable with its window's mean and spread) rises by this share.
        max_step: One decision lowers a rank's clock by at most this share (a model that bends below some
            clock cannot then throw a rank far past the pace).
        floor_windows: A rank that became the pace setter while locked keeps above that clock for this many
            windows.
        energy_tolerance: Where energy per step is measured, a rank whose energy per step rose by more than this
            share when its clock dropped goes back up and stays at or above the higher clock: below the
            least-energy clock, a slower clock costs energy instead of saving it.
        pool_windows: A rank's pool at one clock keeps its latest this many windows (older ones drop out as new
            ones come; a pool at a clock the rank left stays until the rank changes speed, so the fleet's curve keeps
            linking every clock, the free one included, to those the ranks run at now).
        fleet_ranks: Where at least this many ranks ran at a clock, a rank's ready time there is predicted from its
            own time at its current clock and the fleet's curve (:func:`fleet_curve`) rather than from its own
            points alone: the ranks of one job share the shape of time against clock, and the curve fitted over
            all of them is far less noisy than any one rank's windows.
        change_sigmas: A rank's windows at one clock are pooled (the mean of ``pool_windows`` windows is that
            many times less noisy than one window's); a window whose mean differs from the pool's by more than
            this many standard errors of the difference means the rank itself changed speed (a straggler came
            or went), and its pools start again from that window.
        measured: Per rank and clock, the windows measured there (:class:`Pooled`).
    """

    clocks_mhz: Sequence[float]
    margin: float = 0.03
    min_gain: float = 0.02
    time_budget: float = 0.005
    max_step: float = 0.10
    floor_windows: int = 50
    free_clock: dict[int, float] = field(default_factory=dict)
    floor: dict[int, tuple[float, int]] = field(default_factory=dict)
    energy_tolerance: float = 0.01
    energy_floor: dict[int, float] = field(default_factory=dict)
    _seen: dict[int, tuple[float, float]] = field(default_factory=dict)
    _windows: int = 0
    pool_windows: int = 30
    change_sigmas: float = 4.0
    fleet_ranks: int = 3
    measured: dict[int, dict[float, list[Pooled]]] = field(default_factory=dict)
    _curve: FleetCurve = field(default_factory=lambda: FleetCurve({}, {}, {}, {}))

    def __post_init__(self) -> None:
        self.clocks_mhz = sorted(float(c) for c in self.clocks_mhz)
        if not self.clocks_mhz:
            raise ValueError("no SM clocks to choose from")

    def decide(self, window: Sequence[RankWindow]) -> list[float | None]:
        """The clock lock for each rank in the next window; ``None`` to let it run free."""
        for rank, w in enumerate(window):
            if not w.locked:
                self.free_clock[rank] = w.clock_mhz
        self._windows += 1
        self._learn_energy(window)
        for rank, w in enumerate(window):
            self._pool(rank, w)
        self._curve = fleet_curve(self.measured)
        # each rank's ready time at every clock the fleet's curve links to its own (empty where none)
        fleet = [self._curve.predict(rank, w.clock_mhz, self.fleet_ranks) for rank, w in enumerate(window)]
        # every figure below is the rank's pooled estimate at the clock it ran at, this window included
        window = [self._estimate(rank, w, fleet[rank]) for rank, w in enumerate(window)]
        critical = max(range(len(window)), key=lambda r: window[r].ready_s)
        if window[critical].locked:  # slowed too far: never that low again for a while
            self.floor[critical] = (window[critical].clock_mhz, self._windows)
        # every rank's ready time were it running free (see _free_ready); the pace: the critical rank's, but never
        # faster than the slowest rank that runs free already (the real straggler)
        free_ready = [self._free_ready(r, w, fleet[r]) for r, w in enumerate(window)]
        pace = max([free_ready[critical], *(w.ready_s for w in window if not w.locked)])
        # a step lasts as long as its slowest rank: with noise, the latest common ready time the waiting ranks can
        # aim at without lengthening the expected step by more than the budget
        aim = min(pace * (1.0 - self.margin), noisy_aim(free_ready, [w.spread for w in window], critical, pace,
                                                        self.time_budget))
        out: list[float | None] = []
        for rank, w in enumerate(window):
            free = self.free_clock.get(rank, self.clocks_mhz[-1])
            if rank == critical:
                out.append(None)  # the pace setter runs free
                continue
            mine = aim  # clear of the pace by the margin, and by what the noise needs
            # time ~ 1 / clock from where the rank is now: the lowest clock that cannot be too slow, by at most
            # max_step per decision, and above a clock that once made this rank the pace setter
            predicted = w.clock_mhz * w.ready_s / mine
            wanted = max(predicted, w.clock_mhz * (1.0 - self.max_step))
            floor, since = self.floor.get(rank, (0.0, 0))
            if self._windows - since < self.floor_windows:
                wanted = max(wanted, floor + 1e-6)
                predicted = max(predicted, floor + 1e-6)
            lowest = self.energy_floor.get(rank, 0.0)
            wanted, predicted = max(wanted, lowest), max(predicted, lowest)
            up = [c for c in self.clocks_mhz if c >= wanted - 1e-9]
            clock = up[0] if up else None
            below = [c for c in self.clocks_mhz if predicted - 1e-9 <= c < w.clock_mhz - 1e-9]
            if (clock is None or clock >= w.clock_mhz) and below:
                clock = below[-1]  # a coarse clock list: one supported clock down is the smallest step there is
            bound = max(floor + 1e-6 if self._windows - since < self.floor_windows else 0.0, lowest)
            recent = self._recent(rank, fleet[rank], bound)
            # never a clock at or below one the rank's own windows or the fleet's curve say is too slow for the aim
            too_slow = max((c for c, t in recent.items() if t > mine and c < w.clock_mhz - 1e-9), default=None)
            if clock is not None and too_slow is not None and clock <= too_slow + 1e-9:
                clock = next((c for c in self.clocks_mhz if c > too_slow + 1e-9), None)
            tried = self._explore(w, mine, recent, bound)
            if tried is not None and (clock is None or clock >= free or tried < clock):
                out.append(tried)
            elif clock is None or clock >= free:
                out.append(None)
            elif not w.locked and clock > free * (1.0 - self.min_gain):
                out.append(None)  # too little to gain from a lock
            elif w.locked and clock < w.clock_mhz and self._one_step_below(clock, w.clock_mhz):
                out.append(w.clock_mhz)  # one supported clock lower is not worth a change (and flip-flops)
            else:
                out.append(clock)
        return out

    def _recent(self, rank: int, fleet: dict[float, float], lowest: float) -> dict[float, float]:
        """The rank's ready time at each clock above ``lowest`` that it or the fleet ran at recently: ``fleet`` (the
        curve and the rank's level, where at least ``fleet_ranks`` ranks ran there), else its own pooled windows."""
        recent = {c: _pooled_mean(rows) for c, rows in self.measured.get(rank, {}).items() if c > lowest}
        recent.update((c, t) for c, t in fleet.items() if c > lowest)
        return recent

    def _explore(self, w: RankWindow, mine: float, recent: dict[float, float], lowest: float) -> float | None:
        """A lower clock learnt from the rank's and the fleet's windows (``recent``, see :meth:`_recent`), where
        ``time ~ 1 / clock`` is too pessimistic (most kernels slow down far less than their clock): the lowest
        clock whose ready time met ``mine``; and, while the rank meets ``mine`` at its current clock, one supported
        clock between ``min_gain`` and twice that lower and above ``lowest``, unless it was measured too slow or the
        local slope says it would be. ``None``: nothing lower to go to."""
        good = [c for c, t in recent.items() if t <= mine and (w.ready_s <= mine or c > w.clock_mhz)]
        if w.ready_s <= mine and w.clock_mhz in good:
            lower = [c for c in self.clocks_mhz if max(lowest, w.clock_mhz * (1.0 - 2.0 * self.min_gain)) < c
                     <= w.clock_mhz * (1.0 - self.min_gain) + 1e-9]
            if lower and recent.get(lower[-1], 0.0) <= mine and self._local_guess(recent, w, lower[-1]) <= mine:
                good.append(lower[-1])
        best = min(good, default=None)
        if best is None or best > w.clock_mhz + 1e-9 or (best >= w.clock_mhz - 1e-9 and not w.locked):
            return None
        return best

    @staticmethod
    def _local_guess(recent: dict[float, float], w: RankWindow, clock: float) -> float:
        """The rank's ready time at ``clock`` (below its current one), extrapolated from its current point with the
        local slope of log time against log clock between that point and the nearest clock above it that it ran
        at recently (``1 / clock`` when there is none, or the slope is steeper): curves bend more steeply
        further down, so this is on the optimistic side only by the bend over one step."""
        above = [c for c in recent if c > w.clock_mhz * (1.0 + 1e-9)]
        beta = 1.0
        if above:
            nearest = min(above)
            beta = min(max(math.log(max(w.ready_s, 1e-12) / recent[nearest]) / math.log(nearest / w.clock_mhz),
                           0.0), 1.0)
            beta = max(beta, MIN_SLOPE)
        return w.ready_s * (w.clock_mhz / clock) ** beta

    def state_dict(self) -> dict[str, Any]:
        """What the policy has learnt (free clocks, floors, energy floors, the window count): a checkpoint keeps it
        so a resumed run decides as the uninterrupted one would."""
        return {"free_clock": dict(self.free_clock), "floor": {r: list(v) for r, v in self.floor.items()},
                "energy_floor": dict(self.energy_floor), "seen": {r: list(v) for r, v in self._seen.items()},
                "windows": self._windows,
                "measured": {r: [[c, *row] for c, rows in m.items() for row in rows]
                             for r, m in self.measured.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Put back what :meth:`state_dict` returned."""
        self.free_clock = {int(r): float(c) for r, c in state["free_clock"].items()}
        self.floor = {int(r): (float(v[0]), int(v[1])) for r, v in state["floor"].items()}
        self.energy_floor = {int(r): float(c) for r, c in state["energy_floor"].items()}
        self._seen = {int(r): (float(v[0]), float(v[1])) for r, v in state["seen"].items()}
        self._windows = int(state["windows"])
        self.measured = {}
        for r, rows in state.get("measured", {}).items():
            mine = self.measured.setdefault(int(r), {})
            for c, mean, steps, seen, spread, even, odd in rows:
                mine.setdefault(float(c), []).append(Pooled(float(mean), int(steps), int(seen), float(spread),
                                                            float(even), float(odd)))

    def _pool(self, rank: int, w: RankWindow) -> None:
        """Add the window to the rank's pool at its clock. A pool keeps its latest ``pool_windows`` windows; a
        window that differs from its pool by more than ``change_sigmas`` standard errors empties every pool of the
        rank (its own speed changed)."""
        mine = self.measured.setdefault(rank, {})
        rows = mine.get(w.clock_mhz, [])
        if rows:
            mean, se = _pooled_mean(rows), _pooled_se(rows)
            new_se = w.spread * w.ready_s / math.sqrt(max(w.steps, 1))
            if abs(w.ready_s - mean) > self.change_sigmas * math.hypot(se, new_se) + 1e-12 * mean:
                mine.clear()
        rows = mine.setdefault(w.clock_mhz, [])
        rows.append(Pooled(w.ready_s, max(w.steps, 1), self._windows, w.spread, *w.split()))
        del rows[:-self.pool_windows]

    def _estimate(self, rank: int, w: RankWindow, fleet: dict[float, float]) -> RankWindow:
        """The window as the decision sees it (after :meth:`_pool`): the ready time the fleet's curve and the
        rank's level give at its clock (all of the rank's windows at every clock count), else its pool's mean at
        that clock; the spread over all its pools."""
        mine = self.measured[rank]
        rows = [row for pool in mine.values() for row in pool]
        spread = math.sqrt(sum(row.steps * row.spread ** 2 for row in rows) / sum(row.steps for row in rows))
        ready = fleet.get(w.clock_mhz, _pooled_mean(mine[w.clock_mhz]))
        return RankWindow(ready, w.clock_mhz, w.locked, spread, w.energy_j, w.steps)

    def free_ready_s(self, window: Sequence[RankWindow]) -> list[float]:
        """Each rank's ready time over ``window`` as it would be at its free clock (measured where it ran free, else
        through the fleet's curve of the last decision, else ``time ~ 1 / clock``): what a rank's speed is apart
        from the lock this policy gave it (the batch rebalancer, :mod:`dtpo.tune.rebalance`, reads speeds so)."""
        return [self._free_ready(rank, w, self._curve.predict(rank, w.clock_mhz, self.fleet_ranks))
                for rank, w in enumerate(window)]

    def _free_ready(self, rank: int, w: RankWindow, fleet: dict[float, float]) -> float:
        """The rank's ready time at the clock it runs at when free: measured if it runs free, else from the fleet's
        curve (``fleet``) where that links its clock to its free one, else ``time ~ 1 / clock`` (the fastest it can
        be)."""
        if not w.locked:
            return w.ready_s
        free = self.free_clock.get(rank, w.clock_mhz)
        if free in fleet and w.clock_mhz in fleet:
            return w.ready_s * fleet[free] / fleet[w.clock_mhz]
        return w.ready_s * w.clock_mhz / free

    def _one_step_below(self, clock: float, current: float) -> bool:
        """Whether ``clock`` is the supported clock right below ``current``."""
        lower = [c for c in self.clocks_mhz if c < current - 1e-9]
        return bool(lower) and abs(lower[-1] - clock) < 1e-9

    def _learn_energy(self, window: Sequence[RankWindow]) -> None:
        """Set an energy floor for a rank whose energy per step rose when its clock dropped."""
        for rank, w in enumerate(window):
            if w.energy_j is None or w.energy_j <= 0:
                continue
            before = self._seen.get(rank)
            # a rise within the noise of two windows' means could be noise: do not stop on it
            tolerance = max(self.energy_tolerance, 2.0 * math.sqrt(2.0 / max(w.steps, 1)) * w.spread)
            if before is not None and w.clock_mhz < before[0] - 1e-9 and w.energy_j > before[1] * (1.0 + tolerance):
                self.energy_floor[rank] = max(self.energy_floor.get(rank, 0.0), before[0])
            if before is None or abs(w.clock_mhz - before[0]) > 1e-9:
                self._seen[rank] = (w.clock_mhz, w.energy_j)


@dataclass(frozen=True)
class FleetCurve:
    """Log ready time against clock shared by the ranks of a job, and each rank's own level (see
    :func:`fleet_curve`).

    Attributes:
        offset: Per clock, the fitted log ready time relative to the ranks' own levels (only differences between
            clocks of one ``group`` mean anything).
        level: Per rank, its fitted log ready time apart from the clock.
        ranks: Per clock, how many ranks that ran at two or more clocks ran there.
        group: Per clock, the connected set it belongs to (clocks are linked by a rank that ran at both).
    """

    offset: dict[float, float]
    level: dict[int, float]
    ranks: dict[float, int]
    group: dict[float, int]

    def predict(self, rank: int, clock: float, min_ranks: int) -> dict[float, float]:
        """The rank's ready time, from its level and the curve, at its ``clock`` and at every clock linked to it
        that at least ``min_ranks`` ranks ran at; empty when the rank's clock is linked to no other."""
        if clock not in self.group or rank not in self.level:
            return {}
        out = {c: math.exp(self.level[rank] + h) for c, h in self.offset.items()
               if c != clock and self.ranks[c] >= min_ranks and self.group[c] == self.group[clock]}
        if out:
            out[clock] = math.exp(self.level[rank] + self.offset[clock])
        return out


def fleet_curve(measured: dict[int, dict[float, list[Pooled]]],
                iterations: int = 30) -> FleetCurve:
    """Fit ``log ready = level(rank) + offset(clock)`` over every rank's pooled points (steps-weighted least squares,
    by alternating means): each rank keeps its own speed, the shape against clock is common. A rank that ran at
    one clock only gets its level and says nothing about the shape. The offsets are fitted on the windows'
    odd-numbered steps and the levels returned on the even-numbered ones (:attr:`RankWindow.holdout_s`)."""
    points, deciding = _log_points(measured, "odd"), _log_points(measured, "even")
    parent: dict[float, float] = {}

    def root(c: float) -> float:
        while parent.setdefault(c, c) != c:
            c = parent[c]
        return c

    ranks: dict[float, int] = {}
    for pts in points.values():
        if len(pts) >= 2:
            clocks = list(pts)
            for c in clocks:
                ranks[c] = ranks.get(c, 0) + 1
                parent[root(c)] = root(clocks[0])
    offset = dict.fromkeys(ranks, 0.0)
    shaped = {r: pts for r, pts in points.items() if len(pts) >= 2}
    for _ in range(iterations if shaped else 0):
        level = {r: _weighted(pts, offset) for r, pts in shaped.items()}
        sums: dict[float, list[float]] = {}
        for r, pts in shaped.items():
            for c, (y, w) in pts.items():
                acc = sums.setdefault(c, [0.0, 0.0])
                acc[0] += w * (y - level[r])
                acc[1] += w
        offset = {c: total / weight for c, (total, weight) in sums.items()}
    level = {r: _weighted(pts, offset) for r, pts in deciding.items() if all(c in offset for c in pts)}
    index = {g: i for i, g in enumerate(sorted({root(c) for c in ranks}))}
    return FleetCurve(offset, level, ranks, {c: index[root(c)] for c in ranks})


def _log_points(measured: dict[int, dict[float, list[Pooled]]], part: str) -> dict[int, dict[float, tuple[float, int]]]:
    """Per rank and clock, the log of the pooled mean ready time over ``part`` of the steps (see
    :func:`_pooled_mean`) and the pool's steps."""
    return {r: {c: (math.log(max(_pooled_mean(rows, part), 1e-300)), sum(row.steps for row in rows))
                for c, rows in pools.items()} for r, pools in measured.items() if pools}


def _weighted(points: dict[float, tuple[float, int]], offset: dict[float, float]) -> float:
    """A rank's level: the steps-weighted mean of its log ready times less the curve's offsets."""
    return sum(w * (y - offset[c]) for c, (y, w) in points.items()) / sum(w for _, w in points.values())


def _pooled_mean(rows: Sequence[Pooled], part: str = "mean") -> float:
    """The steps-weighted mean ready time of pooled windows: over all their steps (``part="mean"``), or over their
    even- or odd-numbered ones (``"even"``, ``"odd"``)."""
    return sum(getattr(row, part) * row.steps for row in rows) / sum(row.steps for row in rows)


def _pooled_se(rows: Sequence[Pooled]) -> float:
    """The standard error of :func:`_pooled_mean`, from each window's spread (relative step-to-step deviation)."""
    steps = sum(row.steps for row in rows)
    variance = sum(row.steps * (row.spread * row.mean) ** 2 for row in rows) / steps
    return math.sqrt(variance / steps)


def expected_max(means: np.ndarray, sds: np.ndarray, points: int = 128) -> float:
    """Expected maximum of independent normal variables (``means``, standard deviations ``sds``), by integrating
    ``1 - prod(Phi)`` over a grid that spans where the maximum can fall."""
    sds = np.maximum(sds, 1e-9 * np.maximum(np.abs(means), 1e-12))
    lo = float(np.max(means - 8.0 * sds))  # below this the largest-mean variable is (almost) never the maximum
    hi = float(np.max(means + 8.0 * sds))
    if hi <= lo:
        return float(np.max(means))
    t = np.linspace(lo, hi, points)
    cdf = np.prod(_normal_cdf((t[None, :] - means[:, None]) / sds[:, None]), axis=0)
    return lo + float(np.trapezoid(1.0 - cdf, t))


def _normal_cdf(z: np.ndarray) -> np.ndarray:
    """The standard normal CDF (Abramowitz and Stegun 7.1.26 for erf: absolute error below 1.5e-7)."""
    x = np.abs(z) / math.sqrt(2.0)
    k = 1.0 / (1.0 + 0.3275911 * x)
    poly = k * (0.254829592 + k * (-0.284496736 + k * (1.421413741 + k * (-1.453152027 + k * 1.061405429))))
    erf = 1.0 - poly * np.exp(-x * x)
    return 0.5 * (1.0 + np.sign(z) * erf)


def noisy_aim(ready_s: Sequence[float], spreads: Sequence[float], critical: int, pace: float, budget: float,
              iterations: int = 20) -> float:
    """The latest common ready time (at most ``pace``) the ranks other than ``critical`` can be moved to (each
    rank already later keeps its own) with the expected step time at most ``1 + budget`` times what it is with
    every rank at ``ready_s``; each rank's step time is normal with relative spread ``spreads``."""
    means = np.asarray(ready_s, dtype=float)
    rel = np.asarray(spreads, dtype=float)
    others = np.arange(len(means)) != critical

    def step_time(aim: float) -> float:
        moved = np.where(others, np.maximum(means, aim), means)
        return expected_max(moved, rel * moved)

    limit = step_time(0.0) * (1.0 + budget)
    if step_time(pace) <= limit:
        return pace
    low, high = 0.0, pace
    for _ in range(iterations):
        mid = 0.5 * (low + high)
        low, high = (mid, high) if step_time(mid) <= limit else (low, mid)
    return low
