"""Per-rank DVFS for stragglers on simulated data-parallel jobs: bloat recovered and slowdown against no tuning.

What runs: for every GPU count (``--gpus``, default 8, 16 and 64), every case (``--cases``, default one static
straggler 1.1x, 1.2x and 1.5x slower, one drifting 1.2x and one intermittent 1.2x) and every noise level
(``--noise``, relative standard deviation of each rank's step time and power, default 1 % and 3 %), one
:class:`dtpo.simulation.job.JobConfig` (``--gpu`` A40, ``--workload`` resnet50, ``--steps`` 2000,
``--window`` 20 steps per decision, ``--period`` 500 steps; the straggler starts at rank ``--rank`` 1) is run
three times with :func:`dtpo.simulation.stragglers.run_job`:

* *baseline*: no tuning, every rank at the clock it settles at by itself (full clock), seed ``--seed``;
* *tuned*: :class:`dtpo.tune.straggler.StragglerSlowdown` locks a clock per rank after every window, same seed.
  Each rank draws the same noise in both runs, so the pair differs by the tuning, not by the draws;
* *A/A*: the baseline again with seed ``--seed + 1`` (other noise draws). Its time and energy against the
  baseline are the noise floor of an *unpaired* comparison: how far two runs of the same job differ by noise
  alone. The tuned/baseline pair shares its draws, so its own noise is at most that; a second run with the
  *same* seed would only show that the simulation is deterministic (exactly 0).

Definitions (E: energy of all GPUs, T: wall time of the job, both simulated):

* ``E_full`` and ``E_jit`` from :func:`dtpo.simulation.stragglers.ideal_energy`: the noise-free energy of the
  job with every rank at full clock, and with every rank that is not the slowest at the just-in-time setting
  (as computed there: of the clocks at which the rank still keeps up with the slowest one, the one of least
  energy, which need not be the lowest). *bloat* = ``E_full - E_jit``: the energy of waiting ranks above
  what the same work needs at the just-in-time setting; shown as a share of ``E_full``;
* *wait*: the baseline's measured energy spent waiting for the slowest rank, as a share of its energy;
* *recovered* = ``(E_baseline - E_tuned) / bloat``; *saved* = ``(E_baseline - E_tuned) / E_baseline``;
* *slowdown* = ``T_tuned / T_baseline - 1``;
* *A/A E*, *A/A T*: ``E_aa / E_baseline - 1`` and ``T_aa / T_baseline - 1``;
* *relocks*: share of (rank, window) pairs of the tuned run whose clock differs from the window before;
* *new crit*: share of the tuned run's windows with a straggler in which the critical (slowest) rank was not
  one of the stragglers, i.e. the policy slowed a rank so far that it held the job back.

Goals (exit 1 when one is missed; each is printed as met or missed with its worst figure and case):

1. at least 50 % of the bloat recovered in every static case (every GPU count, factor and noise level);
2. under 1 % slowdown in every static case;
3. under 2 % slowdown in every drifting and intermittent case.

Every figure is simulated (:mod:`dtpo.devices.simulated`, one simulated GPU per rank), nothing is measured.
The runs go to ``--jobs`` processes (default: one per CPU core). The default run (30 jobs, 90 runs) took 75-90 s
with 2 processes on a 2-core machine: a tuned run of 64 ranks x 2000 steps takes 12-17 s, most of it in the
journaled clock locks (each a journal entry and a state-file write with ``fsync``), a baseline run under half a
second; so every GPU count keeps the full 2000 steps (``--jobs 1`` takes about twice as long).

Exit status: 0 all goals met, 1 a goal missed, 2 a bad flag (one line on stderr), 3 a simulation error.

    python benchmarks/straggler_dvfs.py [--gpus 8,16,64]
        [--cases static:1.1,static:1.2,static:1.5,drifting:1.2,intermittent:1.2] [--noise 0.01,0.03]
        [--gpu A40] [--workload resnet50] [--steps 2000] [--window 20] [--period 500] [--rank 1] [--seed 0]
        [--jobs N] [--json FILE] [--verbose]
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_cli, next to this file
from bench_cli import OneLineParser  # noqa: E402
from bench_cli import bad_flag as _bad_flag  # noqa: E402
from task_pool import run_rank_steps  # noqa: E402

from dtpo.core.errors import ConfigError, DtpoError, first_line
from dtpo.simulation.job import JobConfig
from dtpo.simulation.stragglers import check_job, ideal_energy, run_job

log = logging.getLogger("straggler_dvfs")

PROG = "straggler_dvfs.py"
DEFAULT_CASES = "static:1.1,static:1.2,static:1.5,drifting:1.2,intermittent:1.2"
RECOVERY_GOAL = 0.5  # static: at least this share of the bloat recovered
STATIC_SLOWDOWN_GOAL = 0.01  # static: slowdown under this
MOVING_SLOWDOWN_GOAL = 0.02  # drifting and intermittent: slowdown under this
KINDS = ("baseline", "tuned", "aa")


# -- options --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One straggler scenario: a pattern and how much slower the straggler computes."""

    pattern: str
    factor: float

    @property
    def name(self) -> str:
        """e.g. ``static 1.2x``."""
        return f"{self.pattern} {self.factor:g}x"


