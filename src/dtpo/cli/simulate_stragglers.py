"""``dtpo simulate --tune stragglers``: per-rank slowdown of the ranks that only wait for a straggler, simulated.

The job (:class:`~dtpo.simulation.job.JobConfig`) runs twice with the same noise (same seed): every rank
free (no tuning), then with :class:`~dtpo.tune.straggler.StragglerSlowdown` locking each rank's SM clock after
every window. It prints

1. the clocks the ranks ran at over the job: one column per stretch of steps, each cell a rank's mean clock
   there, the rank that set the pace marked; every rank up to :data:`MAX_RANK_ROWS` ranks, beyond that the ranks
   that set the pace and the listed stragglers, and one row (their mean) for all the others, which run alike;
2. the two runs side by side (time, energy, power, J/sample, the share of energy spent waiting) with the energy
   saved, the slowdown, the bloat (from :func:`~dtpo.simulation.stragglers.ideal_energy`, noise-free) and the
   share of it recovered;
3. a caption saying that every figure is simulated and what the pattern was.

:func:`run_stragglers` runs it, :func:`print_stragglers` prints it and returns the figures for ``--json``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from rich import box
from rich.console import Console
from rich.table import Table

from dtpo.core.errors import ConfigError
from dtpo.devices.physics.gpu_model import GpuModel
from dtpo.simulation.job import MAX_STEPS, JobConfig
from dtpo.simulation.stragglers import JobResult, ideal_energy, run_job

MAX_GPU_STEPS = 5_000_000  # gpus x steps: every rank is simulated window by window, ~10 minutes for both runs
PROGRESS_GPU_STEPS = 100_000  # both runs together: a progress bar (on a terminal) from about 5 s of work
SEGMENTS = 8  # columns of the clock table
MAX_RANK_ROWS = 8  # up to this many ranks one row each; beyond, the pace setters and one row for the others
MAX_PATH_RANKS = 6  # a drifting straggler's path is spelled out up to this many ranks


@dataclass
class StragglerRun:
    """Both runs of a straggler job and its noise-free yardstick (all simulated).

    Attributes:
        job: The job.
        model: The GPU model every rank used.
        baseline: Every rank free (no tuning).
        tuned: With per-rank slowdown.
        full_j: Noise-free energy with every rank at full clock.
        jit_j: Noise-free energy with every non-critical rank at its just-in-time clock.
    """

    job: JobConfig
    model: GpuModel
    baseline: JobResult
    tuned: JobResult
    full_j: float
    jit_j: float


def check_job(job: JobConfig) -> GpuModel:
    """The job's GPU model, or a one-line :class:`ConfigError` (flags named) for a job that cannot run."""
    if not 1 <= job.steps <= MAX_STEPS:
        raise ConfigError(f"--steps must be between 1 and {MAX_STEPS:,}, got {job.steps:,}")
    if job.period_steps < 1:
        raise ConfigError(f"--period must be >= 1 step, got {job.period_steps}")
    if not (math.isfinite(job.noise) and job.noise >= 0):
        raise ConfigError(f"--noise must be a finite number >= 0 (e.g. 0.01), got {job.noise:g}")
    if job.seed < 0:
        raise ConfigError(f"--seed must be >= 0, got {job.seed}")
    if not job.stragglers:
        raise ConfigError("--tune stragglers needs at least one --straggler RANK:FACTOR, e.g. --straggler 3:1.2")
    job.validate()
    if job.gpus * job.steps > MAX_GPU_STEPS:
        raise ConfigError(f"--gpus x --steps must be at most {MAX_GPU_STEPS:,} GPU-steps with --tune stragglers "
                          f"(each rank is simulated on its own), got {job.gpus:,} x {job.steps:,}; fewer steps "
                          "show the same")
    return job.model()


