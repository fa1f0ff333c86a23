"""How a GPU's step time and power respond to its power limit and SM clock: a physical model and a calibrated one.

Two models answer the same question, :meth:`GpuModel.at`: given a power limit and optionally a locked SM
clock, at which clock does the GPU settle, how long does a training sample take, and what does the board
draw?

**Parametric physical model** (:class:`ParametricModel`). With ``x = f / f_max`` the SM clock as a fraction
of the boost clock:

* Core voltage follows a floor-then-ramp V/f curve: ``V(x)/V_max = v_floor`` for ``x <= v_knee`` and rises
  linearly to 1 at ``x = 1`` above it (real GPUs hold a minimum voltage at low clocks and raise it steeply
  towards the boost clock). A linear ``V(x)`` with an offset was tried first; it cannot produce the measured
  traces' shape (little speed bought by the top 20 % of power, a steep slowdown below the knee).
* Power while computing: ``P_c(x) = P_static + u * (P_max - P_static) * x * (V(x)/V_max)**2`` (dynamic power
  ``~ C V**2 f``). ``u`` is the workload's activity factor: ``u = 1`` draws exactly the maximum limit at the
  boost clock, ``u > 1`` would exceed it (the GPU is power-limited even at the default limit).
* Time per sample: ``t(x) = t0 * ((1 - m) / x + m)``: the compute-bound share ``1 - m`` scales with the SM
  clock, the rest (memory-bound kernels, input pipeline, launch overhead: ``m``) does not.
* Average board power over a step: the compute share runs at ``P_c(x)``, the rest at ``P_static``:
  ``P(x) = (t0 (1 - m) / x * P_c(x) + t0 m P_static) / t(x)``. This is why measured average power sits below
  the limit even when the limit binds.
* A power limit ``L`` makes the GPU settle at the highest supported clock with ``P_c(x) <= L`` (the limiter
  acts on the power of the busy phase). If even the lowest clock draws more than ``L``, the GPU runs at the
  lowest clock and draws more than the limit (the A40 traces show this at 100 W). A clock lock caps the clock
  as well: the effective clock is the lower of the lock and what the limit allows.

GPU constants (``P_static``, ``v_floor``, ``v_knee``) live in :mod:`dtpo.devices.physics.power_specs`: fitted for the
A40 and V100, estimated for the others. Workload constants (``u``, ``m``, ``t0``) are fitted per trace by
least squares on log time and log power over the measured limits (a grid: ``u`` in 0.10..2.00 by 0.02,
``m`` in 0.00..0.95 by 0.01; ``t0`` in closed form), see :func:`fit_workload`. The cap ``u <= 2`` binds for
most heavy A40 traces and for bert/SQuAD on the V100: the fit would make those GPUs even more power-limited
at their maximum limit, trading ``u`` against ``m``; the cap keeps the activity physically plausible (busy
power at the boost clock at most twice what the maximum limit allows). On the traced GPUs the
parametric model uses the fit of that GPU's trace (nearest measured batch size). On an untraced GPU it
uses ``u`` averaged over the A40 and V100 fits, and scales the A40's absolute time: the compute part by the
ratio of peak FP16 tensor FLOP/s, the rest by the ratio of memory bandwidth.

**Calibrated model** (:class:`CalibratedModel`): for a (GPU, workload, batch size) with a trace, time and power
are read off the measured curve, piecewise-linear in the power limit between measured limits (so every
measured point is reproduced exactly and values between two limits lie between theirs). A limit outside the
measured ones (only a user's trace can stop short of the GPU's range; the shipped traces span it) takes the
nearest measured point scaled by the parametric model's ratios between the two limits. A locked SM clock is
mapped to the limit at which the parametric model settles at that clock (``P_c`` of the clock) and the
measured curve is read there; when that limit is below the lowest measured one, the lowest measured point is
scaled by the parametric model's ratios.

Time per sample from a trace is ``time_per_epoch / samples_per_epoch``: the trace's own
``samples_per_epoch`` where it has one (a user's trace, :mod:`dtpo.devices.physics.user_trace`), else the
training-set sizes in :data:`DATASET_SAMPLES` (see :func:`trace_samples_per_epoch`).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from bisect import bisect_right
from dataclasses import dataclass
from functools import cache, lru_cache

import numpy as np

from dtpo.core.errors import ConfigError
from dtpo.devices.physics.power_specs import PowerSpec, find_power_spec, power_spec_names
from dtpo.devices.physics.traces import (
    Trace,
    default_batch_size,
    find_trace,
    known_trace_workloads,
    load_traces,
    resolve_workload,
    traced_gpus,
)

# Training samples per epoch of each traced dataset (what one "epoch" in the traces iterates over).
DATASET_SAMPLES: dict[str, int] = {
    "cifar100": 50_000,
    "imagenet": 1_281_167,
    "librispeech": 281_241,
    "movielens-1m": 4_970_845,
    "squad": 88_524,
    "sentiment140": 1_600_000,
}
DATASET_NOTES: dict[str, str] = {
    "cifar100": "CIFAR-100 train split, 50,000 images",
    "imagenet": "ImageNet-1k train split, 1,281,167 images",
    "librispeech": "LibriSpeech 960 h train set, 281,241 utterances",
    "movielens-1m": ("MovieLens-1M as Zeus's NCF script trains it: 994,169 leave-one-out training ratings, each "
                     "with 4 sampled negatives (num_ng=4): 4,970,845 samples"),
    "squad": ("SQuAD v1.1 train split as BERT features (max_seq_length 384, doc_stride 128): 88,524 features "
              "from 87,599 questions"),
    "sentiment140": "Sentiment140 train split, 1,600,000 tweets",
}

ACTIVITY_GRID = np.round(np.arange(0.10, 2.0 + 1e-9, 0.02), 4)
MEMORY_GRID = np.round(np.arange(0.0, 0.95 + 1e-9, 0.01), 4)
REFERENCE_GPU = "A40"


@dataclass(frozen=True)
class OperatingPoint:
    """Where a GPU settles under a power limit (and optional clock lock), and what that costs.

    Attributes:
        power_limit_w: The limit in force.
        sm_clock_mhz: Effective SM clock the GPU settles at.
        time_per_sample_s: Seconds per training sample while computing.
        power_w: Average board power while computing.
        idle_power_w: Board power while waiting (in a collective, for stragglers).
    """

    power_limit_w: float
    sm_clock_mhz: float
    time_per_sample_s: float
    power_w: float
    idle_power_w: float

    @property
    def energy_per_sample_j(self) -> float:
        """Joules per sample while computing."""
        return self.time_per_sample_s * self.power_w


@dataclass(frozen=True)
class WorkloadFit:
    """Workload constants of the parametric model fitted to one trace.

    Attributes:
        activity: Activity factor ``u``.
        memory_fraction: Share ``m`` of the time at the boost clock that does not scale with the SM clock.
        time_per_sample_s: ``t0``, seconds per sample at the boost clock.
        rms_log_error: Root-mean-square error of log time and log power over the trace's points.
    """

    activity: float
    memory_fraction: float
    time_per_sample_s: float
    rms_log_error: float


def samples_per_epoch(dataset: str) -> int:
    """Training samples in one epoch of a traced dataset."""
    try:
        return DATASET_SAMPLES[dataset]
    except KeyError:
        raise ConfigError(f"no training-set size for dataset {dataset!r}; known: "
                          f"{', '.join(DATASET_SAMPLES)}") from None


def trace_samples_per_epoch(trace: Trace) -> int:
    """Training samples in one epoch of ``trace``: its own ``samples_per_epoch``, else its dataset's known size.

    Raises:
        ConfigError: The trace gives no size and its dataset is not one dtpo knows.
    """
    return trace.samples_per_epoch if trace.samples_per_epoch is not None else samples_per_epoch(trace.dataset)


def _samples_note(trace: Trace) -> str:
    """Where the epoch size of ``trace`` comes from, for the assumptions."""
    if trace.samples_per_epoch is not None:
        return f"samples per epoch as given in {trace.source or 'the trace'}"
    return DATASET_NOTES.get(trace.dataset, f"training-set size of {trace.dataset}")


def _origin(trace: Trace) -> str:
    """Who measured ``trace``: the user's file, or Zeus for the shipped traces."""
    return f"measured trace {trace.source}" if trace.source else "Zeus NSDI'23"


