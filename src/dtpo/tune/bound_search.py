"""The search policy for ``MaxSlowdown``: the race of :mod:`dtpo.tune.race`, where a setting must also be fast
enough, and the choice is moved off the candidates towards the allowed slowdown.

A setting is allowed when its time per sample is at most ``F`` times the default's
(:func:`~dtpo.tune.boundary.allowed`); measured settings clearly too slow are ruled out, and below one far too slow
after a rise nothing is visited. While
the verdict on the best, or a cheaper setting, is open, its time or the default's is measured, whichever narrows
their comparison most for what a step costs (:meth:`BoundPolicy._time_to_measure`).

On an ordered knob that can name settings between its candidates (whole-watt limits, supported clocks), the race
may place one setting between the cheapest candidate surely allowed and the next one down and measure it
(:meth:`BoundPolicy._placement`); when the search ends, its choice moves to the setting between it and the next
setting down where their chord reaches the bound less its margin (:meth:`BoundPolicy.interpolate`). That setting has
no profiling steps of its own: the first hold blocks measure it (:meth:`BoundPolicy.held_to_check`), and if it
proves clearly too slow the setting above it is held instead (:meth:`BoundPolicy.step_back`). The arithmetic of
all of this is in :mod:`dtpo.tune.boundary`.
"""

from __future__ import annotations

from dtpo.tune.boundary import (
    allowed,
    first_to_settle,
    interpolate_between,
    place_between,
    rule_out_too_slow,
    time_information,
)
from dtpo.tune.cost import MaxSlowdown
from dtpo.tune.knob import Between
from dtpo.tune.race import Guess, RacePolicy, stay_if_nearly
from dtpo.tune.setting import GpuSetting
from dtpo.tune.stats import Estimate
from dtpo.tune.tuner_types import Candidate, Judgement, Placement, Room, TunerOptions

__all__ = ["BoundPolicy"]