def run_stragglers(job: JobConfig, progress: Callable[[int], None] | None = None) -> StragglerRun:
    """Run ``job`` without and with per-rank slowdown (same seed: the same noise in both)."""
    model = check_job(job)
    baseline = run_job(job, tune=False, progress=progress)
    tuned = run_job(job, tune=True, progress=progress)
    full_j, jit_j = ideal_energy(job)
    return StragglerRun(job, model, baseline, tuned, float(full_j), float(jit_j))


def _run_figures(run: StragglerRun, result: JobResult) -> dict[str, float]:
    job = run.job
    samples = job.gpus * run.model.batch_size * job.steps
    return {"time_s": result.time_s, "energy_j": result.energy_j,
            "average_power_w": result.energy_j / result.time_s / job.gpus if result.time_s > 0 else 0.0,
            "joules_per_sample": result.energy_j / samples, "wait_energy_j": result.wait_energy_j,
            "wait_energy_share": result.wait_energy_j / result.energy_j if result.energy_j > 0 else 0.0}


def figures(run: StragglerRun) -> dict[str, Any]:
    """The result as plain values: both runs, the saving, the slowdown, the bloat and the share recovered."""
    base, tuned = _run_figures(run, run.baseline), _run_figures(run, run.tuned)
    saved = base["energy_j"] - tuned["energy_j"]
    bloat = run.full_j - run.jit_j
    return {
        "no_tuning": base, "per_rank_slowdown": tuned,
        "energy_saved_j": saved, "energy_saved_share": saved / base["energy_j"],
        "slowdown_share": tuned["time_s"] / base["time_s"] - 1.0,
        "bloat": {"full_clock_j": run.full_j, "just_in_time_j": run.jit_j, "bloat_j": bloat,
                  "bloat_share": bloat / run.full_j if run.full_j > 0 else 0.0,
                  "recovered_share": saved / bloat if bloat > 0 else None},
    }


@dataclass(frozen=True)
class Segment:
    """A stretch of windows: its steps, each rank's mean clock, the rank critical in most of its windows."""

    first_step: int
    last_step: int
    clock_mhz: list[float]
    critical: int


def segments(job: JobConfig, result: JobResult, count: int = SEGMENTS) -> list[Segment]:
    """Split the run's windows into at most ``count`` stretches of (nearly) equal length."""
    windows = len(result.clocks)
    count = max(1, min(count, windows))
    clocks = np.asarray(result.clocks, dtype=float)
    out = []
    for k in range(count):
        lo, hi = round(k * windows / count), round((k + 1) * windows / count)
        critical = Counter(result.critical[lo:hi]).most_common(1)[0][0]
        out.append(Segment(lo * job.window_steps, min(hi * job.window_steps, job.steps) - 1,
                           [float(c) for c in clocks[lo:hi].mean(axis=0)], int(critical)))
    return out


def shown_ranks(job: JobConfig, parts: Sequence[Segment]) -> list[int]:
    """The ranks that get a row of their own: all of a small job; else the pace setters, then the stragglers."""
    if job.gpus <= MAX_RANK_ROWS:
        return list(range(job.gpus))
    keep = list(dict.fromkeys([p.critical for p in parts] + [r for r, _ in job.stragglers]))
    return sorted(keep[:MAX_RANK_ROWS - 1])


def _mhz(value: float, pace: bool) -> str:
    return f"{value:.0f}" + ("*" if pace else " ")