def known_workloads() -> list[str]:
    """Workloads every GPU model can simulate, as canonical ``network/dataset`` names, sorted."""
    return known_trace_workloads()


class _Physics:
    """A GPU's clock grid and the clock-only factor ``x * (V(x)/V_max)**2`` of dynamic power."""

    def __init__(self, spec: PowerSpec) -> None:
        self.clocks = np.asarray(spec.sm_clocks_mhz, dtype=float)
        self.x = self.clocks / spec.max_sm_mhz
        volts = np.where(self.x <= spec.v_knee, spec.v_floor,
                         spec.v_floor + (1.0 - spec.v_floor) * (self.x - spec.v_knee) / (1.0 - spec.v_knee))
        self.g = self.x * volts**2
        self.static_w = spec.static_power_w
        self.dynamic_w = spec.max_power_w - spec.static_power_w


@cache
def _physics(spec: PowerSpec) -> _Physics:
    return _Physics(spec)


@cache
def fit_workload(trace: Trace, spec: PowerSpec | None = None) -> WorkloadFit:
    """Fit ``u``, ``m`` and ``t0`` of the parametric model to a trace (least squares on log time and log power).

    Args:
        trace: The measured trace.
        spec: The GPU constants to fit against (default: the trace's GPU).
    """
    spec = spec or find_power_spec(trace.gpu)
    phys = _physics(spec)
    limits = np.array([p.power_limit_w for p in trace.points])
    times = np.array([p.time_per_epoch_s for p in trace.points]) / trace_samples_per_epoch(trace)
    powers = np.array([p.average_power_w for p in trace.points])
    u = ACTIVITY_GRID[:, None]                                                # (U, 1)
    threshold = (limits[None, :] - phys.static_w) / (u * phys.dynamic_w)       # (U, n)
    index = np.clip(np.searchsorted(phys.g, threshold, side="right") - 1, 0, None)
    x = phys.x[index]
    busy_w = phys.static_w + u * phys.dynamic_w * phys.g[index]                # (U, n)
    m = MEMORY_GRID[:, None, None]                                             # (M, 1, 1)
    compute = (1.0 - m) / x[None]                                              # (M, U, n)
    tau = compute + m
    power = (compute * busy_w[None] + m * phys.static_w) / tau
    resid_t = np.log(times)[None, None, :] - np.log(tau)
    log_t0 = resid_t.mean(axis=-1)
    err = ((resid_t - log_t0[..., None]) ** 2).sum(-1) + ((np.log(power) - np.log(powers)) ** 2).sum(-1)
    mi, ui = np.unravel_index(int(np.argmin(err)), err.shape)
    return WorkloadFit(
        activity=float(ACTIVITY_GRID[ui]), memory_fraction=float(MEMORY_GRID[mi]),
        time_per_sample_s=float(math.exp(log_t0[mi, ui])),
        rms_log_error=float(math.sqrt(err[mi, ui] / (2 * len(limits)))))


