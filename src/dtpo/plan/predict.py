"""The planner: a scenario's step time, throughput, scaling efficiency, energy and cost at each GPU count.

It puts the pieces together: the fabric from the link catalogue (:mod:`dtpo.plan.interconnect`), compute from
the calibration (:mod:`dtpo.plan.calibration`), the step from the step model (:mod:`dtpo.plan.step_model`),
energy and cost from :mod:`dtpo.plan.power_at_scale`. Every prediction says which term limits it and
whether it lies outside what the calibration covers (more GPUs than were measured, or nodes joined by a link
that was not measured: its figures are the catalogue's).

:func:`cheapest` answers ``--deadline`` and ``--budget``: across the scenario's GPU counts and every
inter-node link of the catalogue (the scenario's own first), the cheapest configuration that finishes the
work in time, or the fastest one within the budget.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from dtpo.core.errors import ConfigError
from dtpo.plan.calibration import (
    Calibration,
    calibrate,
    micro_batch_s,
    modelled_optimizer_s,
    sensitivity_shares,
    with_fixed_part,
    with_framework_term,
)
from dtpo.plan.interconnect import CATALOGUE, find_link
from dtpo.plan.power_at_scale import Cost, StepEnergy, gpu_power, price, scenario_step_energy
from dtpo.plan.power_setting import LimitEffect, limit_model
from dtpo.plan.scenario import Scenario
from dtpo.plan.step_model import Fabric, StepTime, step_time

_COUNTS = re.compile(r", \d+ nodes?$")  # "..., 4 nodes": the same assumption at every GPU count

LIMIT_SHARE = 0.10
"""A term that takes more than this share of the step is named as what limits scaling."""


@dataclass(frozen=True)
class Prediction:
    """The planner's figures at one GPU count.

    Attributes:
        step: The step's parts.
        samples_per_step: Samples in one optimizer step.
        throughput: Samples per second of the whole job.
        scaling_efficiency: Throughput per GPU against the smallest GPU count's.
        energy: Energy of one step (GPUs, nodes, facility).
        cost: Time, energy and money for the scenario's work (``None`` without a ``work`` section).
        limit: What limits scaling here, in words.
        extrapolated: Whether this lies beyond what the calibration measured.
        sensitivity: Throughput here, relative to :attr:`throughput`, if the micro-batch's fixed part were each of
            :func:`~dtpo.plan.calibration.sensitivity_shares` instead: 0 % and 20 % where it is assumed, the ends
            of its confidence interval where it was fitted from three or more points (``None``: given, or fitted
            from two).
    """

    step: StepTime
    samples_per_step: int
    throughput: float
    scaling_efficiency: float
    energy: StepEnergy
    cost: Cost | None
    limit: str
    extrapolated: bool
    sensitivity: tuple[float, ...] | None = None

    @property
    def gpus(self) -> int:
        """GPUs in the job."""
        return self.step.gpus

    @property
    def losses(self) -> dict[str, float]:
        """Shares of the step lost to what does not scale, by name: see :func:`step_losses`."""
        return step_losses(self.step)


LOSS_NAMES = {"network": "waiting on the network (communication not hidden behind compute)",
              "contention": "communication slowing compute (sharing the GPU or CPU while hidden)",
              "stragglers": "waiting for the slowest GPU",
              "fixed": "fixed per-step work (launches, framework per micro-batch, optimizer step)",
              "framework": "framework cost across nodes (fitted from a multi-node measurement)"}
"""What each share of :func:`step_losses` means, in words a buyer understands."""


def step_losses(step: StepTime) -> dict[str, float]:
    """Shares of the step spent on what does not shrink as GPUs are added, by :data:`LOSS_NAMES` key: exposed
    communication, contention, stragglers, the fixed per-step part (micro-batches' fixed parts and the optimizer)
    and the framework term."""
    total = step.step_s
    if total <= 0:
        return dict.fromkeys(LOSS_NAMES, 0.0)
    return {"network": step.exposed_comm_s / total, "contention": step.interference_s / total,
            "stragglers": step.sync_wait_s / total, "fixed": (step.fixed_s + step.optimizer_s) / total,
            "framework": step.framework_s / total}


def losses_text(step: StepTime, least: float = 0.005) -> str:
    """The step's losses as a short phrase (``"network 12 %, slowest GPU 3 %"``), largest first; shares under
    ``least`` left out; ``"nothing"`` when none is left."""
    short = {"network": "network", "contention": "contention", "stragglers": "slowest GPU", "fixed": "fixed work",
             "framework": "framework"}
    parts = sorted(((share, name) for name, share in step_losses(step).items() if share >= least), reverse=True)
    return ", ".join(f"{short[name]} {share:.0%}" for share, name in parts) or "nothing"


@dataclass(frozen=True)
class Plan:
    """A scenario's predictions with what they rest on.

    Attributes:
        scenario: The scenario.
        fabric: Its links.
        calibration: Its compute calibration.
        predictions: One per GPU count, ascending.
        assumptions: Everything assumed, in words (calibration, links, power).
    """

    scenario: Scenario
    fabric: Fabric
    calibration: Calibration
    predictions: tuple[Prediction, ...]
    assumptions: tuple[str, ...]


def fabric_of(scenario: Scenario, inter_link: str | None = None) -> Fabric:
    """The scenario's links (or another inter-node link), with its fabric efficiency if it sets one."""
    return Fabric.of(find_link(scenario.intra_link), find_link(inter_link or scenario.inter_link),
                     scenario.nics_per_node, scenario.fabric_efficiency)


def limiting_term(step: StepTime) -> str:
    """What limits scaling: exposed communication, waiting for stragglers, communication slowing compute, or the
    optimizer step when one takes more than :data:`LIMIT_SHARE` of the step, else compute."""
    shares = {"exposed communication": step.exposed_comm_s / step.step_s,
              "waiting for the slowest GPU": step.sync_wait_s / step.step_s,
              "communication slowing compute": step.interference_s / step.step_s,
              "optimizer step": step.optimizer_s / step.step_s,
              "framework cost across nodes": step.framework_s / step.step_s}
    name, share = max(shares.items(), key=lambda kv: kv[1])
    if share > LIMIT_SHARE:
        return f"{name} ({share:.0%} of the step)"
    return "compute (scales linearly)"


# Said wherever a calibration made on part of a node is carried to more GPUs: what the model cannot see from there.
PARTIAL_NODE_CAVEAT = (
    "not modelled: what the GPUs of one node share (the host's CPU cores that load data, memory and PCIe "
    "bandwidth, power and cooling) and what a job pays only once it is distributed, which a calibration on fewer "
    "GPUs than a node cannot see; NVIDIA's published runs on one DGX A100 reach 84-97 % of linear speed-up on 8 "
    "GPUs (DeepLearningExamples READMEs: ResNet-50 6.72x in mixed precision and 7.72x in TF32, Transformer-big "
    "6.72x and 6.81x); a baseline measured on a full node includes them")

# Said wherever a calibration made on one node is carried across nodes: what the model cannot see from there.
SINGLE_NODE_CAVEAT = (
    "not modelled: costs a framework adds only once its job spans nodes (how it schedules its collectives, or "
    "loads data from shared storage, for example), which a one-node calibration cannot see; NVIDIA's published "
    "BERT-Large pre-training on the same DGX A100 cluster reaches 95 % scaling efficiency at 256 GPUs in PyTorch "
    "but 89 % in PaddlePaddle (DeepLearningExamples READMEs); a baseline measured on two or more nodes includes "
    "them")


def plan(scenario: Scenario, inter_link: str | None = None, calibration: Calibration | None = None,
         fabric: Fabric | None = None, sensitivity: bool = True) -> Plan:
    """Predict every GPU count of ``scenario`` (optionally on another inter-node link, or on a ``fabric`` of
    measured links: see :func:`dtpo.plan.link_fit.fit_alpha_beta`).

    The calibration is made on the scenario's own fabric (the one its baseline ran on) and reused on another.
    Where its micro-batch's fixed part is assumed (one batch size), each prediction also carries the throughput at
    the other fixed shares of :data:`~dtpo.plan.calibration.SENSITIVITY_SHARES`, and where it was fitted from three
    or more batch sizes, at the ends of its confidence interval (``sensitivity``; with the framework term refitted
    to them).
    """
    given = fabric is not None
    own = fabric or fabric_of(scenario)
    calibration = calibration or calibrate(scenario, own)
    if fabric is None:
        fabric = own if inter_link is None else fabric_of(scenario, inter_link)
    steps = []
    for gpus in scenario.gpu_counts:
        optimizer = calibration.optimizer_s
        if optimizer is None:
            optimizer = modelled_optimizer_s(scenario, calibration.job, gpus)
        accum = scenario.accum_at(gpus)
        step = step_time(gpus, scenario.gpus_per_node, micro_batch_s(scenario, calibration, gpus), accum,
                         optimizer, calibration.job, fabric)
        steps.append(replace(step, fixed_s=accum * calibration.fixed_s,
                             framework_s=accum * calibration.framework_s if step.nodes > 1 else 0.0))
    power = scenario.power
    if calibration.busy_power_w is not None and power.busy_power_w is None:
        power = replace(power, busy_power_w=calibration.busy_power_w)
    priced = replace(scenario, power=power)
    first = steps[0]
    base_per_gpu = priced.samples_per_step(first.gpus) / first.step_s / first.gpus
    predictions = []
    notes: list[str] = [f"compute: {calibration.source}", *calibration.assumptions]
    if not isinstance(scenario.per_gpu_batch, int):
        notes.append("the per-GPU batch changes with the GPU count: a micro-batch's per-sample part scales in "
                     "proportion to it, its fixed part does not (see micro-batch)")
    moved = _sensitivity(scenario, inter_link, calibration, own, fabric if given else None) if (
        sensitivity and sensitivity_shares(calibration)) else None
    for index, step in enumerate(steps):
        samples = priced.samples_per_step(step.gpus)
        throughput = samples / step.step_s
        # waiting for the slowest GPU draws what waiting on the network does (NCCL's kernels spin either way)
        energy = scenario_step_energy(priced, step.gpus, step.compute_s + step.optimizer_s,
                                      step.exposed_comm_s + step.sync_wait_s + step.framework_s)
        cost = price(priced.work.total_samples, throughput, energy, priced.prices) if priced.work else None
        beyond = calibration.measured_gpus is not None and (
            step.gpus > calibration.measured_gpus or step.nodes > (calibration.measured_nodes or 1))
        predictions.append(Prediction(step, samples, throughput, throughput / step.gpus / base_per_gpu, energy, cost,
                                      limiting_term(step), beyond or calibration.measured_gpus is None,
                                      None if moved is None else tuple(
                                          other[index] / (samples / step.step_s) - 1 for other in moved)))
        notes.extend(a for a in (_COUNTS.sub("", a) for a in energy.assumptions) if a not in notes)
    measured = calibration.measured_gpus or 1  # nothing measured on this GPU: as little as one of them
    if measured < scenario.gpus_per_node and any(step.gpus > measured for step in steps):
        notes.append(PARTIAL_NODE_CAVEAT)
    if (calibration.measured_nodes or 1) == 1 and any(step.nodes > 1 for step in steps):
        notes.append(SINGLE_NODE_CAVEAT)
    link, intra, inter = fabric.inter, fabric.intra_cost, fabric.inter_cost
    origin = "measured links (alpha-beta fits) and catalogue" if given else "catalogue figures"
    notes.append(f"links: {fabric.intra.name} inside a node ({intra.bandwidth_Bps / 1e9:.3g} GB/s, "
                 f"{intra.alpha_s * 1e6:.3g} us), {link.name} between nodes ({inter.bandwidth_Bps / 1e9:.3g} GB/s "
                 f"per node, {inter.alpha_s * 1e6:.3g} us): {origin} ({link.source})")
    if calibration.job.compute_on_host:
        cpu = {"inside a node": intra.cpu_s_per_byte, "between nodes": inter.cpu_s_per_byte}
        measured = ", ".join(f"{where} {c * 1e9:.3g} CPU ns/byte" for where, c in cpu.items() if c > 0)
        notes.append("the workers compute on host CPU cores, which also run the collectives' CPU work: "
                     + (f"the part done while backward runs delays it ({measured}, measured)" if measured else
                        "no measured CPU cost per byte for these links, so none is counted (fit one with "
                        "dtpo.distributed.link_probe)"))
    return Plan(scenario, fabric, calibration, tuple(predictions), tuple(notes))


def _sensitivity(scenario: Scenario, inter_link: str | None, calibration: Calibration, own: Fabric,
                 fabric: Fabric | None) -> list[list[float]]:
    """Throughput at every GPU count with the micro-batch's fixed part at each of its sensitivity shares."""
    out = []
    for share in sensitivity_shares(calibration) or ():
        split = with_fixed_part(scenario, replace(calibration, framework_s=0.0), share)
        split = with_framework_term(scenario, own, split) if calibration.framework_s else split
        other = plan(scenario, inter_link, split, fabric, sensitivity=False)
        out.append([p.throughput for p in other.predictions])
    return out


@dataclass(frozen=True)
class Choice:
    """A configuration :func:`cheapest` picked.

    Attributes:
        inter_link: The inter-node link.
        prediction: Its prediction.
        power_limit_w: The GPUs' power limit (``None``: the scenario's setting).
        power_note: Where the power limit's effect comes from, in words (empty at the scenario's setting).
    """

    inter_link: str
    prediction: Prediction
    power_limit_w: float | None = None
    power_note: str = ""


def _at_limits(scenario: Scenario, calibration: Calibration) -> list[tuple[Scenario, Calibration, LimitEffect | None,
                                                                           str]]:
    """The scenario at its own power setting (the maximum when it names none), and at every other limit of its
    GPU's power model: the compute time and busy power scaled as :mod:`dtpo.plan.power_setting` says."""
    variants: list[tuple[Scenario, Calibration, LimitEffect | None, str]] = [(scenario, calibration, None, "")]
    if scenario.is_cpu:
        return variants
    model = limit_model(scenario.gpu, scenario.power.workload, scenario.power.power_limit_w)
    if model is None:
        return variants
    busy = gpu_power(scenario.gpu, scenario.power).busy_w
    own = scenario.power.power_limit_w or model.effects[0].power_limit_w
    for effect in model.effects:
        if effect.power_limit_w == own:  # the scenario itself, planned above
            continue
        power = replace(scenario.power, setting=effect.power_limit_w, busy_power_w=busy * effect.power_factor)
        scaled = replace(calibration, t_micro_s=calibration.t_micro_s * effect.time_factor,
                         fixed_s=calibration.fixed_s * effect.time_factor)
        variants.append((replace(scenario, power=power), scaled, effect, model.note))
    return variants


def cheapest(scenario: Scenario, deadline_h: float | None = None, budget: float | None = None) -> Choice:
    """The cheapest configuration that finishes the scenario's work within ``deadline_h`` hours, or the fastest
    that costs at most ``budget``; over the scenario's GPU counts, every inter-node link and, where the GPU has a
    power model, every power limit (:mod:`dtpo.plan.power_setting`).

    Raises:
        ConfigError: No work or prices to judge by, or nothing meets the limit.
    """
    if scenario.work is None:
        raise ConfigError("--deadline and --budget need the scenario's work section (samples or epochs)")
    if budget is not None and scenario.prices.per_gpu_hour is None and scenario.prices.per_kwh is None:
        raise ConfigError("--budget needs prices (prices.per_gpu_hour or prices.per_kwh)")
    calibration = calibrate(scenario, fabric_of(scenario))
    links = [scenario.inter_link, *(n for n, link in CATALOGUE.items()
                                    if link.kind == "inter" and n != scenario.inter_link)]
    options = [Choice(link, p, None if effect is None else effect.power_limit_w, note)
               for variant, cal, effect, note in _at_limits(scenario, calibration)
               for link in links for p in plan(variant, link, cal).predictions]
    assert all(o.prediction.cost is not None for o in options)

    def money(o: Choice) -> float:
        cost = o.prediction.cost
        assert cost is not None
        return cost.total if cost.total is not None else cost.kwh

    if deadline_h is not None:
        fit = [o for o in options if o.prediction.cost is not None and o.prediction.cost.hours <= deadline_h]
        if not fit:
            fastest = min(options, key=lambda o: o.prediction.cost.hours if o.prediction.cost else 0.0)
            raise ConfigError(f"no configuration finishes within {deadline_h:g} h: the fastest, "
                              f"{fastest.prediction.gpus} GPUs on {fastest.inter_link}, takes "
                              f"{fastest.prediction.cost.hours if fastest.prediction.cost else 0:.3g} h")
        return min(fit, key=money)
    assert budget is not None
    fit = [o for o in options if money(o) <= budget]
    if not fit:
        least = min(options, key=money)
        raise ConfigError(f"no configuration costs at most {budget:g}: the cheapest, {least.prediction.gpus} GPUs on "
                          f"{least.inter_link}, costs {money(least):.4g}")
    return min(fit, key=lambda o: o.prediction.cost.hours if o.prediction.cost else 0.0)
