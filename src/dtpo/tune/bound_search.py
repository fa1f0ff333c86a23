"""The ``MaxSlowdown`` part of the power tuner's search (:class:`~dtpo.tune.tuner.PowerTuner` mixes it in): moving
the choice off the candidates towards the allowed slowdown, and checking an interpolated choice while it is held.

Under ``MaxSlowdown(F)`` on an ordered knob that can name settings between its candidates (whole-watt limits,
supported clocks), the race may place one setting between the cheapest candidate surely allowed and the next one
down and measure it (:meth:`BoundSearch._toward_bound`); when the search ends, its choice moves to the setting
between it and the next setting down where their chord reaches the bound less its margin
(:meth:`BoundSearch._interpolate_choice`). That setting has no profiling steps of its own: the first hold block
measures it, and if it proves clearly too slow the setting above it is held instead
(:meth:`BoundSearch._verify_held`). While the verdict on a setting near the bound is open, its time or the
default's is measured, whichever narrows their comparison most for what a step costs
(:meth:`BoundSearch._measure_time`). The arithmetic of all of this is in :mod:`dtpo.tune.boundary`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from dtpo.tune.boundary import allowed, interpolate_between, place_between, time_information
from dtpo.tune.cost import CostMetric, MaxSlowdown
from dtpo.tune.knob import Between
from dtpo.tune.setting import GpuSetting
from dtpo.tune.stats import Block, NoiseEstimate, SettingStats
from dtpo.tune.tuner_types import Candidate, Chord, Judgement, TunerOptions

__all__ = ["BoundSearch"]

logger = logging.getLogger("dtpo.tune.tuner")


class BoundSearch:
    """``MaxSlowdown`` moves of :class:`~dtpo.tune.tuner.PowerTuner`: it works on the tuner's own state (the names
    annotated below, set by the tuner) and calls back into its search (``_judgement``, ``_revisit``, ``_hold``...)."""

    metric: CostMetric
    options: TunerOptions
    betweens: list[Between | None]
    history: list[str]
    current: GpuSetting
    steps_back: int
    _candidates: list[Candidate]
    _dimension: int
    _budget: int
    _spent: int
    _boundary_left: int
    _fair_look: int
    _judgement: Callable[[], Judgement]
    _stats_of: Callable[[GpuSetting], SettingStats]
    _noise: Callable[[], NoiseEstimate]
    _warmup_steps: Callable[[], int]
    _revisit: Callable[[Candidate, int, Candidate], None]
    _stay_if_nearly: Callable[[list[Candidate], dict[int, float], float], Candidate]
    _hold: Callable[..., None]

    def _can_interpolate(self) -> bool:
        """Whether this search's choice may end between two settings (``TunerOptions.interpolate_choice``)."""
        return (isinstance(self.metric, MaxSlowdown) and self.options.ordered and self.options.interpolate_choice
                and self.betweens[self._dimension] is not None)

    def _interpolate_choice(self, best: Candidate) -> Candidate:
        """``MaxSlowdown``: the setting between ``best`` and the next setting down where their chord reaches the
        bound less its margin (:func:`~dtpo.tune.boundary.interpolate_between`), as a new candidate with no steps
        of its own; ``best`` itself where there is none."""
        if not self._can_interpolate():
            return best
        j = self._judgement()
        between = self.betweens[self._dimension]
        assert between is not None and isinstance(self.metric, MaxSlowdown)
        found = interpolate_between(self.metric, self._candidates, best, j, between,
                                    self.options.placed_z_share * j.z)
        if found is None:
            return best
        setting, chord = found
        return self._insert_between(setting, chord, f"interpolated between {chord.fast.stats.setting.label} and "
                                                    f"{chord.slow.stats.setting.label} towards the allowed slowdown "
                                                    "(not profiled; measured while held)")

    def _insert_between(self, setting: GpuSetting, chord: Chord, reason: str) -> Candidate:
        """A new candidate for ``setting``, in its place right below ``chord.fast``."""
        new = Candidate(chord.fast.index + 1, self._stats_of(setting), chord=chord, reason=reason)
        self._candidates.insert(new.index, new)
        for i, c in enumerate(self._candidates):
            c.index = i
        self.history.append(f"{setting.label}: {reason}")
        return new

    def _can_place(self) -> bool:
        """Whether this search may still place a setting between two candidates (:mod:`dtpo.tune.boundary`)."""
        return (isinstance(self.metric, MaxSlowdown) and self.options.ordered and self._boundary_left > 0
                and self.betweens[self._dimension] is not None)

    def _toward_bound(self, j: Judgement, best: Candidate) -> bool:
        """``MaxSlowdown``: visit a setting between the cheapest one surely allowed and the next one down (when that
        one is cheaper and not surely allowed: see :func:`~dtpo.tune.boundary.boundary_pair`), where the time
        reaches the bound less the margin its verdict will need (:mod:`dtpo.tune.boundary`). The next one down
        stays in the race: if its own figures show it allowed after all, it is the cheaper choice. Returns
        whether a visit began."""
        planned = self._fair_look
        left = self._budget - self._spent - self._warmup_steps()
        if not self._can_place() or j.ref is None or left < planned:
            return False
        assert isinstance(self.metric, MaxSlowdown)
        between = self.betweens[self._dimension]
        assert between is not None
        placement = place_between(self.metric, self._candidates, j, between, self.options.placed_z_share * j.z,
                                  self._noise().time_cv, planned, left < planned + self.options.revisit_steps,
                                  self.options.min_boundary_fraction)
        if placement is None:
            return False
        setting, chord = placement
        placed = self._insert_between(setting, chord, f"between {chord.fast.stats.setting.label} and "
                                                      f"{chord.slow.stats.setting.label}, towards the allowed slowdown")
        self._boundary_left -= 1
        self._revisit(placed, planned, best)
        return True

    def _measure_time(self, j: Judgement, unsure: Candidate, best: Candidate) -> None:
        """``MaxSlowdown``: one more visit to ``unsure`` or to the default, whichever narrows the interval of
        their time difference most per unit of cost (a step at the expensive default costs the most)."""
        assert j.reference is not None and isinstance(self.metric, MaxSlowdown)
        pair = [unsure] if unsure is j.reference else [unsure, j.reference]
        value = time_information(self.metric, j, pair, j.estimates[best.index].cost, self.options.min_step_cost,
                                 self.options.reference_weight)
        pick = self._stay_if_nearly(pair, value, 0.8)
        self._revisit(pick, self.options.revisit_steps, best)

    def _verify_held(self, block: Block) -> bool:
        """An interpolated choice (no profiling steps of its own) is measured while it is held, until it has had a
        fair look; once its figures, pooled with its chord, show it clearly too slow for ``MaxSlowdown``, the setting
        above it is held instead. Returns whether the block went to that check."""
        held = next((c for c in self._candidates if c.stats.setting == self.current and c.interpolated
                     and c.status == "chosen"), None)
        if held is None or held.stats.steps >= self._fair_look:
            return False
        held.stats.blocks.append(block)
        j = self._judgement()
        if held.index in j.estimates and allowed(self.metric, j.estimates[held.index], j.ref, j.z) is False:
            assert held.chord is not None
            above = held.chord.fast
            held.status, held.reason = "infeasible", "slower than the allowed slowdown while held"
            above.status = "chosen"
            self.history.append(f"{held.stats.setting.label}: too slow while held; back to {above.stats.setting.label}")
            logger.info("tuner: %s proved too slow while held; holding %s", held.stats.setting.label,
                        above.stats.setting.label)
            self.steps_back += 1
            self._hold(above.stats.setting, "the interpolated choice proved too slow", searched=False)
        return True