@dataclass(frozen=True)
class Options:
    """The command line, checked."""

    gpus: tuple[int, ...]
    cases: tuple[Case, ...]
    noises: tuple[float, ...]
    gpu: str
    workload: str
    steps: int
    window: int
    period: int
    rank: int
    seed: int
    jobs: int
    json_path: Path | None
    verbose: bool

    def job(self, gpus: int, case: Case, noise: float, seed: int | None = None) -> JobConfig:
        """The simulated job of one table row (``seed``: the benchmark's seed unless given)."""
        return JobConfig(self.gpu, self.workload, gpus=gpus, steps=self.steps,
                         stragglers=((self.rank, case.factor),), pattern=case.pattern,
                         period_steps=self.period, noise=noise, seed=self.seed if seed is None else seed,
                         window_steps=self.window)


def bad_flag(message: str) -> NoReturn:
    """One line on stderr, exit 2."""
    _bad_flag(PROG, message)


def list_flag(text: str, flag: str, fail: Callable[[str], NoReturn]) -> list[str]:
    """The comma-separated parts of a flag's value (``fail``: one line and exit 2 where there are none)."""
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts:
        fail(f"{flag}: expected a comma-separated list, got {text!r}")
    return parts


def gpu_counts(text: str, fail: Callable[[str], NoReturn]) -> tuple[int, ...]:
    """``--gpus``: distinct whole numbers, in the order given."""
    try:
        counts = [int(part) for part in list_flag(text, "--gpus", fail)]
    except ValueError:
        fail(f"--gpus: expected comma-separated whole numbers, e.g. 8,16,64, got {text!r}")
    return tuple(dict.fromkeys(counts))


def noise_levels(text: str, fail: Callable[[str], NoReturn]) -> tuple[float, ...]:
    """``--noise``: distinct numbers, in the order given."""
    try:
        values = [float(part) for part in list_flag(text, "--noise", fail)]
    except ValueError:
        fail(f"--noise: expected comma-separated numbers (relative std, e.g. 0.01,0.03), got {text!r}")
    return tuple(dict.fromkeys(values))


def _cases(text: str) -> tuple[Case, ...]:
    cases = []
    for part in list_flag(text, "--cases", bad_flag):
        pattern, sep, factor = part.partition(":")
        if not sep:
            bad_flag(f"--cases: expected PATTERN:FACTOR (e.g. static:1.2), got {part!r}")
        try:
            cases.append(Case(pattern.strip().lower(), float(factor)))
        except ValueError:
            bad_flag(f"--cases: the factor of {part!r} is not a number")
    return tuple(dict.fromkeys(cases))


def parse_options(argv: Sequence[str] | None = None) -> Options:
    """Read and check the command line (a bad flag ends the program: one line, exit 2)."""
    parser = OneLineParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", default="8,16,64", help="GPU counts (ranks per job), comma-separated")
    parser.add_argument("--cases", default=DEFAULT_CASES,
                        help="PATTERN:FACTOR, comma-separated; patterns static, drifting, intermittent")
    parser.add_argument("--noise", default="0.01,0.03", help="noise levels, relative std of step time and power")
    parser.add_argument("--gpu", default="A40", help="simulated GPU model")
    parser.add_argument("--workload", default="resnet50", help="simulated workload")
    parser.add_argument("--steps", type=int, default=2000, help="steps per job")
    parser.add_argument("--window", type=int, default=20, help="steps per tuning decision")
    parser.add_argument("--period", type=int, default=500,
                        help="steps before a drifting straggler moves on or an intermittent one switches")
    parser.add_argument("--rank", type=int, default=1, help="the straggler's rank (where a drifting one starts)")
    parser.add_argument("--seed", type=int, default=0, help="noise seed (the A/A control uses seed + 1)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes")
    parser.add_argument("--json", type=Path, help="write every figure and the goals to this file")
    parser.add_argument("-v", "--verbose", action="store_true", help="log every run (INFO)")
    args = parser.parse_args(argv)

    if args.seed < 0:
        bad_flag(f"--seed must be >= 0, got {args.seed}")
    if args.jobs < 1:
        bad_flag(f"--jobs must be >= 1, got {args.jobs}")
    options = Options(gpus=gpu_counts(args.gpus, bad_flag), cases=_cases(args.cases),
                      noises=noise_levels(args.noise, bad_flag),
                      gpu=args.gpu, workload=args.workload, steps=args.steps, window=args.window,
                      period=args.period, rank=args.rank, seed=args.seed, jobs=args.jobs, json_path=args.json,
                      verbose=args.verbose)
    check_jobs(options)
    return options


