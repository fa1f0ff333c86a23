"""Uneven per-rank batches for persistent stragglers: each rank's share of the global step batch follows its speed.

In data-parallel training every step lasts as long as its slowest rank. Slowing the others down (per-rank DVFS,
:mod:`dtpo.tune.straggler`) makes their waiting cheaper, but the job still runs at the straggler's pace. When a
rank is slow for long (an older GPU in a mixed cluster, a throttled node, a noisy neighbour on its CPU), the
throughput answer is to give it fewer samples: with shares that make every rank ready at about the same time, the
job runs near the sum of the ranks' speeds.

The global step batch stays what it was, so the update does too (the Session weights each rank's mean loss by its
share, :mod:`dtpo.session.loop.shares`). :class:`Rebalancer` decides the shares from one window at a time:

* a rank's **time** per step (until its gradients are ready, no waiting, at its free clock) is taken as a fixed
  part plus a part per sample: ``ready = fixed + per_sample x share``. Data loading of the whole global batch,
  Python overhead and kernel launches do not shrink with a rank's share, so a model of time per sample alone would
  keep cutting a slow rank's share while its time hardly moves. Each rank's line is fitted on its settled means at
  the shares it has run (:func:`fit_line`); with one share (or shares too close to tell the parts apart) its time
  is taken as all per sample, which moves a share no further than the equal-ready split and is corrected at the
  next decision;
* the windows since the last change must **persist**: the last ``persist_windows`` of them agree for every rank
  within the noise (their range within ``noise_sigmas`` standard errors of a difference, and at least ``band``). A
  rank whose time still moves (a transient slowdown, a straggler coming or going) keeps the line it has, and
  before it has one counts as the typical rank (the median time per sample of all ranks); its slowness in the
  meantime is the clocks' to handle. A rank whose settled mean
  leaves what its line (or, with one point, what any line through it) allows has changed speed: its line starts
  again from the new point;
* the shares are the whole-sample split of the global batch that minimises the slowest rank's time under those
  lines (:func:`split_batch`), each between one sample and ``max_share`` times the even share (the memory
  headroom), and they change only when that split is faster than the one in force by at least ``min_gain`` and by
  more than the noise of the means could make up (hysteresis: nothing flaps);
* a rank ``drop_factor`` times slower per sample than the median for ``drop_windows`` windows gets a one-line
  recommendation to restart without it.

Every rank runs the same decision on the same gathered figures, so every rank arrives at the same shares without
a further collective.
"""

from __future__ import annotations

import heapq
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

MIN_FIT_SPREAD = 0.1
"""The least relative difference between a rank's smallest and largest share for a line through its points to
tell its fixed time from its time per sample (closer shares: noise would decide the slope)."""


@dataclass(frozen=True)
class RankSpeed:
    """One rank over one window.

    Attributes:
        ready_s: Mean seconds per step of the rank's own work (until its gradients are ready, no waiting), at its
            free clock.
        share: Samples it trained per step in the window.
        spread: Relative step-to-step standard deviation of its ready time in the window.
        steps: Steps in the window.
    """

    ready_s: float
    share: int
    spread: float = 0.0
    steps: int = 1

    @property
    def sample_s(self) -> float:
        """Seconds per sample, the fixed time included."""
        return self.ready_s / self.share

    @property
    def standard_error(self) -> float:
        """Relative standard error of the window's mean."""
        return self.spread / math.sqrt(max(self.steps, 1))


@dataclass(frozen=True)
class RebalanceDecision:
    """What one window's decision says.

    Attributes:
        shares: Samples per rank from the next step on (they sum to the global batch).
        changed: Whether they differ from the shares in force.
        slow_ranks: Ranks whose time per sample is above the median's by more than the band.
        gain: The share of step time the change is predicted to save (0 when unchanged).
        recommendation: A one-line recommendation to restart without a rank, the first time it is due.
    """

    shares: tuple[int, ...]
    changed: bool
    slow_ranks: tuple[int, ...] = ()
    gain: float = 0.0
    recommendation: str | None = None


def even_shares(global_batch: int, world: int) -> tuple[int, ...]:
    """The even split of ``global_batch`` over ``world`` ranks (the first ``global_batch % world`` get one more)."""
    base, extra = divmod(global_batch, world)
    return tuple(base + (1 if r < extra else 0) for r in range(world))


