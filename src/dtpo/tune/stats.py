"""What a tuner knows about each setting: measured blocks of steps, per-sample figures and their intervals.

A *block* is a few consecutive steps at one setting with their summed time, samples and energy (all GPUs).
A setting's time and energy per sample are ratio estimates over its blocks (sum over sum). Their standard
errors come from the scatter of the blocks, pooled over all settings as a relative spread per step
(:class:`NoiseEstimate`): noise is a property of the job and the meters, much the same at every setting, so
pooling gives a usable interval after a handful of steps where a setting's own few blocks would not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from dtpo.tune.cost import CostContext, CostMetric
from dtpo.tune.setting import GpuSetting

PRIOR_CV = 0.05  # relative spread of one step's cost before anything is measured (conservative)
PRIOR_WEIGHT_STEPS = 8  # how many steps' worth of evidence the prior counts as


@dataclass(frozen=True)
class Block:
    """Consecutive steps at one setting.

    Attributes:
        steps: Optimizer steps.
        samples: Samples trained (all GPUs).
        time_s: Wall time.
        energy_j: Energy of all GPUs.
    """

    steps: int
    samples: int
    time_s: float
    energy_j: float

    @property
    def power_w(self) -> float:
        """Average power over the block (all GPUs)."""
        return self.energy_j / self.time_s if self.time_s > 0 else 0.0


@dataclass
class SettingStats:
    """The measured blocks of one setting.

    Attributes:
        setting: The setting.
        blocks: Its measured (settled) blocks.
        warmup_steps: Steps spent warming up at it (not measured).
    """

    setting: GpuSetting
    blocks: list[Block] = field(default_factory=list)
    warmup_steps: int = 0

    @property
    def steps(self) -> int:
        """Measured steps."""
        return sum(b.steps for b in self.blocks)

    @property
    def samples(self) -> int:
        """Measured samples."""
        return sum(b.samples for b in self.blocks)

    @property
    def time_s(self) -> float:
        """Measured time."""
        return sum(b.time_s for b in self.blocks)

    @property
    def energy_j(self) -> float:
        """Measured energy."""
        return sum(b.energy_j for b in self.blocks)

    @property
    def measured(self) -> bool:
        """True once it has at least one block."""
        return bool(self.blocks)

    @property
    def time_per_sample_s(self) -> float:
        """Seconds per sample."""
        return self.time_s / self.samples

    @property
    def energy_per_sample_j(self) -> float:
        """Joules per sample."""
        return self.energy_j / self.samples

    def cost(self, metric: CostMetric, context: CostContext) -> float:
        """The metric's cost per sample at this setting."""
        return metric.per_sample(self.time_per_sample_s, self.energy_per_sample_j, context)

    def block_costs(self, metric: CostMetric, context: CostContext) -> list[tuple[float, int]]:
        """Each block's cost per sample with its step count."""
        a, b = metric.weights(context)
        return [((a * blk.time_s + b * blk.energy_j) / blk.samples, blk.steps) for blk in self.blocks if blk.samples]

    def block_times(self) -> list[tuple[float, int]]:
        """Each block's time per sample with its step count."""
        return [(blk.time_s / blk.samples, blk.steps) for blk in self.blocks if blk.samples]

    def as_row(self) -> dict[str, Any]:
        """The setting's fields and its blocks as ``[steps, samples, time_s, energy_j]`` lists (for JSON: saved
        profiles, checkpoints)."""
        return {**self.setting.as_dict(), "blocks": [[b.steps, b.samples, b.time_s, b.energy_j] for b in self.blocks]}

    @classmethod
    def from_row(cls, row: dict[str, Any], setting_type: Any = GpuSetting) -> SettingStats:
        """Read what :meth:`as_row` wrote; ``setting_type`` has ``from_dict`` (``GpuSetting``, ``JobSetting``).

        Raises:
            ValueError: No block, or a block with no steps, samples or time, or negative energy.
            KeyError, TypeError, IndexError: A malformed row.
        """
        setting = setting_type.from_dict(row)
        blocks = [Block(int(b[0]), int(b[1]), float(b[2]), float(b[3])) for b in row["blocks"]]
        if not blocks or any(b.steps <= 0 or b.samples <= 0 or b.time_s <= 0 or b.energy_j < 0 for b in blocks):
            raise ValueError(f"setting {setting.label} has no valid measurements")
        return cls(setting, blocks)