class GpuModel(ABC):
    """Time and power of one workload on one GPU model as functions of the power limit and SM clock.

    Attributes:
        spec: The GPU's power spec.
        workload: ``network/dataset``, e.g. ``"resnet50/imagenet"``.
        batch_size: Samples per step.
        calibrated: True when the model reproduces a measured trace, False for the parametric model alone.
        assumptions: Readable statements of what the model assumes.
    """

    spec: PowerSpec
    workload: str
    batch_size: int
    calibrated: bool
    assumptions: tuple[str, ...]

    @abstractmethod
    def at(self, power_limit_w: float | None = None, sm_clock_mhz: float | None = None) -> OperatingPoint:
        """The operating point under a power limit (``None``: the maximum) and SM-clock lock (``None``: floating).

        Raises:
            ConfigError: Limit or clock outside the GPU's range (the message states the range).
        """

    def step_time_s(self, power_limit_w: float | None = None, sm_clock_mhz: float | None = None) -> float:
        """Seconds per step (``time_per_sample * batch_size``) while computing."""
        return self.at(power_limit_w, sm_clock_mhz).time_per_sample_s * self.batch_size

    def _check_limit(self, power_limit_w: float | None) -> float:
        spec = self.spec
        if power_limit_w is None:
            return spec.max_power_w
        limit = float(power_limit_w)
        if not (spec.min_power_w - 1e-6 <= limit <= spec.max_power_w + 1e-6):
            raise ConfigError(f"power limit {limit:g} W is outside {spec.name}'s range "
                              f"{spec.min_power_w:g}-{spec.max_power_w:g} W")
        return min(max(limit, spec.min_power_w), spec.max_power_w)

    def _check_clock(self, sm_clock_mhz: float) -> int:
        """Index of the highest supported clock at or below ``sm_clock_mhz`` (a lock snaps down like the driver)."""
        spec = self.spec
        clock = float(sm_clock_mhz)
        if not (spec.min_sm_mhz - 1e-6 <= clock <= spec.max_sm_mhz + 1e-6):
            raise ConfigError(f"SM clock {clock:g} MHz is outside {spec.name}'s supported range "
                              f"{spec.min_sm_mhz}-{spec.max_sm_mhz} MHz")
        return max(bisect_right(spec.sm_clocks_mhz, clock + 1e-6) - 1, 0)

    def __repr__(self) -> str:
        kind = "calibrated" if self.calibrated else "parametric"
        return f"<{type(self).__name__} {self.spec.name} {self.workload} b{self.batch_size} ({kind})>"