def check_jobs(options: Any) -> None:
    """Every job a benchmark of ``options`` (GPU counts, cases, noise levels, and ``job(gpus, case, noise)``) will
    run, checked before any runs: a bad one ends the program in one line (dtpo's own checks name the bad value)."""
    try:
        for gpus in options.gpus:
            for case in options.cases:
                for noise in options.noises:
                    check_job(options.job(gpus, case, noise))
        options.job(options.gpus[0], options.cases[0], options.noises[0]).model()
    except ConfigError as exc:
        bad_flag(str(exc))


# -- the runs -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Task:
    """One simulated run: ``kind`` is ``baseline``, ``tuned`` or ``aa`` (the baseline with another seed)."""

    noise: float
    gpus: int
    case: Case
    kind: str
    job: JobConfig

    @property
    def key(self) -> tuple[float, int, Case, str]:
        """Where its result goes."""
        return self.noise, self.gpus, self.case, self.kind

    @property
    def rank_steps(self) -> int:
        """Its size, for the progress bar."""
        return self.job.gpus * self.job.steps

    @property
    def weight(self) -> int:
        """Its expected cost (a tuned run is ~10x a baseline's: the journaled clock locks), to start big ones first."""
        return self.rank_steps * (10 if self.kind == "tuned" else 1)


def make_tasks(options: Options) -> list[Task]:
    """Every run of the benchmark, biggest first."""
    tasks = []
    for noise in options.noises:
        for gpus in options.gpus:
            for case in options.cases:
                job = options.job(gpus, case, noise)
                tasks += [Task(noise, gpus, case, "baseline", job), Task(noise, gpus, case, "tuned", job),
                          Task(noise, gpus, case, "aa", replace(job, seed=options.seed + 1))]
    return sorted(tasks, key=lambda t: -t.weight)


def straggler_windows(job: JobConfig) -> list[set[int] | None]:
    """Per window, the ranks that are slowest by their factor (``None`` when no rank is slower than the rest)."""
    out: list[set[int] | None] = []
    for first in range(0, job.steps, job.window_steps):
        factors = job.factors(first, min(job.window_steps, job.steps - first)).mean(axis=1)
        top = float(factors.max())
        out.append(set(np.flatnonzero(factors >= top - 1e-12).tolist()) if top > float(factors.min()) else None)
    return out


