"""What the one-call-per-step trackers of JAX and TensorFlow share: :class:`FrameworkTracker`.

A tracker checks its arguments in one line each, asks its framework whether it computes on a GPU and how to name
it, counts a step's samples from what the loop hands it (a count, a batch, or a fixed number per step), and feeds
:class:`~dtpo.frameworks.steps.FrameworkSteps`, which waits on the step's result only where a window closes. Each
framework says how (:meth:`FrameworkTracker.device`, :meth:`~FrameworkTracker.wait`,
:meth:`~FrameworkTracker.batch_rows`, :meth:`~FrameworkTracker.peak_flops`): :mod:`dtpo.frameworks.jax_tracker`
and :mod:`dtpo.frameworks.tf_tracker`.
"""

from __future__ import annotations

import math
import numbers
import os
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar

from dtpo.core.config import TuneConfig
from dtpo.core.errors import ConfigError
from dtpo.core.measurement import Measurement
from dtpo.core.record import RunRecord
from dtpo.frameworks.steps import FrameworkSteps

PRECISIONS = ("float32", "bfloat16", "float16")
"""What ``precision`` takes: the dtype of the step's matrix products, for the device's peak FLOP/s."""


class FrameworkTracker:
    """One process's steps of another framework's training loop, reported to dtpo.

    Args:
        total_steps: Steps the loop will run, where known (progress, the last window, the tuner's estimates).
        samples_per_step: Samples of every step on this process, where :meth:`step` is not told them (with a
            distributed dataset: this process's share of the global batch).
        flops_per_step: FLOPs of one step on this process, for MFU; the peak is the GPU's datasheet figure, or
            the CPU's measured one.
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

    framework: ClassVar[str] = "framework"
    """The framework's name, for the record."""

    def __init__(self, total_steps: int | None = None, *, samples_per_step: int | None = None,
                 flops_per_step: float | None = None, precision: str = "float32",
                 run_dir: str | os.PathLike[str] | None = None, tune: str | TuneConfig | None = None,
                 **options: Any) -> None:
        if total_steps is not None and not is_count(total_steps):
            raise ConfigError(f"total_steps must be a whole number >= 0, got {total_steps!r}")
        if samples_per_step is not None and not is_count(samples_per_step):
            raise ConfigError(f"samples_per_step must be a whole number >= 0, got {samples_per_step!r}")
        if flops_per_step is not None and not (isinstance(flops_per_step, numbers.Real)
                                               and not isinstance(flops_per_step, bool)
                                               and math.isfinite(flops_per_step) and flops_per_step > 0):
            raise ConfigError(f"flops_per_step must be a number > 0, got {flops_per_step!r}")
        if precision not in PRECISIONS:
            raise ConfigError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
        self.samples_per_step = samples_per_step
        gpu, device_name = self.device()
        self.steps = FrameworkSteps(self.wait, self.framework, gpu=gpu, device_name=device_name,
                                    total_steps=total_steps, run_dir=run_dir, tune=tune, **options)
        if flops_per_step is not None:
            rank = self.steps.reporter.rank_record
            rank.flops_per_step = float(flops_per_step)
            rank.peak_flops = self.peak_flops(precision)

    # -- what each framework says ------------------------------------------------------------------------------

    def device(self) -> tuple[bool, str | None]:
        """Whether the framework computes on a GPU here, and how the record names it (``None``: the default)."""
        return False, None

    def wait(self, result: Any) -> Any:
        """Block until ``result`` (what a step returned) is computed."""
        return result

    def batch_rows(self, batch: Any) -> int:
        """Samples in ``batch`` on this process.

        Raises:
            ConfigError: They cannot be counted from it.
        """
        raise ConfigError(f"Tracker.step: cannot count the samples of a {type(batch).__name__}; pass samples=")

    def peak_flops(self, precision: str) -> Measurement:
        """Peak matmul FLOP/s of this process's devices in ``precision``, with its source."""
        return Measurement(None, "FLOP/s", "datasheet", "no peak known")

    # -- the loop ------------------------------------------------------------------------------------------------

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
            result: What the step returned (its loss, the new state, or a nest of them), waited for only where a
                window of steps closes. ``None``: the result of an earlier step stands in.
            samples: Samples of the step on this process, a Python int (a device value would make the host wait
                for it at every step).
            batch: The step's batch (samples along the leading axis), counted where ``samples`` is not given:
                the rows this process holds (:meth:`batch_rows`).
            tokens: Tokens of the step on this process, where counted.

        Raises:
            ConfigError: No way to count the samples, or a bad count.
        """
        if samples is None:
            samples = self.batch_rows(batch) if batch is not None else self.samples_per_step
        if samples is None:
            raise ConfigError("Tracker.step: say how many samples the step carried: step(result, samples=N), "
                              "step(result, batch=x) or Tracker(samples_per_step=N)")
        if not is_count(samples) or (tokens is not None and not is_count(tokens)):
            raise ConfigError(f"Tracker.step: samples and tokens must be whole numbers >= 0, got {samples!r} "
                              f"and {tokens!r}")
        self.steps.step(int(samples), result=result, tokens=None if tokens is None else int(tokens))

    def close_window(self) -> None:
        """Close the open window of steps now, so that what the loop does next (an evaluation) counts in none."""
        self.steps.reporter.close_window()

    def finish(self, error: BaseException | None = None) -> RunRecord | None:
        """Wait for the last step's work and end the run: rank 0 gathers every process's record, writes
        ``record.json`` and (outside ``dtpo launch``) prints the summary; after an error each process writes its
        own partial record. Later calls do nothing.

        Returns:
            The run record on rank 0, ``None`` elsewhere.
        """
        return self.steps.finish(error)

    def __enter__(self) -> FrameworkTracker:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.finish(error=exc)


def is_count(value: Any) -> bool:
    """Whether ``value`` is a whole number >= 0 (``bool`` is not)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 0


def datasheet_peak(gpu_name: str, precision: str, tf32: bool, count: int) -> Measurement:
    """Peak matmul FLOP/s of ``count`` GPUs named ``gpu_name`` in ``precision`` (float32 as TF32 where ``tf32``),
    from the datasheet catalogue; ``None`` with the reason for a GPU it does not hold."""
    from dtpo.devices.physics.catalogue import find_gpu, gpu_peak_flops

    spec = find_gpu(gpu_name)
    if spec is None:
        return Measurement(None, "FLOP/s", "datasheet", f"{gpu_name} is not in the catalogue")
    value = gpu_peak_flops(spec, precision, tf32)
    return Measurement(None if value is None else value * count, "FLOP/s", "datasheet",
                       f"{count} x {spec.name} {precision} dense peak")


def cpu_peak(precision: str) -> Measurement:
    """The CPU's peak matmul FLOP/s in ``precision``, measured (on torch's kernels, as for a PyTorch run)."""
    import torch

    from dtpo.session.loop.mfu import measured_cpu_peak

    return measured_cpu_peak(getattr(torch, precision), autocast=False)
