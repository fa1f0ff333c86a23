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
import os
from collections.abc import Callable
from typing import Any

import jax

from dtpo.core.errors import ConfigError
from dtpo.core.measurement import Measurement
from dtpo.frameworks.tracker import FrameworkTracker, cpu_peak, datasheet_peak

log = logging.getLogger(__name__)



class Tracker(FrameworkTracker):
    """One process's steps of a JAX training loop, reported to dtpo (arguments: :class:`FrameworkTracker`).

    Create it after ``jax.distributed.initialize()`` (where the loop calls it): looking at the devices starts
    JAX's backend, after which JAX refuses to join other processes. A step's result is waited for with
    ``jax.block_until_ready``; ``batch=`` counts the rows of a global ``jax.Array`` this process holds.
    """

    framework = "jax"

    def device(self) -> tuple[bool, str | None]:
        """This process's first local device: a GPU is named ``cuda:<local rank> (<kind>, jax)`` as NVML sees it."""
        _warn_if_not_joined()
        device = jax.local_devices()[0]
        if device.platform != "gpu":
            return False, None
        return True, f"cuda:{int(os.environ.get('LOCAL_RANK', 0) or 0)} ({device.device_kind}, jax)"

    def wait(self, result: Any) -> Any:
        """``jax.block_until_ready``."""
        return jax.block_until_ready(result)

    def batch_rows(self, batch: Any) -> int:
        """:func:`batch_rows`."""
        return batch_rows(batch)

    def peak_flops(self, precision: str) -> Measurement:
        """:func:`peak_flops` of this process's first local device."""
        return peak_flops(jax.local_devices()[0], precision)


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
        tf32 = str(jax.config.jax_default_matmul_precision or "default").lower() not in ("highest", "float32")
        return datasheet_peak(device.device_kind, precision, tf32, count)
    if device.platform == "cpu":
        return cpu_peak(precision)
    return Measurement(None, "FLOP/s", "measured", f"no peak known for {device.platform}")


def _warn_if_not_joined() -> None:
    """One line where several processes were launched but JAX was not told to join them."""
    if int(os.environ.get("WORLD_SIZE", 1) or 1) > 1 and not jax.distributed.is_initialized():
        log.warning("dtpo.jax: %s processes were launched but jax.distributed.initialize() was not called before "
                    "the Tracker: each process trains alone", os.environ["WORLD_SIZE"])

