"""Per-rank slowdown for stragglers: ranks that only wait for the slowest one run at a lower SM clock.

In data-parallel training every step ends in a collective, so a step lasts as long as its slowest rank. The
others finish early and wait at full clock. :class:`StragglerSlowdown` looks at one window at a time (every
rank's mean time per step to become ready, and the clock it actually ran at) and moves every rank that is
not the critical one toward the lowest supported clock at which it still becomes ready a ``margin`` before
the critical rank; the critical rank runs free (full speed). When the straggler moves or goes away, the rank
that has become critical is unlocked in the next decision, i.e. within one window, and a rank whose slack
has shrunk below half the margin is sped up.

The step is taken from the rank's own current point with ``time ~ 1 / clock``: the compute-bound part of a
step scales with the clock and the rest (memory-bound kernels, data loading) does not, so a GPU whose clock
is all that changes slows down no more than this predicts; the clock chosen is then higher than needed
rather than too low, and the next windows close the gap from above, with no model of the workload. Measured
curves can bend more steeply than that (voltage, thermals, a calibrated trace that maps clocks through power
limits), so one decision lowers a clock by at most ``max_step``, a clock that once made a rank the pace setter
is not used again for a while, and a one-step move down is not worth a relock.

Noise: every step lasts as long as its slowest rank, so with step-to-step noise a waiting rank brought close to
the pace lengthens the steps in which the noise makes it the slowest, and the more ranks, the more often. The
waiting ranks therefore aim at the latest common ready time at which the expected step time, the expected
maximum over all ranks (each normal, with its window's mean and spread, :func:`expected_max`), rises by at most
``time_budget`` (:func:`noisy_aim`), and never later than ``margin`` before the pace.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

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
    """

    ready_s: float
    clock_mhz: float
    locked: bool = False
    spread: float = 0.0
    energy_j: float | None = None
    steps: int = 1


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
        explore_windows: How long a rank's ready time measured at a clock counts. A rank that met its aim at its
            clock tries one supported clock ``min_gain`` to twice that lower when its own recent points (the
            local slope of log time against log clock, at least ``MIN_SLOPE``) say it will still meet the aim,
            and keeps the lowest clock it measured meeting it: ``time ~ 1 / clock`` alone never goes where
            kernels slow down far less than the clock.
        measured: Per rank, the ready time measured at each clock and the window it was measured in.
    """

    clocks_mhz: Sequence[float]
    margin: float = 0.03
    min_gain: float = 0.02
    time_budget: float = 0.003
    max_step: float = 0.10
    floor_windows: int = 50
    free_clock: dict[int, float] = field(default_factory=dict)
    floor: dict[int, tuple[float, int]] = field(default_factory=dict)
    energy_tolerance: float = 0.01
    energy_floor: dict[int, float] = field(default_factory=dict)
    _seen: dict[int, tuple[float, float]] = field(default_factory=dict)
    _windows: int = 0
    explore_windows: int = 10
    measured: dict[int, dict[float, tuple[float, int]]] = field(default_factory=dict)

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
            self.measured.setdefault(rank, {})[w.clock_mhz] = (w.ready_s, self._windows)
        critical = max(range(len(window)), key=lambda r: window[r].ready_s)
        if window[critical].locked:  # slowed too far: never that low again for a while
            self.floor[critical] = (window[critical].clock_mhz, self._windows)
        # the pace once the critical rank runs free: if it was locked, the fastest it can then be (time ~ 1 /
        # clock again), but never faster than the slowest rank that runs free already (the real straggler)
        crit = window[critical]
        pace = crit.ready_s * (crit.clock_mhz / self.free_clock.get(critical, crit.clock_mhz) if crit.locked else 1.0)
        pace = max([pace, *(w.ready_s for w in window if not w.locked)])
        # a step lasts as long as its slowest rank: with noise, the latest common ready time the waiting ranks can
        # aim at without lengthening the expected step by more than the budget
        free_ready = [w.ready_s * (w.clock_mhz / self.free_clock.get(r, w.clock_mhz)) if w.locked else w.ready_s
                      for r, w in enumerate(window)]
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
            tried = self._explore(rank, w, mine, pace, max(floor + 1e-6 if self._windows - since < self.floor_windows
                                                          else 0.0, lowest))
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

    def _explore(self, rank: int, w: RankWindow, mine: float, pace: float, lowest: float) -> float | None:
        """A lower clock learnt from the rank's own windows, where ``time ~ 1 / clock`` is too pessimistic (most
        kernels slow down far less than their clock): the lowest clock measured within the last
        ``explore_windows`` windows whose ready time met ``mine``; and, while the rank meets ``mine`` at its
        current clock, one supported clock between ``min_gain`` and twice that lower, unless it was measured too
        slow or even at ``1 / clock`` it would pass the pace. ``None``: nothing lower to go to."""
        recent = {c: t for c, (t, seen) in self.measured.get(rank, {}).items()
                  if self._windows - seen < self.explore_windows and c > lowest}
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
                "measured": {r: [[c, t, seen] for c, (t, seen) in m.items()] for r, m in self.measured.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Put back what :meth:`state_dict` returned."""
        self.free_clock = {int(r): float(c) for r, c in state["free_clock"].items()}
        self.floor = {int(r): (float(v[0]), int(v[1])) for r, v in state["floor"].items()}
        self.energy_floor = {int(r): float(c) for r, c in state["energy_floor"].items()}
        self._seen = {int(r): (float(v[0]), float(v[1])) for r, v in state["seen"].items()}
        self._windows = int(state["windows"])
        self.measured = {int(r): {float(c): (float(t), int(seen)) for c, t, seen in rows}
                         for r, rows in state.get("measured", {}).items()}

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


def expected_max(means: np.ndarray, sds: np.ndarray, points: int = 512) -> float:
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
              iterations: int = 30) -> float:
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
