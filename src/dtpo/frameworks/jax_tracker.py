"""``dtpo.jax.Tracker``: a JAX training loop measured and tuned by dtpo, with one call per step.

The loop keeps its own model, optimizer, mesh and ``jax.distributed`` set-up; it tells the tracker each step's
result and how many samples the step carried on this process, and gets what a PyTorch loop under dtpo gets: the
run record, energy windows, the GPU knobs and the power/clock tuner, progress and the summary::

    import jax
    from dtpo.jax import Tracker, step_flops

    jax.distributed.initialize()  # under `dtpo launch --framework jax`: no arguments needed
    with Tracker(total_steps=1000, flops_per_step=step_flops(train_step, params, x, y)) as tracker:
        for x, y in batches:
            params, loss = train_step(params, x, y)
            tracker.step(loss, batch=x)  # samples: this process's rows of x

A step's device work is waited for (``jax.block_until_ready`` on the result it was given) only where a window of
steps closes (see :class:`~dtpo.frameworks.steps.FrameworkSteps`), so JAX's asynchronous dispatch keeps running
ahead inside a window: per-step times inside a window show how the host queued the work, a window's total is
its device time. Under ``dtpo launch`` or ``dtpo train`` the tracker takes the launch's configuration
(``--tune``, ``--cost``, window sizes); what is passed here wins.
"""

from __future__ import annotations

import logging
import math
import numbers
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax

from dtpo.core.config import EnergyConfig, KnobConfig, RunConfig, TuneConfig
from dtpo.core.errors import ConfigError
from dtpo.core.launch_contract import LaunchContract
from dtpo.core.measurement import Measurement
from dtpo.core.record import RunRecord
from dtpo.frameworks.steps import FrameworkSteps

log = logging.getLogger(__name__)

PRECISIONS = ("float32", "bfloat16", "float16")
"""What ``precision`` takes: the dtype of the step's matrix products, for the device's peak FLOP/s."""

_SESSION_OPTIONS = ("warmup_steps", "window_steps", "flush_every")