def clock_table(run: StragglerRun) -> Table:
    """Per-rank SM clocks of the tuned run over the job, a column per stretch of steps, the pace setter marked."""
    job, tuned = run.job, run.tuned
    parts = segments(job, tuned)
    ranks = shown_ranks(job, parts)
    others = sorted(set(range(job.gpus)) - set(ranks))
    clocks = np.asarray(tuned.clocks, dtype=float)
    windows = len(tuned.critical)
    notes = [f"Columns: stretches of {_stretch(parts)} steps, from the step shown. paced: share of the "
             f"{job.window_steps}-step windows in which the rank was the slowest."]
    if others:
        spread = max(max(p.clock_mhz[r] for r in others) - min(p.clock_mhz[r] for r in others) for p in parts)
        notes.append(f"other {len(others)}: the mean of the ranks without a row (within a stretch they differ by at "
                     f"most {spread:.0f} MHz).")
    notes.append(_free_clock_line(run.baseline))
    table = Table(title="per-rank slowdown: each rank's SM clock (MHz) over the job, the mean of each stretch; * set "
                        "the pace", title_justify="left", caption=" ".join(n for n in notes if n),
                  caption_justify="left", box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False)
    table.add_column("rank", justify="right", no_wrap=True)
    for p in parts:
        table.add_column(f"{p.first_step}", justify="right", no_wrap=True)
    table.add_column("mean", justify="right", no_wrap=True)
    table.add_column("paced", justify="right", no_wrap=True)
    for rank in ranks:
        paced = sum(1 for c in tuned.critical if c == rank) / windows
        table.add_row(f"{rank}", *(_mhz(p.clock_mhz[rank], p.critical == rank) for p in parts),
                      f"{clocks[:, rank].mean():.0f}", f"{paced:.0%}",
                      style="bold" if any(p.critical == rank for p in parts) else "")
    if others:
        group = set(others)
        paced = sum(1 for c in tuned.critical if c in group) / windows
        table.add_row(f"other {len(others)}",
                      *(_mhz(float(np.mean([p.clock_mhz[r] for r in others])), p.critical in group) for p in parts),
                      f"{clocks[:, others].mean():.0f}", f"{paced:.0%}", style="dim")
    return table


def _stretch(parts: Sequence[Segment]) -> str:
    sizes = sorted({p.last_step - p.first_step + 1 for p in parts[:-1]} or {parts[-1].last_step + 1})
    return f"{sizes[0]:,}" if len(sizes) == 1 else f"{sizes[0]:,}-{sizes[-1]:,}"


def _free_clock_line(baseline: JobResult) -> str:
    values = sorted({float(c) for row in baseline.clocks for c in row})
    if not values:
        return ""
    span = f"{values[0]:,.0f} MHz" if len(values) == 1 else f"{values[0]:,.0f}-{values[-1]:,.0f} MHz"
    return f"Without tuning every rank runs free at {span} throughout."


