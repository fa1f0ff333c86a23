"""Settling a near-tie while training: after its search, the tuner holds its choice, and where another setting is not
clearly costlier (the profiling budget ran out before the two could be told apart), it trains at the two in turn,
one hold block each, until one is clearly cheaper or :attr:`~dtpo.tune.tuner_types.TunerOptions.refine_steps` have
passed, then holds the cheaper.

Why: with a few steps per setting at 3 % noise, two settings within about 1 % of each other cannot be told apart
within the search's budget, and holding the wrong one costs that difference for the rest of the job. Training at the
two in turn costs at most half their difference over the refining steps, and every one of those steps trains the
model at a setting as good as the choice, within the noise. The steps spent at the runner-up are reported
(``PowerTuner.refined``) and counted wherever the job's cost is. ``MaxSlowdown`` searches keep their own check of
an interpolated choice instead (:mod:`dtpo.tune.bound_search`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

from dtpo.tune.cost import CostMetric, MaxSlowdown
from dtpo.tune.setting import GpuSetting
from dtpo.tune.stats import Block
from dtpo.tune.tuner_types import Candidate, Judgement, Refine, TunerOptions

__all__ = ["HoldRefine"]

logger = logging.getLogger("dtpo.tune.tuner")


class HoldRefine:
    """Near-tie refining of :class:`~dtpo.tune.tuner.PowerTuner` while it holds (see the module docs); works on the
    tuner's own state (the names annotated below, set by the tuner)."""

    metric: CostMetric
    options: TunerOptions
    history: list[str]
    current: GpuSetting
    choice: GpuSetting | None
    refined: dict[str, Any] | None
    _refine: Refine | None
    _candidates: list[Candidate]
    _judgement: Callable[[], Judgement]

    def _start_refine(self, best: Candidate) -> None:
        """Pick the runner-up not clearly costlier than ``best``, the cheapest such, and refine against it."""
        if self.options.refine_steps <= 0 or isinstance(self.metric, MaxSlowdown):
            return
        j = self._judgement()
        if best.index not in j.estimates:
            return
        b = j.estimates[best.index]
        close = [c for c in self._candidates if c is not best and c.status == "measured" and c.index in j.estimates
                 and j.estimates[c.index].cost - b.cost <= j.z * math.hypot(j.estimates[c.index].cost_se, b.cost_se)]
        if not close:
            return
        runner = min(close, key=lambda c: j.estimates[c.index].cost)
        self._refine = Refine(best, runner, self.options.refine_steps)
        self.refined = {"against": runner.stats.setting.as_dict(), "steps_at_runner_up": 0, "steps": 0,
                        "outcome": "refining"}
        self.history.append(f"refining: {best.stats.setting.label} and {runner.stats.setting.label} are not yet "
                            "told apart; training at each in turn")

    def _refine_block(self, block: Block) -> None:
        """Account a hold block to the setting it ran at; hold the cheaper once the two are told apart (or the
        refining steps are spent), else switch to the other one."""
        refine = self._refine
        assert refine is not None and self.refined is not None
        here = refine.best if self.current == refine.best.stats.setting else refine.runner
        here.stats.blocks.append(block)
        refine.left -= block.steps
        self.refined["steps"] += block.steps
        if here is refine.runner:
            self.refined["steps_at_runner_up"] += block.steps
        j = self._judgement()
        b, r = j.estimates[refine.best.index], j.estimates[refine.runner.index]
        told_apart = abs(b.cost - r.cost) > j.z * math.hypot(b.cost_se, r.cost_se)
        if not (told_apart or refine.left <= 0):
            self.current = (refine.runner if here is refine.best else refine.best).stats.setting
            return
        win = refine.best if b.cost <= r.cost else refine.runner
        self._refine = None
        if win is refine.runner:
            refine.best.status, refine.runner.status = "measured", "chosen"
        why = "told apart" if told_apart else "refining steps spent"
        self.refined["outcome"] = f"{win.stats.setting.label} held ({why})"
        self.history.append(f"refined: {self.refined['outcome']}")
        logger.info("tuner: near-tie refined, holding %s", win.stats.setting.label)
        self.choice = self.current = win.stats.setting
