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
time in between, which errs on the allowed side. The new setting is then measured like any candidate; its
time is judged on its own steps pooled with that chord (:func:`with_chord`, a second estimate from steps
already taken), and it becomes the choice once it is below the bound by the margin.

The margin is the interval that verdict will have after the planned steps: ``z`` standard errors (the tuner
passes a share of its ``z``, ``TunerOptions.placed_z_share``) of the difference between the new setting's
pooled time and ``F`` times the default's.

When the search ends, the same interpolation moves the choice itself (:func:`interpolate_between`): between the
setting chosen and the next one down, where their chord reaches the bound less the chord's own margin. With 3 %
noise per step and a third of a sweep's steps, whether a candidate just inside the bound is allowed often stays
open to the end; holding the candidate above it instead costs a whole grid step of energy (6-8 % on a V100 at
25 W), holding the interpolated setting a fraction of one.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from dtpo.tune.allocation import cheapest_information
from dtpo.tune.cost import MaxSlowdown
from dtpo.tune.knob import Between
from dtpo.tune.setting import GpuSetting
from dtpo.tune.stats import Estimate
from dtpo.tune.tuner_types import Candidate, Chord, Judgement, TunerOptions

__all__ = ["allowed", "boundary_fraction", "boundary_pair", "chord_estimate", "first_to_settle", "interpolate_between",
           "place_between", "placement_fraction", "pool_with_chords", "realised_fraction", "rule_out_too_slow",
           "time_information", "verdict_margin", "with_chord"]

FAR_TOO_SLOW = TunerOptions.far_too_slow  # times the bound: below a setting this slow, nothing is worth a visit


def allowed(metric: MaxSlowdown, est: Estimate, ref: Estimate | None, z: float) -> bool | None:
    """True, False (clearly too slow) or None (not clear yet) for ``metric``'s bound, ``z`` standard errors of the
    time difference deciding; always True for the default itself, or before the default (``ref``) is measured. (A
    metric without a bound has no such check: its search policy allows everything, :mod:`dtpo.tune.race`.)"""
    if ref is None or est.setting == ref.setting:
        return True
    bound = metric.factor * ref.time_per_sample_s
    spread = z * math.hypot(est.time_se, metric.factor * ref.time_se)
    if est.time_per_sample_s - spread > bound:
        return False
    if est.time_per_sample_s + spread <= bound:
        return True
    return None


def rule_out_too_slow(metric: MaxSlowdown, candidates: list[Candidate], j: Judgement,
                      far_too_slow: float = FAR_TOO_SLOW) -> list[Candidate]:
    """Mark the measured settings clearly too slow ``infeasible``; returns those of them far too slow
    (``far_too_slow`` times the bound: ``TunerOptions.far_too_slow``) below which every setting is slower still:
    the setting just above such a one must be measured and clearly slower than the default too. Time rising over
    two settings in a row is the limit biting; one slow setting right below the default may be a measured zigzag (a
    small job whose time hardly depends on the limit), with faster settings further down."""
    far = []
    for c in candidates:
        if c.status != "measured" or j.ref is None or allowed(metric, j.estimates[c.index], j.ref, j.z) is not False:
            continue
        c.status, c.reason = "infeasible", "slower than the allowed slowdown"
        if j.estimates[c.index].time_per_sample_s > far_too_slow * metric.factor * j.ref.time_per_sample_s \
                and _clearly_slower_than_default(candidates, c.index - 1, j):
            far.append(c)
    return far


def _clearly_slower_than_default(candidates: list[Candidate], index: int, j: Judgement) -> bool:
    if index < 0 or candidates[index] is j.reference or index not in j.estimates or j.ref is None:
        return False
    est = j.estimates[index]
    return est.time_per_sample_s - j.ref.time_per_sample_s > j.z * math.hypot(est.time_se, j.ref.time_se)


def time_information(metric: MaxSlowdown, j: Judgement, pair: list[Candidate], best_cost: float,
                     min_step_cost: float, reference_weight: float = 1.0) -> dict[int, float]:
    """How much a step at each of ``pair`` (an unsure setting and the default) narrows the interval of their time
    difference, per unit of what it costs above the best (:func:`~dtpo.tune.allocation.cheapest_information`).
    A step at the default counts ``reference_weight`` times: its time enters every verdict, not only this one."""
    assert j.reference is not None
    factor = {c.index: metric.factor if c is j.reference else 1.0 for c in pair}
    variances = {c.index: (factor[c.index] * j.estimates[c.index].time_se) ** 2 for c in pair}
    steps = {c.index: c.stats.steps for c in pair}
    costs = {c.index: j.estimates[c.index].cost - best_cost for c in pair}
    value = cheapest_information(variances, steps, costs, min_step_cost * abs(best_cost))
    if j.reference.index in value:
        value[j.reference.index] *= reference_weight
    return value


