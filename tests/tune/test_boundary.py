"""Placing a setting between two candidates towards a ``MaxSlowdown`` bound: the margin its verdict needs and
where the interpolated time reaches the bound less that margin."""

from __future__ import annotations

import math

import pytest

from dtpo.tune.boundary import (
    allowed,
    boundary_fraction,
    boundary_pair,
    chord_estimate,
    first_to_settle,
    interpolate_between,
    placement_fraction,
    realised_fraction,
    rule_out_too_slow,
    time_information,
    verdict_margin,
    with_chord,
)
from dtpo.tune.cost import MaxSlowdown
from dtpo.tune.knob import power_limit_between
from dtpo.tune.setting import GpuSetting
from dtpo.tune.stats import Block, Estimate, SettingStats
from dtpo.tune.tuner_types import Candidate, Judgement


def test_the_margin_is_z_standard_errors_of_the_time_difference() -> None:
    # own: 1 % of 1.1 s over sqrt(16) steps = 2.75 ms; the default's: 1.1 x 5 ms = 5.5 ms
    expected = 2.0 * math.hypot(0.01 * 1.1 / 4.0, 1.1 * 0.005)
    assert verdict_margin(2.0, 0.01, 1.1, 16, 1.1, 0.005) == pytest.approx(expected)
    assert verdict_margin(2.0, 0.01, 1.1, 64, 1.1, 0.005) < expected  # more planned steps, a narrower margin


def test_the_fraction_is_where_the_chord_reaches_the_bound_less_the_margin() -> None:
    # from 1.0 s to 1.2 s, the target 1.1 - 0.02 = 1.08 s lies 40 % of the way
    assert boundary_fraction(1.1, 1.0, 1.2, 0.02, 0.1) == pytest.approx(0.4)


@pytest.mark.parametrize(("allowed", "fast", "slow", "margin", "why"), [
    (1.3, 1.0, 1.2, 0.02, "the slower setting itself may be allowed"),
    (1.1, 1.0, 1.2, 0.1, "the margin takes everything up to the faster one"),
    (1.1, 1.0, 1.2, 0.09, "5 % of the way is below the least worth a visit"),
    (1.1, 1.2, 1.0, 0.02, "the lower setting measured faster: nothing to interpolate"),
])
def test_no_fraction_where_a_visit_between_is_pointless(allowed: float, fast: float, slow: float, margin: float,
                                                       why: str) -> None:
    assert boundary_fraction(allowed, fast, slow, margin, 0.1) is None, why


def _est(setting: float, time: float, se: float) -> Estimate:
    return Estimate(GpuSetting(setting), 10, time, se, time, se, time)


def test_allowed_is_sure_either_way_or_not_yet_clear() -> None:
    metric, ref = MaxSlowdown(1.1), _est(300.0, 1.0, 0.0)
    assert allowed(metric, _est(200.0, 1.05, 0.01), ref, 2.0) is True
    assert allowed(metric, _est(200.0, 1.15, 0.01), ref, 2.0) is False
    assert allowed(metric, _est(200.0, 1.09, 0.01), ref, 2.0) is None
    assert allowed(metric, _est(200.0, 1.09, 0.01), ref, 0.0) is True
    assert allowed(metric, _est(200.0, 9.0, 0.01), None, 2.0) is True  # the default not measured yet


def test_the_pair_is_the_cheapest_sure_setting_and_the_likely_too_slow_one_below() -> None:
    limits, times = [300.0, 250.0, 200.0, 175.0], [1.0, 1.02, 1.06, 1.15]
    cands = [Candidate(i, SettingStats(GpuSetting(w)), "measured") for i, w in enumerate(limits)]
    estimates = {i: Estimate(GpuSetting(w), 10, 1.0 - 0.05 * i, 0.001, t, 0.01, 1.0 - 0.05 * i)
                 for i, (w, t) in enumerate(zip(limits, times, strict=True))}
    j = Judgement(estimates, estimates[0], 2.0, cands[0])
    assert boundary_pair(MaxSlowdown(1.1), cands, j, 12) == (cands[2], cands[3])
    # a bound that 175 W may well meet: no pair before both had a fair look (12 steps; none measured here), the race
    # measures 175 W first
    assert boundary_pair(MaxSlowdown(1.145), cands, j, 12) is None
    # after a fair look it is still unsure: a setting between hedges it (and 175 W stays in the race)
    assert boundary_pair(MaxSlowdown(1.145), cands, j, 0) == (cands[2], cands[3])
    # likewise when what is left of the budget pays for one placement only
    assert boundary_pair(MaxSlowdown(1.145), cands, j, 12, closing=True) == (cands[2], cands[3])
    # a bound 175 W surely meets: it is the cheapest sure setting, nothing below it to place towards
    assert boundary_pair(MaxSlowdown(1.3), cands, j, 12) is None


