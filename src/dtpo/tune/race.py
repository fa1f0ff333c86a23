"""The plain search policy of the power tuner: which candidate to measure next, given what every measured one
costs, and when to stop (``Energy``, ``Time``, ``ZeusCost``, ``Dollars``: a cost with no constraint).

After each visit the tuner (:mod:`dtpo.tune.tuner`) judges every measured setting (a
:class:`~dtpo.tune.tuner_types.Judgement`) and asks its search policy what to do next (:meth:`RacePolicy.decide`).
The policy drops what is clearly costlier than the best (and, on an ordered knob, everything below a steep rise:
:mod:`dtpo.tune.ordered`), sends the search to the next unvisited candidate, and once every candidate is visited
or ruled out races the survivors: every challenger still in the running gets a fair look of its own, then the
budget goes where :mod:`dtpo.tune.allocation` says it decides most, until the best is within ``tolerance`` of
every survivor. Its answer is a :class:`~dtpo.tune.tuner_types.Next`; the tuner carries it out (warm-ups, the
budget's hard cap, holding).

A policy for a metric with a constraint subclasses :class:`RacePolicy` and fills in its hooks (what is allowed,
what is ruled out, moves towards a bound, a check of the choice while held): :mod:`dtpo.tune.bound_search`.
:func:`dtpo.tune.policy.search_policy` picks the policy for a metric.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from dtpo.tune.allocation import Contender, ocba_targets
from dtpo.tune.cost import CostMetric
from dtpo.tune.knob import Between
from dtpo.tune.ordered import next_unvisited, prune_below, steep_below
from dtpo.tune.setting import GpuSetting
from dtpo.tune.stats import Estimate
from dtpo.tune.tuner_types import Candidate, Judgement, Next, Placement, Room, TunerOptions

__all__ = ["Guess", "RacePolicy"]

Guess = Callable[[list[GpuSetting], Estimate], int]


class RacePolicy:
    """Decides the search over one knob's candidates for a cost with no constraint (see the module docs).

    Args:
        metric: What the search minimises.
        options: Search parameters.
        guess: Optional model: given the candidates and the default's measured estimate, the index of the candidate
            predicted to be best (see :mod:`dtpo.tune.prior`); it picks the second visit.
    """

    quick_looks = True  # a first visit may end early once the setting is clearly costlier than the best
    refines_near_ties = True  # a near-tie the race left may be settled while holding (dtpo.tune.hold_refine)
    keeps_reference = False  # the default is never dropped as costlier (it is a constraint's reference)

    def __init__(self, metric: CostMetric, options: TunerOptions, guess: Guess | None = None) -> None:
        self.metric = metric
        self.options = options
        self.guess = guess
        self.between: Between | None = None

    @property
    def fair_look(self) -> int:
        """Measured steps of a first visit and a revisit: what a contender gets before near-ties share the rest."""
        return self.options.first_visit_steps + self.options.revisit_steps

    def start_knob(self, between: Between | None) -> None:
        """A search over a new knob begins; ``between`` names settings between its candidates, if it can."""
        self.between = between

    # -- hooks for a constraint (none here) -----------------------------------------------------------------

    def allowed(self, est: Estimate, ref: Estimate | None, z: float) -> bool | None:
        """Whether ``est`` satisfies the metric's constraint against the default's ``ref``, ``z`` standard errors
        deciding: True, False (clearly not) or None (not clear yet). Always True here: there is no constraint."""
        return True

    def choice_margin(self, placed: bool, z: float) -> float:
        """Standard errors by which a setting must satisfy the constraint to be the choice (none here)."""
        return 0.0

    @property
    def can_interpolate(self) -> bool:
        """Whether the choice may end between two candidates (never here)."""
        return False

    def interpolate(self, candidates: list[Candidate], best: Candidate, j: Judgement) -> Placement | None:
        """A setting between ``best`` and a neighbour to hold instead of ``best`` when the search ends (none here)."""
        return None

    def held_to_check(self, candidates: list[Candidate], current: GpuSetting) -> Candidate | None:
        """The held choice that the hold blocks still measure, to check it (none here)."""
        return None

    def step_back(self, held: Candidate, j: Judgement) -> Candidate | None:
        """The candidate to hold instead of ``held`` once its own figures rule it out (never here)."""
        return None

    def _rule_out(self, candidates: list[Candidate], j: Judgement) -> list[Candidate]:
        """Mark what the constraint rules out; returns those below which every setting is ruled out too."""
        return []

    def _placement(self, candidates: list[Candidate], j: Judgement, room: Room) -> Placement | None:
        """A setting to place between two candidates and measure next (none here)."""
        return None

    def _time_to_measure(self, live: list[Candidate], j: Judgement, best: Candidate,
                         room: Room) -> Candidate | None:
        """A setting, or the default, to measure because the constraint's verdict on it is open (none here)."""
        return None

    # -- deciding -----------------------------------------------------------------------------------------------

    def decide(self, candidates: list[Candidate], j: Judgement, room: Room) -> Next:
        """After a visit: judge every measured candidate again, then visit the next unvisited one, race the
        survivors, or end the search on the best. Changes the candidates' statuses."""
        for c in candidates:  # a drop holds only while the evidence does: judge again against today's figures
            if c.status in ("dropped", "infeasible"):
                c.status, c.reason = "measured", ""
        for c in self._rule_out(candidates, j):
            self._prune_below(candidates, c.index, "below a setting far slower than allowed")
        live = [c for c in candidates if c.status == "measured"]
        if not live:  # everything measured is ruled out: the default is always allowed
            assert j.reference is not None
            j.reference.status = "measured"
            live = [j.reference]
        feasible = [c for c in live
                    if self.allowed(j.estimates[c.index], j.ref, self.choice_margin(c.interpolated, j.z))]
        best = min(feasible or live, key=lambda c: j.estimates[c.index].cost)
        self._drop_costlier(candidates, j, live, best)
        if room.left <= 0:
            return Next(best, why="profiling budget spent")
        unvisited = [c for c in candidates if c.status == "unvisited"]
        if unvisited:
            nxt = next_unvisited(candidates, unvisited, best, j.estimates, self.guess)
            return Next(best, nxt, self.options.first_visit_steps)
        return self._race(candidates, j, [c for c in candidates if c.status == "measured"], best, room)

    def _drop_costlier(self, candidates: list[Candidate], j: Judgement, live: list[Candidate],
                       best: Candidate) -> None:
        """Drop what is clearly costlier than the cheapest setting that is surely allowed; where cost and time
        rise steeply below the best, drop every lower setting unvisited."""
        sure = [c for c in live if self.allowed(j.estimates[c.index], j.ref, j.z) is True]
        if not sure:
            return
        anchor = min(sure, key=lambda c: j.estimates[c.index].cost)
        a = j.estimates[anchor.index]
        for c in live:
            if c is best or c is anchor or c is j.reference and self.keeps_reference:
                continue
            e = j.estimates[c.index]
            gap = e.cost - a.cost
            if gap <= j.z * math.hypot(e.cost_se, a.cost_se):
                continue
            share = f"{gap / a.cost * 100:.1f} % " if a.cost > 0 else ""
            c.status, c.reason = "dropped", f"{share}costlier than {a.setting.label}"
            if gap > self.options.steep_rise * a.cost and self.options.ordered \
                    and steep_below(candidates, c, anchor, j.estimates, j.z):
                self._prune_below(candidates, c.index, f"below {c.stats.setting.label}, which is already far costlier")

    def _race(self, candidates: list[Candidate], j: Judgement, live: list[Candidate], best: Candidate,
              room: Room) -> Next:
        """Every candidate is visited or ruled out: end on the best once it is within tolerance of every survivor,
        else measure more of the best or a challenger, as :mod:`dtpo.tune.allocation` says. A constraint's policy
        may first place a setting between two candidates, or measure a setting whose verdict is open."""
        placed = self._placement(candidates, j, room)
        if placed is not None:
            return Next(best, placed=placed, steps=self.fair_look)
        b, z = j.estimates[best.index], j.z
        pending = [c for c in live if c is not best and
                   (b.cost - j.estimates[c.index].cost) + z * math.hypot(j.estimates[c.index].cost_se, b.cost_se)
                   > self.options.tolerance * b.cost]
        unsure = self._time_to_measure(live, j, best, room)
        if unsure is not None:
            return Next(best, unsure, self.options.revisit_steps)
        if not pending:
            return Next(best, why="best within tolerance of every survivor")
        # a contender still in the running gets a fair look of its own before the budget goes to near-ties
        thin = [c for c in pending if c.stats.steps < self.fair_look]
        if thin:
            pick = min(thin, key=lambda c: j.estimates[c.index].cost - z * j.estimates[c.index].cost_se)
            return Next(best, pick, self.options.revisit_steps)
        group = [best, *pending]
        contenders = {c.index: Contender(c.index, c.stats.steps, j.estimates[c.index].cost,
                                         j.estimates[c.index].cost_se * math.sqrt(max(c.stats.steps, 1)))
                      for c in group}
        left = max(room.left, 0)
        targets = ocba_targets(contenders[best.index], [contenders[c.index] for c in pending],
                               sum(c.stats.steps for c in group) + left, self.options.min_gap * b.cost)
        deficit = {c.index: targets[c.index] - c.stats.steps for c in group}
        pick = stay_if_nearly(group, deficit, self.options.race_stay_share, room.current)
        return Next(best, pick, min(max(self.options.revisit_steps, math.ceil(deficit[pick.index])),
                                    self.options.max_race_visit * self.options.revisit_steps))

    def _prune_below(self, candidates: list[Candidate], index: int, reason: str) -> None:
        if self.options.ordered:
            prune_below(candidates, index, reason)


def stay_if_nearly(group: list[Candidate], score: dict[int, float], share: float, current: GpuSetting) -> Candidate:
    """The candidate of ``group`` with the highest ``score``, or the one in force (``current``) when its score is at
    least ``share`` of that: staying put costs no warm-up."""
    pick = max(group, key=lambda c: score[c.index])
    here = next((c for c in group if c.stats.setting == current), None)
    return here if here is not None and score[here.index] >= share * score[pick.index] else pick