class BoundPolicy(RacePolicy):
    """Decides a ``MaxSlowdown`` search (see the module docs): the plain race with the bound's hooks filled in.

    Args:
        metric: The slowdown bound.
        options: Search parameters (``boundary_points``, ``interpolate_choice``, ``placed_z_share``,
            ``grid_z_share``, ``min_step_cost``, ``reference_weight``, ``min_boundary_fraction``, ``far_too_slow``,
            ``time_stay_share`` are this policy's).
        guess: As for :class:`~dtpo.tune.race.RacePolicy`.
    """

    quick_looks = False  # a setting costlier than the best may still be the cheapest one fast enough
    refines_near_ties = False  # the choice is checked against the bound while held instead
    keeps_reference = True  # the default is the bound's reference

    def __init__(self, metric: MaxSlowdown, options: TunerOptions, guess: Guess | None = None) -> None:
        super().__init__(metric, options, guess)
        self.bound = metric
        self.boundary_left = 0  # settings this knob's search may still place between two candidates

    def start_knob(self, between: Between | None) -> None:
        """See :meth:`RacePolicy.start_knob`; also allows ``boundary_points`` placements for this knob."""
        super().start_knob(between)
        self.boundary_left = self.options.boundary_points

    def allowed(self, est: Estimate, ref: Estimate | None, z: float) -> bool | None:
        """At most ``F`` times the default's time, ``z`` standard errors deciding
        (:func:`~dtpo.tune.boundary.allowed`)."""
        return allowed(self.bound, est, ref, z)

    def choice_margin(self, placed: bool, z: float) -> float:
        """Standard errors by which a setting must be inside the bound to be the choice: a setting placed near the
        bound on purpose needs ``placed_z_share`` of ``z``; a candidate where the choice can be interpolated towards
        the bound instead needs ``grid_z_share``; any other candidate none."""
        if placed:
            return self.options.placed_z_share * z
        return self.options.grid_z_share * z if self.can_interpolate else 0.0

    @property
    def can_interpolate(self) -> bool:
        """Whether this search's choice may end between two settings (``TunerOptions.interpolate_choice``)."""
        return self.options.ordered and self.options.interpolate_choice and self.between is not None

    @property
    def can_place(self) -> bool:
        """Whether this search may still place a setting between two candidates (:mod:`dtpo.tune.boundary`)."""
        return self.options.ordered and self.boundary_left > 0 and self.between is not None

    def interpolate(self, candidates: list[Candidate], best: Candidate, j: Judgement) -> Placement | None:
        """The setting between ``best`` and the next setting down where their chord reaches the bound less its
        margin (:func:`~dtpo.tune.boundary.interpolate_between`), to hold with no steps of its own; ``None`` where
        there is none."""
        if not self.can_interpolate:
            return None
        assert self.between is not None
        found = interpolate_between(self.bound, candidates, best, j, self.between, self.options.placed_z_share * j.z)
        if found is None:
            return None
        setting, chord = found
        return Placement(setting, chord, f"interpolated between {chord.fast.stats.setting.label} and "
                                         f"{chord.slow.stats.setting.label} towards the allowed slowdown "
                                         "(not profiled; measured while held)")

    def held_to_check(self, candidates: list[Candidate], current: GpuSetting) -> Candidate | None:
        """The held interpolated choice (no profiling steps of its own) while it has not had a fair look: the hold
        blocks are its measurements until then."""
        held = next((c for c in candidates if c.stats.setting == current and c.interpolated and c.status == "chosen"),
                    None)
        return None if held is None or held.stats.steps >= self.fair_look else held

    def step_back(self, held: Candidate, j: Judgement) -> Candidate | None:
        """Once ``held``'s figures, pooled with its chord, show it clearly too slow, the setting above it, marked
        chosen (``held`` infeasible); ``None`` while it may be fast enough."""
        if held.index not in j.estimates or allowed(self.bound, j.estimates[held.index], j.ref, j.z) is not False:
            return None
        assert held.chord is not None
        above = held.chord.fast
        held.status, held.reason = "infeasible", "slower than the allowed slowdown while held"
        above.status = "chosen"
        return above

    def _rule_out(self, candidates: list[Candidate], j: Judgement) -> list[Candidate]:
        """Clearly too slow goes; returns those far too slow after a rise
        (:func:`~dtpo.tune.boundary.rule_out_too_slow`)."""
        return rule_out_too_slow(self.bound, candidates, j, self.options.far_too_slow)

    def _placement(self, candidates: list[Candidate], j: Judgement, room: Room) -> Placement | None:
        """A setting between the cheapest one surely allowed and the next one down (when that one is cheaper and not
        surely allowed: see :func:`~dtpo.tune.boundary.boundary_pair`), where the time reaches the bound less the
        margin its verdict will need (:mod:`dtpo.tune.boundary`). The next one down stays in the race: if its own
        figures show it allowed after all, it is the cheaper choice."""
        planned = self.fair_look
        left = room.left - room.warmup
        if not self.can_place or j.ref is None or left < planned:
            return None
        assert self.between is not None
        placement = place_between(self.bound, candidates, j, self.between, self.options.placed_z_share * j.z,
                                  j.time_cv, planned, left < planned + self.options.revisit_steps,
                                  self.options.min_boundary_fraction)
        if placement is None:
            return None
        setting, chord = placement
        self.boundary_left -= 1
        return Placement(setting, chord, f"between {chord.fast.stats.setting.label} and "
                                         f"{chord.slow.stats.setting.label}, towards the allowed slowdown")

    def _time_to_measure(self, live: list[Candidate], j: Judgement, best: Candidate,
                         room: Room) -> Candidate | None:
        """While the best, or a cheaper setting, may be too slow: it or the default, whichever narrows the interval
        of their time difference most per unit of cost (a step at the expensive default costs the most)."""
        b = j.estimates[best.index]
        unsure = [c for c in live if (c is best or j.estimates[c.index].cost < b.cost)
                  and self.allowed(j.estimates[c.index], j.ref, j.z) is None]
        if not unsure or j.reference is None:
            return None
        assert j.ref is not None
        first = first_to_settle(unsure, j.estimates, j.ref.steps, self.fair_look, self.can_place)
        pair = [first] if first is j.reference else [first, j.reference]
        value = time_information(self.bound, j, pair, b.cost, self.options.min_step_cost,
                                 self.options.reference_weight)
        return stay_if_nearly(pair, value, self.options.time_stay_share, room.current)
