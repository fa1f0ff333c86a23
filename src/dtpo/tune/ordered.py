"""Searching along an ordered knob (power limits from the maximum down, clocks from the highest down), where time
only grows as the setting falls: which candidate to visit next, when a rise is steep enough that nothing below
can pay for it, and dropping what lies below unvisited."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

from dtpo.tune.setting import GpuSetting
from dtpo.tune.stats import Estimate
from dtpo.tune.tuner_types import Candidate

__all__ = ["next_unvisited", "prune_below", "steep_below"]

logger = logging.getLogger(__name__)

Guess = Callable[[list[GpuSetting], Estimate], int]


def next_unvisited(candidates: list[Candidate], unvisited: list[Candidate], best: Candidate,
                   estimates: dict[int, Estimate], guess: Guess | None) -> Candidate:
    """The candidate to visit next: after the first, the one ``guess`` (a physical model) predicts best; then the
    nearest to the best so far, on a tie on the side where the cost went down towards the best."""
    measured = [c for c in candidates if c.stats.measured]
    if len(measured) == 1 and guess is not None:
        try:
            g = guess([c.stats.setting for c in candidates], estimates[best.index])
        except Exception as exc:  # noqa: BLE001 - a failed guess only costs search order
            logger.debug("tuner: no model guess (%s)", exc)
            g = None
        if g is not None and 0 <= g < len(candidates) and candidates[g].status == "unvisited":
            return candidates[g]

    def direction(c: Candidate) -> int:
        side = [o for o in measured if (o.index < best.index) == (c.index < best.index) and o is not best]
        return 1 if side and min(estimates.get(o.index, estimates[best.index]).cost for o in side) > \
            estimates[best.index].cost else 0

    return min(unvisited, key=lambda c: (abs(c.index - best.index), direction(c), -c.index))


def steep_below(candidates: list[Candidate], c: Candidate, best: Candidate, estimates: dict[int, Estimate],
                z: float) -> bool:
    """Whether cost and time rise clearly over two settings in a row from ``best`` down to ``c``: the setting just
    above ``c`` is clearly costlier and slower than the best, and ``c`` clearly costlier and slower than it. One
    rise alone may be a measured zigzag (a limit that does not bind); two in a row are the limit biting.
    ``estimates`` holds every measured candidate's."""
    if c.index < best.index + 2:
        return False
    above = candidates[c.index - 1]
    if not above.stats.measured:
        return False

    def clearly_above(hi: Estimate, lo: Estimate) -> bool:
        return (hi.cost - lo.cost > z * math.hypot(hi.cost_se, lo.cost_se)
                and hi.time_per_sample_s - lo.time_per_sample_s > z * math.hypot(hi.time_se, lo.time_se))

    e_c, e_a, e_b = (estimates[x.index] for x in (c, above, best))
    return clearly_above(e_c, e_a) and clearly_above(e_a, e_b)


def prune_below(candidates: list[Candidate], index: int, reason: str) -> None:
    """Drop every unvisited candidate below ``index`` for ``reason``."""
    for c in candidates[index + 1:]:
        if c.status == "unvisited":
            c.status, c.reason = "pruned", reason
