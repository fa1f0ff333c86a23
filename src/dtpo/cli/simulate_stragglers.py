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

``--tune rebalance`` (``rebalance,stragglers``: with per-rank slowdown too) runs the second job with
:class:`~dtpo.tune.rebalance.Rebalancer` splitting the global batch by the ranks' speeds after every window, and
:func:`print_rebalance` prints each rank's share over the job (as the clocks above; with per-rank slowdown, the
clocks too), the two runs side by side with their throughput against no tuning and against the ideal (the
noise-free sum of the ranks' speeds, :func:`~dtpo.simulation.stragglers.ideal_throughput`), the final shares, the
share changes and any recommendation to restart without a rank.
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
from dtpo.core.simulate_config import REBALANCE_TUNE, STRAGGLER_TUNE
from dtpo.devices.physics.gpu_model import GpuModel
from dtpo.simulation.job import MAX_STEPS, JobConfig
from dtpo.simulation.stragglers import JobResult, ideal_energy, ideal_throughput, run_job

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
        clocks: Whether the tuned run locked clocks per rank (per-rank slowdown).
        rebalance: Whether the tuned run split the global batch by speed.
        ideal_samples_per_s: Noise-free throughput at the sum of the ranks' speeds (0 where not computed).
    """

    job: JobConfig
    model: GpuModel
    baseline: JobResult
    tuned: JobResult
    full_j: float
    jit_j: float
    clocks: bool = True
    rebalance: bool = False
    ideal_samples_per_s: float = 0.0

    @property
    def knob(self) -> str:
        """What ``--tune`` asked for: ``stragglers``, ``rebalance`` or ``rebalance,stragglers``."""
        return tuning_name(self.clocks, self.rebalance)


def tuning_name(clocks: bool, rebalance: bool) -> str:
    """The ``--tune`` value of a tuned run: ``stragglers``, ``rebalance`` or ``rebalance,stragglers``."""
    return ",".join(name for name, on in ((REBALANCE_TUNE, rebalance), (STRAGGLER_TUNE, clocks)) if on)


def check_job(job: JobConfig, knob: str = STRAGGLER_TUNE) -> GpuModel:
    """The job's GPU model, or a one-line :class:`ConfigError` (flags named; ``knob``: the ``--tune`` asked for)
    for a job that cannot run."""
    if not 1 <= job.steps <= MAX_STEPS:
        raise ConfigError(f"--steps must be between 1 and {MAX_STEPS:,}, got {job.steps:,}")
    if job.period_steps < 1:
        raise ConfigError(f"--period must be >= 1 step, got {job.period_steps}")
    if not (math.isfinite(job.noise) and job.noise >= 0):
        raise ConfigError(f"--noise must be a finite number >= 0 (e.g. 0.01), got {job.noise:g}")
    if job.seed < 0:
        raise ConfigError(f"--seed must be >= 0, got {job.seed}")
    if not job.stragglers:
        raise ConfigError(f"--tune {knob} needs at least one --straggler RANK:FACTOR, e.g. --straggler 3:1.2")
    job.validate()
    if job.gpus * job.steps > MAX_GPU_STEPS:
        raise ConfigError(f"--gpus x --steps must be at most {MAX_GPU_STEPS:,} GPU-steps with --tune {knob} "
                          f"(each rank is simulated on its own), got {job.gpus:,} x {job.steps:,}; fewer steps "
                          "show the same")
    return job.model()


def run_stragglers(job: JobConfig, progress: Callable[[int], None] | None = None, *, clocks: bool = True,
                   rebalance: bool = False) -> StragglerRun:
    """Run ``job`` without tuning and with it (same seed: the same noise in both): per-rank slowdown where
    ``clocks``, uneven per-rank batches where ``rebalance``."""
    if not (clocks or rebalance):
        raise ValueError("nothing to tune: ask for clocks, rebalance or both")
    model = check_job(job, tuning_name(clocks, rebalance))
    baseline = run_job(job, tune=False, progress=progress)
    tuned = run_job(job, tune=clocks, progress=progress, rebalance=rebalance)
    full_j, jit_j = ideal_energy(job)
    return StragglerRun(job, model, baseline, tuned, float(full_j), float(jit_j), clocks, rebalance,
                        ideal_throughput(job) if rebalance else 0.0)


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


def clock_table(run: StragglerRun) -> Table:
    """Per-rank SM clocks of the tuned run over the job, a column per stretch of steps, the pace setter marked."""
    job, tuned = run.job, run.tuned
    parts = segments(job, tuned)
    ranks = shown_ranks(job, parts)
    others = sorted(set(range(job.gpus)) - set(ranks))
    clocks = np.asarray(tuned.clocks, dtype=float)
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
    per_part = [np.asarray(p.clock_mhz, dtype=float) for p in parts]
    _rank_rows(table, tuned, parts, ranks, others, per_part, "mean", clocks.mean(axis=0))
    return table


def _rank_rows(table: Table, tuned: JobResult, parts: Sequence[Segment], ranks: Sequence[int], others: Sequence[int],
               per_part: Sequence[np.ndarray], last_name: str, last: np.ndarray) -> None:
    """The columns and rows of a per-rank table over the job: a value per stretch of steps (``per_part``, every
    rank's), one more column (``last_name``: ``last``, every rank's), and the share of windows each rank set the
    pace; a row per shown rank (the pace setters bold, their stretches starred), then the mean of the others."""
    windows = len(tuned.critical)
    table.add_column("rank", justify="right", no_wrap=True)
    for p in parts:
        table.add_column(f"{p.first_step}", justify="right", no_wrap=True)
    table.add_column(last_name, justify="right", no_wrap=True)
    table.add_column("paced", justify="right", no_wrap=True)
    for rank in ranks:
        paced = sum(1 for c in tuned.critical if c == rank) / windows
        table.add_row(f"{rank}", *(_mark(float(v[rank]), p.critical == rank) for v, p in zip(per_part, parts,
                                                                                          strict=True)),
                      f"{last[rank]:.0f}", f"{paced:.0%}",
                      style="bold" if any(p.critical == rank for p in parts) else "")
    if others:
        group = set(others)
        paced = sum(1 for c in tuned.critical if c in group) / windows
        table.add_row(f"other {len(others)}",
                      *(_mark(float(v[others].mean()), p.critical in group) for v, p in zip(per_part, parts,
                                                                                              strict=True)),
                      f"{last[others].mean():.0f}", f"{paced:.0%}", style="dim")


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


def _against_no_tuning(tuned: str) -> Table:
    """An empty result table: a row label, no tuning, and the tuned run (``tuned``: its column heading)."""
    table = Table(title="result (simulated)", title_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("", justify="left", no_wrap=True)
    table.add_column("no tuning", justify="right", no_wrap=True)
    table.add_column(tuned, justify="right", no_wrap=True)
    return table


def _energy_rows(table: Table, base: dict[str, Any], tuned: dict[str, Any]) -> None:
    """Energy, average power, energy per sample and the share spent waiting, of both runs."""
    table.add_row("energy", _energy(base["energy_j"]), _energy(tuned["energy_j"]))
    table.add_row("average power", f"{base['average_power_w']:,.1f} W/GPU", f"{tuned['average_power_w']:,.1f} W/GPU")
    table.add_row("energy per sample", f"{_digits4(base['joules_per_sample'])} J",
                  f"{_digits4(tuned['joules_per_sample'])} J")
    table.add_row("energy spent waiting", f"{base['wait_energy_share']:.1%}", f"{tuned['wait_energy_share']:.1%}")


def result_table(run: StragglerRun, data: dict[str, Any]) -> Table:
    """No tuning against per-rank slowdown, then the saving, the slowdown and the bloat recovered."""
    base, tuned, bloat = data["no_tuning"], data["per_rank_slowdown"], data["bloat"]
    table = _against_no_tuning("per-rank slowdown")
    table.add_row("time", f"{base['time_s']:,.1f} s", f"{tuned['time_s']:,.1f} s")
    _energy_rows(table, base, tuned)
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


# -- --tune rebalance[,stragglers]: uneven per-rank batches ------------------------------------------------------

MAX_SHARE_RANKS = 4  # the final shares name up to this many ranks apart from the rest
APART = 0.02  # a rank's final share is apart from the rest when it differs from the median by more than this share


def _rebalance_run_figures(run: StragglerRun, result: JobResult) -> dict[str, float]:
    figures_ = _run_figures(run, result)
    figures_.update(samples=result.samples, samples_per_s=result.samples_per_s,
                    ideal_share=result.samples_per_s / run.ideal_samples_per_s if run.ideal_samples_per_s > 0 else 0.0)
    return figures_


def rebalance_figures(run: StragglerRun) -> dict[str, Any]:
    """The result of ``--tune rebalance[,stragglers]`` as plain values: both runs with their throughput, the gain
    against no tuning, the gap to the ideal closed, the energy saved, the share changes and the final shares."""
    base, tuned = _rebalance_run_figures(run, run.baseline), _rebalance_run_figures(run, run.tuned)
    ideal = run.ideal_samples_per_s
    saved = base["energy_j"] - tuned["energy_j"]
    gap = ideal - base["samples_per_s"]
    return {
        "no_tuning": base, "rebalanced": tuned, "per_rank_slowdown": run.clocks,
        "ideal_samples_per_s": ideal,
        "throughput_gain_share": tuned["samples_per_s"] / base["samples_per_s"] - 1.0,
        "ideal_gap_closed_share": (tuned["samples_per_s"] - base["samples_per_s"]) / gap if gap > 0 else None,
        "energy_saved_j": saved, "energy_saved_share": saved / base["energy_j"],
        "joules_per_sample_change_share": tuned["joules_per_sample"] / base["joules_per_sample"] - 1.0,
        "global_batch": run.job.gpus * run.model.batch_size,
        "share_changes": run.tuned.share_changes,
        "final_shares": list(run.tuned.shares[-1]) if run.tuned.shares else [],
        "recommendations": list(run.tuned.recommendations),
    }


def _share_means(job: JobConfig, result: JobResult, part: Segment) -> np.ndarray:
    """Each rank's mean share over the windows of ``part``."""
    lo, hi = part.first_step // job.window_steps, part.last_step // job.window_steps + 1
    return np.asarray(result.shares[lo:hi], dtype=float).mean(axis=0)


def share_table(run: StragglerRun) -> Table:
    """Per-rank shares of the global batch in the rebalanced run over the job, a column per stretch of steps (the
    mean over it), the final shares, and the pace setter marked."""
    job, tuned = run.job, run.tuned
    parts = segments(job, tuned)
    ranks = shown_ranks(job, parts)
    others = sorted(set(range(job.gpus)) - set(ranks))
    means = [_share_means(job, tuned, p) for p in parts]
    final = np.asarray(tuned.shares[-1], dtype=float)
    batch, global_batch = run.model.batch_size, job.gpus * run.model.batch_size
    notes = [f"Columns: stretches of {_stretch(parts)} steps, from the step shown; final: the shares in force at "
             f"the end. paced: share of the {job.window_steps}-step windows in which the rank was the slowest."]
    if others:
        spread = max(float(m[others].max() - m[others].min()) for m in [*means, final])
        notes.append(f"other {len(others)}: the mean of the ranks without a row (within a stretch they differ by at "
                     f"most {spread:.0f} sample{'' if round(spread) == 1 else 's'}).")
    notes.append(f"Without rebalancing every rank computes {batch:,} samples per step.")
    table = Table(title=f"rebalance: each rank's share of the {global_batch:,}-sample global batch over the job "
                        "(samples per step), the mean of each stretch; * set the pace", title_justify="left",
                  caption=" ".join(notes), caption_justify="left", box=box.SIMPLE_HEAD, collapse_padding=True,
                  pad_edge=False)
    _rank_rows(table, tuned, parts, ranks, others, means, "final", final)
    return table


def _mark(value: float, pace: bool) -> str:
    return f"{value:.0f}" + ("*" if pace else " ")


def _span(low: float, high: float) -> str:
    return f"{low:,.0f}" if low == high else f"{low:,.0f}-{high:,.0f}"


def describe_shares(shares: Sequence[int], global_batch: int) -> str:
    """The shares in a few words: ``rank 1: 178 of 2,048 samples; the other 7: 267-268``, or ``even: 256 of 2,048
    samples each``; the ranks more than :data:`APART` from the median share are named (up to
    :data:`MAX_SHARE_RANKS`, the smallest shares first)."""
    if not shares:
        return "none"
    if max(shares) - min(shares) <= 1:
        return f"even: {_span(min(shares), max(shares))} of {global_batch:,} samples each"
    median = float(np.median(shares))
    apart = sorted((r for r, s in enumerate(shares) if abs(s - median) > max(1.0, APART * median)),
                   key=lambda r: (shares[r], r))
    rest = [s for r, s in enumerate(shares) if r not in apart[:MAX_SHARE_RANKS]]
    if not apart:
        return f"within {APART:.0%} of each other: {_span(min(shares), max(shares))} of {global_batch:,} samples"
    text = " and ".join(f"rank {r}: {shares[r]:,}" for r in apart[:MAX_SHARE_RANKS]) + f" of {global_batch:,} samples"
    if rest:
        text += f"; the other {len(rest)}: {_span(min(rest), max(rest))}"
    return text


def rebalance_table(run: StragglerRun, data: dict[str, Any]) -> Table:
    """No tuning against the rebalanced run: time, throughput (also as a share of the ideal), energy; then the
    throughput gained, the ideal, the gap to it closed, the energy saved and the share changes."""
    base, tuned = data["no_tuning"], data["rebalanced"]
    table = _against_no_tuning("rebalance" + (" + per-rank slowdown" if run.clocks else ""))
    table.add_row("time", f"{base['time_s']:,.1f} s", f"{tuned['time_s']:,.1f} s")
    table.add_row("throughput", f"{base['samples_per_s']:,.1f} samples/s", f"{tuned['samples_per_s']:,.1f} samples/s")
    table.add_row("of the ideal", f"{base['ideal_share']:.1%}", f"{tuned['ideal_share']:.1%}")
    _energy_rows(table, base, tuned)
    table.add_section()
    table.add_row("throughput gained", "", f"{data['throughput_gain_share']:+.1%}",
                  style="bold green" if data["throughput_gain_share"] > 0 else "")
    table.add_row("ideal throughput (noise-free)", f"{data['ideal_samples_per_s']:,.1f} samples/s", "")
    closed = data["ideal_gap_closed_share"]
    table.add_row("gap to the ideal closed", "", "n/a (no gap)" if closed is None else f"{closed:.1%}")
    table.add_row("energy saved", "", f"{_energy(data['energy_saved_j'])} ({data['energy_saved_share']:.1%})")
    windows = len(run.tuned.shares)
    table.add_row("share changes", "", f"{data['share_changes']} (in {windows} windows)")
    return table


def rebalance_caption(run: StragglerRun) -> str:
    """Every figure is simulated; the pattern; what rebalancing assumes; what the ideal is."""
    job, m = run.job, run.model
    kind = "calibrated on a measured trace" if m.calibrated else "parametric model"
    clocks = ", then per-rank slowdown locks the clocks of the ranks that still wait" if run.clocks else ""
    return (f"All figures are simulated, not measured ({job.gpus} x {m.spec.name}, {m.workload}, batch "
            f"{m.batch_size}/GPU ({job.gpus * m.batch_size:,} samples per step over all ranks), {job.steps:,} steps, "
            f"{kind}, noise {job.noise:g}, seed {job.seed}; both runs draw the same noise). Straggler pattern: "
            f"{describe_pattern(job)}. The rebalancer splits the global batch every {job.window_steps} steps by each "
            f"rank's seconds per sample at its free clock{clocks}; a rank's compute time is taken as linear in its "
            "share. Ideal: the noise-free throughput at the sum of the ranks' speeds at full clock (with noise every "
            "step lasts as long as its slowest rank, so no split reaches it). Communication and data loading are "
            "not modelled.")


def print_rebalance(console: Console, run: StragglerRun) -> dict[str, Any]:
    """Print the shares (and, with per-rank slowdown, the clocks) over the job, the result, the final shares, any
    recommendation and the caption; return the figures as plain values for ``--json``."""
    data = rebalance_figures(run)
    console.print(share_table(run))
    if run.clocks:
        console.print(clock_table(run))
    console.print(rebalance_table(run, data))
    console.print(f"final shares (simulated): {describe_shares(data['final_shares'], data['global_batch'])}; "
                  f"{data['share_changes']} share change" + ("" if data["share_changes"] == 1 else "s"),
                  highlight=False)
    for line in run.tuned.recommendations:
        console.print(f"recommendation (simulated): {line}", style="bold yellow", highlight=False)
    console.print(rebalance_caption(run), style="dim", highlight=False)
    m, job = run.model, run.job
    parts = segments(job, run.tuned)
    out: dict[str, Any] = {
        "knob": run.knob, "config": asdict(job), "gpu": m.spec.name, "workload": m.workload,
        "batch_size": m.batch_size, "calibrated": m.calibrated, "pattern": describe_pattern(job), **data,
        "shares": {
            "window_steps": job.window_steps,
            "segments": [{"first_step": p.first_step, "last_step": p.last_step, "critical": p.critical,
                          "shares": [float(s) for s in _share_means(job, run.tuned, p)]} for p in parts],
            "per_window": [list(row) for row in run.tuned.shares],
            "per_window_critical": list(run.tuned.critical),
            "no_tuning_per_window_critical": list(run.baseline.critical),
        },
    }
    if run.clocks:
        out["clocks"] = {"segments": [asdict(p) for p in parts], "window_steps": job.window_steps,
                         "per_window_mhz": [[float(c) for c in row] for row in run.tuned.clocks]}
    out["simulated"] = True
    return out
