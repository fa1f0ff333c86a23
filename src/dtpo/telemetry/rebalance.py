"""What ``--tune rebalance`` left in a record, read once for the summary, the report and the run store.

The rebalancer writes the same shares on every rank (``ranks[].slack``: ``shares``, ``initial_shares``,
``share_changes``, ``recommendations``; see :class:`~dtpo.core.record_sections.SlackSection`), so one rank's
section tells the whole run. :func:`shares_over_run` reads it into :class:`SharesOverRun`; a record without those
keys (rebalancing did not run) gives ``None``. A malformed change (no shares, or shares of another world size)
is skipped, never a reason to fail a summary.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dtpo.core.record import RunRecord

MAX_NAMED_RANKS = 3
"""Ranks a one-line summary names (the rest are counted: ``+N more``)."""


@dataclass(frozen=True)
class RankShare:
    """One rank's share of the global batch at the end of the run against its even share.

    Attributes:
        rank: The rank.
        share: Its samples per step at the end.
        even: Its samples per step at the start (the even split).
        since: The first step its final share was in force (``None`` when no change says so).
    """

    rank: int
    share: int
    even: int
    since: int | None

    @property
    def ratio(self) -> float:
        """The final share as a multiple of the even one."""
        return self.share / self.even if self.even else math.inf


@dataclass(frozen=True)
class SharesOverRun:
    """Every rank's samples per step over a rebalanced run.

    Attributes:
        initial: Every rank's share at the start (the even split).
        final: Every rank's share at the end.
        changes: The rebalancer's changes in order, each with ``step`` (the first step with the new shares),
            ``shares``, ``gain`` and ``slow_ranks``; only those whose shares fit the world size.
        recommendations: One-line recommendations to restart without a rank.
    """

    initial: tuple[int, ...]
    final: tuple[int, ...]
    changes: tuple[dict[str, Any], ...]
    recommendations: tuple[str, ...]

    @property
    def world(self) -> int:
        """Ranks sharing the batch."""
        return len(self.final)

    @property
    def global_batch(self) -> int:
        """Samples per step of all ranks together (the same at every step)."""
        return sum(self.final)

    def gains(self) -> list[float]:
        """Each change's predicted share of step time saved against the shares before it, under the speeds of its
        window (a prediction of the rebalancer, not a measurement; not additive: the speeds differ between
        changes)."""
        out = []
        for change in self.changes:
            gain = change.get("gain")
            if isinstance(gain, int | float) and not isinstance(gain, bool) and math.isfinite(gain):
                out.append(float(gain))
        return out

    def schedule(self) -> list[tuple[int, tuple[int, ...]]]:
        """``(first step, every rank's share)`` for the start and each change, in step order."""
        out = [(0, self.initial)]
        for change in self.changes:
            out.append((int(change["step"]), tuple(change["shares"])))
        return out

    def moved(self) -> list[RankShare]:
        """The ranks whose final share differs from their even one, the farthest from it first (fewer samples
        first on a tie: the slow ranks are the news)."""
        out = []
        for rank, (share, even) in enumerate(zip(self.final, self.initial, strict=True)):
            if share != even:
                out.append(RankShare(rank, share, even, self._since(rank)))
        return sorted(out, key=lambda m: (-abs(m.share - m.even), m.share - m.even, m.rank))

    def ever_moved(self) -> list[int]:
        """The ranks whose share differed from their even one at some step, in rank order."""
        return [r for r in range(self.world)
                if any(shares[r] != self.initial[r] for _, shares in self.schedule())]

    def _since(self, rank: int) -> int | None:
        """The first step of ``rank``'s final share: the last change that moved it."""
        since, previous = None, self.initial[rank]
        for step, shares in self.schedule()[1:]:
            if shares[rank] != previous:
                since, previous = step, shares[rank]
        return since


def _ints(value: Any) -> tuple[int, ...] | None:
    if not isinstance(value, Sequence) or isinstance(value, str) or not value:
        return None
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in value):
        return None
    return tuple(int(v) for v in value)


def even_split(global_batch: int, world: int) -> tuple[int, ...]:
    """The even split of ``global_batch`` over ``world`` ranks (the first ``global_batch % world`` get one more)."""
    base, extra = divmod(global_batch, world)
    return tuple(base + (1 if r < extra else 0) for r in range(world))


def shares_over_run(record: RunRecord) -> SharesOverRun | None:
    """The shares the rebalancer left in ``record`` (the lowest rank that has them), ``None`` where it did not
    run."""
    for rank in sorted(record.ranks, key=lambda r: r.rank):
        slack = rank.slack
        final = _ints(getattr(slack, "shares", None)) if slack is not None else None
        if final is None:
            continue
        initial = _ints(slack.initial_shares)
        if initial is None or len(initial) != len(final):
            initial = even_split(sum(final), len(final))
        changes = []
        for change in slack.share_changes or []:
            shares = _ints(change.get("shares")) if isinstance(change, dict) else None
            if shares is not None and len(shares) == len(final) and isinstance(change.get("step"), int):
                changes.append({**change, "shares": list(shares)})
        changes.sort(key=lambda c: c["step"])
        advice = tuple(str(r) for r in slack.recommendations or [] if r)
        return SharesOverRun(initial, final, tuple(changes), advice)
    return None


def last_step(record: RunRecord, run: SharesOverRun) -> int:
    """The run's last step (of any rank; the last change's step where no rank recorded steps)."""
    steps = [s.step for r in record.ranks for s in r.steps]
    return max(steps) if steps else max((step for step, _ in run.schedule()), default=0)