def test_the_chord_narrows_a_placed_settings_time_and_cost_pooled_by_inverse_variance() -> None:
    fast, slow = _est(200.0, 1.00, 0.004), _est(175.0, 1.20, 0.004)
    own = _est(190.0, 1.10, 0.01)
    pooled = with_chord(own, fast, slow, 0.4)
    chord_s, chord_se = 0.6 * 1.00 + 0.4 * 1.20, math.hypot(0.6 * 0.004, 0.4 * 0.004)
    w_own, w_chord = 0.01 ** -2, chord_se ** -2
    assert pooled.time_per_sample_s == pytest.approx((w_own * 1.10 + w_chord * chord_s) / (w_own + w_chord))
    assert pooled.time_se == pytest.approx((w_own + w_chord) ** -0.5)
    assert pooled.time_se < min(own.time_se, chord_se)
    # the cost is pooled the same way (``_est`` gives cost = time): a watt above ``slow`` ranks near it
    assert pooled.cost == pytest.approx(pooled.time_per_sample_s) and pooled.cost_se == pytest.approx(pooled.time_se)
    assert pooled.setting == own.setting and pooled.energy_per_sample_j == own.energy_per_sample_j


def test_the_realised_fraction_follows_the_knob_that_differs() -> None:
    assert realised_fraction(GpuSetting(200.0), GpuSetting(175.0), GpuSetting(190.0)) == pytest.approx(0.4)
    assert realised_fraction(GpuSetting(None, 1800), GpuSetting(None, 1600), GpuSetting(None, 1650)) \
        == pytest.approx(0.75)
    with pytest.raises(ValueError, match="between"):
        realised_fraction(GpuSetting(200.0), GpuSetting(200.0), GpuSetting(190.0))


def test_placement_counts_on_the_chord_and_goes_closer_to_the_bound_than_its_own_steps_allow() -> None:
    ref, fast, slow = _est(300.0, 1.0, 0.005), _est(200.0, 1.05, 0.005), _est(175.0, 1.15, 0.005)
    placed = placement_fraction(1.1, ref, fast, slow, 2.0, 0.03, 12, 0.1)
    own_only = boundary_fraction(1.1, 1.05, 1.15, verdict_margin(2.0, 0.03, 1.1, 12, 1.1, 0.005), 0.1)
    assert placed is not None and own_only is not None and placed > own_only
    # the margin it used is the pooled one at the place it chose
    chord_se = math.hypot((1 - placed) * 0.005, placed * 0.005)
    margin = 1.1 - (1.05 + placed * 0.10)
    assert margin >= verdict_margin(2.0, 0.03, 1.1, 12, 1.1, 0.005, chord_se) - 1e-9
    assert placement_fraction(1.1, ref, fast, _est(175.0, 1.08, 0.005), 2.0, 0.03, 12, 0.1) is None


def _judged(times: list[float], steps: int) -> tuple[list[Candidate], Judgement]:
    """Candidates at 300, 250, 200 and 175 W with ``times`` (the default's 1.0), ``steps`` measured each."""
    limits = [300.0, 250.0, 200.0, 175.0]
    cands = [Candidate(i, SettingStats(GpuSetting(w), [Block(steps, steps, t * steps, 1.0)]), "measured")
             for i, (w, t) in enumerate(zip(limits, times, strict=True))]
    estimates = {i: Estimate(GpuSetting(w), steps, 1.0 - 0.05 * i, 0.001, t, 0.005, 1.0 - 0.05 * i)
                 for i, (w, t) in enumerate(zip(limits, times, strict=True))}
    return cands, Judgement(estimates, estimates[0], 2.0, cands[0])


def test_clearly_too_slow_settings_go_and_the_far_too_slow_are_named_for_pruning_below() -> None:
    cands, j = _judged([1.0, 1.05, 1.13, 1.25], 12)
    far = rule_out_too_slow(MaxSlowdown(1.1), cands, j)
    assert [c.status for c in cands] == ["measured", "measured", "infeasible", "infeasible"]
    assert far == [cands[3]]  # 1.25 > 1.05 x 1.1; 1.13 is too slow but not far too slow


@pytest.mark.parametrize("times", [[1.0, 1.25, 1.0, 1.05], [1.0, 1.0, 1.25, 1.05]])
def test_a_far_too_slow_setting_prunes_below_only_when_the_one_above_it_is_clearly_slower_too(
        times: list[float]) -> None:
    # right below the default, or below a setting as fast as the default, one slow setting may be a measured
    # zigzag: it is too slow itself, but says nothing of the settings below
    cands, j = _judged(times, 12)
    assert rule_out_too_slow(MaxSlowdown(1.1), cands, j) == []
    assert cands[times.index(1.25)].status == "infeasible"


