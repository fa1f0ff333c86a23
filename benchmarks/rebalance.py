"""Uneven per-rank batches for stragglers on simulated data-parallel jobs: throughput against the ideal.

What runs: for every GPU count (``--gpus``, default 8, 16 and 64), every case (``--cases``, default one static
straggler 1.2x, 1.5x and 2x slower, one drifting 1.5x that moves on to the next rank every 500 steps, and one
transient: intermittent 1.5x, slow for 40 steps (two windows) and then not for as long) and every noise level
(``--noise``, relative standard deviation of each rank's step time and power, default 1 % and 3 %), one
:class:`dtpo.simulation.job.JobConfig` (``--gpu`` A40, ``--workload`` resnet50, ``--steps`` 2000, ``--window``
20 steps per decision; the straggler starts at rank ``--rank`` 1) is run six times with
:func:`dtpo.simulation.stragglers.run_job`, all with seed ``--seed`` but the A/A control:

* *none*: no tuning, every rank computes the per-GPU batch at the clock it settles at by itself (full clock);
* *clocks*: per-rank DVFS, :class:`dtpo.tune.straggler.StragglerSlowdown` (``tune=True``);
* *rebalance*: uneven per-rank batches, :class:`dtpo.tune.rebalance.Rebalancer` (``rebalance=True``);
* *both*: the rebalancer first, then per-rank DVFS on what the shares leave;
* *oracle*: no tuning, the shares fixed from the true (noise-free) speeds from step 0, window by window
  (:func:`dtpo.simulation.stragglers.true_shares`), same draws: what a split can attain under the noise;
* *A/A*: *none* again with seed ``--seed + 1`` (other noise draws): the noise floor of an *unpaired* comparison.
  The five runs above share their draws (paired), so their own noise is at most that.

The simulation takes a rank's compute time as linear in its share of the global batch (``gpus x`` the per-GPU
batch, which every step trains however it is split). Definitions (T: throughput, samples per second; e: energy
per sample; all simulated):

* ``T_ideal`` from :func:`dtpo.simulation.stragglers.ideal_throughput`: the noise-free sum of the ranks' speeds
  at full clock (over time, for the moving cases). Every mode is shown as ``T / T_ideal``. With noise every step
  lasts as long as its slowest rank, the maximum of ``gpus`` noisy times, so no split reaches it: the *oracle*
  column shows how far the best fixed split gets;
* *closed*: the gap to the ideal that clocks-only leaves, closed by rebalance (*reb*) and by *both*:
  ``(T - T_clocks) / (T_ideal - T_clocks)``;
* *e both:clk*: ``e_both / e_clocks - 1``;
* *changes*: the share changes of the rebalance and both runs;
* *A/A T*, *A/A e*: ``T_aa / T_none - 1`` and ``e_aa / e_none - 1``.

Goals (exit 1 when one is missed; each is printed as met or missed with its worst figure and case):

1. persistent (static) stragglers: rebalance and both within 5 % of the ideal (``T / T_ideal >= 0.95``);
2. persistent (static) stragglers: rebalance and both close at least half the gap clocks-only leaves;
3. transient (intermittent) stragglers: both no worse than clocks-only within 1 % (``T_both / T_clocks - 1 >=
   -1 %``);
4. every case: energy per sample of both no worse than clocks-only, up to the A/A noise floor of its row: ``e
   both:clk <= |A/A e|`` (the paired pair's noise is at most the unpaired control's).

Goal 1 is out of reach where the noise alone costs more than 5 %: the step time is the maximum of ``gpus`` noisy
ranks (about ``noise x 2.4`` above the mean for 64 ranks), which no split of the batch can avoid; the oracle column
shows it. Goal 4 weighs energy against throughput: rebalancing runs every rank busy at full clock, while
clocks-only runs the waiting ranks at a lower, more efficient clock. The benchmark reports what it finds and
exits 1; nothing is tuned to pass.

What the default run found (exit 1): goals 2 and 3 met (at least 58 % of the gap closed; the transient straggler
never changed a share, so both ran exactly as clocks-only). Goal 1 missed in 10 of 18 static rows: at 3 % noise
everywhere but 8 GPUs 1.2x (rebalance 91-95 % of the ideal, the oracle itself 93.5-95.9 %), and at 1 % noise on 64
GPUs 2x (95.00 %, 94.998 % before rounding). Most of the gap to the oracle is the three windows of evidence the
rebalancer waits for at the even split, 60 of 2000 steps (2.5 % of a 2x job's time). Goal 4 missed: energy per
sample of both is 6-19 % above clocks-only for 1.2x and 1.5x stragglers, and 1-7 % below it for 2x.

Every figure is simulated (:mod:`dtpo.devices.simulated`, one simulated GPU per rank), nothing is measured.
The runs go to ``--jobs`` processes (default: one per CPU core), whose simulated GPUs keep their state files in
``/dev/shm``. The default run (30 jobs, 180 runs) took 159 s with 2 processes on a 2-core machine shared with other
work (load average 5-8; 250-280 s under heavier load); its runs used 115 CPU-seconds in all, so about a minute where
both cores are free. A clocks or both run of 64 ranks x 2000 steps uses 3-5 CPU-seconds (most of it in the clock
policy's curve fit and the rebalancer's split), and those 20 runs two thirds of the total (``--jobs 1`` takes about
twice as long).

Exit status: 0 all goals met, 1 a goal missed, 2 a bad flag (one line on stderr), 3 a simulation error.

    python benchmarks/rebalance.py [--gpus 8,16,64]
        [--cases static:1.2,static:1.5,static:2,drifting:1.5:500,intermittent:1.5:40] [--noise 0.01,0.03]
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

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_cli and straggler_dvfs, next to this file
from bench_cli import OneLineParser  # noqa: E402
from bench_cli import bad_flag as _bad_flag  # noqa: E402
from rebalance_gloo import RealResult, run_real  # noqa: E402
from straggler_dvfs import Task as StragglerTask  # noqa: E402
from straggler_dvfs import _pct, check_jobs, gpu_counts, list_flag, noise_levels  # noqa: E402
from task_pool import run_rank_steps  # noqa: E402

from dtpo.core.errors import ConfigError, DtpoError, first_line
from dtpo.simulation.job import PATTERNS, JobConfig
from dtpo.simulation.stragglers import ideal_throughput, run_job, true_shares
from dtpo.workloads import get_workload

log = logging.getLogger("rebalance")

PROG = "rebalance.py"
DEFAULT_CASES = "static:1.2,static:1.5,static:2,drifting:1.5:500,intermittent:1.5:40"
IDEAL_GOAL = 0.95  # static: rebalance and both at least this share of the ideal throughput
GAP_GOAL = 0.5  # static: rebalance and both close at least this share of the gap clocks-only leaves
TRANSIENT_GOAL = -0.01  # intermittent: both's throughput against clocks-only's, at least this
KINDS = ("none", "clocks", "rebalance", "both", "oracle", "aa")
REBALANCED = ("rebalance", "both")
WEIGHTS = {"clocks": 10, "both": 14, "rebalance": 4}  # a run's cost against a plain one's, to start big ones first


# -- options --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One straggler scenario: a pattern, how much slower the straggler computes, and its period."""

    pattern: str
    factor: float
    period: int

    @property
    def name(self) -> str:
        """e.g. ``static 1.5x`` or ``intermittent 1.5x/40``."""
        return f"{self.pattern} {self.factor:g}x" + ("" if self.pattern == "static" else f"/{self.period}")

    @property
    def transient(self) -> bool:
        """Whether the straggler comes and goes (intermittent)."""
        return self.pattern == "intermittent"


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
    rank: int
    seed: int
    jobs: int
    json_path: Path | None
    verbose: bool
    real_rounds: int = 2
    real_slow: float = 2.0
    real_steps: int = 80
    real_workload: str = "lm"

    def job(self, gpus: int, case: Case, noise: float, seed: int | None = None) -> JobConfig:
        """The simulated job of one table row (``seed``: the benchmark's seed unless given)."""
        return JobConfig(self.gpu, self.workload, gpus=gpus, steps=self.steps,
                         stragglers=((self.rank, case.factor),), pattern=case.pattern,
                         period_steps=case.period, noise=noise, seed=self.seed if seed is None else seed,
                         window_steps=self.window)


