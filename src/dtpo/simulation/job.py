"""The one description of a training job on simulated GPUs, shared by every simulation of :mod:`dtpo.simulation`.

A :class:`JobConfig` says what runs (GPU model or a measured trace, workload, batch), how big the job is (GPUs,
steps), how the GPUs differ from the model (noise, seed, energy-counter period) and which ranks are
stragglers, when (:data:`PATTERNS`). Each GPU is a :class:`~dtpo.devices.simulated.SimulatedGpu` of
:meth:`JobConfig.gpu_config`, rank ``r`` drawing its noise from ``(seed, r)``, so two simulations of one config
draw the same noise on every rank.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from dtpo.core.errors import ConfigError
from dtpo.devices.physics.gpu_model import GpuModel
from dtpo.devices.simulated import SimulatedGpuConfig, model_for

PATTERNS: tuple[str, ...] = ("static", "drifting", "intermittent")
MAX_GPUS = 4096  # each GPU is simulated on its own (its noise, its counter): time grows with the count
MAX_STEPS = 1_000_000

Progress = Callable[[int], None]  # called with the number of steps just simulated


@dataclass(frozen=True)
class JobConfig:
    """A data-parallel training job on simulated GPUs.

    Attributes:
        gpu: GPU model key (``dtpo simulate --list`` shows them); with ``trace_file``, the GPU it was measured on.
        workload: Workload name; with ``trace_file``, which of the file's traces (``"network"``,
            ``"network/dataset"`` or ``"network/dataset/optimizer"``; ``""``: the file's only one).
        gpus: Number of GPUs (data-parallel ranks).
        steps: Training steps (per setting, where a simulation runs several).
        batch_size: Per-GPU batch (``None``: the model's default).
        calibrated: Force the calibrated (True) or parametric (False) model; ``None`` picks calibrated where
            a trace exists.
        trace_file: A user's measured power-limit sweep (CSV in the Zeus columns, see
            :mod:`dtpo.devices.physics.user_trace`) to calibrate the GPUs on; ``None``: the shipped traces.
        seed: Noise seed.
        noise: Relative standard deviation of each step's compute time and of its power.
        counter_period_s: Energy-counter update period (0: continuous). The straggler simulation reads each
            rank's energy exactly and does not use it.
        stragglers: ``(rank, factor)`` pairs: those ranks compute ``factor`` times slower while slow. The
            data-parallel simulation applies a factor as it is (below 1 a rank is faster); the straggler
            simulation only slows ranks down (:meth:`factors`).
        pattern: When the stragglers are slow: ``static`` (always), ``drifting`` (the slow ranks move on to the
            next rank every ``period_steps``) or ``intermittent`` (slow for ``period_steps``, then not for as long).
        period_steps: How often a drifting straggler moves on, or an intermittent one switches.
        window_steps: Steps per window: what a per-rank policy sees between two decisions.
    """

    gpu: str
    workload: str
    gpus: int = 8
    steps: int = 1000
    batch_size: int | None = None
    calibrated: bool | None = None
    trace_file: str | None = None
    seed: int = 0
    noise: float = 0.01
    counter_period_s: float = 0.1
    stragglers: tuple[tuple[int, float], ...] = ()
    pattern: str = "static"
    period_steps: int = 500
    window_steps: int = 20

    def validate(self) -> None:
        """Raise :class:`ConfigError` (one line, the flag named) on values that cannot describe a job."""
        if not 1 <= self.gpus <= MAX_GPUS:
            raise ConfigError(f"--gpus must be between 1 and {MAX_GPUS:,}, got {self.gpus:,}")
        if not 1 <= self.steps <= MAX_STEPS:
            raise ConfigError(f"--steps must be between 1 and {MAX_STEPS:,}, got {self.steps:,}")
        if not math.isfinite(self.noise) or self.noise < 0:
            raise ConfigError(f"--noise must be a finite number >= 0 (e.g. 0.01), got {self.noise:g}")
        if not math.isfinite(self.counter_period_s) or self.counter_period_s < 0:
            raise ConfigError(f"--counter-period must be a finite number >= 0 s, got {self.counter_period_s:g}")
        if self.seed < 0:
            raise ConfigError(f"--seed must be >= 0, got {self.seed}")
        if self.batch_size is not None and self.batch_size < 1:
            raise ConfigError(f"--batch-size must be >= 1, got {self.batch_size}")
        if self.trace_file is not None and self.calibrated is False:
            raise ConfigError("--model parametric cannot use --trace: a measured trace gives a calibrated model")
        if self.pattern not in PATTERNS:
            raise ConfigError(f"unknown straggler pattern {self.pattern!r}; choose one of {', '.join(PATTERNS)}")
        for rank, factor in self.stragglers:
            if not 0 <= rank < self.gpus:
                raise ConfigError(f"straggler rank {rank} is not one of the {self.gpus} ranks (0-{self.gpus - 1})")
            if not math.isfinite(factor) or factor <= 0:
                raise ConfigError(f"straggler factor must be a finite number > 0, got {factor:g}")
        if self.period_steps < 1:
            raise ConfigError(f"--period must be >= 1 step, got {self.period_steps}")
        if self.window_steps < 1:
            raise ConfigError(f"window must be >= 1 step, got {self.window_steps}")

    def gpu_config(self, rank: int = 0) -> SimulatedGpuConfig:
        """The simulated GPU of ``rank`` (its noise drawn from ``(seed, rank)``), before any straggler slowdown."""
        return SimulatedGpuConfig(self.gpu, self.workload, self.batch_size, self.calibrated, index=rank,
                                  seed=self.seed, time_noise=self.noise, power_noise=self.noise,
                                  counter_period_s=self.counter_period_s,
                                  trace_file=None if self.trace_file is None else str(self.trace_file))

    def model(self) -> GpuModel:
        """The GPU model every rank runs (a shipped model, or one calibrated on ``trace_file``)."""
        return model_for(self.gpu_config())

    def factors(self, first_step: int, steps: int) -> np.ndarray:
        """Each rank's slowdown factor at each of ``steps`` steps from ``first_step``: shape (ranks, steps).

        A straggler slows its rank down only (a factor below 1 leaves it as it is); where two land on one rank,
        the larger factor counts.
        """
        out = np.ones((self.gpus, steps))
        index = np.arange(first_step, first_step + steps)
        phase = index // self.period_steps
        for rank, factor in self.stragglers:
            if self.pattern == "static":
                out[rank] = np.maximum(out[rank], factor)
            elif self.pattern == "drifting":
                moved = (rank + phase) % self.gpus
                for r in np.unique(moved):
                    out[r, moved == r] = np.maximum(out[r, moved == r], factor)
            else:
                out[rank, phase % 2 == 0] = np.maximum(out[rank, phase % 2 == 0], factor)
        return out