def _pooled_cv(groups: list[list[tuple[float, int]]], prior_cv: float = PRIOR_CV) -> tuple[float, int]:
    """Relative spread per step pooled over groups of (value per sample, steps) blocks, and its degrees of
    freedom (``prior_cv`` where there are none). Each block's squared relative deviation from its group's mean
    counts with its step count."""
    weighted = 0.0
    dof = 0
    for blocks in groups:
        if len(blocks) < 2:
            continue
        total_steps = sum(s for _, s in blocks)
        mean = sum(v * s for v, s in blocks) / total_steps
        if mean <= 0:
            continue
        weighted += sum(s * (v / mean - 1.0) ** 2 for v, s in blocks)
        dof += len(blocks) - 1
    return (math.sqrt(weighted / dof) if dof else prior_cv), dof


@dataclass(frozen=True)
class NoiseEstimate:
    """Relative spread of one step's cost and time, pooled over every measured setting.

    Attributes:
        cost_cv: Relative standard deviation of one step's cost.
        time_cv: Relative standard deviation of one step's time.
        dof: Degrees of freedom behind the estimate (blocks minus settings).
    """

    cost_cv: float
    time_cv: float
    dof: int

    @classmethod
    def pooled(cls, stats: list[SettingStats], metric: CostMetric, context: CostContext,
               prior_cv: float = PRIOR_CV, prior_steps: float = PRIOR_WEIGHT_STEPS) -> NoiseEstimate:
        """Pool the blocks of ``stats``; a conservative prior (a spread of ``prior_cv`` counted as ``prior_steps``
        steps' worth of evidence) weighs in while there are few."""
        cost_cv, dof = _pooled_cv([s.block_costs(metric, context) for s in stats], prior_cv)
        time_cv, _ = _pooled_cv([s.block_times() for s in stats], prior_cv)
        # Shrink towards the prior while the evidence is thin, so a lucky first few blocks don't make every
        # interval look tight.
        w = prior_steps
        cost_cv = math.sqrt((dof * cost_cv**2 + w * prior_cv**2) / (dof + w))
        time_cv = math.sqrt((dof * time_cv**2 + w * prior_cv**2) / (dof + w))
        return cls(cost_cv, time_cv, dof)


def t_quantile(dof: int, z: float) -> float:
    """``z`` widened for few degrees of freedom (a Student-t correction: z * (1 + (z^2 + 1) / (4 dof)))."""
    if dof <= 0:
        return z * 3.0
    return z * (1.0 + (z * z + 1.0) / (4.0 * dof))


@dataclass(frozen=True)
class Estimate:
    """A setting's figures with standard errors.

    Attributes:
        setting: The setting.
        steps: Measured steps.
        cost: Cost per sample.
        cost_se: Standard error of ``cost``.
        time_per_sample_s: Seconds per sample.
        time_se: Standard error of ``time_per_sample_s``.
        energy_per_sample_j: Joules per sample.
    """

    setting: GpuSetting
    steps: int
    cost: float
    cost_se: float
    time_per_sample_s: float
    time_se: float
    energy_per_sample_j: float


def estimate(stats: SettingStats, noise: NoiseEstimate, metric: CostMetric, context: CostContext) -> Estimate:
    """``stats`` as figures with standard errors from the pooled noise."""
    steps = max(stats.steps, 1)
    cost = stats.cost(metric, context)
    time = stats.time_per_sample_s
    return Estimate(stats.setting, stats.steps, cost, abs(cost) * noise.cost_cv / math.sqrt(steps), time,
                    time * noise.time_cv / math.sqrt(steps), stats.energy_per_sample_j)
