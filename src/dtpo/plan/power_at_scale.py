"""Energy and cost of a predicted training step at scale.

The planner predicts, per optimizer step, how long the GPUs compute and how much communication is left
exposed (not hidden behind compute). This module turns that into energy: every GPU draws its *busy* power
while computing and its *waiting* power while the step waits on exposed communication (or on the slowest GPU:
the planner passes both as ``exposed_comm_s``); every node draws its
overhead (CPUs, memory, NICs, switches, fans) for the whole step; the facility's PUE multiplies it all::

    step_s    = compute_s + exposed_comm_s
    gpu_j     = gpus  x (busy_w x compute_s + waiting_w x exposed_comm_s)
    node_j    = nodes x node_overhead_w x step_s            (nodes = ceil(gpus / gpus_per_node))
    joules    = (gpu_j + node_j) x pue                      (facility_j = the (pue - 1) part)

:func:`price` then scales one step to an amount of work: hours, kWh, kg CO2 and money.

Assumptions (each one used is named, with its figures, in :attr:`StepEnergy.assumptions`, so the planner can
print what it assumed):

* Busy power at the maximum setting: ``power.busy_power_w`` when the scenario gives it (a measured run);
  otherwise :data:`BUSY_FRACTION_OF_MAX` (90 %) of the GPU's maximum power: of its power model
  (:mod:`dtpo.devices.physics.power_specs`) where dtpo has one, else of the datasheet power in
  :mod:`dtpo.devices.physics.catalogue`. Large training jobs keep a GPU near, but mostly not at, its power
  limit; 90 % is an assumption, not a measurement, good to perhaps +-10 %. A ``cpu`` scenario must give
  ``busy_power_w``.
* A power limit caps busy power: ``min(limit, busy power at max)``. The compute time given must already be the
  time at that limit (this module does not slow the GPUs down).
* Waiting power: ``power.waiting_power_fraction`` x busy power when given; otherwise the GPU's idle power plus
  :data:`WAITING_MARGIN_OF_MAX` (10 %) of its maximum power: NCCL's kernels keep running (spinning on flags
  and copying buffers) while they wait for the network, so a waiting GPU sits at full clocks and draws more
  than an idle one. GPUs without a power model have no idle figure: it is taken as
  :data:`IDLE_FRACTION_OF_MAX` (10 %) of the datasheet power. A CPU worker is assumed to draw its busy power
  while it waits (gloo's reduction runs on the same cores). Waiting power never exceeds busy power.
* Node overhead is drawn for the whole step by every node in use; a partly used node counts as a whole one
  (its unused GPUs are not counted).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from dtpo.core.errors import ConfigError
from dtpo.plan.scenario import CPU, DEFAULT_NODE_OVERHEAD_W, PowerSection, Prices, Scenario, resolve_gpu

logger = logging.getLogger(__name__)

BUSY_FRACTION_OF_MAX = 0.9  # assumption: busy training power / maximum power, when none is measured
WAITING_MARGIN_OF_MAX = 0.10  # assumption: waiting power = idle + this x maximum power (NCCL kernels spin)
IDLE_FRACTION_OF_MAX = 0.10  # assumption: idle power / datasheet power, for GPUs without a power model
JOULES_PER_KWH = 3.6e6
SECONDS_PER_HOUR = 3600.0
THROUGHPUT_MISMATCH = 0.01  # price() warns when its throughput and the step's differ by more than this


@dataclass(frozen=True)
class GpuPower:
    """Power of one GPU (or CPU worker) while computing and while waiting on communication.

    Attributes:
        busy_w: Power while computing, in watts (after any power limit).
        waiting_w: Power while waiting on exposed communication, in watts.
        assumptions: What was assumed to get these figures, one sentence each.
    """

    busy_w: float
    waiting_w: float
    assumptions: tuple[str, ...]


@dataclass(frozen=True)
class StepEnergy:
    """Energy of one optimizer step of the whole job.

    ``joules_per_step = gpu_j + node_j + facility_j``: ``gpu_j`` and ``node_j`` are what the GPUs and the rest
    of the nodes draw (IT energy, what meters in the nodes would read); ``facility_j`` is the PUE's share
    (cooling, power delivery).

    Attributes:
        joules_per_step: Facility energy of one step, in joules.
        joules_per_sample: ``joules_per_step`` per training sample.
        gpu_j: Energy of all GPUs in one step (before PUE).
        node_j: Energy of everything else in the nodes in one step (before PUE).
        assumptions: What was assumed, one human-readable sentence each.
        facility_j: The PUE's share: ``(pue - 1) x (gpu_j + node_j)``.
        gpus: GPUs in the job.
        step_s: Duration of one step (compute plus exposed communication), in seconds.
        samples_per_step: Training samples in one step.
    """

    joules_per_step: float
    joules_per_sample: float
    gpu_j: float
    node_j: float
    assumptions: tuple[str, ...]
    facility_j: float
    gpus: int
    step_s: float
    samples_per_step: int


@dataclass(frozen=True)
class Cost:
    """What an amount of work costs at one scale.

    Money is in the currency of the scenario's prices; a figure whose price is not given is ``None``, and
    ``total`` is the sum of the figures that are priced (``None`` when neither is). Note that a rental price
    per GPU-hour often includes the energy already: then ``total`` counts energy twice and
    ``gpu_hour_cost`` alone is the bill.

    Attributes:
        hours: Wall-clock hours to do the work.
        kwh: Facility energy in kWh (PUE included).
        co2_kg: Emissions of that energy at the grid's carbon intensity, in kg CO2.
        energy_cost: ``kwh x per_kwh``.
        gpu_hour_cost: ``hours x gpus x per_gpu_hour``.
        total: ``energy_cost + gpu_hour_cost`` (of those given).
    """

    hours: float
    kwh: float
    co2_kg: float
    energy_cost: float | None
    gpu_hour_cost: float | None
    total: float | None


def gpu_power(gpu: str, power: PowerSection) -> GpuPower:
    """Busy and waiting power of one GPU (or CPU worker) at the scenario's power setting.

    Args:
        gpu: GPU model as in a scenario (``"H100"``, ``"A100-SXM"``, ``"L40S"``, ``"cpu"``).
        power: The scenario's power section.

    Raises:
        ConfigError: Unknown GPU, or ``cpu`` without ``busy_power_w``.
    """
    notes: list[str] = []
    is_cpu = gpu.strip().lower() == CPU
    spec, sheet = resolve_gpu(gpu)
    if is_cpu:
        if power.busy_power_w is None:
            raise ConfigError("power.busy_power_w is required with gpu 'cpu' (a CPU has no power model here)")
        max_w = idle_w = None
        source = "power.busy_power_w"
    elif spec is not None:
        max_w, idle_w = spec.max_power_w, spec.idle_power_w
        source = f"{spec.name} power model"
    elif sheet is not None:
        max_w = sheet.tdp_w
        idle_w = IDLE_FRACTION_OF_MAX * max_w
        source = f"{sheet.name} datasheet"
        notes.append(f"{sheet.name}: no power model in dtpo; its power figures come from the datasheet")
    else:
        raise ConfigError(f"gpu {gpu!r} is not a GPU model dtpo knows")

    if power.busy_power_w is not None:
        busy_max = power.busy_power_w
        notes.append(f"busy power {busy_max:g} W per {'worker' if is_cpu else 'GPU'}: given "
                     f"(power.busy_power_w, from a measured run)")
    else:
        assert max_w is not None
        busy_max = BUSY_FRACTION_OF_MAX * max_w
        notes.append(f"busy power {busy_max:g} W per GPU: assumed {BUSY_FRACTION_OF_MAX:.0%} of the {max_w:g} W "
                     f"maximum of the {source} (training keeps a GPU near, not at, its limit; set "
                     f"power.busy_power_w from a measured run to replace it)")

    busy = busy_max
    limit = power.power_limit_w
    if limit is not None:
        if limit < busy_max:
            busy = limit
            notes.append(f"power limit {limit:g} W caps busy power (from {busy_max:g} W); the compute time must "
                         f"be the time at this limit")
        else:
            notes.append(f"power limit {limit:g} W is at or above the busy power {busy_max:g} W: no effect assumed")

    if power.waiting_power_fraction is not None:
        waiting = power.waiting_power_fraction * busy
        notes.append(f"waiting power {waiting:g} W = {power.waiting_power_fraction:g} x busy power "
                     f"(power.waiting_power_fraction)")
    elif is_cpu:
        waiting = busy
        notes.append(f"waiting power {waiting:g} W per worker: assumed equal to busy power (gloo reduces on the "
                     f"same cores and polls while it waits)")
    else:
        assert max_w is not None and idle_w is not None
        waiting = min(busy, idle_w + WAITING_MARGIN_OF_MAX * max_w)
        idle_note = f"from the {source}" if spec is not None else f"assumed {IDLE_FRACTION_OF_MAX:.0%} of the maximum"
        notes.append(f"waiting power {waiting:g} W per GPU: assumed idle power ({idle_w:g} W, {idle_note}) + "
                     f"{WAITING_MARGIN_OF_MAX:.0%} of the {max_w:g} W maximum, capped at busy power, because "
                     f"NCCL kernels spin at full clocks while they wait for the network (estimate)")
    return GpuPower(busy_w=busy, waiting_w=min(waiting, busy), assumptions=tuple(notes))


def step_energy(compute_s: float, exposed_comm_s: float, gpus: int, gpus_per_node: int, samples_per_step: int,
                gpu: str, power: PowerSection) -> StepEnergy:
    """Energy of one optimizer step of ``gpus`` GPUs.

    Args:
        compute_s: Time the GPUs compute in one step (all micro-batches), in seconds.
        exposed_comm_s: Time the GPUs wait in one step: communication not hidden behind compute (and, from the
            planner, waiting for the slowest GPU), in seconds.
        gpus: GPUs in the job.
        gpus_per_node: GPUs per node.
        samples_per_step: Training samples in one step (per-GPU batch x accumulation x GPUs).
        gpu: GPU model as in a scenario.
        power: The scenario's power section.

    Raises:
        ValueError: A negative time, a step of zero length, or a non-positive count.
        ConfigError: See :func:`gpu_power`.
    """
    if compute_s < 0 or exposed_comm_s < 0 or compute_s + exposed_comm_s <= 0:
        raise ValueError(f"step times must be >= 0 with a positive sum, got compute {compute_s} s and exposed "
                         f"communication {exposed_comm_s} s")
    if gpus < 1 or gpus_per_node < 1 or samples_per_step < 1:
        raise ValueError(f"gpus, gpus_per_node and samples_per_step must be positive, got {gpus}, "
                         f"{gpus_per_node}, {samples_per_step}")
    watts = gpu_power(gpu, power)
    notes = list(watts.assumptions)
    step_s = compute_s + exposed_comm_s
    nodes = math.ceil(gpus / gpus_per_node)
    gpu_j = gpus * (watts.busy_w * compute_s + watts.waiting_w * exposed_comm_s)
    node_j = nodes * power.node_overhead_w * step_s
    facility_j = (power.pue - 1.0) * (gpu_j + node_j)
    total = gpu_j + node_j + facility_j

    source = (" (dtpo's default: an estimate for a DGX A100-class node)"
              if power.node_overhead_w == DEFAULT_NODE_OVERHEAD_W else " (power.node_overhead_w)")
    notes.append(f"node overhead {power.node_overhead_w:g} W per node for the whole step{source}, "
                 f"{nodes} node{'s' if nodes != 1 else ''}")
    if gpus % gpus_per_node:
        notes.append(f"{gpus} GPUs use {nodes} node{'s' if nodes != 1 else ''} of {gpus_per_node}: a partly used "
                     f"node's whole overhead is counted, its unused GPUs are not")
    if power.pue > 1.0:
        notes.append(f"PUE {power.pue:g} multiplies all energy (cooling and power delivery)")
    else:
        notes.append("PUE 1.0: no cooling or power-delivery losses counted")
    return StepEnergy(joules_per_step=total, joules_per_sample=total / samples_per_step, gpu_j=gpu_j,
                      node_j=node_j, assumptions=tuple(notes), facility_j=facility_j, gpus=gpus, step_s=step_s,
                      samples_per_step=samples_per_step)


def scenario_step_energy(scenario: Scenario, gpus: int, compute_s: float, exposed_comm_s: float) -> StepEnergy:
    """:func:`step_energy` with the GPU, node size, batch and power section of ``scenario`` at ``gpus`` GPUs."""
    return step_energy(compute_s, exposed_comm_s, gpus, scenario.gpus_per_node, scenario.samples_per_step(gpus),
                       scenario.gpu, scenario.power)


def price(work_samples: float, throughput: float, step_energy: StepEnergy, prices: Prices | None = None) -> Cost:
    """Time, energy, emissions and money for ``work_samples`` samples at ``throughput`` samples per second.

    Energy is ``work_samples x step_energy.joules_per_sample``; GPU-hours are ``hours x step_energy.gpus``.

    Args:
        work_samples: Samples to train on, in all.
        throughput: Samples per second of the whole job (normally ``samples_per_step / step_s``).
        step_energy: Energy of one step at this scale.
        prices: GPU-hour and energy prices and the grid's carbon intensity (default: no prices, 475 g/kWh).

    Raises:
        ValueError: ``work_samples`` or ``throughput`` is not positive.
    """
    if not work_samples > 0 or not throughput > 0:
        raise ValueError(f"work_samples and throughput must be positive, got {work_samples} and {throughput}")
    prices = prices if prices is not None else Prices()
    step_throughput = step_energy.samples_per_step / step_energy.step_s
    if abs(throughput - step_throughput) > THROUGHPUT_MISMATCH * step_throughput:
        logger.warning("pricing at %.6g samples/s, but the step's energy was computed for %.6g samples/s",
                       throughput, step_throughput)
    hours = work_samples / throughput / SECONDS_PER_HOUR
    kwh = work_samples * step_energy.joules_per_sample / JOULES_PER_KWH
    co2_kg = kwh * prices.grid_g_co2_per_kwh / 1000.0
    energy_cost = kwh * prices.per_kwh if prices.per_kwh is not None else None
    gpu_hour_cost = hours * step_energy.gpus * prices.per_gpu_hour if prices.per_gpu_hour is not None else None
    priced = [cost for cost in (energy_cost, gpu_hour_cost) if cost is not None]
    return Cost(hours=hours, kwh=kwh, co2_kg=co2_kg, energy_cost=energy_cost, gpu_hour_cost=gpu_hour_cost,
                total=sum(priced) if priced else None)
