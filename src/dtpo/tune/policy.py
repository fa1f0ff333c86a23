"""Which policies a power tuner composes: the search policy a metric needs, chosen once, and the hold policy.

:func:`search_policy` is the one place that tells metrics apart: a cost with a constraint (``MaxSlowdown``) gets
:class:`~dtpo.tune.bound_search.BoundPolicy`, every other cost the plain race (:class:`~dtpo.tune.race.RacePolicy`).
:func:`hold_policy` settles near-ties while holding (:class:`~dtpo.tune.hold_refine.RefineHold`) where the options
give it steps and the search policy leaves near-ties to it; else the choice is held as it is.
"""

from __future__ import annotations

from dtpo.tune.bound_search import BoundPolicy
from dtpo.tune.cost import CostMetric, MaxSlowdown
from dtpo.tune.hold_refine import HoldPolicy, RefineHold
from dtpo.tune.race import Guess, RacePolicy
from dtpo.tune.tuner_types import TunerOptions

__all__ = ["hold_policy", "search_policy"]


def search_policy(metric: CostMetric, options: TunerOptions, guess: Guess | None = None) -> RacePolicy:
    """The search policy for ``metric``: towards its bound for ``MaxSlowdown``, the plain race otherwise."""
    if isinstance(metric, MaxSlowdown):
        return BoundPolicy(metric, options, guess)
    return RacePolicy(metric, options, guess)


def hold_policy(options: TunerOptions, search: RacePolicy) -> HoldPolicy:
    """Near-tie refining (``options.refine_steps`` > 0, where ``search`` leaves near-ties to the hold), else a
    plain hold."""
    if options.refine_steps > 0 and search.refines_near_ties:
        return RefineHold(options.refine_steps)
    return HoldPolicy()