def pace(shares: Sequence[int], per_sample_s: Sequence[float], fixed_s: Sequence[float] | None = None) -> float:
    """The step time the slowest rank sets: ``max(fixed + share * seconds per sample)``."""
    fixed = fixed_s or [0.0] * len(shares)
    return max(f + s * t for s, t, f in zip(shares, per_sample_s, fixed, strict=True))


def split_batch(global_batch: int, per_sample_s: Sequence[float], low: Sequence[int], high: Sequence[int],
                fixed_s: Sequence[float] | None = None) -> tuple[int, ...]:
    """The whole-sample shares of ``global_batch`` that minimise the slowest rank's time (``fixed + share *
    per_sample``), each rank's between ``low`` and ``high``: every sample beyond the floors goes, one at a time, to
    the rank that would finish it first (ties to the lower rank), which is optimal for this min-max of increasing
    times.

    Raises:
        ValueError: The bounds cannot hold ``global_batch``, or a time is not finite (per sample: positive).
    """
    world = len(per_sample_s)
    fixed = list(fixed_s) if fixed_s is not None else [0.0] * world
    if len(low) != world or len(high) != world or len(fixed) != world:
        raise ValueError("one time per sample, one fixed time and one pair of bounds per rank")
    if any(not math.isfinite(t) or t <= 0 for t in per_sample_s) or any(not math.isfinite(f) or f < 0 for f in fixed):
        raise ValueError(f"seconds per sample must be positive and finite, got {list(per_sample_s)} (fixed {fixed})")
    if sum(low) > global_batch or sum(high) < global_batch or any(lo > hi for lo, hi in zip(low, high, strict=True)):
        raise ValueError(f"{global_batch} samples do not fit between {list(low)} and {list(high)}")
    shares = list(low)
    heap = [(fixed[r] + (shares[r] + 1) * per_sample_s[r], r) for r in range(world) if shares[r] < high[r]]
    heapq.heapify(heap)
    for _ in range(global_batch - sum(low)):
        _, r = heapq.heappop(heap)
        shares[r] += 1
        if shares[r] < high[r]:
            heapq.heappush(heap, (fixed[r] + (shares[r] + 1) * per_sample_s[r], r))
    return tuple(shares)


def fit_line(points: dict[int, tuple[float, float]], sigmas: float = 3.0) -> tuple[float, float]:
    """``(fixed seconds, seconds per sample)`` of a rank's ready time against its share, from its settled means at
    each share (``share: (mean, standard error)``, the newest last).

    A least-squares line where the shares differ by at least :data:`MIN_FIT_SPREAD` and its slope stands ``sigmas``
    standard errors clear of zero, with the fixed part kept between 0 and the smallest mean and the slope at least
    a twentieth of the time per sample; else all of the newest point's time per sample (no fixed part), which
    moves a share toward equal ready times but never past them when the ranks' fixed times are alike.
    """
    shares = list(points)
    newest = shares[-1] if shares else 1
    proportional = (0.0, points[newest][0] / newest) if shares else (0.0, 1.0)
    if len(shares) < 2 or max(shares) < min(shares) * (1.0 + MIN_FIT_SPREAD):
        return proportional
    n = len(shares)
    mean_s = sum(shares) / n
    mean_y = sum(points[s][0] for s in shares) / n
    spread = sum((s - mean_s) ** 2 for s in shares)
    slope = sum((s - mean_s) * (points[s][0] - mean_y) for s in shares) / spread
    slope_se = math.sqrt(sum((points[s][1] * (s - mean_s)) ** 2 for s in shares)) / spread
    if slope <= sigmas * slope_se:
        return proportional  # the data cannot tell the fixed part from the part per sample
    least = min(points[s][0] / s for s in shares) / 20.0
    slope = max(slope, least)
    fixed = min(max(mean_y - slope * mean_s, 0.0), min(y for y, _ in points.values()))
    return fixed, max((mean_y - fixed) / mean_s, least)


