"""The ``MaxSlowdown`` bound in a search: whether a setting is allowed, and moving the choice up to the bound with
a setting between two adjacent candidates.

A setting is allowed when its time per sample is at most ``F`` times the default's; with ``z`` standard errors
of that comparison the verdict is sure either way, or not yet clear (:func:`allowed`).

Under ``MaxSlowdown(F)`` energy falls as the power limit (or the clock) falls, until the limit bites hard,
so the least energy lies at the slowest setting allowed. On a grid of candidates (Zeus's 25 W steps) the
best one is often well inside the bound: a job 6 % slower at 200 W and 11 % slower at 175 W leaves four of
the ten points that ``slowdown:1.1`` allows, and the energy they would save, unused. Between two adjacent
settings the time changes smoothly, so the setting where it reaches the bound less a safety margin is placed
by linear interpolation between the cheapest setting surely allowed (``fast``) and the next one down
(``slow``, not surely allowed). Where time rises convexly as the limit falls, the chord over-estimates the
time in between, which errs on the allowed side. The new setting is then measured like any candidate, and it
becomes the choice only when its own measurement shows it surely allowed.

The margin is the interval that verdict will have after the planned steps: ``z`` standard errors of the
difference between the new setting's time and ``F`` times the default's.
"""

from __future__ import annotations

import math

from dtpo.tune.cost import CostMetric, MaxSlowdown
from dtpo.tune.stats import Estimate
from dtpo.tune.tuner_types import Candidate, Judgement

__all__ = ["allowed", "boundary_fraction", "boundary_pair", "verdict_margin"]


def allowed(metric: CostMetric, est: Estimate, ref: Estimate | None, z: float) -> bool | None:
    """True, False (clearly too slow) or None (not clear yet) for ``metric``'s constraint, ``z`` standard errors
    of the time difference deciding; always True for a metric without one, for the default itself, or before
    the default (``ref``) is measured."""
    if not isinstance(metric, MaxSlowdown) or ref is None or est.setting == ref.setting:
        return True
    bound = metric.factor * ref.time_per_sample_s
    spread = z * math.hypot(est.time_se, metric.factor * ref.time_se)
    if est.time_per_sample_s - spread > bound:
        return False
    if est.time_per_sample_s + spread <= bound:
        return True
    return None


def boundary_pair(metric: MaxSlowdown, candidates: list[Candidate], j: Judgement, looked_steps: int
                  ) -> tuple[Candidate, Candidate] | None:
    """The two adjacent candidates (of an ordered knob) to place a setting between: the cheapest one surely
    allowed, and the next one down, which must be cheaper and likely too slow: by a standard error, or at all once
    both it and the default had ``looked_steps`` steps (one that may well be allowed is measured until the race
    knows). ``None`` when there is no such pair."""
    if j.ref is None:
        return None
    sure = [c for c in candidates if c.status == "measured" and allowed(metric, j.estimates[c.index], j.ref, j.z)]
    if not sure:
        return None
    fast = min(sure, key=lambda c: j.estimates[c.index].cost)
    slow = candidates[fast.index + 1] if fast.index + 1 < len(candidates) else None
    if slow is None or slow.index not in j.estimates or slow.status == "rejected" \
            or j.estimates[slow.index].cost >= j.estimates[fast.index].cost:
        return None
    looked = min(slow.stats.steps, j.ref.steps) >= looked_steps
    if allowed(metric, j.estimates[slow.index], j.ref, 0.0 if looked else 1.0) is not False:
        return None
    return fast, slow


def verdict_margin(z: float, time_cv: float, allowed_s: float, planned_steps: int, factor: float,
                   reference_se_s: float) -> float:
    """Seconds per sample to stay below the allowed time so that a setting measured for ``planned_steps`` steps
    near it comes out surely allowed.

    Args:
        z: Standard errors that make a verdict sure.
        time_cv: Relative spread of one step's time.
        allowed_s: ``factor`` times the default's time per sample.
        planned_steps: Steps the new setting will be measured.
        factor: The allowed slowdown.
        reference_se_s: Standard error of the default's time per sample.
    """
    own_se = time_cv * allowed_s / math.sqrt(max(planned_steps, 1))
    return z * math.hypot(own_se, factor * reference_se_s)


def boundary_fraction(allowed_s: float, fast_s: float, slow_s: float, margin_s: float,
                      min_fraction: float) -> float | None:
    """How far from ``fast`` towards ``slow`` the interpolated time per sample reaches ``allowed_s - margin_s``.

    Returns:
        The fraction in ``[min_fraction, 1)``, or ``None``: the target lies at or beyond ``slow`` (``slow``
        itself may be allowed: measure it rather than something short of it), too close to ``fast`` to be worth
        a visit, or behind it.
    """
    target = allowed_s - margin_s
    if slow_s <= fast_s or target <= fast_s:
        return None
    fraction = (target - fast_s) / (slow_s - fast_s)
    return fraction if min_fraction <= fraction < 1.0 else None