def test_the_setting_settled_first_is_one_not_yet_looked_at_while_a_placement_can_still_hedge() -> None:
    cands, j = _judged([1.0, 1.05, 1.09, 1.10], 12)
    cands[2].stats.blocks = [Block(4, 4, 4.36, 1.0)]  # 200 W: 4 steps only
    unsure = [cands[2], cands[3]]
    assert first_to_settle(unsure, j.estimates, 12, 12, can_place=True) is cands[2]
    assert first_to_settle(unsure, j.estimates, 12, 12, can_place=False) is cands[3]  # the cheapest
    assert first_to_settle(unsure, j.estimates, 4, 12, can_place=True) is cands[3]  # nothing had a fair look yet


def test_time_information_is_variance_removed_per_cost_and_a_default_step_counts_reference_weight_times() -> None:
    cands, j = _judged([1.0, 1.05, 1.09, 1.10], 12)
    pair = [cands[3], cands[0]]  # an unsure setting (cost 0.85) and the default (cost 1.0); best costs 0.9
    plain = time_information(MaxSlowdown(1.1), j, pair, 0.9, 0.1)
    # variance / (steps + 1) / max(cost above the best, floor): the default's time counts 1.1 times
    assert plain[3] == pytest.approx(0.005 ** 2 / 13 / (0.1 * 0.9))
    assert plain[0] == pytest.approx((1.1 * 0.005) ** 2 / 13 / 0.1)
    weighted = time_information(MaxSlowdown(1.1), j, pair, 0.9, 0.1, reference_weight=2.0)
    assert weighted[3] == pytest.approx(plain[3])
    assert weighted[0] == pytest.approx(2.0 * plain[0])


def test_the_choice_is_interpolated_where_the_chord_reaches_the_bound_less_its_margin() -> None:
    # 200 W at 1.05, 175 W at 1.25 (times against the default's 1.0; each with a standard error of 0.005):
    # with no margin the chord reaches 1.1 a quarter of the way down, at 193.75 W -> 194 W
    cands, j = _judged([1.0, 1.02, 1.05, 1.25], 12)
    found = interpolate_between(MaxSlowdown(1.1), cands, cands[2], j, power_limit_between, 0.0)
    assert found is not None
    setting, chord = found
    assert setting == GpuSetting(194.0) and (chord.fast, chord.slow) == (cands[2], cands[3])
    assert chord.fraction == pytest.approx(6 / 25)
    # with z = 2 it stays 2 x hypot(chord se, 1.1 x the default's se) short of the bound: further from 175 W
    setting_z, _ = interpolate_between(MaxSlowdown(1.1), cands, cands[2], j, power_limit_between, 2.0) or (None, None)
    fraction = 0.25
    for _ in range(2):
        margin = 2.0 * math.hypot(math.hypot((1 - fraction) * 0.005, fraction * 0.005), 1.1 * 0.005)
        fraction = (1.1 - margin - 1.05) / 0.20
    assert setting_z == GpuSetting(float(round(200.0 - 25.0 * fraction)))
    assert setting_z.power_limit_w > setting.power_limit_w


@pytest.mark.parametrize(("times", "why"), [
    ([1.0, 1.02, 1.05, 1.08], "the next one down is itself within the bound: nothing lies between"),
    ([1.0, 1.02, 1.12, 1.25], "the choice itself is past the bound less the margin"),
])
def test_no_interpolated_choice_where_the_chord_does_not_cross_the_bound(times: list[float], why: str) -> None:
    cands, j = _judged(times, 12)
    assert interpolate_between(MaxSlowdown(1.1), cands, cands[2], j, power_limit_between, 2.0) is None, why


def test_no_interpolated_choice_towards_a_costlier_or_rejected_setting_or_below_the_last() -> None:
    cands, j = _judged([1.0, 1.02, 1.05, 1.25], 12)
    assert interpolate_between(MaxSlowdown(1.1), cands, cands[3], j, power_limit_between, 0.0) is None  # the last
    cands[3].status = "rejected"
    assert interpolate_between(MaxSlowdown(1.1), cands, cands[2], j, power_limit_between, 0.0) is None
    cands[3].status = "measured"
    from dataclasses import replace
    j.estimates[3] = replace(j.estimates[3], cost=j.estimates[2].cost + 0.01)  # 175 W costs more than 200 W
    assert interpolate_between(MaxSlowdown(1.1), cands, cands[2], j, power_limit_between, 0.0) is None


def test_a_chord_estimate_reads_time_energy_and_cost_off_the_chord() -> None:
    fast, slow = _est(200.0, 1.0, 0.004), _est(175.0, 1.2, 0.003)
    est = chord_estimate(fast, slow, 0.25, GpuSetting(194.0))
    assert est.setting == GpuSetting(194.0) and est.steps == 0
    assert est.time_per_sample_s == pytest.approx(1.05) and est.cost == pytest.approx(1.05)
    assert est.energy_per_sample_j == pytest.approx(1.05)
    assert est.time_se == pytest.approx(math.hypot(0.75 * 0.004, 0.25 * 0.003))