@dataclass
class Rebalancer:
    """Decides every rank's share of the global step batch from one window at a time; see the module docs.

    Args:
        global_batch: Samples per optimizer step over all ranks.
        world: Number of ranks.
        max_share: A rank takes at most this many times the even share (memory headroom).
        persist_windows: Windows at the shares in force whose times must agree before the shares change.
        band: The least relative range of a rank's windows that counts as moving, and of a mean off its line
            that counts as a change of speed.
        noise_sigmas: How many standard errors (of a window's mean, from its spread) a difference must exceed to be
            more than noise.
        min_gain: The least share of step time a change must save.
        drop_factor: A rank this many times slower per sample than the median ...
        drop_windows: ... for this many windows in a row gets a recommendation to restart without it.
        shares: The shares in force (default: the even split).
    """

    global_batch: int
    world: int
    max_share: float = 1.5
    persist_windows: int = 3
    band: float = 0.03
    noise_sigmas: float = 3.0
    min_gain: float = 0.02
    drop_factor: float = 3.0
    drop_windows: int = 10
    shares: tuple[int, ...] = ()
    points: list[dict[int, tuple[float, float]]] = field(default_factory=list)  # per rank, by share: settled
    # mean ready time and its standard error (seconds), the newest last
    history: list[list[RankSpeed]] = field(default_factory=list)  # the windows at the shares in force (latest few)
    windows: int = 0
    changes: int = 0
    _slow_for: list[int] = field(default_factory=list)
    _recommended: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        if self.world < 1 or self.global_batch < self.world:
            raise ValueError(f"a global batch of {self.global_batch} cannot give each of {self.world} ranks a sample")
        if not self.max_share >= 1.0:
            raise ValueError(f"max_share must be >= 1, got {self.max_share}")
        if not self.shares:
            self.shares = even_shares(self.global_batch, self.world)
        if not self.points:
            self.points = [{} for _ in range(self.world)]
        if not self._slow_for:
            self._slow_for = [0] * self.world

    @property
    def bounds(self) -> tuple[list[int], list[int]]:
        """Each rank's least and most samples: one, and ``max_share`` times the even share (never below it)."""
        even = even_shares(self.global_batch, self.world)
        return [1] * self.world, [max(e, math.floor(self.max_share * self.global_batch / self.world)) for e in even]

    def loss_weights(self) -> tuple[float, ...]:
        """Each rank's factor on its mean loss so that DDP's average over ranks is the global batch's mean."""
        return tuple(self.world * s / self.global_batch for s in self.shares)

    def lines(self) -> list[tuple[float, float] | None]:
        """Each rank's ``(fixed seconds, seconds per sample)`` from its settled points (``None``: none yet)."""
        return [fit_line(points, self.noise_sigmas) if points else None for points in self.points]

    def decide(self, window: Sequence[RankSpeed]) -> RebalanceDecision:
        """The shares from the next step on, given every rank's time over the window just ended (at the shares in
        force)."""
        if len(window) != self.world:
            raise ValueError(f"a window of {len(window)} ranks for a job of {self.world}")
        self.windows += 1
        if tuple(w.share for w in window) != self.shares:  # not at the shares in force (a resumed job's first)
            self.history = []
            return self._hold(None)
        self.history = [*self.history, list(window)][-self.persist_windows:]
        recommendation = self._watch_drop()
        if len(self.history) < self.persist_windows:
            return self._hold(recommendation)
        means = [statistics.fmean(w[r].ready_s for w in self.history) for r in range(self.world)]
        errors = [self._standard_error(r) / math.sqrt(len(self.history)) for r in range(self.world)]
        for r in range(self.world):
            if self._settled(r, means[r]):
                self._add_point(r, means[r], errors[r])
        if all(not points for points in self.points):
            return self._hold(recommendation)  # no rank settled yet: nothing to go on
        # a rank that has not settled yet counts as the typical rank: the median time per sample of all ranks now
        typical = (0.0, statistics.median(means[r] / self.shares[r] for r in range(self.world)))
        lines = [line or typical for line in self.lines()]
        fixed = [line[0] for line in lines]
        per_sample = [line[1] for line in lines]
        low, high = self.bounds
        proposed = split_batch(self.global_batch, per_sample, low, high, fixed)
        gain = 1.0 - pace(proposed, per_sample, fixed) / pace(self.shares, per_sample, fixed)
        # a gain the noise of the means could make up is no reason to move (nor to move back)
        noise = self.noise_sigmas * max(errors)
        if proposed == self.shares or gain < max(self.min_gain, noise):
            return self._hold(recommendation)
        self.shares = proposed
        self.changes += 1
        self.history = []  # the next decision waits for windows at the new shares
        return RebalanceDecision(proposed, True, self._slow_ranks(per_sample), gain, recommendation)

    def _hold(self, recommendation: str | None) -> RebalanceDecision:
        return RebalanceDecision(self.shares, False, self._slow_ranks(), recommendation=recommendation)

    def _settled(self, rank: int, mean: float) -> bool:
        """Whether ``rank``'s windows at the shares in force agree within the noise."""
        values = [w[rank].ready_s for w in self.history]
        moved = (max(values) - min(values)) / mean
        return moved <= max(self.band, self.noise_sigmas * math.sqrt(2.0) * self._standard_error(rank))

    def _standard_error(self, rank: int) -> float:
        return max(w[rank].standard_error for w in self.history)

    def _add_point(self, rank: int, mean: float, error: float) -> None:
        """Keep ``rank``'s settled mean (relative standard error ``error``) at its share in force; where it leaves
        what the rank's other points allow, the rank changed speed and its points start again from this one."""
        share = self.shares[rank]
        others = {s: point for s, point in self.points[rank].items() if s != share}
        tolerance = max(self.band, self.noise_sigmas * error)
        if len(others) == 1:  # one point: any line through it with fixed >= 0, slope >= 0 allows this band
            (s0, (y0, _)), = others.items()
            lowest, highest = sorted((y0 * share / s0, y0))
            if not lowest * (1.0 - tolerance) <= mean <= highest * (1.0 + tolerance):
                others = {}
        elif others:
            fixed, per_sample = fit_line(others, self.noise_sigmas)
            expected = fixed + per_sample * share
            if abs(mean / expected - 1.0) > tolerance:
                others = {}
        self.points[rank] = {**others, share: (mean, mean * error)}

    def _slow_ranks(self, per_sample: Sequence[float | None] | None = None) -> tuple[int, ...]:
        """Ranks whose time per sample is above the median's by more than twice the band: the fitted ones (default),
        or ``per_sample`` as a decision used them (an unsettled rank counted as the typical one)."""
        if per_sample is None:
            per_sample = [line[1] if line is not None else None for line in self.lines()]
        known = [t for t in per_sample if t is not None]
        if not known:
            return ()
        median = statistics.median(known)
        return tuple(r for r, t in enumerate(per_sample) if t is not None and t > median * (1.0 + 2 * self.band))

    def _watch_drop(self) -> str | None:
        """Count the windows each rank has been ``drop_factor`` times slower per sample than the median (its time
        over the window, less its fitted fixed time, per sample); the first time one reaches ``drop_windows``, the
        recommendation."""
        lines = self.lines()
        latest = self.history[-1]
        per_sample = [(w.ready_s - (line[0] if line is not None else 0.0)) / w.share for w, line in zip(latest, lines,
                                                                                                       strict=True)]
        median = statistics.median_low(per_sample)
        out = None
        for r, t in enumerate(per_sample):
            self._slow_for[r] = self._slow_for[r] + 1 if t >= self.drop_factor * median else 0
            if self._slow_for[r] >= self.drop_windows and r not in self._recommended and out is None:
                self._recommended.add(r)
                out = (f"rank {r} has computed {t / median:.1f}x slower per sample than the median rank for "
                       f"{self._slow_for[r]} windows: even with its share cut to {self.shares[r]} of "
                       f"{self.global_batch} samples it holds the job back; restart the job without its node")
        return out

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps: the shares in force and what the decision remembers."""
        return {"shares": list(self.shares),
                "points": [[[s, y, e] for s, (y, e) in p.items()] for p in self.points],
                "windows": self.windows, "changes": self.changes, "slow_for": list(self._slow_for),
                "recommended": sorted(self._recommended),
                "history": [[[w.ready_s, w.share, w.spread, w.steps] for w in window] for window in self.history]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`."""
        self.shares = tuple(int(s) for s in state["shares"])
        self.points = [{int(s): (float(y), float(e)) for s, y, e in p} for p in state["points"]]
        self.windows = int(state["windows"])
        self.changes = int(state["changes"])
        self._slow_for = [int(n) for n in state["slow_for"]]
        self._recommended = {int(r) for r in state["recommended"]}
        self.history = [[RankSpeed(float(t), int(s), float(sp), int(n)) for t, s, sp, n in window]
                        for window in state["history"]]
