"""Where the power tuner's race spends its next steps (:meth:`dtpo.tune.race.RacePolicy.decide`).

Two questions, two classic answers:

* **Which of the cost contenders to measure** (:func:`ocba_targets`): Optimal Computing Budget Allocation
  (Chen et al., 2000) splits a fixed budget of steps between the best estimate and its challengers so that the
  probability of holding the truly best one is as high as it can be: a challenger ``i`` gets steps in
  proportion to ``(sd_i / gap_i)^2``, the best ``sd_b * sqrt(sum n_i^2 / sd_i^2)``. Gaps are floored at a
  fraction of the best cost: two settings closer than that are as good as each other for the result, and a
  near-tie must not swallow the budget that a less-measured contender needs.
* **Which side of a ``MaxSlowdown`` comparison to measure** (:func:`cheapest_information`): whether a setting
  is fast enough is decided by its time against the default's; one more step at either narrows the interval of
  their difference. Each step costs what the metric charges over the best setting so far (a step at the
  default, the most expensive setting, costs the most), so the step that buys the most variance per unit of
  that cost is taken. Every step is charged at least a floor (it still takes a change, a warm-up and time).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Contender", "cheapest_information", "ocba_targets"]


@dataclass(frozen=True)
class Contender:
    """One setting in the race, as the allocation sees it.

    Attributes:
        key: Whatever identifies it to the caller.
        steps: Steps measured so far.
        mean: Estimated cost (or time) per sample.
        sd: Standard deviation of one step's figure (``se * sqrt(steps)``).
    """

    key: int
    steps: int
    mean: float
    sd: float


def ocba_targets(best: Contender, challengers: Sequence[Contender], total_steps: float, min_gap: float
                 ) -> dict[int, float]:
    """Steps each contender should have measured once ``total_steps`` (their measured steps plus what is left of
    the budget) are spent, by OCBA; gaps below ``min_gap`` count as ``min_gap``.

    Returns:
        ``key -> target steps`` for ``best`` and every challenger.
    """
    weights: dict[int, float] = {}
    for c in challengers:
        gap = max(c.mean - best.mean, min_gap)
        weights[c.key] = (c.sd / gap) ** 2 if gap > 0 else 0.0
    spread = sum((weights[c.key] / c.sd) ** 2 for c in challengers if c.sd > 0)
    weights[best.key] = best.sd * math.sqrt(spread)
    norm = sum(weights.values())
    if norm <= 0:
        return {c.key: total_steps / (len(challengers) + 1) for c in (best, *challengers)}
    return {key: total_steps * w / norm for key, w in weights.items()}


def cheapest_information(variances: dict[int, float], steps: dict[int, int], step_costs: dict[int, float],
                         floor: float) -> dict[int, float]:
    """How much each side's next step narrows a difference's variance per unit of what the step costs (the side
    with the largest value is the one to measure).

    Args:
        variances: Each side's share of the variance of the difference (its squared standard error, scaled as
            it enters the difference).
        steps: Each side's measured steps.
        step_costs: What one step at each side costs beyond the best setting so far (may be negative).
        floor: The least any step is charged (positive).

    Returns:
        ``key -> variance removed per unit of cost`` (a step removes about ``variance / (steps + 1)``).
    """
    floor = max(floor, 1e-12)  # a cost metric that reads zero everywhere: plain variance reduction
    return {key: variances[key] / (max(steps[key], 1) + 1) / max(step_costs[key], floor) for key in variances}

