"""What the power tuner does with its choice once a search ends: hold it as it is (:class:`HoldPolicy`), or first
settle a near-tie while training (:class:`RefineHold`).

Refining: where another setting is not clearly costlier than the choice (the profiling budget ran out before the two
could be told apart), the tuner trains at the two in turn, one hold block each, until one is clearly cheaper or
:attr:`~dtpo.tune.tuner_types.TunerOptions.refine_steps` have passed, then holds the cheaper.

Why: with a few steps per setting at 3 % noise, two settings within about 1 % of each other cannot be told apart
within the search's budget, and holding the wrong one costs that difference for the rest of the job. Training at the
two in turn costs at most half their difference over the refining steps, and every one of those steps trains the
model at a setting as good as the choice, within the noise. The steps spent at the runner-up are reported
(:attr:`HoldPolicy.refined`, ``PowerTuner.refined``) and counted wherever the job's cost is. ``MaxSlowdown``
searches keep their own check of an interpolated choice instead (:mod:`dtpo.tune.bound_search`), so they hold
plainly (:func:`dtpo.tune.policy.hold_policy`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dtpo.tune.setting import GpuSetting
from dtpo.tune.stats import Block
from dtpo.tune.tuner_types import Candidate, Judgement, Refine

__all__ = ["HoldPolicy", "HoldStep", "RefineHold"]

logger = logging.getLogger("dtpo.tune.tuner")


@dataclass(frozen=True)
class HoldStep:
    """What a hold policy decided after a hold block: the setting for the next block, whether it is now the choice
    (``settled``), and a line for the tuner's history."""

    setting: GpuSetting
    settled: bool = False
    note: str | None = None


class HoldPolicy:
    """Holds the search's choice as it is: nothing to settle while training."""

    def __init__(self) -> None:
        self.refined: dict[str, Any] | None = None  # what refining did (never here)

    @property
    def active(self) -> bool:
        """True while hold blocks go to this policy (never here)."""
        return False

    def start(self, best: Candidate, candidates: list[Candidate], judge: Callable[[], Judgement]) -> str | None:
        """The search ended on ``best``; returns a line for the history, or ``None``. ``judge`` gives the current
        judgement of the candidates (called only when needed)."""
        return None

    def feed(self, block: Block, current: GpuSetting, judge: Callable[[], Judgement]) -> HoldStep:
        """Account a hold block measured at ``current`` (only while :attr:`active`)."""
        return HoldStep(current)

    def stop(self) -> None:
        """A new search begins: whatever was being settled is given up."""


class RefineHold(HoldPolicy):
    """Settles a near-tie the search left by training at the choice and its runner-up in turn (see the module docs).

    Args:
        refine_steps: Most steps spent refining, at both settings together.
    """

    def __init__(self, refine_steps: int) -> None:
        super().__init__()
        self.refine_steps = refine_steps
        self._refine: Refine | None = None

    @property
    def active(self) -> bool:
        """True while a near-tie is being settled."""
        return self._refine is not None

    def start(self, best: Candidate, candidates: list[Candidate], judge: Callable[[], Judgement]) -> str | None:
        """Pick the runner-up not clearly costlier than ``best``, the cheapest such, and refine against it."""
        j = judge()
        if best.index not in j.estimates:
            return None
        b = j.estimates[best.index]
        close = [c for c in candidates if c is not best and c.status == "measured" and c.index in j.estimates
                 and j.estimates[c.index].cost - b.cost <= j.z * math.hypot(j.estimates[c.index].cost_se, b.cost_se)]
        if not close:
            return None
        runner = min(close, key=lambda c: j.estimates[c.index].cost)
        self._refine = Refine(best, runner, self.refine_steps)
        self.refined = {"against": runner.stats.setting.as_dict(), "steps_at_runner_up": 0, "steps": 0,
                        "outcome": "refining"}
        return (f"refining: {best.stats.setting.label} and {runner.stats.setting.label} are not yet told apart; "
                "training at each in turn")

    def feed(self, block: Block, current: GpuSetting, judge: Callable[[], Judgement]) -> HoldStep:
        """Account a hold block to the setting it ran at; hold the cheaper once the two are told apart (or the
        refining steps are spent), else switch to the other one."""
        refine = self._refine
        assert refine is not None and self.refined is not None
        here = refine.best if current == refine.best.stats.setting else refine.runner
        here.stats.blocks.append(block)
        refine.left -= block.steps
        self.refined["steps"] += block.steps
        if here is refine.runner:
            self.refined["steps_at_runner_up"] += block.steps
        j = judge()
        b, r = j.estimates[refine.best.index], j.estimates[refine.runner.index]
        told_apart = abs(b.cost - r.cost) > j.z * math.hypot(b.cost_se, r.cost_se)
        if not (told_apart or refine.left <= 0):
            return HoldStep((refine.runner if here is refine.best else refine.best).stats.setting)
        win = refine.best if b.cost <= r.cost else refine.runner
        self._refine = None
        if win is refine.runner:
            refine.best.status, refine.runner.status = "measured", "chosen"
        why = "told apart" if told_apart else "refining steps spent"
        self.refined["outcome"] = f"{win.stats.setting.label} held ({why})"
        logger.info("tuner: near-tie refined, holding %s", win.stats.setting.label)
        return HoldStep(win.stats.setting, settled=True, note=f"refined: {self.refined['outcome']}")

    def stop(self) -> None:
        """See :meth:`HoldPolicy.stop` (what refining did so far stays in :attr:`refined`)."""
        self._refine = None