class ParametricModel(GpuModel):
    """The physical model (see the module docs) with fixed workload constants; tables precomputed per clock."""

    calibrated = False

    def __init__(self, spec: PowerSpec, workload: str, batch_size: int, activity: float, memory_fraction: float,
                 time_per_sample_s: float, assumptions: tuple[str, ...] = ()) -> None:
        """Build the model.

        Args:
            spec: GPU constants.
            workload: ``network/dataset``.
            batch_size: Samples per step.
            activity: Activity factor ``u`` (> 0).
            memory_fraction: Share ``m`` in [0, 1) of the time at the boost clock that ignores the SM clock.
            time_per_sample_s: ``t0``, seconds per sample at the boost clock.
            assumptions: Statements to report with the model's numbers.
        """
        if not (activity > 0 and 0 <= memory_fraction < 1 and time_per_sample_s > 0):
            raise ValueError(f"bad workload constants u={activity}, m={memory_fraction}, t0={time_per_sample_s}")
        self.spec = spec
        self.workload = workload
        self.batch_size = int(batch_size)
        self.activity = float(activity)
        self.memory_fraction = float(memory_fraction)
        self.time_per_sample_at_max_s = float(time_per_sample_s)
        self.assumptions = tuple(assumptions)
        phys = _physics(spec)
        busy = phys.static_w + activity * phys.dynamic_w * phys.g
        compute = time_per_sample_s * (1.0 - memory_fraction) / phys.x
        other = time_per_sample_s * memory_fraction
        times = compute + other
        self._clocks = [float(c) for c in spec.sm_clocks_mhz]
        self._busy_w = [float(p) for p in busy]
        self._time_s = [float(t) for t in times]
        self._power_w = [float(p) for p in (compute * busy + other * phys.static_w) / times]
        self._idle_w = float(spec.static_power_w)

    def settle_index(self, power_limit_w: float) -> int:
        """Index (into ``spec.sm_clocks_mhz``) of the highest clock whose busy power fits under the limit."""
        return max(bisect_right(self._busy_w, power_limit_w) - 1, 0)

    def busy_power_w(self, sm_clock_mhz: float) -> float:
        """Power while computing at a supported clock: the limit at which the GPU settles at that clock."""
        return self._busy_w[self._check_clock(sm_clock_mhz)]

    def at(self, power_limit_w: float | None = None, sm_clock_mhz: float | None = None) -> OperatingPoint:
        """See :meth:`GpuModel.at`."""
        limit = self._check_limit(power_limit_w)
        i = self.settle_index(limit)
        if sm_clock_mhz is not None:
            i = min(i, self._check_clock(sm_clock_mhz))
        return OperatingPoint(limit, self._clocks[i], self._time_s[i], self._power_w[i], self._idle_w)


