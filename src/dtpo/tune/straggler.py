"""Per-rank slowdown for stragglers: ranks that only wait for the slowest one run at a lower SM clock.

In data-parallel training every step ends in a collective, so a step lasts as long as its slowest rank. The
others finish early and wait at full clock. :class:`StragglerSlowdown` looks at one window at a time (every
rank's mean time per step to become ready, and the clock it actually ran at) and moves every rank that is
not the critical one toward the lowest supported clock at which it still becomes ready a ``margin`` before
the critical rank; the critical rank runs free (full speed). When the straggler moves or goes away, the rank
that has become critical is unlocked in the next decision, i.e. within one window, and a rank whose slack
has shrunk below half the margin is sped up.

The step is taken from the rank's own current point with ``time ~ 1 / clock``: the compute-bound part of a
step scales with the clock and the rest (memory-bound kernels, data loading) does not, so no real GPU slows
down *more* than this predicts. The clock chosen is therefore never too low, only sometimes higher than
needed, and the next windows close the rest of the gap from above: a feedback loop that needs no model of
the workload and cannot overshoot into making a rank the new straggler (noise aside, which the margin
covers).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class RankWindow:
    """One rank over one window.

    Attributes:
        ready_s: Mean seconds per step until the rank's gradients were ready (its own work, no waiting).
        clock_mhz: The SM clock it actually ran at (under a power limit that binds, below any lock).
        locked: Whether its clock was locked (``False``: it ran at the clock the GPU settles at by itself).
        spread: Relative standard deviation of its per-step ready times in the window (step-to-step noise).
    """

    ready_s: float
    clock_mhz: float
    locked: bool = False
    spread: float = 0.0


@dataclass
class StragglerSlowdown:
    """Chooses a clock lock per rank from the last window; see the module docs.

    Args:
        clocks_mhz: Supported SM clocks (any order).
        margin: A slowed rank aims to be ready this share of the critical rank's time early.
        min_gain: Leave a rank alone unless the clock it would drop by is at least this share.
        noise_margins: The margin is at least this many standard deviations of the step-to-step difference
            between a rank and the critical one.
    """

    clocks_mhz: Sequence[float]
    margin: float = 0.03
    min_gain: float = 0.02
    noise_margins: float = 2.0
    free_clock: dict[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.clocks_mhz = sorted(float(c) for c in self.clocks_mhz)
        if not self.clocks_mhz:
            raise ValueError("no SM clocks to choose from")

    def decide(self, window: Sequence[RankWindow]) -> list[float | None]:
        """The clock lock for each rank in the next window; ``None`` to let it run free."""
        for rank, w in enumerate(window):
            if not w.locked:
                self.free_clock[rank] = w.clock_mhz
        critical = max(range(len(window)), key=lambda r: window[r].ready_s)
        # the pace once the critical rank runs free: if it was locked, the fastest it can then be (time ~ 1 /
        # clock again), so that nobody is slowed for a pace that will not come
        crit = window[critical]
        pace = crit.ready_s * (crit.clock_mhz / self.free_clock.get(critical, crit.clock_mhz) if crit.locked else 1.0)
        out: list[float | None] = []
        for rank, w in enumerate(window):
            free = self.free_clock.get(rank, self.clocks_mhz[-1])
            if rank == critical:
                out.append(None)  # the pace setter runs free
                continue
            # keep clear of the pace by the margin, or by the step-to-step noise of the two ranks if larger:
            # a step lasts as long as its slowest rank, so a rank that is slower than the pace in some steps
            # because of noise slows the job down
            noise = self.noise_margins * math.hypot(w.spread, crit.spread)
            mine = pace * (1.0 - max(self.margin, noise))
            # time ~ 1 / clock from where the rank is now: the lowest clock that cannot be too slow
            wanted = w.clock_mhz * w.ready_s / mine
            up = [c for c in self.clocks_mhz if c >= wanted - 1e-9]
            clock = up[0] if up else None
            if clock is None or clock >= free:
                out.append(None)
            elif not w.locked and clock > free * (1.0 - self.min_gain):
                out.append(None)  # too little to gain from a lock
            else:
                out.append(clock)
        return out
