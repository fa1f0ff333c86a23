"""Moving a ``MaxSlowdown`` choice up to the allowed slowdown: a setting between two adjacent candidates.

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

__all__ = ["boundary_fraction", "verdict_margin"]


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