class CalibratedModel(GpuModel):
    """A measured trace, interpolated in the power limit; clock locks mapped through the parametric model."""

    calibrated = True

    def __init__(self, trace: Trace, parametric: ParametricModel | None = None) -> None:
        """Build the model from a trace.

        Args:
            trace: The measured trace (any optimizer): a shipped one, or a user's own
                (:func:`dtpo.devices.physics.user_trace.load_trace_file`) on any GPU with a power spec.
            parametric: The parametric model that maps clocks to limits (default: fitted to this trace).

        Raises:
            ConfigError: The trace's GPU has no power spec, or its epoch size is unknown.
        """
        self.trace = trace
        self.spec = find_power_spec(trace.gpu)
        self.workload = trace.workload
        self.batch_size = trace.batch_size
        self.parametric = parametric or _parametric_from_trace(self.spec, trace, trace.batch_size)
        samples = trace_samples_per_epoch(trace)
        self._limits = [p.power_limit_w for p in trace.points]
        self._time_s = [p.time_per_epoch_s / samples for p in trace.points]
        self._power_w = [p.average_power_w for p in trace.points]
        spans = (self._limits[0] <= self.spec.min_power_w + 1e-6 and self._limits[-1] >= self.spec.max_power_w - 1e-6)
        self.assumptions = (
            f"calibrated on a measured trace: {trace.gpu}, {trace.workload}, batch {trace.batch_size}, "
            f"{trace.optimizer} ({_origin(trace)}, limits {self._limits[0]:g}-{self._limits[-1]:g} W)",
            "piecewise-linear in the power limit between measured limits"
            + ("" if spans else "; outside them, the nearest measured point scaled by the parametric model"),
            f"time per sample = time per epoch / {samples:,} samples ({_samples_note(trace)})",
            "an SM-clock lock reads the trace at the limit where the parametric model settles at that clock",
            "idle power while waiting = the GPU's static power (capped at its busy power)",
        )

    def _read(self, limit: float) -> tuple[float, float]:
        limits = self._limits
        if limit <= limits[0]:
            return self._time_s[0], self._power_w[0]
        if limit >= limits[-1]:
            return self._time_s[-1], self._power_w[-1]
        j = bisect_right(limits, limit)
        lo, hi = limits[j - 1], limits[j]
        w = (limit - lo) / (hi - lo)
        return (self._time_s[j - 1] + w * (self._time_s[j] - self._time_s[j - 1]),
                self._power_w[j - 1] + w * (self._power_w[j] - self._power_w[j - 1]))

    def _curve(self, limit: float) -> tuple[float, float]:
        """Time per sample and power at ``limit``: read off the trace, or extrapolated past its ends.

        Past the measured limits the nearest measured point is scaled by the parametric model's ratios between
        that point's limit and ``limit`` (clamped to the GPU's range). The shipped traces span the whole range,
        so for them this is :meth:`_read`.
        """
        low, high = self._limits[0], self._limits[-1]
        target = min(max(limit, self.spec.min_power_w), self.spec.max_power_w)
        edge = low if target < low else high if target > high else None
        if edge is None:
            return self._read(target)
        time_s, power_w = self._read(edge)
        at_edge, there = self.parametric.at(edge), self.parametric.at(target)
        return (time_s * there.time_per_sample_s / at_edge.time_per_sample_s,
                power_w * there.power_w / at_edge.power_w)

    def at(self, power_limit_w: float | None = None, sm_clock_mhz: float | None = None) -> OperatingPoint:
        """See :meth:`GpuModel.at`."""
        limit = self._check_limit(power_limit_w)
        par = self.parametric
        free = par.settle_index(limit)
        i = free if sm_clock_mhz is None else min(free, self._check_clock(sm_clock_mhz))
        clock = float(self.spec.sm_clocks_mhz[i])
        if i == free:
            time_s, power_w = self._curve(limit)
        else:
            equivalent = par.busy_power_w(clock)
            if equivalent >= self._limits[0]:
                time_s, power_w = self._curve(equivalent)
            else:
                base = par.at(max(self._limits[0], self.spec.min_power_w))
                locked = par.at(None, clock)
                time_s = self._time_s[0] * locked.time_per_sample_s / base.time_per_sample_s
                power_w = self._power_w[0] * locked.power_w / base.power_w
        return OperatingPoint(limit, clock, time_s, power_w, min(self.spec.static_power_w, power_w))