def simulate(task: Task, progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Run one task; its figures (simulated)."""
    started = time.perf_counter()
    result = run_job(task.job, tune=task.kind == "tuned", progress=progress)
    clocks = np.asarray(result.clocks, dtype=float)
    changed = np.diff(clocks, axis=0) != 0 if len(clocks) > 1 else np.zeros((0, task.gpus), dtype=bool)
    slow = straggler_windows(task.job)
    with_straggler = [(s, c) for s, c in zip(slow, result.critical, strict=True) if s is not None]
    wrong = sum(1 for s, c in with_straggler if c not in s)
    wall_s = time.perf_counter() - started
    log.info("%s %d GPUs %s noise %g: %.1f s", task.kind, task.gpus, task.case.name, task.noise, wall_s)
    return {"time_s": result.time_s, "energy_j": result.energy_j, "wait_energy_j": result.wait_energy_j,
            "relocks": float(changed.mean()) if changed.size else 0.0,
            "new_critical": wrong / len(with_straggler) if with_straggler else 0.0,
            "windows": len(result.critical), "wall_s": wall_s}


def run_all(options: Options, tasks: list[Task]) -> dict[tuple[float, int, Case, str], dict[str, Any]]:
    """Run every task (in ``--jobs`` processes), with a progress bar on stderr."""
    return run_rank_steps(tasks, simulate, options.jobs, options.verbose)


# -- figures and goals ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One job's figures (all simulated); shares are fractions, not per cent."""

    noise: float
    gpus: int
    case: Case
    full_j: float
    jit_j: float
    baseline_time_s: float
    baseline_energy_j: float
    baseline_wait_j: float
    tuned_time_s: float
    tuned_energy_j: float
    tuned_wait_j: float
    aa_time_s: float
    aa_energy_j: float
    relocks: float
    new_critical: float

    @property
    def label(self) -> str:
        """e.g. ``64 GPUs, static 1.1x, noise 3 %``."""
        return f"{self.gpus} GPUs, {self.case.name}, noise {_pct(self.noise, 0)}"

    @property
    def bloat_j(self) -> float:
        """Noise-free energy of waiting above the just-in-time setting."""
        return self.full_j - self.jit_j

    @property
    def bloat_share(self) -> float:
        """The bloat as a share of the full-clock energy."""
        return self.bloat_j / self.full_j

    @property
    def wait_share(self) -> float:
        """The baseline's measured wait energy as a share of its energy."""
        return self.baseline_wait_j / self.baseline_energy_j

    @property
    def saved_j(self) -> float:
        """Baseline energy minus tuned energy."""
        return self.baseline_energy_j - self.tuned_energy_j

    @property
    def recovered(self) -> float | None:
        """Share of the bloat the tuning saved (``None`` when there is no bloat)."""
        return self.saved_j / self.bloat_j if self.bloat_j > 0 else None

    @property
    def saved(self) -> float:
        """Energy saved as a share of the baseline's."""
        return self.saved_j / self.baseline_energy_j

    @property
    def slowdown(self) -> float:
        """Tuned time over baseline time, minus 1."""
        return self.tuned_time_s / self.baseline_time_s - 1.0

    @property
    def aa_time(self) -> float:
        """A/A control: baseline (seed + 1) time over baseline time, minus 1."""
        return self.aa_time_s / self.baseline_time_s - 1.0

    @property
    def aa_energy(self) -> float:
        """A/A control: baseline (seed + 1) energy over baseline energy, minus 1."""
        return self.aa_energy_j / self.baseline_energy_j - 1.0

    def as_dict(self) -> dict[str, Any]:
        """Every figure, for the JSON file."""
        data = asdict(self)
        data["case"] = {"pattern": self.case.pattern, "factor": self.case.factor, "name": self.case.name}
        for name in ("bloat_j", "bloat_share", "wait_share", "saved_j", "recovered", "saved", "slowdown",
                     "aa_time", "aa_energy"):
            data[name] = getattr(self, name)
        return data


def make_rows(options: Options, results: dict[tuple[float, int, Case, str], dict[str, Any]]) -> list[Row]:
    """One row per job, in table order."""
    rows = []
    for noise in options.noises:
        for gpus in options.gpus:
            for case in options.cases:
                base, tuned, aa = (results[(noise, gpus, case, kind)] for kind in KINDS)
                full_j, jit_j = ideal_energy(options.job(gpus, case, noise))
                row = Row(noise, gpus, case, float(full_j), float(jit_j),
                          base["time_s"], base["energy_j"], base["wait_energy_j"],
                          tuned["time_s"], tuned["energy_j"], tuned["wait_energy_j"],
                          aa["time_s"], aa["energy_j"], tuned["relocks"], tuned["new_critical"])
                if row.recovered is None:
                    log.warning("%s: no bloat (the straggler is not slower), nothing to recover", row.label)
                rows.append(row)
    return rows


@dataclass(frozen=True)
class Goal:
    """One goal: met or not, with its worst figure and where."""

    name: str
    met: bool
    worst: float | None
    case: str | None
    threshold: float


def evaluate_goals(rows: list[Row]) -> list[Goal]:
    """The three goals of the module docs (a goal with no case to judge is met and says so)."""
    static = [r for r in rows if r.case.pattern == "static"]
    moving = [r for r in rows if r.case.pattern != "static"]
    goals = []
    judged = [r for r in static if r.recovered is not None]
    worst = min(judged, key=lambda r: r.recovered or 0.0) if judged else None
    goals.append(Goal(f"static: at least {_pct(RECOVERY_GOAL, 0)} of the bloat recovered",
                      bool(worst is None or (worst.recovered or 0.0) >= RECOVERY_GOAL),
                      worst.recovered if worst else None, worst.label if worst else None, RECOVERY_GOAL))
    for name, group, limit in (
            (f"static: slowdown under {_pct(STATIC_SLOWDOWN_GOAL, 0)}", static, STATIC_SLOWDOWN_GOAL),
            (f"drifting and intermittent: slowdown under {_pct(MOVING_SLOWDOWN_GOAL, 0)}", moving,
             MOVING_SLOWDOWN_GOAL)):
        slowest = max(group, key=lambda r: r.slowdown) if group else None
        goals.append(Goal(name, bool(slowest is None or slowest.slowdown < limit),
                          slowest.slowdown if slowest else None, slowest.label if slowest else None, limit))
    return goals


# -- output ---------------------------------------------------------------------------------------------


def _pct(value: float | None, digits: int = 1, signed: bool = False) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value * 100:{'+' if signed else ''}.{digits}f} %"