class Tracker:
    """One process's steps of a JAX training loop, reported to dtpo.

    Create it after ``jax.distributed.initialize()`` (where the loop calls it): looking at the devices starts
    JAX's backend, after which JAX refuses to join other processes.

    Args:
        total_steps: Steps the loop will run, where known (progress, the last window, the tuner's estimates).
        samples_per_step: Samples of every step on this process, where :meth:`step` is not told them.
        flops_per_step: FLOPs of one step on this process (:func:`step_flops`), for MFU; the peak is the GPU's
            datasheet figure, or the CPU's measured one.
        precision: The dtype of the step's matrix products (one of :data:`PRECISIONS`), for that peak.
        run_dir: Where rank 0 writes ``record.json`` (default: the launch's, ``$DTPO_RUN_DIR`` or
            ``runs/<run-id>``).
        tune: Tune a GPU knob while training: ``"power-limit"``, ``"sm-clock"``, ``"both"`` or a
            :class:`~dtpo.core.config.TuneConfig`.
        options: Further :class:`~dtpo.session.step_reporter.StepReporter` arguments (``warmup_steps``,
            ``window_steps``, ``energy``, ``knobs``, ``callbacks``, ``progress``, ``summary``, ``config``,
            ``run_config``, ``clock``, ...).

    Attributes:
        steps: The :class:`~dtpo.frameworks.steps.FrameworkSteps` underneath (its ``reporter`` is the run's
            :class:`~dtpo.session.step_reporter.StepReporter`).

    Raises:
        ConfigError: A bad argument (one line).
    """

    def __init__(self, total_steps: int | None = None, *, samples_per_step: int | None = None,
                 flops_per_step: float | None = None, precision: str = "float32",
                 run_dir: str | os.PathLike[str] | None = None, tune: str | TuneConfig | None = None,
                 **options: Any) -> None:
        if total_steps is not None and not _is_count(total_steps):
            raise ConfigError(f"total_steps must be a whole number >= 0, got {total_steps!r}")
        if samples_per_step is not None and not _is_count(samples_per_step):
            raise ConfigError(f"samples_per_step must be a whole number >= 0, got {samples_per_step!r}")
        if flops_per_step is not None and not (isinstance(flops_per_step, numbers.Real)
                                               and not isinstance(flops_per_step, bool)
                                               and math.isfinite(flops_per_step) and flops_per_step > 0):
            raise ConfigError(f"flops_per_step must be a number > 0, got {flops_per_step!r}")
        if precision not in PRECISIONS:
            raise ConfigError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
        self.samples_per_step = samples_per_step
        _warn_if_not_joined()
        device = jax.local_devices()[0]
        gpu = device.platform == "gpu"
        local_rank = int(os.environ.get("LOCAL_RANK", 0) or 0)
        name = f"cuda:{local_rank} ({device.device_kind}, jax)" if gpu else None
        run_config = _run_config(tune, options)
        if run_config is not None:
            options["run_config"] = run_config
        self.steps = FrameworkSteps(jax.block_until_ready, "jax", gpu=gpu, device_name=name, total_steps=total_steps,
                                    run_dir=run_dir, **options)
        if flops_per_step is not None:
            rank = self.steps.reporter.rank_record
            rank.flops_per_step = float(flops_per_step)
            rank.peak_flops = peak_flops(device, precision)

    @property
    def step_count(self) -> int:
        """Steps reported so far."""
        return self.steps.step_count

    @property
    def run_dir(self) -> Path:
        """The run directory every process agreed on."""
        return self.steps.reporter.run_dir

    def start(self) -> None:
        """Training starts: the first step begins now (``with`` calls it; else the first :meth:`step` does)."""
        self.steps.start()

    def step(self, result: Any = None, samples: int | None = None, *, batch: Any = None,
             tokens: int | None = None) -> None:
        """A training step was dispatched; the next one begins.

        Args:
            result: What the step returned (its loss, the new state: any pytree of arrays), waited for only where a
                window of steps closes. ``None``: the result of an earlier step stands in.
            samples: Samples of the step on this process.
            batch: The step's batch (an array or a pytree of arrays, samples along the leading axis), counted where
                ``samples`` is not given: a global ``jax.Array`` counts the rows this process holds.
            tokens: Tokens of the step on this process, where counted.

        Raises:
            ConfigError: No way to count the samples, or a bad count.
        """
        if samples is None:
            samples = batch_rows(batch) if batch is not None else self.samples_per_step
        if samples is None:
            raise ConfigError("Tracker.step: say how many samples the step carried: step(result, samples=N), "
                              "step(result, batch=x) or Tracker(samples_per_step=N)")
        if not _is_count(samples) or (tokens is not None and not _is_count(tokens)):
            raise ConfigError(f"Tracker.step: samples and tokens must be whole numbers >= 0, got {samples!r} "
                              f"and {tokens!r}")
        self.steps.step(int(samples), result=result, tokens=None if tokens is None else int(tokens))

    def finish(self, error: BaseException | None = None) -> RunRecord | None:
        """Wait for the last step's work and end the run: rank 0 gathers every process's record, writes
        ``record.json`` and (outside ``dtpo launch``) prints the summary. Later calls do nothing.

        Returns:
            The run record on rank 0, ``None`` elsewhere.
        """
        return self.steps.finish(error)

    def __enter__(self) -> Tracker:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        self.finish(error=exc)


def batch_rows(batch: Any) -> int:
    """Samples in ``batch`` on this process: the leading dimension of its first array, where that is a global
    ``jax.Array`` the rows of it this process holds (each row once, however many local devices replicate it).

    Raises:
        ConfigError: No array in ``batch``, or one without a leading dimension.
    """
    leaves = jax.tree.leaves(batch)
    if not leaves or not hasattr(leaves[0], "shape"):
        raise ConfigError(f"Tracker.step: batch= must hold arrays, got {type(batch).__name__}")
    first = leaves[0]
    if not first.shape:
        raise ConfigError("Tracker.step: the batch's first array is a scalar; pass samples= instead")
    if not isinstance(first, jax.Array) or first.is_fully_addressable:
        return int(first.shape[0])
    rows = {shard.index[0].indices(first.shape[0])[:2] if shard.index else (0, first.shape[0])
            for shard in first.addressable_shards}
    return sum(stop - start for start, stop in rows)


