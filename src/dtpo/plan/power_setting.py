"""Power limits for the planner: how much slower a GPU computes, and how much less it draws, under a limit.

``dtpo plan --deadline/--budget`` weighs a lower power limit against the time it costs, with the same GPU model the
power optimiser and the simulator use (:mod:`dtpo.devices.physics.gpu_model`): for a limit ``L``, the compute time
of a micro-batch is multiplied by ``t(L) / t(base)`` and busy power by ``P(L) / P(base)``, where ``base`` is the
setting the calibration measured (the scenario's ``power.setting``, normally the maximum). Communication and the
optimizer step are left as they are (the network does not care, and the optimizer is bound by memory).

The model needs a workload: this job's own is unknown to it, so the constants of a traced one stand in for it,
``power.workload`` (default :data:`DEFAULT_PROXY_WORKLOAD`, a transformer fine-tuning job); every figure from it
says so. A GPU without a power model (only datasheet figures) is planned at its scenario setting only.
"""

from __future__ import annotations

from dataclasses import dataclass

from dtpo.core.errors import ConfigError
from dtpo.devices.physics.power_specs import find_power_spec

DEFAULT_PROXY_WORKLOAD = "bert_base_uncased/squad"
"""Traced workload whose fitted constants stand in for a planned job's response to power limits."""

LIMIT_STEP_W = 25.0
"""Spacing of the power limits searched (Zeus's and the power tuner's grid)."""


@dataclass(frozen=True)
class LimitEffect:
    """What one power limit does to a GPU's compute, against the calibration's setting.

    Attributes:
        power_limit_w: The limit.
        time_factor: Compute time at the limit over compute time at the calibration's setting.
        power_factor: Busy power at the limit over busy power at the calibration's setting.
    """

    power_limit_w: float
    time_factor: float
    power_factor: float


@dataclass(frozen=True)
class LimitModel:
    """The limits a planned GPU can be set to, and what each one does.

    Attributes:
        gpu: The power model's GPU name.
        workload: The traced workload standing in for the job.
        effects: One per limit, from the maximum down to the minimum, in :data:`LIMIT_STEP_W` steps.
        note: Where the figures come from, in words.
    """

    gpu: str
    workload: str
    effects: tuple[LimitEffect, ...]
    note: str


def limit_model(gpu: str, workload: str | None = None, base_limit_w: float | None = None) -> LimitModel | None:
    """The power limits of ``gpu`` and their effect relative to ``base_limit_w`` (``None``: the maximum), from
    the GPU model with ``workload``'s constants (default :data:`DEFAULT_PROXY_WORKLOAD`); ``None`` for a GPU
    without a power model.

    Raises:
        ConfigError: ``workload`` is not a traced workload.
    """
    try:
        spec = find_power_spec(gpu)
    except ConfigError:
        return None
    from dtpo.devices.physics.gpu_model import load_model  # numpy and the traces: only when limits are weighed

    proxy = workload or DEFAULT_PROXY_WORKLOAD
    model = load_model(spec.name, proxy)
    base = model.at(base_limit_w)
    points = []
    limit = spec.max_power_w
    while limit >= spec.min_power_w - 1e-9:
        points.append(model.at(limit))
        limit -= LIMIT_STEP_W
    effects = tuple(LimitEffect(p.power_limit_w, p.time_per_sample_s / base.time_per_sample_s,
                                p.power_w / base.power_w) for p in points)
    kind = "calibrated on its measured trace" if model.calibrated else "parametric"
    note = (f"power limits: the {spec.name} model ({kind}) with {model.workload}'s constants standing in for this "
            f"job's (power.workload); compute slows and busy power falls as that model says, communication "
            f"and the optimizer step do not change")
    return LimitModel(spec.name, model.workload, effects, note)
