"""Per-rank straggler slowdown on simulated GPUs: a data-parallel job whose slowest rank changes over time.

Each rank is its own :class:`~dtpo.devices.simulated.SimulatedGpu` (its own knob-state file and journal
entry, so each can run its own clock), all of one GPU model and workload. A *pattern* makes some ranks
slower: ``static`` (the listed ranks, always), ``drifting`` (the slow ranks move to the next ranks every
``period_steps``) or ``intermittent`` (slow for ``period_steps``, then not for as long). Every step ends when
the slowest rank is done; the others wait at idle power.

:func:`run_job` runs the job with or without :class:`~dtpo.tune.straggler.StragglerSlowdown` deciding a clock
per rank after every window, through a journaled knob controller. :func:`ideal_energy` is the yardstick: the
noise-free energy when every non-critical rank runs at the *just-in-time* setting (of the clocks at which it
still keeps up with the critical rank, the one that spends least, waiting included) and when every rank runs
at full clock; their difference is the *bloat*. Every
figure here is simulated.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dtpo.core.errors import ConfigError
from dtpo.devices.base import KnobState
from dtpo.devices.journal import KnobJournal
from dtpo.devices.knobs import KnobController
from dtpo.devices.physics.gpu_model import GpuModel, load_model
from dtpo.devices.simulated import SimulatedGpu, SimulatedGpuConfig, operating_point
from dtpo.tune.straggler import RankWindow, StragglerSlowdown

PATTERNS: tuple[str, ...] = ("static", "drifting", "intermittent")
MAX_JOB_GPUS = 1024


@dataclass(frozen=True)
class StragglerJob:
    """A simulated job with stragglers.

    Attributes:
        gpu: GPU model, e.g. ``"A40"``.
        workload: Workload, e.g. ``"resnet50"``.
        gpus: Ranks.
        steps: Steps to run.
        stragglers: ``(rank, factor)`` pairs: those ranks compute ``factor`` times slower while slow.
        pattern: ``static``, ``drifting`` or ``intermittent``.
        period_steps: How often a drifting straggler moves on, or an intermittent one switches.
        noise: Relative standard deviation of step time and power.
        seed: Noise seed.
        window_steps: Steps per decision.
        batch_size: Per-rank batch (``None``: the model's default).
    """

    gpu: str
    workload: str
    gpus: int = 8
    steps: int = 2000
    stragglers: tuple[tuple[int, float], ...] = ((0, 1.2),)
    pattern: str = "static"
    period_steps: int = 500
    noise: float = 0.01
    seed: int = 0
    window_steps: int = 20
    batch_size: int | None = None

    def validate(self) -> None:
        """One-line :class:`ConfigError` for a job that cannot be simulated."""
        if not 2 <= self.gpus <= MAX_JOB_GPUS:
            raise ConfigError(f"--gpus must be between 2 and {MAX_JOB_GPUS} for stragglers, got {self.gpus}")
        if self.pattern not in PATTERNS:
            raise ConfigError(f"unknown straggler pattern {self.pattern!r}; choose one of {', '.join(PATTERNS)}")
        for rank, factor in self.stragglers:
            if not 0 <= rank < self.gpus:
                raise ConfigError(f"straggler rank {rank} is not one of the {self.gpus} ranks (0-{self.gpus - 1})")
            if not (math.isfinite(factor) and factor > 0):
                raise ConfigError(f"straggler factor must be a finite number > 0, got {factor:g}")
        for name, value in (("steps", self.steps), ("period", self.period_steps), ("window", self.window_steps)):
            if value < 1:
                raise ConfigError(f"{name} must be >= 1, got {value}")
        if not (math.isfinite(self.noise) and self.noise >= 0):
            raise ConfigError(f"noise must be a finite number >= 0, got {self.noise:g}")

    def factors(self, first_step: int, steps: int) -> np.ndarray:
        """Each rank's slowdown factor at each of ``steps`` steps from ``first_step``: shape (ranks, steps)."""
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


@dataclass
class JobResult:
    """One run of a straggler job (simulated figures).

    Attributes:
        time_s: Wall time.
        energy_j: Energy of all GPUs.
        wait_energy_j: Energy spent waiting for the slowest rank.
        clocks: Per window, every rank's clock (MHz).
        critical: Per window, the critical rank.
    """

    time_s: float
    energy_j: float
    wait_energy_j: float
    clocks: list[list[float]] = field(default_factory=list)
    critical: list[int] = field(default_factory=list)


def job_model(job: StragglerJob) -> GpuModel:
    """The GPU model every rank of the job uses."""
    return load_model(job.gpu, job.workload, job.batch_size)


def run_job(job: StragglerJob, tune: bool, journal_dir: Path | None = None,
            progress: Callable[[int], None] | None = None,
            fixed_locks: Sequence[float | None] | None = None) -> JobResult:
    """Run ``job`` (with per-rank slowdown when ``tune``; or with ``fixed_locks``, one SM clock per rank, ``None``
    for free, held from the first step: a static setting to compare with); the GPUs are restored before
    returning."""
    job.validate()
    model = job_model(job)
    spec = model.spec
    with tempfile.TemporaryDirectory(prefix="dtpo-stragglers-") as tmp:
        folder = Path(tmp)
        journal = KnobJournal((journal_dir or folder) / "knobs-journal.json")
        ranks = [SimulatedGpu(SimulatedGpuConfig(spec.name, model.workload, model.batch_size, index=r, seed=job.seed,
                                                 time_noise=job.noise, power_noise=job.noise, counter_period_s=0.0),
                              folder / f"rank{r}.json", model=model) for r in range(job.gpus)]
        policy = StragglerSlowdown(spec.sm_clocks_mhz)
        locks: list[float | None] = [None] * job.gpus
        result = JobResult(0.0, 0.0, 0.0)
        with KnobController("apply", journal, log=lambda _: None) as controller:
            for r, clock in enumerate(fixed_locks or ()):
                if clock is not None:
                    controller.lock_sm_clock(ranks[r], int(clock))
                    locks[r] = clock
            done = 0
            while done < job.steps:
                n = min(job.window_steps, job.steps - done)
                drawn = [gpu.sample_steps(n) for gpu in ranks]
                compute = np.stack([t for t, _ in drawn]) * job.factors(done, n)
                step_s = compute.max(axis=0)
                spent = np.zeros(job.gpus)
                for r, (gpu, (_, powers), mine) in enumerate(zip(ranks, drawn, compute, strict=True)):
                    wait = step_s - mine
                    spent[r] = gpu.advance(mine, powers, wait)
                    result.wait_energy_j += float(wait.sum()) * gpu.operating_point().idle_power_w
                result.energy_j += float(spent.sum())
                result.time_s += float(step_s.sum())
                done += n
                ready = compute.mean(axis=1)
                holdout = compute[:, 1::2].mean(axis=1) if n > 1 else ready
                spread = compute.std(axis=1) / np.maximum(ready, 1e-12) if n > 1 else np.zeros(job.gpus)
                running = [gpu.operating_point().sm_clock_mhz for gpu in ranks]
                result.critical.append(int(np.argmax(ready)))
                result.clocks.append(running)
                if tune:
                    wanted = policy.decide([RankWindow(float(ready[r]), running[r], locks[r] is not None,
                                                       float(spread[r]), float(spent[r]) / n, n, float(holdout[r]))
                                            for r in range(job.gpus)])
                    for r, (gpu, clock) in enumerate(zip(ranks, wanted, strict=True)):
                        if clock == locks[r]:
                            continue
                        if clock is None:
                            controller.unlock_sm_clocks(gpu)
                        else:
                            controller.lock_sm_clock(gpu, int(clock))
                        locks[r] = clock
                if progress is not None:
                    progress(n)
        for gpu in ranks:
            gpu.forget_state_file()
    return result


def ideal_energy(job: StragglerJob) -> tuple[float, float]:
    """Noise-free ``(energy at full clock, energy at the just-in-time clocks)`` of the job: the bloat is their
    difference."""
    model = job_model(job)
    spec = model.spec
    batch = model.batch_size
    points = [operating_point(model, KnobState(spec.max_power_w, (c, c))) for c in spec.sm_clocks_mhz]
    full = operating_point(model, KnobState(spec.max_power_w, None))
    idle = full.idle_power_w
    factors = job.factors(0, job.steps)
    patterns, counts = np.unique(factors.T, axis=0, return_counts=True)
    full_j = jit_j = 0.0
    for pattern, count in zip(patterns, counts, strict=True):
        times = full.time_per_sample_s * batch * pattern
        step_s = float(times.max())
        full_j += count * sum(t * full.power_w + (step_s - t) * idle for t in times)
        for f in pattern:
            options = [full, *(p for p in points if p.time_per_sample_s * batch * f <= step_s + 1e-12)]
            jit_j += count * min(p.time_per_sample_s * batch * f * (p.power_w - idle) + step_s * idle
                                 for p in options)
    return full_j, jit_j