def boundary_pair(metric: MaxSlowdown, candidates: list[Candidate], j: Judgement, looked_steps: int,
                  closing: bool = False) -> tuple[Candidate, Candidate] | None:
    """The two adjacent candidates (of an ordered knob) to place a setting between: the cheapest one surely
    allowed, and the next one down, which must be cheaper and not surely allowed. Before both it and the default
    had ``looked_steps`` steps it must also be likely too slow (by a standard error): a short look at a setting
    that may well be allowed is not enough to give up on it. Once they have, or when the search is ``closing``
    (what is left of the budget pays for one placement and little more), a setting near the bound that the race
    cannot settle soon is hedged by a placed one: the race would need many steps where the two times are close.
    ``None`` when there is no such pair."""
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
    if allowed(metric, j.estimates[slow.index], j.ref, j.z) is True:
        return None
    looked = min(slow.stats.steps, j.ref.steps) >= looked_steps
    if not (looked or closing) and allowed(metric, j.estimates[slow.index], j.ref, 1.0) is not False:
        return None
    return fast, slow


def verdict_margin(z: float, time_cv: float, allowed_s: float, planned_steps: int, factor: float,
                   reference_se_s: float, chord_se_s: float = 0.0) -> float:
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
    if chord_se_s > 0:
        own_se = _inverse_variance(own_se, chord_se_s)
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


def realised_fraction(fast: GpuSetting, slow: GpuSetting, placed: GpuSetting) -> float:
    """How far ``placed`` lies from ``fast`` towards ``slow`` along the one knob they differ in (power limit or
    SM clock): the fraction the :attr:`~dtpo.tune.knob.Knob.between` rounding actually gave."""
    for field in ("power_limit_w", "sm_clock_mhz"):
        a, b, x = getattr(fast, field), getattr(slow, field), getattr(placed, field)
        if a is not None and b is not None and x is not None and a != b:
            return (a - x) / (a - b)
    raise ValueError(f"{placed.label} does not lie between {fast.label} and {slow.label}")


def with_chord(own: Estimate, fast: Estimate, slow: Estimate, fraction: float) -> Estimate:
    """A placed setting's time and cost per sample, its own measurements pooled with the chord between its two
    neighbours.

    The chord ``(1 - f) t_fast + f t_slow`` is a second, independent estimate of the same time; where time rises
    convexly as the limit (or clock) falls it lies above the curve, so pooling errs on the allowed side only by
    being pessimistic. The two are weighted by their inverse variances; the result's standard error is below
    either's, which lets a setting placed near the bound be judged in fewer steps of its own. The cost is pooled
    the same way, so a setting placed a watt above ``slow`` is not ranked below it on a few noisy steps.
    """
    time_s, time_se = _pooled(own.time_per_sample_s, own.time_se, fast.time_per_sample_s, fast.time_se,
                              slow.time_per_sample_s, slow.time_se, fraction)
    cost, cost_se = _pooled(own.cost, own.cost_se, fast.cost, fast.cost_se, slow.cost, slow.cost_se, fraction)
    return replace(own, time_per_sample_s=time_s, time_se=time_se, cost=cost, cost_se=cost_se)


def _pooled(own: float, own_se: float, fast: float, fast_se: float, slow: float, slow_se: float,
            fraction: float) -> tuple[float, float]:
    """``own`` pooled with the chord ``(1 - f) fast + f slow`` by inverse variances, and its standard error."""
    chord = (1.0 - fraction) * fast + fraction * slow
    chord_se = _chord_se(fast_se, slow_se, fraction)
    if own_se <= 0 or chord_se <= 0:
        return own, own_se
    w_own, w_chord = own_se ** -2, chord_se ** -2
    return (w_own * own + w_chord * chord) / (w_own + w_chord), _inverse_variance(own_se, chord_se)


def _chord_se(fast_se: float, slow_se: float, fraction: float) -> float:
    """Standard error of the chord ``(1 - f) fast + f slow``."""
    return math.hypot((1.0 - fraction) * fast_se, fraction * slow_se)


def _inverse_variance(a_se: float, b_se: float) -> float:
    """Standard error of two independent estimates pooled by their inverse variances."""
    return (a_se ** -2 + b_se ** -2) ** -0.5


def placement_fraction(factor: float, ref: Estimate, fast: Estimate, slow: Estimate, z: float, time_cv: float,
                       planned_steps: int, min_fraction: float) -> float | None:
    """Where between ``fast`` and ``slow`` to place a setting (:func:`boundary_fraction`), with the margin its
    verdict will need (:func:`verdict_margin`) once its own ``planned_steps`` are pooled with the chord between
    the two (:func:`with_chord`); ``None`` where no placement is worth a visit."""
    bound = factor * ref.time_per_sample_s
    return _fraction_with_margin(
        bound, fast, slow, lambda chord_se: verdict_margin(z, time_cv, bound, planned_steps, factor, ref.time_se,
                                                           chord_se), 0.0, min_fraction)


