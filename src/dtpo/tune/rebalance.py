"""Uneven per-rank batches for persistent stragglers: each rank's share of the global step batch follows its speed.

In data-parallel training every step lasts as long as its slowest rank. Slowing the others down (per-rank DVFS,
:mod:`dtpo.tune.straggler`) makes their waiting cheaper, but the job still runs at the straggler's pace. When a
rank is slow for long (an older GPU in a mixed cluster, a throttled node, a noisy neighbour on its CPU), the
throughput answer is to give it fewer samples: with shares proportional to speed every rank is ready at about the
same time, and the job runs near the sum of the ranks' speeds.

The global step batch stays what it was, so the update does too (the Session weights each rank's mean loss by its
share, :mod:`dtpo.session.loop.shares`). :class:`Rebalancer` decides the shares from one window at a time:

* a rank's **speed** is its seconds per sample of its own work (the time until its gradients are ready, divided by
  its share), at its free clock;
* it is **persistent** when its last ``persist_windows`` windows agree within the noise (their range within
  ``noise_sigmas`` standard errors of a difference, and at least ``band``); a rank whose speed still moves (a
  transient slowdown, a straggler that is coming or going) keeps the speed it was last given credit for, and its
  slowness in the meantime is the clocks' to handle;
* a rank within ``band`` (or the noise) of the typical rank (the lower median of the ranks' speeds) counts as
  exactly that: shares do not chase noise;
* the shares are the whole-sample split of the global batch that minimises the slowest rank's time under the
  speeds so credited (:func:`split_batch`), each between one sample and ``max_share`` times the even share (the
  memory headroom), and they change only when that split is faster than the one in force, under the same speeds,
  by at least ``min_gain`` and by more than the noise of the speeds could make up (hysteresis: nothing flaps);
* a rank ``drop_factor`` times slower than the median for ``drop_windows`` windows gets a one-line
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


@dataclass(frozen=True)
class RankSpeed:
    """One rank over one window.

    Attributes:
        sample_s: Seconds per sample of the rank's own work (until its gradients are ready, no waiting), at its
            free clock.
        spread: Relative step-to-step standard deviation of its ready time in the window.
        steps: Steps in the window.
    """

    sample_s: float
    spread: float = 0.0
    steps: int = 1

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
        slow_ranks: Ranks credited with a persistent speed below the median.
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


def pace(shares: Sequence[int], sample_s: Sequence[float]) -> float:
    """The step time the slowest rank sets: ``max(share * seconds per sample)``."""
    return max(s * t for s, t in zip(shares, sample_s, strict=True))


def split_batch(global_batch: int, sample_s: Sequence[float], low: Sequence[int],
                high: Sequence[int]) -> tuple[int, ...]:
    """The whole-sample shares of ``global_batch`` that minimise the slowest rank's time (``share * sample_s``),
    each rank's between ``low`` and ``high``: every sample beyond the floors goes, one at a time, to the rank that
    would finish it first (ties to the lower rank), which is optimal for this min-max.

    Raises:
        ValueError: The bounds cannot hold ``global_batch``, or a speed is not a positive finite number.
    """
    world = len(sample_s)
    if len(low) != world or len(high) != world:
        raise ValueError("one speed and one pair of bounds per rank")
    if any(not math.isfinite(t) or t <= 0 for t in sample_s):
        raise ValueError(f"seconds per sample must be positive and finite, got {list(sample_s)}")
    if sum(low) > global_batch or sum(high) < global_batch or any(lo > hi for lo, hi in zip(low, high, strict=True)):
        raise ValueError(f"{global_batch} samples do not fit between {list(low)} and {list(high)}")
    shares = list(low)
    heap = [((shares[r] + 1) * sample_s[r], r) for r in range(world) if shares[r] < high[r]]
    heapq.heapify(heap)
    for _ in range(global_batch - sum(low)):
        _, r = heapq.heappop(heap)
        shares[r] += 1
        if shares[r] < high[r]:
            heapq.heappush(heap, ((shares[r] + 1) * sample_s[r], r))
    return tuple(shares)


@dataclass
class Rebalancer:
    """Decides every rank's share of the global step batch from one window at a time; see the module docs.

    Args:
        global_batch: Samples per optimizer step over all ranks.
        world: Number of ranks.
        max_share: A rank takes at most this many times the even share (memory headroom).
        persist_windows: Windows whose speeds must agree before a rank's speed is credited.
        band: Relative difference from the median below which a rank counts as the median, and the least range
            of its windows that counts as moving.
        noise_sigmas: How many standard errors (of a window's mean, from its spread) a difference must exceed to be
            more than noise.
        min_gain: The least share of step time a change must save.
        drop_factor: A rank this many times slower than the median ...
        drop_windows: ... for this many windows in a row gets a recommendation to restart without it.
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
    credited: list[float | None] = field(default_factory=list)  # per rank: its credited seconds/sample, or median
    history: list[list[RankSpeed]] = field(default_factory=list)  # the latest persist_windows windows
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
        if not self.credited:
            self.credited = [None] * self.world
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

    def decide(self, window: Sequence[RankSpeed]) -> RebalanceDecision:
        """The shares from the next step on, given every rank's speed over the window just ended."""
        if len(window) != self.world:
            raise ValueError(f"a window of {len(window)} ranks for a job of {self.world}")
        self.windows += 1
        self.history = [*self.history, list(window)][-self.persist_windows:]
        means = [statistics.fmean(w[r].sample_s for w in self.history) for r in range(self.world)]
        # the typical rank: the lower median (with two ranks, the faster one, not the point between them)
        median = statistics.median_low(means)
        recommendation = self._watch_drop(means, median)
        if len(self.history) < self.persist_windows:
            return RebalanceDecision(self.shares, False, self._slow_ranks(median), recommendation=recommendation)
        for r in range(self.world):
            if not self._settled(r, means[r]):
                continue  # still moving: keep the credit it has (the clocks handle the meantime)
            near = max(self.band, self.noise_sigmas * self._standard_error(r) / math.sqrt(len(self.history)))
            self.credited[r] = None if abs(means[r] / median - 1.0) <= near else means[r]
        speeds = [median if c is None else c for c in self.credited]
        low, high = self.bounds
        proposed = split_batch(self.global_batch, speeds, low, high)
        gain = 1.0 - pace(proposed, speeds) / pace(self.shares, speeds)
        # a gain the noise of the means could make up is no reason to move (nor to move back)
        noise = self.noise_sigmas * max(self._standard_error(r) for r in range(self.world)) / math.sqrt(
            len(self.history))
        if proposed == self.shares or gain < max(self.min_gain, noise):
            return RebalanceDecision(self.shares, False, self._slow_ranks(median), recommendation=recommendation)
        self.shares = proposed
        self.changes += 1
        return RebalanceDecision(proposed, True, self._slow_ranks(median), gain, recommendation)

    def _settled(self, rank: int, mean: float) -> bool:
        """Whether ``rank``'s latest windows agree within the noise."""
        values = [w[rank].sample_s for w in self.history]
        moved = (max(values) - min(values)) / mean
        return moved <= max(self.band, self.noise_sigmas * math.sqrt(2.0) * self._standard_error(rank))

    def _standard_error(self, rank: int) -> float:
        return max(w[rank].standard_error for w in self.history)

    def _slow_ranks(self, median: float) -> tuple[int, ...]:
        """Ranks credited with a speed slower than the median."""
        return tuple(r for r, c in enumerate(self.credited) if c is not None and c > median)

    def _watch_drop(self, means: Sequence[float], median: float) -> str | None:
        """Count the windows each rank has been ``drop_factor`` times slower than the median; the first time one
        reaches ``drop_windows``, the recommendation."""
        out = None
        for r, mean in enumerate(means):
            self._slow_for[r] = self._slow_for[r] + 1 if mean >= self.drop_factor * median else 0
            if self._slow_for[r] >= self.drop_windows and r not in self._recommended and out is None:
                self._recommended.add(r)
                out = (f"rank {r} has computed {mean / median:.1f}x slower than the median rank for "
                       f"{self._slow_for[r]} windows: even with its share cut to {self.shares[r]} of "
                       f"{self.global_batch} samples it holds the job back; restart the job without its node")
        return out

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps: the shares in force and what the decision remembers."""
        return {"shares": list(self.shares), "credited": list(self.credited), "windows": self.windows,
                "changes": self.changes, "slow_for": list(self._slow_for), "recommended": sorted(self._recommended),
                "history": [[[w.sample_s, w.spread, w.steps] for w in window] for window in self.history]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`."""
        self.shares = tuple(int(s) for s in state["shares"])
        self.credited = [None if c is None else float(c) for c in state["credited"]]
        self.windows = int(state["windows"])
        self.changes = int(state["changes"])
        self._slow_for = [int(n) for n in state["slow_for"]]
        self._recommended = {int(r) for r in state["recommended"]}
        self.history = [[RankSpeed(float(t), float(s), int(n)) for t, s, n in window] for window in state["history"]]