def _digits4(value: float) -> str:
    """Four significant digits, never in scientific notation: ``0.7433``, ``12.35``, ``1,235``."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    return f"{value:,.{max(0, 3 - math.floor(math.log10(abs(value))))}f}"


def _energy(joules: float) -> str:
    return f"{joules / 1e3:,.1f} kJ" if abs(joules) >= 1e4 else f"{joules:,.0f} J"


def result_table(run: StragglerRun, data: dict[str, Any]) -> Table:
    """No tuning against per-rank slowdown, then the saving, the slowdown and the bloat recovered."""
    base, tuned, bloat = data["no_tuning"], data["per_rank_slowdown"], data["bloat"]
    table = Table(title="result (simulated)", title_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("", justify="left", no_wrap=True)
    table.add_column("no tuning", justify="right", no_wrap=True)
    table.add_column("per-rank slowdown", justify="right", no_wrap=True)
    table.add_row("time", f"{base['time_s']:,.1f} s", f"{tuned['time_s']:,.1f} s")
    table.add_row("energy", _energy(base["energy_j"]), _energy(tuned["energy_j"]))
    table.add_row("average power", f"{base['average_power_w']:,.1f} W/GPU", f"{tuned['average_power_w']:,.1f} W/GPU")
    table.add_row("energy per sample", f"{_digits4(base['joules_per_sample'])} J",
                  f"{_digits4(tuned['joules_per_sample'])} J")
    table.add_row("energy spent waiting", f"{base['wait_energy_share']:.1%}", f"{tuned['wait_energy_share']:.1%}")
    table.add_section()
    table.add_row("energy saved", "", f"{_energy(data['energy_saved_j'])} ({data['energy_saved_share']:.1%})",
                  style="bold green" if data["energy_saved_j"] > 0 else "")
    table.add_row("slowdown", "", f"{data['slowdown_share']:+.2%}")
    table.add_row("bloat (noise-free)", f"{_energy(bloat['bloat_j'])} ({bloat['bloat_share']:.1%})", "")
    recovered = bloat["recovered_share"]
    table.add_row("bloat recovered", "", "n/a (no bloat)" if recovered is None else f"{recovered:.1%}")
    return table


def describe_stragglers(job: JobConfig) -> str:
    """``rank 3 computes 1.2x slower`` or ``ranks 3, 5 compute 1.2x, 1.1x slower``."""
    if len(job.stragglers) == 1:
        (rank, factor), = job.stragglers
        return f"rank {rank} computes {factor:g}x slower"
    ranks = ", ".join(str(rank) for rank, _ in job.stragglers)
    factors = ", ".join(f"{factor:g}x" for _, factor in job.stragglers)
    return f"ranks {ranks} compute {factors} slower"


def describe_pattern(job: JobConfig) -> str:
    """The pattern in words, e.g. ``static (rank 3 computes 1.2x slower throughout)``."""
    who = describe_stragglers(job)
    period = f"{job.period_steps:,} step" + ("s" if job.period_steps != 1 else "")
    if job.pattern == "static":
        return f"static ({who} throughout)"
    if job.pattern == "intermittent":
        return f"intermittent ({who} for {period}, then at full speed for as long, and so on)"
    moves = math.ceil(job.steps / job.period_steps)
    paths = []
    for rank, _ in job.stragglers:
        path: list[int | str] = [(rank + i) % job.gpus for i in range(moves)]
        if len(path) > MAX_PATH_RANKS:
            path = [*path[:MAX_PATH_RANKS - 2], "...", path[-1]]
        paths.append(" -> ".join(str(r) for r in path))
    return (f"drifting ({who} at first; each slow rank hands its slowness on to the next rank every {period}: "
            f"{'; '.join(paths)})")


def caption(run: StragglerRun) -> str:
    """Every figure is simulated; the pattern; what the bloat is."""
    job, m = run.job, run.model
    kind = "calibrated on a measured trace" if m.calibrated else "parametric model"
    return (f"All figures are simulated, not measured ({job.gpus} x {m.spec.name}, {m.workload}, batch "
            f"{m.batch_size}/GPU, {job.steps:,} steps, {kind}, noise {job.noise:g}, seed {job.seed}; both runs "
            f"draw the same noise). Straggler pattern: {describe_pattern(job)}. Per-rank slowdown decides every "
            f"{job.window_steps} steps. Bloat: the noise-free energy with every rank at full clock minus that with "
            "every rank that waits at the least-energy clock that still keeps up. Communication and data loading are "
            "not modelled.")


def print_stragglers(console: Console, run: StragglerRun) -> dict[str, Any]:
    """Print both tables and the caption; return the figures as plain values for ``--json``."""
    data = figures(run)
    console.print(clock_table(run))
    console.print(result_table(run, data))
    console.print(caption(run), style="dim", highlight=False)
    m = run.model
    parts = segments(run.job, run.tuned)
    return {
        "knob": "stragglers", "config": asdict(run.job), "gpu": m.spec.name, "workload": m.workload,
        "batch_size": m.batch_size, "calibrated": m.calibrated, "pattern": describe_pattern(run.job),
        **data,
        "clocks": {
            "segments": [asdict(p) for p in parts],
            "window_steps": run.job.window_steps,
            "per_window_mhz": [[float(c) for c in row] for row in run.tuned.clocks],
            "per_window_critical": list(run.tuned.critical),
            "no_tuning_per_window_critical": list(run.baseline.critical),
        },
        "simulated": True,
    }