def _fraction_with_margin(bound: float, fast: Estimate, slow: Estimate, margin: Callable[[float], float],
                          first_chord_se: float, min_fraction: float) -> float | None:
    """:func:`boundary_fraction` with a margin that depends on the chord's standard error, which depends on where the
    setting lies: place with ``margin(first_chord_se)``, then place again with the chord's error there."""
    chord_se = first_chord_se
    fraction = None
    for _ in range(2):
        fraction = boundary_fraction(bound, fast.time_per_sample_s, slow.time_per_sample_s, margin(chord_se),
                                     min_fraction)
        if fraction is None:
            return None
        chord_se = _chord_se(fast.time_se, slow.time_se, fraction)
    return fraction


def place_between(metric: MaxSlowdown, candidates: list[Candidate], j: Judgement, between: Between, z: float,
                  time_cv: float, planned_steps: int, closing: bool, min_fraction: float
                  ) -> tuple[GpuSetting, Chord] | None:
    """The setting to place between the pair :func:`boundary_pair` names, where :func:`placement_fraction` puts
    it and ``between`` (the knob's) can name it, with its :class:`Chord`; ``None`` when there is none."""
    pair = boundary_pair(metric, candidates, j, planned_steps, closing)
    if pair is None or j.ref is None:
        return None
    fast, slow = pair
    fraction = placement_fraction(metric.factor, j.ref, j.estimates[fast.index], j.estimates[slow.index], z,
                                  time_cv, planned_steps, min_fraction)
    setting = None if fraction is None else between(fast.stats.setting, slow.stats.setting, fraction)
    if setting is None:
        return None
    return setting, Chord(fast, slow, realised_fraction(fast.stats.setting, slow.stats.setting, setting))


def pool_with_chords(candidates: list[Candidate], estimates: dict[int, Estimate]) -> None:
    """Replace, in ``estimates``, each placed setting's figures by them pooled with its chord (:func:`with_chord`),
    where both of its neighbours are measured."""
    for c in candidates:
        chord = c.chord
        if chord is not None and {c.index, chord.fast.index, chord.slow.index} <= estimates.keys():
            estimates[c.index] = with_chord(estimates[c.index], estimates[chord.fast.index],
                                            estimates[chord.slow.index], chord.fraction)


def first_to_settle(unsure: list[Candidate], estimates: dict[int, Estimate], reference_steps: int,
                    looked_steps: int, can_place: bool) -> Candidate:
    """Of the settings whose ``MaxSlowdown`` verdict is open, the one to settle first: the cheapest, unless it
    already had a fair look (``looked_steps`` on it and on the default) and a setting between can still hedge
    it. A setting that stays unsure after a fair look lies near the bound and would take many more steps; one
    not looked at yet (the one above it) is settled first, so a setting can be placed between the two."""
    def cost(c: Candidate) -> float:
        return estimates[c.index].cost

    fresh = [c for c in unsure if min(c.stats.steps, reference_steps) < looked_steps] if can_place else []
    return min(fresh or unsure, key=cost)


def chord_estimate(fast: Estimate, slow: Estimate, fraction: float, setting: GpuSetting) -> Estimate:
    """The figures of ``setting``, ``fraction`` of the way from ``fast`` to ``slow``, read off their chord (no steps of
    its own)."""
    def along(a: float, b: float) -> float:
        return (1.0 - fraction) * a + fraction * b

    return Estimate(setting, 0, along(fast.cost, slow.cost), _chord_se(fast.cost_se, slow.cost_se, fraction),
                    along(fast.time_per_sample_s, slow.time_per_sample_s),
                    _chord_se(fast.time_se, slow.time_se, fraction),
                    along(fast.energy_per_sample_j, slow.energy_per_sample_j))


def interpolate_between(metric: MaxSlowdown, candidates: list[Candidate], best: Candidate, j: Judgement,
                        between: Between, z: float) -> tuple[GpuSetting, Chord] | None:
    """When a search ends on ``best``: the setting between it and the next candidate down where the chord of their
    times reaches the bound less ``z`` standard errors of that chord against the default, with its :class:`Chord`.

    The next candidate down must be measured, cheaper than ``best``, and not rejected; where it is surely allowed
    the target lies at or beyond it and there is nothing to interpolate. ``None`` when there is no such setting
    (or ``between`` cannot name one strictly inside the pair).
    """
    if j.ref is None or best.index not in j.estimates or best.index + 1 >= len(candidates):
        return None
    slow = candidates[best.index + 1]
    if slow.index not in j.estimates or slow.status == "rejected":
        return None
    fast_e, slow_e = j.estimates[best.index], j.estimates[slow.index]
    if slow_e.cost >= fast_e.cost:
        return None
    ref_se = metric.factor * j.ref.time_se
    fraction = _fraction_with_margin(metric.factor * j.ref.time_per_sample_s, fast_e, slow_e,
                                     lambda chord_se: z * math.hypot(chord_se, ref_se), fast_e.time_se, 0.0)
    if fraction is None:
        return None
    setting = between(best.stats.setting, slow.stats.setting, fraction)
    if setting is None:
        return None
    return setting, Chord(best, slow, realised_fraction(best.stats.setting, slow.stats.setting, setting))
