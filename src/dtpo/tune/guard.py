"""The convergence guard: a setting that changes numerics is accepted only while training stays on track.

Two checks, both in the record with their figures whatever they decide:

1. **Gradient agreement, before the setting trains a single step.** On a probe batch, with the same weights,
   the candidate's gradient (its precision's forward and backward, its compression's all-reduce) must have a
   cosine similarity of at least ``min_cosine`` with the exact gradient (float32, uncompressed). A
   compression with error feedback is probed over ``feedback_passes`` passes on the same batch and judged on
   their mean: error feedback re-sends what one step dropped, so the mean approaches the exact gradient as
   passes add up (a rank-1 PowerSGD step alone may keep only half of a gradient's norm and still train
   well), while the same compression without error feedback stays where its first pass was.
2. **Loss, while it is profiled.** Over the candidate's profiling steps, the mean loss must not rise above
   the mean loss of the steps just before it by more than ``loss_rise`` (relative) plus ``z`` standard errors
   of the difference. Losses fall as training goes on, so a candidate is held to the loss it inherited.

The probe also times the candidate: one that is ``screen_slowdown`` times slower than the exact probe is not
worth profiling steps (no precision or compression lowers power enough to pay for halving throughput).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class GuardOptions:
    """The guard's thresholds.

    Attributes:
        min_cosine: Least cosine similarity of a candidate's probe gradient with the exact one.
        loss_rise: Relative rise of the mean loss over a candidate's profiling steps that rejects it.
        z: Standard errors of the loss difference a rise must also exceed.
        feedback_passes: Probe passes averaged for a compression with error feedback.
        screen_slowdown: A candidate whose probe pass takes this many times the exact probe's is not profiled.
        min_loss_steps: Fewest profiling steps before the loss check may reject.
    """

    min_cosine: float = 0.8
    loss_rise: float = 0.05
    z: float = 2.0
    feedback_passes: int = 4
    screen_slowdown: float = 2.0
    min_loss_steps: int = 2


@dataclass(frozen=True)
class Verdict:
    """What the guard made of one setting.

    Attributes:
        accepted: Whether the setting may train.
        reason: Why, in words (empty when nothing was checked).
        cosine: Cosine similarity of its probe gradient with the exact one (``None``: not probed).
        probe_slowdown: Its probe pass time over the exact probe's (``None``: not probed).
        loss_before: Mean loss of the steps before it (``None``: loss not checked).
        loss_during: Mean loss of its profiling steps.
    """

    accepted: bool
    reason: str = ""
    cosine: float | None = None
    probe_slowdown: float | None = None
    loss_before: float | None = None
    loss_during: float | None = None

    def as_dict(self) -> dict[str, Any]:
        """Plain values for JSON."""
        return {"accepted": self.accepted, "reason": self.reason, "cosine": self.cosine,
                "probe_slowdown": self.probe_slowdown, "loss_before": self.loss_before,
                "loss_during": self.loss_during}


def cosine_similarity(a: torch.Tensor, b: torch.Tensor, group: Any = None, sharded: bool = False) -> float:
    """Cosine similarity of two flattened gradients; with ``sharded`` each rank holds one shard of each and the
    three sums are all-reduced over ``group`` first. ``nan`` when either is zero or not finite."""
    sums = torch.stack([torch.dot(a.double(), b.double()), torch.dot(a.double(), a.double()),
                        torch.dot(b.double(), b.double())])
    if sharded:
        import torch.distributed as dist

        dist.all_reduce(sums, group=group)
    dot, aa, bb = (float(x) for x in sums.tolist())
    if not (math.isfinite(dot) and aa > 0 and bb > 0 and math.isfinite(aa) and math.isfinite(bb)):
        return float("nan")
    return max(-1.0, min(1.0, dot / math.sqrt(aa * bb)))


def judge_probe(cosine: float, finite: bool, slowdown: float, options: GuardOptions) -> Verdict:
    """The verdict on a probed setting from its gradient's cosine with the exact one and its relative time."""
    if not finite or math.isnan(cosine):
        return Verdict(False, "its probe gradient is not finite (overflow)", None, slowdown)
    if cosine < options.min_cosine:
        return Verdict(False, f"gradient cosine {cosine:.3f} with the exact gradient is below {options.min_cosine:g}",
                       cosine, slowdown)
    if slowdown >= options.screen_slowdown:
        return Verdict(False, f"its probe ran {slowdown:.1f}x slower than the exact one: not worth profiling",
                       cosine, slowdown)
    return Verdict(True, f"gradient cosine {cosine:.3f}", cosine, slowdown)


def _mean_se(values: list[float]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, abs(mean)  # one value says nothing about its own spread: an interval as wide as itself
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)


def judge_loss(before: list[float], during: list[float], options: GuardOptions) -> Verdict | None:
    """A rejection when the loss over a candidate's steps (``during``) rose clearly above the loss just before
    it (``before``); ``None`` while there is too little to judge or nothing wrong. Non-finite losses reject."""
    finite_during = [v for v in during if math.isfinite(v)]
    if len(finite_during) < len(during):
        return Verdict(False, "the loss became NaN or infinite", loss_during=float("nan"))
    finite_before = [v for v in before if math.isfinite(v)]
    if len(finite_during) < options.min_loss_steps or not finite_before:
        return None
    b, b_se = _mean_se(finite_before)
    d, d_se = _mean_se(finite_during)
    if d - b - options.loss_rise * abs(b) > options.z * math.hypot(b_se, d_se):
        return Verdict(False, f"the loss rose from {b:.4g} to {d:.4g} while it trained", loss_before=b,
                       loss_during=d)
    return None