def report(console: Console, options: Options, rows: list[Row], goals: list[Goal], runtime_s: float) -> None:
    """The tables (one per noise level), a legend and the goal lines."""
    for noise in options.noises:
        table = Table(title=f"Per-rank DVFS against no tuning, noise {_pct(noise, 0)} ({options.gpu}, "
                            f"{options.workload}, {options.steps} steps, window {options.window}, "
                            f"period {options.period}; simulated)")
        for header in ("GPUs", "case", "bloat", "wait", "recovered", "saved", "A/A E", "slowdown", "A/A T",
                       "relocks", "new crit"):
            table.add_column(header, justify="left" if header == "case" else "right")
        for row in (r for r in rows if r.noise == noise):
            missed = ((row.case.pattern == "static" and ((row.recovered is not None and row.recovered < RECOVERY_GOAL)
                                                          or row.slowdown >= STATIC_SLOWDOWN_GOAL))
                      or (row.case.pattern != "static" and row.slowdown >= MOVING_SLOWDOWN_GOAL))
            table.add_row(str(row.gpus), row.case.name, _pct(row.bloat_share), _pct(row.wait_share),
                          _pct(row.recovered), _pct(row.saved), _pct(row.aa_energy, 2, True),
                          _pct(row.slowdown, 2, True), _pct(row.aa_time, 2, True), _pct(row.relocks, 0),
                          _pct(row.new_critical, 0), style="red" if missed else None)
        console.print(table)
    console.print("bloat: noise-free E_full - E_jit, share of E_full; wait: baseline's wait energy, share of its "
                  "energy; recovered: (E_base - E_tuned) / bloat;\nsaved: (E_base - E_tuned) / E_base; slowdown: "
                  "T_tuned / T_base - 1 (same seed, same noise draws); A/A E, A/A T: baseline with seed + 1 against "
                  "the baseline\n(the unpaired noise floor); relocks: rank-windows whose clock changed; new crit: "
                  "windows in which a slowed rank, not the straggler, was the slowest. Red: a goal missed.")
    for goal in goals:
        if goal.worst is None:
            console.print(f"GOAL met (nothing to judge): {goal.name}")
            continue
        status = "[green]met[/green]" if goal.met else "[red]MISSED[/red]"
        console.print(f"GOAL {status}: {goal.name}: worst {_pct(goal.worst, 2)} ({goal.case})")
    console.print(f"runtime {runtime_s:.0f} s ({len(rows) * len(KINDS)} simulated runs, --jobs {options.jobs}); "
                  "every figure is simulated")


def write_json(path: Path, options: Options, rows: list[Row], goals: list[Goal], runtime_s: float,
               results: dict[tuple[float, int, Case, str], dict[str, Any]]) -> None:
    """All figures, the goals and the options."""
    runs = [{"noise": k[0], "gpus": k[1], "case": k[2].name, "kind": k[3], **v} for k, v in results.items()]
    data = {"benchmark": "straggler_dvfs", "simulated": True, "runtime_s": runtime_s,
            "options": {**asdict(options), "json_path": str(options.json_path),
                        "cases": [c.name for c in options.cases]},
            "goals": [asdict(g) for g in goals], "rows": [r.as_dict() for r in rows], "runs": runs}
    path.write_text(json.dumps(data, indent=1) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; 0 when every goal is met, 1 otherwise."""
    options = parse_options(argv)
    logging.basicConfig(level=logging.INFO if options.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    tasks = make_tasks(options)
    started = time.perf_counter()
    try:
        results = run_all(options, tasks)
    except DtpoError as exc:
        log.error("simulation failed: %s", first_line(str(exc)))
        return 3
    runtime_s = time.perf_counter() - started
    rows = make_rows(options, results)
    goals = evaluate_goals(rows)
    if options.json_path:
        write_json(options.json_path, options, rows, goals, runtime_s, results)
    report(Console(width=None if sys.stdout.isatty() else 200), options, rows, goals, runtime_s)
    return 0 if all(g.met for g in goals) else 1


if __name__ == "__main__":
    sys.exit(main())
