"""Which policies a tuner composes (``dtpo.tune.policy``): the search policy a metric needs, and the hold policy."""

from __future__ import annotations

import pytest

from dtpo.tune.bound_search import BoundPolicy
from dtpo.tune.cost import CostMetric, Dollars, Energy, MaxSlowdown, Time, ZeusCost
from dtpo.tune.hold_refine import RefineHold
from dtpo.tune.policy import hold_policy, search_policy
from dtpo.tune.race import RacePolicy
from dtpo.tune.tuner_types import TunerOptions


@pytest.mark.parametrize("metric", [Energy(), Time(), ZeusCost(0.5), Dollars(0.15, 2.5)], ids=str)
def test_a_cost_without_a_bound_gets_the_plain_race_and_refines_near_ties(metric: CostMetric) -> None:
    search = search_policy(metric, TunerOptions())
    assert type(search) is RacePolicy and search.metric is metric
    assert isinstance(hold_policy(TunerOptions(), search), RefineHold)
    assert not isinstance(hold_policy(TunerOptions(refine_steps=0), search), RefineHold)


def test_a_slowdown_bound_gets_the_bound_policy_and_a_plain_hold() -> None:
    guess = lambda settings, default: 1  # noqa: E731
    search = search_policy(MaxSlowdown(1.1), TunerOptions(), guess)
    assert isinstance(search, BoundPolicy) and search.guess is guess and search.bound.factor == 1.1
    assert not isinstance(hold_policy(TunerOptions(), search), RefineHold)