def bad_flag(message: str) -> NoReturn:
    """One line on stderr, exit 2."""
    _bad_flag(PROG, message)


def _cases(text: str, period: int) -> tuple[Case, ...]:
    cases = []
    for part in list_flag(text, "--cases", bad_flag):
        fields = [f.strip() for f in part.split(":")]
        if len(fields) not in (2, 3):
            bad_flag(f"--cases: expected PATTERN:FACTOR[:PERIOD] (e.g. static:1.5, intermittent:1.5:40), got {part!r}")
        pattern = fields[0].lower()
        if pattern not in PATTERNS:
            bad_flag(f"--cases: unknown pattern {fields[0]!r} in {part!r}; choose one of {', '.join(PATTERNS)}")
        try:
            factor = float(fields[1])
            steps = int(fields[2]) if len(fields) == 3 else period
        except ValueError:
            bad_flag(f"--cases: the factor or period of {part!r} is not a number")
        if not (math.isfinite(factor) and factor > 1.0):
            bad_flag(f"--cases: the factor of {part!r} must be a number above 1 (a straggler is slower)")
        cases.append(Case(pattern, factor, steps))
    return tuple(dict.fromkeys(cases))


def parse_options(argv: Sequence[str] | None = None) -> Options:
    """Read and check the command line (a bad flag ends the program: one line, exit 2)."""
    parser = OneLineParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", default="8,16,64", help="GPU counts (ranks per job), comma-separated")
    parser.add_argument("--cases", default=DEFAULT_CASES,
                        help="PATTERN:FACTOR[:PERIOD], comma-separated; patterns static, drifting, intermittent")
    parser.add_argument("--noise", default="0.01,0.03", help="noise levels, relative std of step time and power")
    parser.add_argument("--gpu", default="A40", help="simulated GPU model")
    parser.add_argument("--workload", default="resnet50", help="simulated workload")
    parser.add_argument("--steps", type=int, default=2000, help="steps per job")
    parser.add_argument("--window", type=int, default=20, help="steps per decision (shares and clocks)")
    parser.add_argument("--period", type=int, default=500,
                        help="steps before a drifting straggler moves on or an intermittent one switches, where a "
                             "case names none")
    parser.add_argument("--rank", type=int, default=1, help="the straggler's rank (where a drifting one starts)")
    parser.add_argument("--seed", type=int, default=0, help="noise seed (the A/A control uses seed + 1)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes")
    parser.add_argument("--json", type=Path, help="write every figure and the goals to this file")
    parser.add_argument("--real-rounds", type=int, default=2,
                        help="rounds of real 2-rank gloo runs (untuned, even, rebalanced); 0 skips them")
    parser.add_argument("--real-slow", type=float, default=2.0, help="how many times slower rank 1's GPU is there")
    parser.add_argument("--real-steps", type=int, default=80, help="steps of each real run")
    parser.add_argument("--real-workload", default="lm", help="built-in workload of the real runs")
    parser.add_argument("-v", "--verbose", action="store_true", help="log every run (INFO)")
    args = parser.parse_args(argv)

    if args.seed < 0:
        bad_flag(f"--seed must be >= 0, got {args.seed}")
    if args.jobs < 1:
        bad_flag(f"--jobs must be >= 1, got {args.jobs}")
    if args.real_rounds < 0 or args.real_rounds == 1:
        bad_flag(f"--real-rounds must be 0 (none) or at least 2 (the A/A control needs two rounds), got "
                 f"{args.real_rounds}")
    if not (math.isfinite(args.real_slow) and args.real_slow > 1.0):
        bad_flag(f"--real-slow must be a finite number above 1, got {args.real_slow:g}")
    try:
        get_workload(args.real_workload)
    except ConfigError as exc:
        bad_flag(f"--real-workload: {exc}")
    if args.real_steps < 40:
        bad_flag(f"--real-steps must be at least 40 (the rebalancer waits three windows of 10), got "
                 f"{args.real_steps}")
    options = Options(gpus=gpu_counts(args.gpus, bad_flag), cases=_cases(args.cases, args.period),
                      noises=noise_levels(args.noise, bad_flag),
                      gpu=args.gpu, workload=args.workload, steps=args.steps, window=args.window, rank=args.rank,
                      seed=args.seed, jobs=args.jobs, json_path=args.json, verbose=args.verbose,
                      real_rounds=args.real_rounds, real_slow=args.real_slow, real_steps=args.real_steps,
                      real_workload=args.real_workload)
    check_jobs(options)
    return options