def _nearest(traces: list[Trace], batch_size: int) -> Trace:
    return min(traces, key=lambda t: (abs(math.log(t.batch_size / batch_size)), t.batch_size))


def _traces_of(gpu: str, workload: str) -> list[Trace]:
    network, dataset = resolve_workload(workload)
    return [t for t in load_traces(gpu) if (t.network, t.dataset) == (network, dataset)]


def _physics_assumptions(spec: PowerSpec) -> tuple[str, ...]:
    constants = (f"P_static {spec.static_power_w:g} W, V floor {spec.v_floor:g} of max up to "
                 f"{spec.v_knee * spec.max_sm_mhz:.0f} MHz")
    origin = ("fitted to the Zeus NSDI'23 traces of this GPU" if spec.fitted
              else "estimated (idle + 7 % of max power; V/f curve = mean of the fitted A40/V100 curves)")
    return (
        "parametric model: busy power = P_static + u (P_max - P_static) (f/f_max) (V/V_max)^2, "
        "time = t0 ((1 - m) f_max/f + m); the limit caps busy power; the non-scaling share runs at P_static",
        f"GPU constants: {constants}, {origin}",
        f"datasheet: {spec.source}",
    )


def _parametric_from_trace(spec: PowerSpec, trace: Trace, batch_size: int) -> ParametricModel:
    fit = fit_workload(trace, spec)
    batch_note = ("" if trace.batch_size == batch_size
                  else f" (batch {batch_size} not measured: constants of the nearest measured batch)")
    assumptions = (
        *_physics_assumptions(spec),
        f"workload constants u={fit.activity:.2f}, m={fit.memory_fraction:.2f} fitted to the {trace.gpu} trace "
        f"({_origin(trace)}) of {trace.workload} at batch {trace.batch_size}{batch_note} "
        f"(rms log error {fit.rms_log_error:.3f})",
        f"time per sample = time per epoch / {trace_samples_per_epoch(trace):,} samples ({_samples_note(trace)})",
        "idle power while waiting = the GPU's static power",
    )
    return ParametricModel(spec, trace.workload, batch_size, fit.activity, fit.memory_fraction,
                           fit.time_per_sample_s, assumptions)


