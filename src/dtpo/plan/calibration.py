"""Calibration: one micro-batch's compute time, the optimizer step and power, from what the user measured.

The planner predicts communication from the fabric (:mod:`dtpo.plan.collectives`); compute it takes from a
measurement, in this order of preference:

1. **A dtpo run** (``baseline.run_dir``, or ``dtpo plan --from-run``): per-step compute and optimizer time
   (medians over the measured steps), the gradient's bytes, tensor shapes and DDP bucket size, and the power the
   run drew per worker, all from its record.
2. **A measured throughput** at some GPU count (``baseline = {gpus, throughput}``, as published results give
   it): the step model (:mod:`dtpo.plan.step_model`) is solved for the micro-batch time that reproduces that
   throughput there, with the optimizer step modelled and communication predicted.
3. **Compute time per sample** given directly (``baseline.compute_s_per_sample``).
4. **FLOPs per sample** (``model.flops_per_sample``): at :data:`ASSUMED_MFU` of the GPU's datasheet peak, an
   assumption, said so.

Whatever was used is in :attr:`Calibration.source` and every assumption in :attr:`Calibration.assumptions`.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dtpo.core.errors import ConfigError
from dtpo.devices.physics.catalogue import find_gpu, gpu_peak_flops
from dtpo.plan.batch_fit import CONFIDENCE, fit_batch_times
from dtpo.plan.scenario import Scenario
from dtpo.plan.step_model import (
    DEFAULT_JITTER_CV,
    DEFAULT_OVERLAP_SLOWDOWN,
    Fabric,
    JobShape,
    optimizer_seconds,
    step_time,
)

ASSUMED_MFU = 0.4
"""Model FLOPs utilisation assumed when compute is known only from FLOPs per sample (typical of large-model
training on modern GPUs: 35-55 %)."""

GRADIENT_DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


@dataclass(frozen=True)
class Calibration:
    """What a prediction rests on.

    Attributes:
        t_micro_s: One micro-batch's forward and backward on one GPU, at a per-GPU batch of ``batch``.
        optimizer_s: One optimizer step (``None``: modelled per GPU count from the parameters).
        job: The job's gradient, parameters and communication settings.
        source: Where ``t_micro_s`` came from, in words.
        measured_gpus: GPU count of the measurement (``None`` when nothing was measured).
        measured_nodes: Nodes of the measurement (inter-node figures beyond it are the catalogue's).
        busy_power_w: Power per GPU (or CPU worker) measured while training, if known.
        assumptions: What was assumed, in words.
        batch: The per-GPU batch ``t_micro_s`` is for (``None``: the scenario's at its first GPU count); at another
            batch its per-sample part scales in proportion (:func:`micro_batch_s`).
        fixed_s: The part of ``t_micro_s`` that a micro-batch pays whatever its size (:mod:`dtpo.plan.batch_fit`).
        fixed_assumed: Whether ``fixed_s`` is an assumption (one batch size only) rather than given or fitted.
        framework_s: Per-step cost a framework adds once a job spans nodes, fitted from a multi-node measurement
            (:func:`with_framework_term`); 0 without one.
        fixed_range: Where ``fixed_s`` was fitted from three or more points, the shares of ``t_micro_s`` at the ends
            of the fixed part's confidence interval (:attr:`dtpo.plan.batch_fit.BatchFit.fixed_range_s`).
    """

    t_micro_s: float
    optimizer_s: float | None
    job: JobShape
    source: str
    measured_gpus: int | None = None
    measured_nodes: int | None = None
    busy_power_w: float | None = None
    assumptions: tuple[str, ...] = field(default_factory=tuple)
    batch: float | None = None
    fixed_s: float = 0.0
    fixed_assumed: bool = True
    framework_s: float = 0.0
    fixed_range: tuple[float, float] | None = None


def first_batch(scenario: Scenario) -> int:
    """The scenario's per-GPU batch at its first (smallest) GPU count."""
    return scenario.batch_at(scenario.gpu_counts[0])


def micro_batch_s(scenario: Scenario, calibration: Calibration, gpus: int, nearest: bool = False) -> float:
    """One micro-batch's compute at ``gpus`` GPUs: the calibrated time's fixed part, plus its per-sample part scaled
    to the per-GPU batch there (with ``nearest``, the nearest count's batch where ``gpus`` has none)."""
    reference = calibration.batch or first_batch(scenario)
    per_sample = (calibration.t_micro_s - calibration.fixed_s) / reference
    return calibration.fixed_s + per_sample * scenario.batch_at(gpus, nearest)


SENSITIVITY_SHARES = (0.0, 0.2)
"""Fixed shares of a micro-batch a plan calibrated on one batch size is also shown at (its sensitivity)."""


def sensitivity_shares(calibration: Calibration) -> tuple[float, ...] | None:
    """The fixed shares a plan is also shown at: :data:`SENSITIVITY_SHARES` where the split is assumed, the ends of
    the fitted fixed part's confidence interval where it was fitted from three or more points, else none."""
    if calibration.fixed_assumed:
        return SENSITIVITY_SHARES
    return calibration.fixed_range


def with_fixed_part(scenario: Scenario, calibration: Calibration, share: float | None = None) -> Calibration:
    """The calibration with its micro-batch split into a fixed and a per-sample part: at ``share`` when given (a
    sensitivity), else the scenario's ``micro_batch`` (a given share, or a fit of times measured at two or more batch
    sizes, whose share at the calibration batch is carried), else none (assumed, and said so)."""
    reference = calibration.batch or first_batch(scenario)
    spec = scenario.micro_batch
    notes = [a for a in calibration.assumptions if not a.startswith("micro-batch:")]
    fixed_range = None
    if share is not None:
        note, assumed = f"micro-batch: {share:.0%} of it at the calibration batch taken as fixed (sensitivity)", True
    elif spec is not None and spec.times_s:
        counts = Counter(b for b, _ in spec.times_s)
        sizes = ", ".join(f"{b} (x{n})" if n > 1 else str(b) for b, n in sorted(counts.items()))
        try:
            fit = fit_batch_times(spec.times_s)
        except ConfigError as exc:  # measured, but too noisy to split: said so, and assumed as with one size
            share, assumed = 0.0, True
            note = (f"micro-batch: the times measured at batch sizes {sizes} do not split ({exc}); assumed all "
                    "per-sample, the sensitivity column shows 0 % against 20 % fixed")
        else:
            share, assumed = fit.fixed_share(reference), False
            note = (f"micro-batch: {fit.fixed_s * 1e3:.3g} ms fixed + {fit.per_sample_s * 1e3:.3g} ms per sample, "
                    f"fitted from batch sizes {sizes}: {share:.0%} of a micro-batch of {reference:g} is fixed "
                    "(measured; carried as that share)")
            if fit.fixed_range_s is not None:
                low, high = fit.fixed_range_s
                total = fit.seconds(reference)
                fixed_range = (low / total, high / total)
                note += (f"; the points' scatter leaves the fixed part anywhere in {low * 1e3:.3g}-{high * 1e3:.3g} "
                         f"ms ({CONFIDENCE:.0%} confidence), and the fit-range column shows the throughput at both "
                         "ends")
    elif spec is not None and spec.fixed_share is not None:
        share, assumed = spec.fixed_share, False
        note = f"micro-batch: {share:.0%} of it at the calibration batch of {reference:g} is fixed (given)"
    else:
        share, assumed = 0.0, True
        note = (f"micro-batch: calibrated at one batch size ({reference:g} per GPU), so its time is assumed to be all "
                "per-sample (no fixed part); the sensitivity column shows 0 % against 20 % fixed")
    return replace(calibration, fixed_s=share * calibration.t_micro_s, fixed_assumed=assumed,
                   fixed_range=fixed_range, assumptions=(*notes, note))


def with_framework_term(scenario: Scenario, fabric: Fabric, calibration: Calibration) -> Calibration:
    """The calibration with a per-step framework cost fitted from the baseline's multi-node measurement: the step
    measured there less the step the model predicts there without it (none where the model is already as slow);
    carried unchanged to every count of two or more nodes. Without such a measurement, the calibration as it is.

    Raises:
        ConfigError: The measurement's throughput is not positive.
    """
    base = scenario.baseline
    if base is None or base.multi_node_gpus is None or base.multi_node_throughput is None:
        return calibration
    gpus = base.multi_node_gpus
    samples_per_s = base.multi_node_throughput / scenario.units_per_sample
    accum = scenario.accum_at(gpus, nearest=True)
    measured = scenario.batch_at(gpus, nearest=True) * accum * gpus / samples_per_s
    optimizer = calibration.optimizer_s
    if optimizer is None:
        optimizer = modelled_optimizer_s(scenario, calibration.job, gpus)
    modelled = step_time(gpus, scenario.gpus_per_node, micro_batch_s(scenario, calibration, gpus, nearest=True),
                         accum, optimizer, calibration.job, fabric).step_s
    framework = max(measured - modelled, 0.0) / accum
    note = (f"framework: {framework * 1e3:.3g} ms per micro-batch added at 2 or more nodes, fitted from "
            f"{base.multi_node_throughput:,.0f} {scenario.unit} measured at {gpus} GPUs ({scenario.nodes(gpus)} nodes; "
            f"the model without it predicts {modelled * 1e3:.4g} ms per step there, measured {measured * 1e3:.4g} ms); "
            "the same cost per micro-batch is assumed at every larger count")
    return replace(calibration, framework_s=framework, assumptions=(*calibration.assumptions, note),
                   measured_gpus=max(calibration.measured_gpus or 0, gpus),
                   measured_nodes=max(calibration.measured_nodes or 1, scenario.nodes(gpus)))


def job_shape(scenario: Scenario, record_model: dict[str, Any] | None = None,
              measured_jitter_cv: float | None = None) -> JobShape:
    """The job's communication shape from the scenario (and a run record's model section, which wins); its
    compute jitter is the scenario's, else the one a run measured, else :data:`DEFAULT_JITTER_CV`."""
    model = scenario.model
    if record_model:
        grad = float(record_model["gradient_bytes"])
        params = float(record_model["parameters"])
        shapes = tuple(tuple(s) for s in record_model.get("matrix_shapes") or ()) or None
        cap = int(record_model.get("bucket_cap_bytes") or 25 * 1024 * 1024)
    else:
        grad = float(model.gradient_size_bytes)
        params = float(model.parameters or grad / GRADIENT_DTYPE_BYTES[model.gradient_dtype])
        shapes, cap = None, 25 * 1024 * 1024
    compression = scenario.compression
    if compression == "powersgd" and shapes is None:
        raise ConfigError("compression powersgd needs the model's tensor shapes: plan from a dtpo run "
                          "(baseline.run_dir) of the model")
    param_bytes = params * (2 if scenario.precision in ("bf16-mixed", "16-mixed") else 4)
    jitter = scenario.jitter_cv
    if jitter is None:
        jitter = measured_jitter_cv if measured_jitter_cv is not None else DEFAULT_JITTER_CV
    slowdown = scenario.overlap_slowdown if scenario.overlap_slowdown is not None else DEFAULT_OVERLAP_SLOWDOWN
    return JobShape(gradient_bytes=grad, parameters=params, strategy=scenario.strategy, compression=compression,
                    powersgd_rank=scenario.powersgd_rank, matrix_shapes=shapes, bucket_cap_bytes=cap,
                    param_bytes=param_bytes, overlap=scenario.overlap, compute_on_host=scenario.is_cpu,
                    jitter_cv=jitter, overlap_slowdown=slowdown)


def sharing_assumptions(scenario: Scenario, job: JobShape, measured_jitter: bool = False) -> tuple[str, ...]:
    """What the step model assumes of stragglers and of communication sharing the GPU, and where it came from."""
    origin = "given" if scenario.jitter_cv is not None else "measured in the run" if measured_jitter else "assumed"
    notes = [f"stragglers: one micro-batch's compute varies by {job.jitter_cv:.1%} from step to step (relative "
             f"standard deviation, {origin}); each step waits for the slowest GPU"]
    if not job.compute_on_host:
        origin = "given" if scenario.overlap_slowdown is not None else "assumed"
        notes.append(f"communication hidden behind backward still delays it by {job.overlap_slowdown:.0%} of its "
                     f"time ({origin}): NCCL's kernels share the GPU's SMs and memory bandwidth")
    return tuple(notes)


def memory_bandwidth(scenario: Scenario) -> float | None:
    """The GPU's peak memory bandwidth: its power model's, else its datasheet's, if dtpo knows either."""
    spec = scenario.power_spec
    if spec is not None:
        return float(spec.memory_bandwidth_bps)
    sheet = scenario.gpu_spec
    return float(sheet.memory_bps) if sheet is not None and sheet.memory_bps else None


def modelled_optimizer_s(scenario: Scenario, job: JobShape, gpus: int) -> float:
    """The optimizer step modelled for ``gpus`` GPUs (sharded by FSDP, whole under DDP)."""
    return optimizer_seconds(job.parameters, memory_bandwidth(scenario), gpus if job.strategy == "fsdp" else 1)


def calibrate(scenario: Scenario, fabric: Fabric) -> Calibration:
    """The calibration the scenario's baseline (or model FLOPs) gives (see the module docs), with its micro-batch's
    fixed part (:func:`with_fixed_part`) and a framework term where a multi-node point gives one
    (:func:`with_framework_term`).

    Raises:
        ConfigError: Nothing to calibrate from, or a run record without what is needed.
    """
    calibration = with_fixed_part(scenario, _compute_calibration(scenario, fabric))
    return with_framework_term(scenario, fabric, calibration)


def _compute_calibration(scenario: Scenario, fabric: Fabric) -> Calibration:
    base = scenario.baseline
    if base is not None and base.run_dir is not None:
        return from_run(scenario, Path(base.run_dir))
    if base is not None and base.throughput is not None and base.gpus is not None:
        return from_throughput(scenario, fabric, base.gpus, base.throughput)
    job = job_shape(scenario)
    assumptions = (*_optimizer_assumption(scenario), *sharing_assumptions(scenario, job))
    if base is not None and base.compute_s_per_sample is not None:
        return Calibration(base.compute_s_per_sample * first_batch(scenario), None, job,
                           f"compute {base.compute_s_per_sample:.4g} s per sample (given)", assumptions=assumptions)
    flops = scenario.model.flops_per_sample
    spec = scenario.gpu_spec
    peak = gpu_peak_flops(spec, _dtype(scenario.precision)) if spec is not None else None
    if flops is None or not peak:
        raise ConfigError(f"{scenario.source or 'scenario'}: needs a baseline (a run, or a measured throughput) or "
                          "model.flops_per_sample on a GPU with a known peak")
    t_micro = flops * first_batch(scenario) / (peak * ASSUMED_MFU)
    return Calibration(t_micro, None, job, f"{flops:.3g} FLOPs per sample at {ASSUMED_MFU:.0%} of the "
                       f"{spec.name if spec else scenario.gpu} datasheet peak (assumed MFU)",
                       assumptions=(*assumptions, f"MFU {ASSUMED_MFU:.0%} (no measurement of this model)"))


def _dtype(precision: str) -> str:
    return {"bf16-mixed": "bfloat16", "16-mixed": "float16"}.get(precision, "float32")


def _optimizer_assumption(scenario: Scenario) -> tuple[str, ...]:
    bw = memory_bandwidth(scenario)
    if bw is None:
        return (f"optimizer step not modelled: no memory bandwidth known for {scenario.gpu}",)
    return (f"optimizer step: AdamW, 32 bytes of memory traffic per parameter at {bw / 1e12:.2f} TB/s",)


def from_throughput(scenario: Scenario, fabric: Fabric, gpus: int, throughput: float) -> Calibration:
    """Solve the step model for the micro-batch time that gives ``throughput`` (in the scenario's unit) at ``gpus``
    GPUs.

    Raises:
        ConfigError: The throughput is not positive, or no micro-batch time reproduces it (what is not compute
            alone takes longer than the measured step: a throughput in another unit, tokens read as samples).
    """
    if throughput <= 0:
        raise ConfigError(f"baseline.throughput must be positive, got {throughput:g}")
    job = job_shape(scenario)
    accum = scenario.accum_at(gpus, nearest=True)
    batch = scenario.batch_at(gpus, nearest=True)
    step = batch * accum * gpus / (throughput / scenario.units_per_sample)
    optimizer = modelled_optimizer_s(scenario, job, gpus)
    t_micro = max((step - optimizer) / accum, 1e-12)
    for _ in range(50):  # what is not compute depends on t_micro: a fixed point, reached in a few rounds
        predicted = step_time(gpus, scenario.gpus_per_node, t_micro, accum, optimizer, job, fabric)
        overhead = predicted.exposed_comm_s + predicted.interference_s + predicted.sync_wait_s
        t_new = max((step - optimizer - overhead) / accum, 1e-12)
        if abs(t_new - t_micro) <= 1e-9 * t_micro:
            break
        t_micro = t_new
    reproduced = step_time(gpus, scenario.gpus_per_node, t_micro, accum, optimizer, job, fabric).step_s
    if abs(reproduced - step) > 1e-6 * step:
        where = scenario.source or "scenario"
        raise ConfigError(f"{where}: baseline {throughput:,.6g} {scenario.unit} at {gpus} GPUs "
                          f"is a step of {step * 1e3:.3g} ms, shorter than the model's communication and optimizer "
                          f"alone ({reproduced * 1e3:.3g} ms): check the unit (unit, sequence_length), per_gpu_batch")
    return Calibration(t_micro, None, job, f"measured {throughput:,.0f} {scenario.unit} at {gpus} GPUs "
                       f"(accumulation {accum})", measured_gpus=gpus, measured_nodes=scenario.nodes(gpus),
                       assumptions=(*_optimizer_assumption(scenario), *sharing_assumptions(scenario, job)),
                       batch=batch)



def read_record(run_dir: Path) -> dict[str, Any]:
    """The run's ``record.json`` as a dict.

    Raises:
        ConfigError: No record, or one that cannot be read.
    """
    path = run_dir / "record.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{run_dir} has no record.json (not a dtpo run directory?)") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None


def from_run(scenario: Scenario, run_dir: Path) -> Calibration:
    """Compute, optimizer time, gradient shape and power from a dtpo run's record.

    The run's micro-batch time is scaled to the scenario's per-GPU batch in proportion (compute is linear in
    the batch at the sizes training uses); its workers' power is the run's energy over its time and workers.
    """
    record = read_record(run_dir)
    ranks = record.get("ranks") or []
    if ranks and not _same_device(scenario, str(ranks[0].get("device", ""))):
        return _from_run_flops(scenario, run_dir, record)
    model = next((r.get("model") for r in ranks if r.get("model")), None)
    if not model:
        raise ConfigError(f"{run_dir}/record.json has no model section (recorded by dtpo 0.1 before the planner); "
                          "run the job again with this dtpo")
    steps = [s for s in (ranks[0].get("steps") or []) if not s.get("warmup")]
    if not steps:
        raise ConfigError(f"{run_dir}/record.json has no measured steps")
    accum = int((record.get("config") or {}).get("session", {}).get("grad_accum", 1))
    samples = statistics.median(s["samples"] for s in steps) / accum
    t_micro_run = statistics.median(s["compute_s"] for s in steps) / accum
    optimizer = statistics.median(s["optimizer_s"] for s in steps)
    batch = first_batch(scenario)
    t_micro = t_micro_run * batch / samples
    jitter = compute_jitter_cv(ranks, accum)
    job = job_shape(scenario, model, jitter)
    workers = len(ranks)
    energy = record.get("energy") or {}
    joules = (energy.get("energy_j") or {}).get("value")
    seconds = energy.get("time_s") or 0.0
    power = joules / seconds / workers if joules and seconds else None
    assumptions = [f"compute scaled linearly from the run's micro-batch of {samples:g} samples to "
                   f"{batch}" if samples != batch else ""]
    if power is not None and (energy.get("energy_j") or {}).get("source") == "estimated":
        assumptions.append("the run's power is dtpo's CPU model (estimated), not a counter")
    assumptions.extend(sharing_assumptions(scenario, job, measured_jitter=jitter is not None))
    nodes = len({r.get("node") for r in ranks}) or 1
    return Calibration(t_micro, optimizer, job, f"dtpo run {run_dir} ({workers} worker(s), "
                       f"{len(steps)} measured steps)", measured_gpus=workers, measured_nodes=nodes,
                       busy_power_w=power, assumptions=tuple(a for a in assumptions if a))


MIN_JITTER_STEPS = 8
"""Fewest measured steps per rank from which a run's compute jitter is read."""


def compute_jitter_cv(ranks: list[dict[str, Any]], accum: int) -> float | None:
    """One micro-batch's compute jitter in a dtpo run: per rank, the robust relative spread of its measured steps'
    compute time (1.4826 x the median absolute deviation over the median, the standard deviation for normal
    noise, unmoved by the odd slow step), the median over ranks, over ``sqrt(accum)`` (a step holds ``accum``
    micro-batches); ``None`` with fewer than :data:`MIN_JITTER_STEPS` steps on every rank."""
    spreads = []
    for rank in ranks:
        times = [float(s["compute_s"]) for s in rank.get("steps") or [] if not s.get("warmup") and "compute_s" in s]
        if len(times) < MIN_JITTER_STEPS:
            continue
        middle = statistics.median(times)
        if middle <= 0:
            continue
        mad = statistics.median(abs(t - middle) for t in times)
        spreads.append(1.4826 * mad / middle)
    if not spreads:
        return None
    return statistics.median(spreads) / math.sqrt(max(accum, 1))


def _same_device(scenario: Scenario, device: str) -> bool:
    """Whether the run computed on the scenario's kind of device (its measured compute then applies)."""
    if device.startswith("cpu"):
        return scenario.is_cpu
    spec = scenario.gpu_spec
    return spec is not None and find_gpu(device) == spec


def _from_run_flops(scenario: Scenario, run_dir: Path, record: dict[str, Any]) -> Calibration:
    """A run on other hardware: its model (gradient, shapes, buckets) and its counted FLOPs per sample, with
    compute on the scenario's GPU at :data:`ASSUMED_MFU` of its datasheet peak."""
    ranks = record.get("ranks") or []
    model = next((r.get("model") for r in ranks if r.get("model")), None)
    flops = ranks[0].get("flops_per_step") if ranks else None
    steps = [s for s in (ranks[0].get("steps") or []) if not s.get("warmup")] if ranks else []
    spec = scenario.gpu_spec
    peak = gpu_peak_flops(spec, _dtype(scenario.precision)) if spec is not None else None
    if not model or not flops or not steps or not peak:
        raise ConfigError(f"{run_dir} ran on {ranks[0].get('device') if ranks else 'another device'}: planning "
                          f"{scenario.gpu} from it needs its counted FLOPs (--count-flops) and model section, and "
                          f"a datasheet peak for {scenario.gpu}")
    per_sample = float(flops) / (statistics.median(s["samples"] for s in steps))
    t_micro = per_sample * first_batch(scenario) / (peak * ASSUMED_MFU)
    job = job_shape(scenario, model)
    return Calibration(t_micro, None, job,
                       f"{per_sample:.3g} FLOPs per sample counted in dtpo run {run_dir} (on "
                       f"{ranks[0].get('device')}), at {ASSUMED_MFU:.0%} of the {spec.name if spec else ''} "
                       "datasheet peak (assumed MFU)",
                       assumptions=(*_optimizer_assumption(scenario), *sharing_assumptions(scenario, job),
                                    f"MFU {ASSUMED_MFU:.0%} on {scenario.gpu} (the run measured another device)"))