# -- the runs -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Task(StragglerTask):
    """One simulated run (:class:`straggler_dvfs.Task`): ``kind`` is one of :data:`KINDS`."""

    @property
    def weight(self) -> int:
        """Its expected cost, to start big ones first."""
        return self.rank_steps * WEIGHTS.get(self.kind, 1)


def make_tasks(options: Options) -> list[Task]:
    """Every run of the benchmark, biggest first."""
    tasks = []
    for noise in options.noises:
        for gpus in options.gpus:
            for case in options.cases:
                job = options.job(gpus, case, noise)
                tasks += [Task(noise, gpus, case, kind, replace(job, seed=options.seed + 1) if kind == "aa" else job)
                          for kind in KINDS]
    return sorted(tasks, key=lambda t: -t.weight)


def simulate(task: Task, progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Run one task; its figures (simulated)."""
    started, cpu = time.perf_counter(), time.process_time()
    job, kind = task.job, task.kind
    result = run_job(job, tune=kind in ("clocks", "both"), progress=progress, rebalance=kind in REBALANCED,
                     fixed_shares=true_shares(job) if kind == "oracle" else None)
    wall_s = time.perf_counter() - started
    log.info("%s %d GPUs %s noise %g: %.1f s", kind, task.gpus, task.case.name, task.noise, wall_s)
    return {"time_s": result.time_s, "energy_j": result.energy_j, "samples": result.samples,
            "samples_per_s": result.samples_per_s, "share_changes": result.share_changes,
            "final_shares": result.shares[-1], "recommendations": result.recommendations, "wall_s": wall_s,
            "cpu_s": time.process_time() - cpu}


def run_all(options: Options, tasks: list[Task]) -> dict[tuple[float, int, Case, str], dict[str, Any]]:
    """Run every task (in ``--jobs`` processes), with a progress bar on stderr."""
    return run_rank_steps(tasks, simulate, options.jobs, options.verbose)


# -- figures and goals ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One job's figures (all simulated): throughput (samples/s) and energy per sample (J) of every run."""

    noise: float
    gpus: int
    case: Case
    ideal: float
    throughput: dict[str, float]
    joules_per_sample: dict[str, float]
    changes: dict[str, int]
    recommendations: int

    @property
    def label(self) -> str:
        """e.g. ``64 GPUs, static 1.5x, noise 3 %``."""
        return f"{self.gpus} GPUs, {self.case.name}, noise {_pct(self.noise, 0)}"

    def of_ideal(self, kind: str) -> float:
        """The run's throughput as a share of the ideal."""
        return self.throughput[kind] / self.ideal

    def closed(self, kind: str) -> float | None:
        """The share of the gap to the ideal that clocks-only leaves, closed by ``kind`` (``None``: no gap)."""
        gap = self.ideal - self.throughput["clocks"]
        return (self.throughput[kind] - self.throughput["clocks"]) / gap if gap > 0 else None

    @property
    def both_vs_clocks(self) -> float:
        """Throughput of both over clocks-only, minus 1."""
        return self.throughput["both"] / self.throughput["clocks"] - 1.0

    @property
    def energy_both_vs_clocks(self) -> float:
        """Energy per sample of both over clocks-only, minus 1."""
        return self.joules_per_sample["both"] / self.joules_per_sample["clocks"] - 1.0

    @property
    def energy_both_vs_none(self) -> float:
        """Energy per sample of both over no tuning, minus 1."""
        return self.joules_per_sample["both"] / self.joules_per_sample["none"] - 1.0

    @property
    def aa_throughput(self) -> float:
        """A/A control: throughput of none with seed + 1 over none's, minus 1."""
        return self.throughput["aa"] / self.throughput["none"] - 1.0

    @property
    def aa_energy(self) -> float:
        """A/A control: energy per sample of none with seed + 1 over none's, minus 1."""
        return self.joules_per_sample["aa"] / self.joules_per_sample["none"] - 1.0

    def misses(self) -> bool:
        """Whether the row misses one of the goals."""
        if self.case.pattern == "static":
            if min(self.of_ideal(k) for k in REBALANCED) < IDEAL_GOAL:
                return True
            if any((self.closed(k) or 0.0) < GAP_GOAL for k in REBALANCED if self.closed(k) is not None):
                return True
        if self.case.transient and self.both_vs_clocks < TRANSIENT_GOAL:
            return True
        return self.energy_both_vs_clocks > abs(self.aa_energy)

    def as_dict(self) -> dict[str, Any]:
        """Every figure, for the JSON file."""
        data = asdict(self)
        data["case"] = {"pattern": self.case.pattern, "factor": self.case.factor, "period": self.case.period,
                        "name": self.case.name}
        data["of_ideal"] = {k: self.of_ideal(k) for k in KINDS}
        data["closed"] = {k: self.closed(k) for k in REBALANCED}
        for name in ("both_vs_clocks", "energy_both_vs_clocks", "aa_throughput", "aa_energy"):
            data[name] = getattr(self, name)
        return data


def make_rows(options: Options, results: dict[tuple[float, int, Case, str], dict[str, Any]]) -> list[Row]:
    """One row per job, in table order."""
    rows = []
    for noise in options.noises:
        for gpus in options.gpus:
            for case in options.cases:
                runs = {kind: results[(noise, gpus, case, kind)] for kind in KINDS}
                rows.append(Row(noise, gpus, case, ideal_throughput(options.job(gpus, case, noise)),
                                {k: r["samples_per_s"] for k, r in runs.items()},
                                {k: r["energy_j"] / r["samples"] for k, r in runs.items()},
                                {k: runs[k]["share_changes"] for k in REBALANCED},
                                sum(len(runs[k]["recommendations"]) for k in REBALANCED)))
    return rows


@dataclass(frozen=True)
class Goal:
    """One goal: met or not, with its worst figure, where, and what it was held against."""

    name: str
    met: bool
    worst: float | None
    case: str | None
    against: str


def _goal(name: str, rows: list[Row], figure: Callable[[Row], float | None], ok: Callable[[Row, float], bool],
          against: Callable[[Row], str], worst_first: Callable[[Row, float], float]) -> Goal:
    """The goal over ``rows``: met where ``ok`` holds for every row's figure; its worst row by ``worst_first``."""
    judged = [(r, v) for r in rows if (v := figure(r)) is not None]
    if not judged:
        return Goal(name, True, None, None, "")
    row, value = max(judged, key=lambda rv: worst_first(*rv))
    return Goal(name, all(ok(r, v) for r, v in judged), value, row.label, against(row))


def evaluate_goals(rows: list[Row]) -> list[Goal]:
    """The four goals of the module docs (a goal with no case to judge is met and says so)."""
    static = [r for r in rows if r.case.pattern == "static"]
    transient = [r for r in rows if r.case.transient]
    return [
        _goal(f"static: rebalance and both within {_pct(1 - IDEAL_GOAL, 0)} of the ideal throughput", static,
              lambda r: min(r.of_ideal(k) for k in REBALANCED), lambda r, v: v >= IDEAL_GOAL,
              lambda r: f"oracle {_pct(r.of_ideal('oracle'))} of the ideal", lambda r, v: -v),
        _goal(f"static: rebalance and both close at least {_pct(GAP_GOAL, 0)} of the gap clocks-only leaves", static,
              lambda r: min((c for k in REBALANCED if (c := r.closed(k)) is not None), default=None),
              lambda r, v: v >= GAP_GOAL, lambda r: f"clocks-only {_pct(r.of_ideal('clocks'))} of the ideal",
              lambda r, v: -v),
        _goal(f"transient: both no worse than clocks-only within {_pct(-TRANSIENT_GOAL, 0)} in throughput",
              transient, lambda r: r.both_vs_clocks, lambda r, v: v >= TRANSIENT_GOAL,
              lambda r: f"share changes {r.changes['both']}", lambda r, v: -v),
        _goal("every case: energy per sample of both no worse than clocks-only, up to the A/A noise floor", rows,
              lambda r: r.energy_both_vs_clocks, lambda r, v: v <= abs(r.aa_energy),
              lambda r: f"allowed {_pct(abs(r.aa_energy), 2, True)}", lambda r, v: v - abs(r.aa_energy)),
    ]


# -- output ---------------------------------------------------------------------------------------------


def _closed(value: float | None) -> str:
    return "-" if value is None else _pct(value, 0)


def report(console: Console, options: Options, rows: list[Row], goals: list[Goal], runtime_s: float) -> None:
    """The table, a legend and the goal lines."""
    table = Table(title=f"Uneven per-rank batches against per-rank DVFS: throughput as a share of the ideal "
                        f"({options.gpu}, {options.workload}, {options.steps} steps, window {options.window}; "
                        "simulated)")
    for header in ("GPUs", "case", "noise", "none", "clocks", "reb", "both", "oracle", "closed reb", "closed both",
                   "e both:clk", "e both:none", "changes", "A/A T", "A/A e"):
        table.add_column(header, justify="left" if header == "case" else "right")
    for row in rows:
        table.add_row(str(row.gpus), row.case.name, _pct(row.noise, 0),
                      *(_pct(row.of_ideal(k)) for k in ("none", "clocks", "rebalance", "both", "oracle")),
                      _closed(row.closed("rebalance")), _closed(row.closed("both")),
                      _pct(row.energy_both_vs_clocks, 2, True), _pct(row.energy_both_vs_none, 2, True),
                      f"{row.changes['rebalance']}/{row.changes['both']}",
                      _pct(row.aa_throughput, 2, True), _pct(row.aa_energy, 2, True),
                      style="red" if row.misses() else None)
    console.print(table)
    console.print("none, clocks, reb (rebalance), both, oracle: throughput T / T_ideal, T_ideal the noise-free sum of "
                  "the ranks' speeds at full clock; oracle: shares fixed from the true\nspeeds from step 0 (same "
                  "draws); closed: (T - T_clocks) / (T_ideal - T_clocks); e both:clk: energy per sample of both over "
                  "clocks-only - 1; e both:none: the same over no tuning; changes: share changes of\n"
                  "rebalance/both; A/A T, A/A e: none with seed + 1 against none (the unpaired noise floor; every "
                  "other run shares its draws). Red: a goal missed.")
    recommended = sum(r.recommendations for r in rows)
    if recommended:
        console.print(f"{recommended} recommendation(s) to restart without a rank (see --json)")
    for goal in goals:
        if goal.worst is None:
            console.print(f"GOAL met (nothing to judge): {goal.name}")
            continue
        status = "[green]met[/green]" if goal.met else "[red]MISSED[/red]"
        signed = goal.name.startswith(("transient", "every case"))
        console.print(f"GOAL {status}: {goal.name}: worst {_pct(goal.worst, 2, signed)} ({goal.case}; "
                      f"{goal.against})")
    console.print(f"runtime {runtime_s:.0f} s ({len(rows) * len(KINDS)} simulated runs, --jobs {options.jobs}); "
                  "every figure is simulated")


def write_json(path: Path, options: Options, rows: list[Row], goals: list[Goal], runtime_s: float,
               results: dict[tuple[float, int, Case, str], dict[str, Any]], real: RealResult | None = None) -> None:
    """All figures, the goals and the options (and the real runs, where they ran)."""
    runs = [{"noise": k[0], "gpus": k[1], "case": k[2].name, "kind": k[3], **v} for k, v in results.items()]
    data = {"benchmark": "rebalance", "simulated": True, "runtime_s": runtime_s,
            "options": {**asdict(options), "json_path": str(options.json_path),
                        "cases": [c.name for c in options.cases]},
            "goals": [asdict(g) for g in goals], "rows": [r.as_dict() for r in rows], "runs": runs,
            "real": None if real is None else {
                "runs": [asdict(r) for r in real.runs], "factor": real.factor, "steps": real.steps,
                "speedup": real.speedup, "aa": real.aa,
                "goals": [{"name": n, "met": m, "figure": f} for n, m, f in real.goals()]}}
    path.write_text(json.dumps(data, indent=1) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; 0 when every goal is met, 1 otherwise, 3 on a simulation error."""
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
    console = Console(width=None if sys.stdout.isatty() else 200)
    real = None
    if options.real_rounds:
        try:
            real = run_real(options.real_rounds, options.real_slow, options.real_steps, options.real_workload,
                            progress=lambda what: console.print(what, style="dim"))
        except RuntimeError as exc:
            log.error("a real run failed: %s", exc)
            return 3
    if options.json_path:
        write_json(options.json_path, options, rows, goals, runtime_s, results, real)
    report(console, options, rows, goals, runtime_s)
    if real is not None:
        report_real(console, real)
    real_met = real is None or all(met for _, met, _ in real.goals())
    return 0 if all(g.met for g in goals) and real_met else 1


def report_real(console: Console, real: RealResult) -> None:
    """The real runs' table and goal lines."""
    table = Table(title=f"dtpo train on 2 gloo ranks, rank 1's virtual GPU {real.factor:g}x slower, {real.workload}, "
                        f"{real.steps} steps (throughput partly simulated: the slow GPU's delay)")
    for header in ("mode", "seed", "samples/s", "eval loss", "final shares", "changes"):
        table.add_column(header, justify="left" if header == "mode" else "right")
    for run in real.runs:
        table.add_row(run.mode, str(run.seed), f"{run.throughput:,.1f}", f"{run.eval_loss:.4f}",
                      "-" if run.final_shares is None else "/".join(map(str, run.final_shares)), str(run.changes))
    console.print(table)
    console.print(f"rebalance / none throughput x{real.speedup:.3f}; A/A (the untuned runs of seeds 0 and 1) "
                  f"{real.aa:.3f}; even: --tune rebalance --rebalance-max-share 1, the same global batches split "
                  "evenly")
    for name, met, figure in real.goals():
        console.print(f"GOAL {'[green]met[/green]' if met else '[red]MISSED[/red]'}: {name}: {figure}")


if __name__ == "__main__":
    sys.exit(main())
