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

import os
from types import ModuleType
from typing import Any

from dtpo.core.errors import ConfigError
from dtpo.core.measurement import Measurement
from dtpo.frameworks.tracker import FrameworkTracker, cpu_peak, datasheet_peak

FRAMEWORK = "tensorflow"


class Tracker(FrameworkTracker):
    """One worker's steps of a TensorFlow training loop, reported to dtpo (arguments: :class:`FrameworkTracker`).

    A step's result is read back to the host where a window closes (:func:`read_back`); ``batch=`` counts this
    worker's rows, summed over its replicas for a distributed dataset's ``PerReplica`` batch; ``samples`` must be
    a Python int (a tensor would make the host wait for it at every step).
    """

    framework = FRAMEWORK

    def device(self) -> tuple[bool, str | None]:
        """:func:`describe_device`."""
        return describe_device(_tensorflow())

    def wait(self, result: Any) -> Any:
        """:func:`read_back`."""
        return read_back(result)

    def batch_rows(self, batch: Any) -> int:
        """:func:`batch_rows`."""
        return batch_rows(batch)

    def peak_flops(self, precision: str) -> Measurement:
        """:func:`peak_flops`."""
        return peak_flops(_tensorflow(), precision)


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
        tf32 = tf.config.experimental.tensor_float_32_execution_enabled()
        return datasheet_peak(_gpu_name(tf) or "this GPU", precision, tf32, len(gpus))
    return cpu_peak(precision)


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

