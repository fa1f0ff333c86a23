"""A physical prior for the search order: which candidate the parametric GPU model predicts to be best.

After the default setting is measured, its average power per GPU pins the workload's activity factor ``u``
of :class:`dtpo.devices.physics.gpu_model.ParametricModel` (with the memory-bound share ``m`` at a typical
0.3); the model then predicts time and energy at every candidate relative to the default, and the cheapest
feasible prediction is visited next. The guess only orders the search: every setting that could still win
is measured before a choice is made, so a poor guess costs steps, never the result.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from dtpo.core.errors import ConfigError
from dtpo.devices.base import KnobLimits
from dtpo.devices.physics.gpu_model import ParametricModel
from dtpo.devices.physics.power_specs import PowerSpec
from dtpo.tune.cost import CostContext, CostMetric
from dtpo.tune.setting import GpuSetting
from dtpo.tune.stats import Estimate

ASSUMED_MEMORY_SHARE = 0.3
ACTIVITIES = np.round(np.arange(0.10, 2.0 + 1e-9, 0.02), 4)


def within_limits(spec: PowerSpec, limits: KnobLimits | None) -> PowerSpec:
    """``spec`` with the power-limit range and clocks a real GPU reports (a PCIe card of a model whose figures
    are the SXM part's, an admin's narrower range), so a model of it only proposes settings it accepts."""
    if limits is None:
        return spec
    changes: dict[str, object] = {"max_power_w": limits.max_power_limit_w, "min_power_w": limits.min_power_limit_w}
    if limits.sm_clocks_mhz:
        clocks = tuple(sorted(limits.sm_clocks_mhz))
        changes.update(sm_clocks_mhz=clocks, min_sm_mhz=clocks[0], max_sm_mhz=clocks[-1])
    return dataclasses.replace(spec, **changes)  # type: ignore[arg-type]


def model_matching(spec: PowerSpec, default: GpuSetting, power_per_gpu_w: float) -> ParametricModel:
    """The parametric model of ``spec`` (memory share 0.3) whose average power at ``default`` is closest to the
    measured ``power_per_gpu_w``."""
    best: tuple[float, ParametricModel] | None = None
    for u in ACTIVITIES:
        model = ParametricModel(spec, "tuned job", 1, float(u), ASSUMED_MEMORY_SHARE, 1.0)
        power = model.at(default.power_limit_w, default.sm_clock_mhz).power_w
        miss = abs(power - power_per_gpu_w)
        if best is None or miss < best[0]:
            best = (miss, model)
    assert best is not None
    return best[1]


def model_guess(spec: PowerSpec, metric: CostMetric, context: CostContext
                ) -> Callable[[list[GpuSetting], Estimate], int]:
    """A guess function for :class:`dtpo.tune.tuner.PowerTuner`: index of the predicted best candidate."""

    def guess(settings: list[GpuSetting], default: Estimate) -> int:
        power = default.energy_per_sample_j / default.time_per_sample_s / max(context.gpus, 1)
        model = model_matching(spec, settings[0], power)
        base = model.at(settings[0].power_limit_w, settings[0].sm_clock_mhz)
        best_index, best_cost = 0, float("inf")
        for i, s in enumerate(settings):
            try:
                point = model.at(s.power_limit_w, s.sm_clock_mhz)
            except ConfigError:
                continue
            t = default.time_per_sample_s * point.time_per_sample_s / base.time_per_sample_s
            e = default.energy_per_sample_j * point.energy_per_sample_j / base.energy_per_sample_j
            if not metric.feasible(t, default.time_per_sample_s):
                continue
            cost = metric.per_sample(t, e, context)
            if cost < best_cost:
                best_index, best_cost = i, cost
        return best_index

    return guess
