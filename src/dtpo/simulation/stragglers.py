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
at full clock; their difference is the *bloat*.

With ``rebalance``, :class:`~dtpo.tune.rebalance.Rebalancer` gives every rank a share of the global step batch
(``gpus x`` the model's per-GPU batch, even at first) after every window, from each rank's seconds per sample at
its free clock; the simulation takes a rank's compute time as linear in its share (its drawn step time at the
per-GPU batch times ``share / batch``), power per step as drawn. :func:`ideal_throughput` is that yardstick: the
noise-free sum of the ranks' speeds at full clock. Every figure here is simulated.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from dtpo.core.errors import ConfigError
from dtpo.devices.base import KnobState
from dtpo.devices.journal import KnobJournal
from dtpo.devices.knobs import KnobController
from dtpo.devices.simulated import SimulatedGpu, operating_point
from dtpo.simulation.job import JobConfig, Progress
from dtpo.tune.rebalance import RankSpeed, Rebalancer, even_shares, split_batch
from dtpo.tune.straggler import RankWindow, StragglerSlowdown

MAX_STRAGGLER_GPUS = 1024

Shares = Sequence[int] | Callable[[int, int], Sequence[int]]
"""Fixed shares of the global batch: one per rank, held throughout; or a function of a window's first step and
its length that gives that window's shares."""


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
        samples: Samples trained (the global batch every step, however it was split).
        shares: Per window, every rank's share of the global batch (samples per step).
        recommendations: The rebalancer's recommendations to restart without a rank, in order.
    """

    time_s: float
    energy_j: float
    wait_energy_j: float
    clocks: list[list[float]] = field(default_factory=list)
    critical: list[int] = field(default_factory=list)
    samples: int = 0
    shares: list[list[int]] = field(default_factory=list)
    recommendations: list[str] = field(default_factory=list)

    @property
    def samples_per_s(self) -> float:
        """Throughput: samples over wall time (0 for a job that took no time)."""
        return self.samples / self.time_s if self.time_s > 0 else 0.0

    @property
    def share_changes(self) -> int:
        """Windows whose shares differ from the window's before."""
        return sum(1 for before, after in zip(self.shares, self.shares[1:], strict=False) if before != after)


def run_job(job: JobConfig, tune: bool, journal_dir: Path | None = None,
            progress: Progress | None = None,
            fixed_locks: Sequence[float | None] | None = None, rebalance: bool = False,
            fixed_shares: Shares | None = None) -> JobResult:
    """Run ``job`` (with per-rank slowdown when ``tune``; or with ``fixed_locks``, one SM clock per rank, ``None``
    for free, held from the first step: a static setting to compare with); the GPUs are restored before
    returning.

    With ``rebalance``, :class:`~dtpo.tune.rebalance.Rebalancer` splits the global batch (``gpus x`` the model's
    per-GPU batch) after every window, from the next window on; with ``fixed_shares`` (:data:`Shares`) the split is
    given instead (a yardstick: the shares the true speeds call for). A rank's compute time per step is taken as
    linear in its share: its step time drawn at the per-GPU batch times ``share / batch``; its power as drawn.
    Without either, every rank computes the per-GPU batch, exactly as before these options existed.

    Raises:
        ConfigError: The job cannot run here, or ``fixed_shares`` is not one whole sample or more per rank summing
            to the global batch (or comes with ``rebalance``).
    """
    check_job(job)
    model = job.model()
    spec = model.spec
    batch = model.batch_size
    global_batch = job.gpus * batch
    if rebalance and fixed_shares is not None:
        raise ConfigError("rebalance decides the shares itself; it takes no fixed shares")
    rebalancer = Rebalancer(global_batch, job.gpus) if rebalance else None
    uneven = rebalance or fixed_shares is not None  # without, no rank's time is touched (figures as before)
    shares = even_shares(global_batch, job.gpus)
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
                if fixed_shares is not None:
                    shares = _checked_shares(fixed_shares(done, n) if callable(fixed_shares) else fixed_shares,
                                             global_batch, job.gpus)
                drawn = [gpu.sample_steps(n) for gpu in ranks]
                compute = np.stack([t for t, _ in drawn]) * job.factors(done, n)
                if uneven:
                    compute *= (np.asarray(shares, dtype=float) / batch)[:, None]
                step_s = compute.max(axis=0)
                spent = np.zeros(job.gpus)
                for r, (gpu, (_, powers), mine) in enumerate(zip(ranks, drawn, compute, strict=True)):
                    wait = step_s - mine
                    spent[r] = gpu.advance(mine, powers, wait)
                    result.wait_energy_j += float(wait.sum()) * gpu.operating_point().idle_power_w
                result.energy_j += float(spent.sum())
                result.time_s += float(step_s.sum())
                result.samples += global_batch * n
                result.shares.append(list(shares))
                done += n
                ready = compute.mean(axis=1)
                holdout = compute[:, 1::2].mean(axis=1) if n > 1 else ready
                spread = compute.std(axis=1) / np.maximum(ready, 1e-12) if n > 1 else np.zeros(job.gpus)
                running = [gpu.operating_point().sm_clock_mhz for gpu in ranks]
                result.critical.append(int(np.argmax(ready)))
                result.clocks.append(running)
                # energy per step as the clock policy compares it between clocks; under rebalancing, per the
                # per-GPU batch, so that a rank whose share changed does not read as one whose clock cost energy
                per_step = spent / n if rebalancer is None else spent / n * batch / np.asarray(shares, dtype=float)
                rank_windows = [RankWindow(float(ready[r]), running[r], locks[r] is not None, float(spread[r]),
                                           float(per_step[r]), n, float(holdout[r])) for r in range(job.gpus)]
                if rebalancer is not None:
                    # the shares first, then the clocks on what the shares leave: the clock policy decides on the
                    # ready times the new shares will give (_at_shares), not on times the next window will not see.
                    # So a locked rank's speed at its free clock comes from the curve of the policy's last decision
                    # (a window old; its decision on this window comes after). Where that curve does not link the
                    # rank's clock yet (the window after its first lock) it is time ~ 1 / clock, the fastest the
                    # rank can be: the straggler's first share can end a few samples low (171 rather than 178 of
                    # 2,048 on 8 ranks, 1.5x), which hysteresis then keeps: a few tenths of a per cent of throughput
                    # (benchmarks/rebalance.py: both 0-0.4 % below rebalance alone, the clocks' noise margin
                    # included). Deciding the clocks first would use a fresh curve, but lock the ranks for shares
                    # that no longer hold, for a window, on every change.
                    free = policy.free_ready_s(rank_windows) if tune else [float(t) for t in ready]
                    decision = rebalancer.decide([RankSpeed(free[r], shares[r], float(spread[r]), n)
                                                  for r in range(job.gpus)])
                    if decision.recommendation is not None:
                        result.recommendations.append(decision.recommendation)
                    if decision.changed:
                        rank_windows = _at_shares(rank_windows, shares, decision.shares)
                    shares = decision.shares
                if tune:
                    wanted = policy.decide(rank_windows)
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


