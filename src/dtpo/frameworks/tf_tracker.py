"""The steps of a TensorFlow custom training loop (``tf.function`` + ``strategy.run``): :class:`Tracker`.

A loop that keeps its own model, optimizer and ``tf.distribute`` strategy says where each step ends and what it
returned; dtpo does the rest (the record, energy windows, the GPU knobs and their tuner), as for JAX::

    import dtpo.tensorflow

    with dtpo.tensorflow.Tracker(total_steps=1000, samples_per_step=batch) as tracker:
        for step in range(1000):
            loss = train_step(next(batches))      # a tf.function running strategy.run(...)
            tracker.step(loss)

TensorFlow returns from a step while the GPU still computes. The tracker waits for the step's work only where a
window of steps closes (:class:`~dtpo.frameworks.steps.FrameworkSteps`), by reading the step's result back to
the host (:func:`read_back`): a copy from the device queues behind everything the step put on it, the optimizer's
updates included, so the window holds its own device time and the host keeps queueing steps in between.

Under ``MultiWorkerMirroredStrategy`` each worker reports its own steps and samples (its share of the global
batch); ``dtpo launch --framework tensorflow`` writes every worker's ``TF_CONFIG``.
"""

from __future__ import annotations

import math
import numbers
import os
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any

from dtpo.core.config import EnergyConfig, KnobConfig, RunConfig, TuneConfig
from dtpo.core.errors import ConfigError
from dtpo.core.launch_contract import LaunchContract
from dtpo.core.measurement import Measurement
from dtpo.core.record import RunRecord
from dtpo.frameworks.steps import FrameworkSteps

FRAMEWORK = "tensorflow"
PRECISIONS = ("float32", "bfloat16", "float16")
"""What ``precision`` takes: the dtype of the step's matrix products, for the device's peak FLOP/s."""
_SESSION_OPTIONS = ("warmup_steps", "window_steps", "flush_every")


class Tracker:
    """One worker's steps of a TensorFlow training loop, reported to dtpo.

    Args:
        total_steps: Steps the loop will run, where known (progress, the last window, the tuner's estimate).
        samples_per_step: Samples each step processes on this worker, where :meth:`step` is not told (with a
            distributed dataset: this worker's share of the global batch, not the global batch).
        flops_per_step: FLOPs of one step on this worker (its share of the global batch), for MFU; the peak is
            the datasheet figure of this worker's GPUs, or the CPU's measured one.
        precision: The dtype of the step's matrix products (one of :data:`PRECISIONS`), for that peak.
        run_dir: Where rank 0 writes ``record.json`` (default: the launch's, ``$DTPO_RUN_DIR`` or
            ``runs/<run-id>``).
        tune: Tune a GPU knob while training: ``"power-limit"``, ``"sm-clock"``, ``"both"`` or a
            :class:`~dtpo.core.config.TuneConfig`.
        options: Further :class:`~dtpo.session.step_reporter.StepReporter` arguments (``warmup_steps``,
            ``window_steps``, ``energy``, ``knobs``, ``callbacks``, ``progress``, ``summary``, ``config``,
            ``run_config``, ``clock``, ...). Under ``dtpo launch`` or ``dtpo train`` the launch's configuration
            (``--tune``, ``--cost``, window sizes) is the default; what is passed here wins.

    Raises:
        ConfigError: A bad argument (one line), or tuning that only ``dtpo.Session`` does.
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
        tf = _tensorflow()
        gpu, device_name = describe_device(tf)
        run_config = _run_config(tune, options)
        if run_config is not None:
            options["run_config"] = run_config
        self.steps = FrameworkSteps(read_back, FRAMEWORK, gpu=gpu, device_name=device_name, total_steps=total_steps,
                                    run_dir=run_dir, **options)
        if flops_per_step is not None:
            rank = self.steps.reporter.rank_record
            rank.flops_per_step = float(flops_per_step)
            rank.peak_flops = peak_flops(tf, precision)

    @property
    def step_count(self) -> int:
        """Steps reported so far."""
        return self.steps.step_count

    @property
    def run_dir(self) -> Path:
        """The run directory every worker agreed on."""
        return self.steps.reporter.run_dir

    def start(self) -> None:
        """Training starts: the first step begins now (``with`` calls it; else the first :meth:`step` does)."""
        self.steps.start()

    def step(self, result: Any = None, samples: int | None = None, *, batch: Any = None,
             tokens: int | None = None) -> None:
        """A training step was dispatched; the next one begins.

        Args:
            result: What the step returned (its loss: a tensor, a ``PerReplica`` value of ``strategy.run``, or a
                nest of them), read back to the host only where a window of steps closes. ``None``: the result
                of an earlier step stands in.
            samples: Samples of the step on this worker, a Python int (a tensor would make the host wait for it
                at every step).
            batch: The step's batch (a tensor, a distributed dataset's ``PerReplica`` batch, or a nest of them,
                samples along the leading axis), counted where ``samples`` is not given: this worker's rows.
            tokens: Tokens of the step on this worker, where counted.

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

    def close_window(self) -> None:
        """Close the open window of steps now, so that what the loop does next (an evaluation) counts in none."""
        self.steps.reporter.close_window()

    def finish(self, error: BaseException | None = None) -> RunRecord | None:
        """Wait for the last step's work and end the run: rank 0 gathers every worker's record, writes
        ``record.json`` and (outside ``dtpo launch``) prints the summary; after an error each worker writes its
        own partial record. Later calls do nothing.

        Returns:
            The run record on rank 0, ``None`` elsewhere.
        """
        return self.steps.finish(error)

    def __enter__(self) -> Tracker:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.finish(error=exc)