def _parametric_untraced(spec: PowerSpec, workload: str, batch_size: int) -> ParametricModel:
    ref_gpu = find_power_spec(REFERENCE_GPU)
    ref = _nearest(_traces_of(REFERENCE_GPU, workload), batch_size)
    fits = [fit_workload(_nearest(_traces_of(gpu, workload), batch_size)) for gpu in traced_gpus()]
    ref_fit = fit_workload(ref)
    activity = sum(f.activity for f in fits) / len(fits)
    compute_s = ref_fit.time_per_sample_s * (1 - ref_fit.memory_fraction) * ref_gpu.peak_flops / spec.peak_flops
    other_s = (ref_fit.time_per_sample_s * ref_fit.memory_fraction
               * ref_gpu.memory_bandwidth_bps / spec.memory_bandwidth_bps)
    t0 = compute_s + other_s
    assumptions = (
        *_physics_assumptions(spec),
        f"no measured trace for {spec.name}: activity u={activity:.2f} = mean of the A40 and V100 fits of "
        f"{ref.workload} (batch {ref.batch_size} nearest to {batch_size})",
        f"time scaled from the A40 trace: compute share by datasheet peak FP16 tensor FLOP/s "
        f"({ref_gpu.peak_flops / 1e12:.0f} -> {spec.peak_flops / 1e12:.0f} TFLOP/s), the rest by datasheet "
        f"memory bandwidth ({ref_gpu.memory_bandwidth_bps / 1e9:.0f} -> {spec.memory_bandwidth_bps / 1e9:.0f} "
        f"GB/s); per-sample time does not change with batch size",
        "idle power while waiting = the GPU's static power",
    )
    return ParametricModel(spec, ref.workload, batch_size, activity, other_s / t0, t0, assumptions)


@lru_cache(maxsize=256)
def _load_model(gpu: str, workload: str, batch_size: int | None, calibrated: bool | None) -> GpuModel:
    spec = find_power_spec(gpu)
    if spec.name not in traced_gpus():
        if calibrated:
            raise ConfigError(f"no measured trace for {spec.name}, so no calibrated model; calibrated models "
                              f"exist for {', '.join(traced_gpus())} (use the parametric model)")
        batch = batch_size if batch_size is not None else default_batch_size(REFERENCE_GPU, workload)
        return _parametric_untraced(spec, workload, batch)
    batch = batch_size if batch_size is not None else default_batch_size(spec.name, workload)
    traces = _traces_of(spec.name, workload)
    exact = next((t for t in traces if t.batch_size == batch), None)
    if calibrated and exact is None:
        find_trace(spec.name, workload, batch)  # raises the ConfigError listing the measured batch sizes
    parametric = _parametric_from_trace(spec, exact or _nearest(traces, batch), batch)
    if exact is not None and calibrated is not False:
        return CalibratedModel(exact, parametric)
    return parametric


def load_model(gpu: str, workload: str, batch_size: int | None = None,
               calibrated: bool | None = None) -> GpuModel:
    """The model of ``workload`` on ``gpu`` (cached: the same arguments return the same object).

    Args:
        gpu: GPU name or alias (see :mod:`dtpo.devices.physics.power_specs`), e.g. ``"A40"``, ``"h100"``.
        workload: ``"network"`` (when unambiguous) or ``"network/dataset"``, e.g. ``"resnet50"``.
        batch_size: Samples per step; ``None`` for Zeus's default batch of that workload (see
            :mod:`dtpo.devices.physics.traces`).
        calibrated: ``True``: the calibrated model (needs a trace); ``False``: the parametric model;
            ``None``: calibrated where a trace of (gpu, workload, batch size) exists, else parametric.

    Raises:
        ConfigError: Unknown GPU or workload, a bad batch size, ``calibrated=True`` without a trace, or a GPU
            outside the catalogue (``unlisted-<min>-<max>W``: it exists only with its trace).
    """
    spec = find_power_spec(gpu)
    if spec.from_trace:
        raise ConfigError(f"{spec.name} is a GPU outside the catalogue known only by its measured trace: simulate it "
                          f"with that trace, or choose one of {', '.join(power_spec_names())}")
    network, dataset = resolve_workload(workload)
    if batch_size is not None and (isinstance(batch_size, bool) or int(batch_size) != batch_size
                                   or batch_size < 1):
        raise ConfigError(f"batch size must be a positive integer, got {batch_size!r}")
    return _load_model(spec.name, f"{network}/{dataset}", None if batch_size is None else int(batch_size),
                       calibrated)
