"""The race's allocation rules: OCBA shares of a budget, and the cheapest information for a slowdown check."""

from __future__ import annotations

import pytest

from dtpo.tune.allocation import Contender, cheapest_information, ocba_targets


def test_ocba_gives_close_challengers_more_and_shares_out_the_whole_budget() -> None:
    best = Contender(0, 10, 1.00, 0.03)
    near, far = Contender(1, 10, 1.01, 0.03), Contender(2, 10, 1.05, 0.03)
    targets = ocba_targets(best, [near, far], 100, min_gap=0.005)
    assert sum(targets.values()) == pytest.approx(100)
    assert targets[1] > targets[2]
    # the textbook ratio between two challengers: (sd_i / gap_i)^2
    assert targets[1] / targets[2] == pytest.approx((0.05 / 0.01) ** 2)
    # the best: sd_b * sqrt(sum n_i^2 / sd_i^2)
    assert targets[0] == pytest.approx(0.03 * ((targets[1] / 0.03) ** 2 + (targets[2] / 0.03) ** 2) ** 0.5)


def test_ocba_floors_the_gap_so_a_near_tie_does_not_take_everything() -> None:
    best = Contender(0, 10, 1.0, 0.03)
    tie, other = Contender(1, 10, 1.0001, 0.03), Contender(2, 10, 1.02, 0.03)
    targets = ocba_targets(best, [tie, other], 100, min_gap=0.005)
    assert targets[1] / targets[2] == pytest.approx((0.02 / 0.005) ** 2)


def test_the_cheaper_side_of_a_slowdown_check_is_measured_until_its_share_is_small() -> None:
    # equal uncertainty and steps: the side that costs less per step is measured
    value = cheapest_information({0: 1e-4, 1: 1e-4}, {0: 10, 1: 10}, {0: 0.0, 1: 0.2}, floor=0.05)
    assert max(value, key=value.get) == 0
    # once the cheap side is well measured, the expensive one is worth its step
    value = cheapest_information({0: 1e-6, 1: 1e-4}, {0: 40, 1: 10}, {0: -0.1, 1: 0.2}, floor=0.05)
    assert max(value, key=value.get) == 1