def batch_rows(batch: Any) -> int:
    """Samples in ``batch`` on this worker: the leading dimension of its first tensor; for a distributed value
    (a distributed dataset's ``PerReplica`` batch), the sum over this worker's replicas.

    Raises:
        ConfigError: No tensor in ``batch``, or one without a known leading dimension.
    """
    tf = _tensorflow()
    leaves = tf.nest.flatten(batch)
    parts = _components(tf, leaves[0]) if leaves else ()
    if not parts or not all(hasattr(part, "shape") for part in parts):
        raise ConfigError(f"Tracker.step: batch= must hold tensors, got {type(batch).__name__}")
    rows = 0
    for part in parts:
        shape = tuple(part.shape)
        if not shape or shape[0] is None:
            raise ConfigError("Tracker.step: the batch's first tensor has no known leading dimension; pass "
                              "samples= instead")
        rows += int(shape[0])
    return rows


def read_back(result: Any) -> None:
    """Wait until ``result`` (a step's tensors, ``PerReplica``/mirrored values, or a nest of them) is computed,
    by copying every tensor in it to the host; Python and NumPy values need no waiting."""
    tf = _tensorflow()
    for leaf in tf.nest.flatten(result):
        for value in _components(tf, leaf):
            numpy = getattr(value, "numpy", None)
            if callable(numpy):
                numpy()
    _drain_async_eager()


def describe_device(tf: ModuleType) -> tuple[bool, str | None]:
    """Whether TensorFlow computes on a GPU here, and how the record names this worker's (``None``: the CPU):
    ``cuda:<local rank> (<GPU name>, tensorflow)``, as NVML sees it for energy and the knobs."""
    name = _gpu_name(tf)
    if name is None:
        return False, None
    return True, f"cuda:{os.environ.get('LOCAL_RANK', 0) or 0} ({name}, {FRAMEWORK})"


def peak_flops(tf: ModuleType, precision: str) -> Measurement:
    """Peak matmul FLOP/s of this worker's devices in ``precision``, with its source: its GPUs' from the datasheet
    catalogue (float32 as TF32 where TensorFlow allows it, its default), else the CPU's measured (on torch's
    kernels, as for a PyTorch run)."""
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        from dtpo.devices.physics.catalogue import find_gpu, gpu_peak_flops

        name = _gpu_name(tf) or "this GPU"
        spec = find_gpu(name)
        if spec is None:
            return Measurement(None, "FLOP/s", "datasheet", f"{name} is not in the catalogue")
        value = gpu_peak_flops(spec, precision, tf.config.experimental.tensor_float_32_execution_enabled())
        return Measurement(None if value is None else value * len(gpus), "FLOP/s", "datasheet",
                           f"{len(gpus)} x {spec.name} {precision} dense peak")
    import torch

    from dtpo.session.loop.mfu import measured_cpu_peak

    return measured_cpu_peak(getattr(torch, precision), autocast=False)


def _gpu_name(tf: ModuleType) -> str | None:
    """The name of this worker's GPU as CUDA reports it (the one at its local rank, else the first TensorFlow
    sees), ``None`` without a GPU."""
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return None
    local_rank = int(os.environ.get("LOCAL_RANK", 0) or 0)
    gpu = gpus[local_rank] if local_rank < len(gpus) else gpus[0]
    try:
        details = tf.config.experimental.get_device_details(gpu)
    except (ValueError, RuntimeError):
        details = {}
    return str(details.get("device_name") or gpu.name.replace("/physical_device:", ""))


def _components(tf: ModuleType, value: Any) -> tuple[Any, ...]:
    """The per-device tensors of a distributed value (``PerReplica``, mirrored), else the value itself."""
    if isinstance(value, tf.distribute.DistributedValues):
        return tuple(getattr(value, "values", ())) or (value,)
    return (value,)


def _drain_async_eager() -> None:
    """In asynchronous eager mode (``tf.config.experimental.set_synchronous_execution(False)``), wait for the ops
    still queued (cheap, and nothing, in the default synchronous mode)."""
    try:
        from tensorflow.python.eager import context  # no public name for it in TF 2.x
    except ImportError:
        return
    if context.context().executor.is_async():
        context.async_wait()


def _tensorflow() -> ModuleType:
    import tensorflow as tf  # the tensorflow extra: imported when first needed

    return tf


def _run_config(tune: str | TuneConfig | None, options: dict[str, Any]) -> RunConfig | None:
    """The run's configuration where one is needed: the caller's ``run_config``, else the launch's
    (``dtpo launch --tune``, ``dtpo train``), with ``tune`` and the session options passed here on top; ``None``
    where neither exists (the reporter builds one from the options). As :mod:`dtpo.frameworks.jax_tracker` does."""
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


def _is_count(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 0