def step_flops(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> float:
    """FLOPs of one call of ``fn`` on this process, from XLA's cost analysis of it compiled for these arguments.

    ``fn`` is a ``jax.jit`` function (a plain one is jitted here); compiling it ahead of time costs one extra
    compilation. XLA counts the FLOPs of one device's share of a sharded computation; this process's figure is
    that times the devices of this process the arguments live on.

    Raises:
        ConfigError: XLA reported no FLOPs for it.
    """
    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    cost = jitted.lower(*args, **kwargs).compile().cost_analysis()
    if isinstance(cost, list | tuple):  # older JAX: one dict per computation
        cost = cost[0] if cost else None
    flops = float((cost or {}).get("flops", 0.0) or 0.0)
    if flops <= 0:
        raise ConfigError(f"XLA reported no FLOPs for {getattr(fn, '__name__', fn)!r}: pass flops_per_step yourself")
    devices = {device for leaf in jax.tree.leaves((args, kwargs)) if isinstance(leaf, jax.Array)
               for device in leaf.sharding.addressable_devices}
    return flops * max(1, len(devices))


def peak_flops(device: Any, precision: str) -> Measurement:
    """Peak matmul FLOP/s of this process's devices like ``device`` in ``precision``, with its source: a GPU's from
    the datasheet catalogue (float32 as TF32 unless JAX's default matmul precision asks for more), the CPU's
    measured (on torch's kernels, as for a PyTorch run)."""
    count = jax.local_device_count()
    if device.platform == "gpu":
        from dtpo.devices.physics.catalogue import find_gpu, gpu_peak_flops

        spec = find_gpu(device.device_kind)
        if spec is None:
            return Measurement(None, "FLOP/s", "datasheet", f"{device.device_kind} is not in the catalogue")
        tf32 = str(jax.config.jax_default_matmul_precision or "default").lower() not in ("highest", "float32")
        value = gpu_peak_flops(spec, precision, tf32)
        return Measurement(None if value is None else value * count, "FLOP/s", "datasheet",
                           f"{count} x {spec.name} {precision} dense peak")
    if device.platform == "cpu":
        import torch

        from dtpo.session.loop.mfu import measured_cpu_peak

        return measured_cpu_peak(getattr(torch, precision), autocast=False)
    return Measurement(None, "FLOP/s", "measured", f"no peak known for {device.platform}")


def _run_config(tune: str | TuneConfig | None, options: dict[str, Any]) -> RunConfig | None:
    """The run's configuration where one is needed: the caller's ``run_config``, else the launch's
    (``dtpo launch --tune``, ``dtpo train``), with ``tune`` and the session options passed here on top; ``None``
    where neither exists (the reporter builds one from the options)."""
    if tune is not None and not isinstance(tune, str | TuneConfig):
        raise ConfigError(f"tune must be a knob name or a TuneConfig, got {tune!r}")
    base = options.pop("run_config", None)
    if base is None:
        path = LaunchContract.from_environ().config
        if path is None:
            if tune is not None:
                options["tune"] = TuneConfig(knob=tune) if isinstance(tune, str) else tune
            return None
        base = RunConfig.load(path)
    if not isinstance(base, RunConfig):
        raise ConfigError(f"run_config must be a RunConfig, got {type(base).__name__}")
    session = {name: options.pop(name) for name in _SESSION_OPTIONS if name in options}
    changes: dict[str, dict[str, Any]] = {"session": {"count_flops": False, **session}}
    if tune is not None:  # a knob's name keeps the launch's cost; a whole TuneConfig replaces it
        changes["tune"] = {"knob": tune} if isinstance(tune, str) else tune.to_dict()
    energy = options.pop("energy", None)
    if energy is not None:
        changes["energy"] = energy.to_dict() if isinstance(energy, EnergyConfig) else {"enabled": bool(energy)}
    knobs = options.pop("knobs", None)
    if isinstance(knobs, KnobConfig):
        changes["knobs"] = knobs.to_dict()
    return base.replace(**changes)


def _warn_if_not_joined() -> None:
    """One line where several processes were launched but JAX was not told to join them."""
    if int(os.environ.get("WORLD_SIZE", 1) or 1) > 1 and not jax.distributed.is_initialized():
        log.warning("dtpo.jax: %s processes were launched but jax.distributed.initialize() was not called before "
                    "the Tracker: each process trains alone", os.environ["WORLD_SIZE"])


def _is_count(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 0