def _at_shares(windows: Sequence[RankWindow], before: Sequence[int], after: Sequence[int]) -> list[RankWindow]:
    """The windows as the new shares will make them (ready times linear in the share): what the clock policy
    decides the next window's clocks on. Its pools see the change as a change of speed, which it is."""
    return [replace(w, ready_s=w.ready_s * new / old,
                    holdout_s=None if w.holdout_s is None else w.holdout_s * new / old)
            for w, old, new in zip(windows, before, after, strict=True)]


def _checked_shares(shares: Sequence[int], global_batch: int, world: int) -> tuple[int, ...]:
    """``shares`` as a tuple, or a :class:`ConfigError` unless they are ``world`` whole samples >= 1 summing to
    ``global_batch``."""
    out = tuple(int(s) for s in shares)
    if len(out) != world or min(out) < 1 or sum(out) != global_batch or any(s != o for s, o in zip(shares, out,
                                                                                                  strict=True)):
        raise ConfigError(f"fixed shares must be {world} whole samples >= 1 summing to {global_batch}, "
                          f"got {list(shares)}")
    return out


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


def ideal_throughput(job: JobConfig) -> float:
    """Noise-free samples per second of the job at the sum of its ranks' speeds: at every step, each rank's speed is
    the per-GPU batch over its full-clock step time times its straggler factor (``job.factors``, which change over
    time for drifting and intermittent stragglers); a step of the global batch at their sum lasts ``global batch /
    sum``. Over the job: the samples over the sum of those steps' times, i.e. the steps' speeds averaged with each
    step weighted by its time, which is what a measured throughput (samples over time) is compared with. No split
    of whole samples beats it, and with noise every step lasts as long as its slowest rank, so nothing reaches it."""
    model = job.model()
    full = operating_point(model, KnobState(model.spec.max_power_w, None))
    batch = model.batch_size
    speeds = (batch / (full.time_per_sample_s * batch * job.factors(0, job.steps))).sum(axis=0)
    # steps x global batch samples over the time sum(global batch / speed): the harmonic mean of the speeds
    return float(speeds.size / np.sum(1.0 / speeds))


def true_shares(job: JobConfig, max_share: float = 1.5) -> Callable[[int, int], tuple[int, ...]]:
    """The shares the true (noise-free) speeds call for, window by window: the whole-sample split of the global
    batch that minimises the slowest rank's time (:func:`~dtpo.tune.rebalance.split_batch`) under each rank's mean
    straggler factor over the window, with the rebalancer's bounds (one sample, ``max_share`` times the even share).
    An oracle to compare the rebalancer with: it knows every speed from the first step, and never waits for
    evidence. Pass it to :func:`run_job` as ``fixed_shares``."""
    global_batch = job.gpus * job.model().batch_size
    low, high = Rebalancer(global_batch, job.gpus, max_share=max_share).bounds
    known: dict[tuple[float, ...], tuple[int, ...]] = {}  # most windows repeat a few patterns of factors

    def shares(first_step: int, steps: int) -> tuple[int, ...]:
        factors = tuple(float(f) for f in job.factors(first_step, steps).mean(axis=1))
        if factors not in known:
            known[factors] = split_batch(global_batch, factors, low, high)
        return known[factors]

    return shares
