"""Per-rank straggler slowdown on simulated GPUs: a data-parallel job whose slowest rank changes over time.

Each rank is its own :class:`~dtpo.devices.simulated.SimulatedGpu` (its own knob-state file and journal
entry, so each can run its own clock), all of one GPU model and workload. The job's
:attr:`~dtpo.simulation.job.JobConfig.pattern` makes its stragglers slow always, drifting from rank to rank, or
intermittently (:meth:`~dtpo.simulation.job.JobConfig.factors`). Every step ends when the slowest rank is done;
the others wait at idle power. Each rank's energy is what it spent, exactly (no energy counter).

:func:`run_job` runs the job with or without :class:`~dtpo.tune.straggler.StragglerSlowdown` deciding a clock
per rank after every window, through a journaled knob controller. :func:`ideal_energy` is the yardstick: the
noise-free energy when every non-critical rank runs at the *just-in-time* setting (of the clocks at which it
still keeps up with the critical rank, the one that spends least, waiting included) and when every rank runs
at full clock; their difference is the *bloat*. Every figure here is simulated.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from dtpo.core.errors import ConfigError
from dtpo.devices.base import KnobState
from dtpo.devices.journal import KnobJournal
from dtpo.devices.knobs import KnobController
from dtpo.devices.simulated import SimulatedGpu, operating_point
from dtpo.simulation.job import JobConfig, Progress
from dtpo.tune.straggler import RankWindow, StragglerSlowdown

MAX_STRAGGLER_GPUS = 1024


def check_job(job: JobConfig) -> None:
    """Raise :class:`ConfigError` for a job this simulation cannot run (beyond :meth:`JobConfig.validate`)."""
    if not 2 <= job.gpus <= MAX_STRAGGLER_GPUS:
        raise ConfigError(f"--gpus must be between 2 and {MAX_STRAGGLER_GPUS} for stragglers, got {job.gpus}")
    job.validate()


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


def run_job(job: JobConfig, tune: bool, journal_dir: Path | None = None,
            progress: Progress | None = None,
            fixed_locks: Sequence[float | None] | None = None) -> JobResult:
    """Run ``job`` (with per-rank slowdown when ``tune``; or with ``fixed_locks``, one SM clock per rank, ``None``
    for free, held from the first step: a static setting to compare with); the GPUs are restored before
    returning."""
    check_job(job)
    model = job.model()
    spec = model.spec
    with tempfile.TemporaryDirectory(prefix="dtpo-stragglers-") as tmp:
        folder = Path(tmp)
        journal = KnobJournal((journal_dir or folder) / "knobs-journal.json")
        # each rank's energy is read exactly (what advance() spent), not through a counter
        ranks = [SimulatedGpu(replace(job.gpu_config(r), counter_period_s=0.0), folder / f"rank{r}.json", model=model)
                 for r in range(job.gpus)]
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


def ideal_energy(job: JobConfig) -> tuple[float, float]:
    """Noise-free ``(energy at full clock, energy at the just-in-time clocks)`` of the job: the bloat is their
    difference."""
    model = job.model()
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
