"""Leave-one-out validation for ``tuner_vs_zeus.py``: dtpo's tuner constants chosen on some GPUs' traces, judged on
a GPU they were not chosen on.

dtpo's tuner has thresholds, budgets and weights (:class:`dtpo.tune.tuner_types.TunerOptions`) whose defaults were
chosen on the very traces ``tuner_vs_zeus.py`` judges it on. Here, for every GPU among the selected traces in turn:

1. **Fit** on the other GPUs' traces: a coordinate search from the defaults. Each constant of :data:`SEARCH` in turn
   (``--quick``: :data:`QUICK`) is tried at each of its values, the others held where the search has put them; the
   best value is kept when it beats the current one. A set of constants is scored by the benchmark's own goals on
   the fitting traces (:func:`fit_score`): the number of goals missed, then by how much (runs off the oracle, runs
   over a third of Zeus's profiling steps, runs short of winning 90 % of each metric × noise cell), then the mean
   of dtpo's whole-job cost over Zeus's. At the same goals, a value displaces another only where it lowers that
   mean clearly: by more than :data:`GAIN_Z` standard errors of the paired differences (the same runs, seeds and
   all, under both), and by at least :data:`MIN_GAIN`. A smaller gain is the fitting traces' noise, or too small
   to matter, and fitting it would only fit them.
2. **Judge** the chosen constants on the GPU left out: the same goals (within 2 % of the oracle on every run, at
   most a third of Zeus's profiling steps, a cheaper job than Zeus's on at least 90 % of the traces in every cell),
   now held on traces the constants were not chosen on. A missed one fails the benchmark.

With two GPUs (the shipped A40 and V100) that is: chosen on the A40, judged on the V100, and the other way round.
The defaults' figures on the held-out GPU are printed beside the chosen constants' (they were chosen on it too, so
they are no held-out figure, and no goal here).

Zeus's runs do not depend on dtpo's constants, so the main run's are reused; only dtpo's tuner runs again, with the
same seeds as in the main run, and a constant that cannot change a metric's runs (one of the ``MaxSlowdown`` search
only, or of near-tie refining, which that search does not use) reuses the runs it cannot change.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table
from tuner_vs_zeus import (
    STEPS_GOAL,
    WIN_GOAL,
    Case,
    CaseRunner,
    CaseTask,
    Goal,
    Options,
    all_tasks,
    evaluate_goals,
    goal_lines,
    summary_row,
)

from dtpo.devices.physics.traces import Trace
from dtpo.tune.tuner_types import TunerOptions

GAIN_Z = 2.0  # standard errors of the paired job-cost differences by which a new value must be cheaper
MIN_GAIN = 1e-4  # and the least fall of the mean job cost over Zeus's (0.01 % of Zeus's job) that counts


@dataclass(frozen=True)
class Tunable:
    """A constant the search may move.

    Attributes:
        name: The :class:`~dtpo.tune.tuner_types.TunerOptions` field.
        values: What it tries instead of the default.
        scope: Which metrics' runs it can change: ``all``, ``slowdown`` (the ``MaxSlowdown`` search only:
            ``dtpo.tune.bound_search``) or ``others`` (near-tie refining, which ``MaxSlowdown`` does not use).
    """

    name: str
    values: tuple[Any, ...]
    scope: str = "all"

    def applies(self, metric: str) -> bool:
        """Whether this constant can change a run under ``metric`` (a cost metric's name)."""
        slowdown = metric.startswith("slowdown")
        return self.scope == "all" or (self.scope == "slowdown") == slowdown


SEARCH: tuple[Tunable, ...] = (
    Tunable("budget_steps_per_candidate", (14, 18)),  # the profiling budget, warm-ups included
    Tunable("z", (1.5, 2.5)),  # standard errors that make a difference clear
    Tunable("first_visit_steps", (3, 6)),
    Tunable("revisit_steps", (6, 12)),
    Tunable("refine_steps", (0, 4000), "others"),  # near-tie refining while holding
    Tunable("placed_z_share", (0.25, 0.75), "slowdown"),  # margin of a setting placed towards the bound
    Tunable("grid_z_share", (0.0, 0.5), "slowdown"),  # margin of a grid choice that could be interpolated
    Tunable("reference_weight", (1.0, 4.0), "slowdown"),  # a step at the default against one at an unsure setting
)
# Tried and left out of the default search, as they moved the mean job cost by under 0.02 % on either GPU's
# traces: tolerance (0.005, 0.02), steep_rise (0.15, 0.4), refine_steps 1000, budget_steps_per_candidate 12 (it
# missed goals on both).
QUICK = ("budget_steps_per_candidate", "z", "first_visit_steps", "placed_z_share")

Constants = dict[str, Any]


def _describe(constants: Mapping[str, Any]) -> str:
    """``name default → value`` for each constant off its default; ``the defaults`` when none is."""
    defaults = TunerOptions()
    if not constants:
        return "the defaults"
    return ", ".join(f"{name} {getattr(defaults, name):g} → {value:g}" for name, value in sorted(constants.items()))


# -- scoring ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FitScore:
    """How a set of constants does on the fitting traces, by the benchmark's goals (lower is better throughout).

    Attributes:
        missed: Goals missed (of the oracle, steps, job and completed-runs goals).
        short: By how much, in runs: runs off the oracle (or past a slowdown bound), runs over a third of Zeus's
            profiling steps, and the runs each metric × noise cell is short of a 90 % win share.
        job: Mean over the runs of dtpo's whole-job cost over Zeus's.
        jobs: That ratio run by run (2 for a run that failed), in the order of the fitting runs.
    """

    missed: int
    short: float
    job: float
    jobs: tuple[float, ...] = ()

    @property
    def key(self) -> tuple[int, float, float]:
        """What orders scores: goals missed, runs short, mean job cost over Zeus's."""
        return self.missed, self.short, self.job

    def beats(self, other: FitScore) -> bool:
        """Fewer goals missed, or as many and less short of them, or neither and a job cost over Zeus's lower by
        more than ``GAIN_Z`` standard errors of the run-by-run differences and by ``MIN_GAIN``."""
        if (self.missed, self.short) != (other.missed, other.short):
            return (self.missed, self.short) < (other.missed, other.short)
        gains = [b - a for a, b in zip(self.jobs, other.jobs, strict=True)]
        if len(gains) < 2:
            return False
        mean = statistics.fmean(gains)
        return mean >= MIN_GAIN and mean > GAIN_Z * statistics.stdev(gains) / len(gains) ** 0.5

    def __str__(self) -> str:
        return (f"{self.missed} goal{'' if self.missed == 1 else 's'} missed, {self.short:g} runs short, "
                f"mean job dtpo/Zeus {self.job:.5f}")


def fit_score(cases: Sequence[Case], job_steps: int) -> FitScore:
    """Score ``cases`` (dtpo's runs under one set of constants, with Zeus's) by the benchmark's goals."""
    goals = evaluate_goals(cases, job_steps)
    done = [c for c in cases if not c.error]
    short = float(len(cases) - len(done))
    short += sum(not c.scores["dtpo"].meets_oracle for c in done)
    short += sum(c.steps_ratio > STEPS_GOAL + 1e-12 for c in done)
    cells: dict[tuple[str, float], list[Case]] = {}
    for c in done:
        cells.setdefault((c.metric, c.noise), []).append(c)
    short += sum(max(0.0, WIN_GOAL * len(group) - sum(c.dtpo_cheaper for c in group)) for group in cells.values())
    jobs = tuple(2.0 if c.error else c.scores["dtpo"].job_cost / c.scores["zeus"].job_cost for c in cases)
    return FitScore(sum(not g.met for g in goals), round(short, 6), statistics.fmean(jobs) if jobs else 2.0, jobs)


# -- dtpo's runs under other constants --------------------------------------------------------------------------


class Evaluator:
    """dtpo's runs of the main run's cases under other constants (Zeus's reused), run on demand and kept.

    Args:
        cases: The main run's cases, in the order of ``tasks``.
        tasks: What ran them.
        tunables: The constants that may move (for their scopes).
        runner: Runs the tasks.
    """

    def __init__(self, cases: Sequence[Case], tasks: Sequence[CaseTask], tunables: Sequence[Tunable],
                 runner: CaseRunner) -> None:
        self.base = list(cases)
        self.tasks = list(tasks)
        self.tunables = {t.name: t for t in tunables}
        self.runner = runner
        self.runs = 0
        self._done: dict[tuple[int, tuple[tuple[str, Any], ...]], Case] = {}

    def _effective(self, i: int, constants: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
        """The constants that can change case ``i``'s run, sorted."""
        metric = self.base[i].metric
        return tuple(sorted((k, v) for k, v in constants.items() if self.tunables[k].applies(metric)))

    def cases(self, indices: Sequence[int], sets: Sequence[Mapping[str, Any]], what: str) -> list[list[Case]]:
        """For each set of constants, the cases ``indices`` with dtpo's runs under it (run together, in parallel)."""
        wanted = {}
        for constants in sets:
            for i in indices:
                key = (i, self._effective(i, constants))
                if key[1] and key not in self._done and not self.base[i].error:
                    task = self.tasks[i]
                    wanted[key] = CaseTask(task.trace, task.metric, task.noise, task.seed, task.repeat, ("dtpo",),
                                           key[1], details=False)
        if wanted:
            for key, case in zip(wanted, self.runner.run(list(wanted.values()), what), strict=True):
                self._done[key] = case
            self.runs += len(wanted)
        return [[self._combined(i, self._effective(i, constants)) for i in indices] for constants in sets]

    def _combined(self, i: int, key: tuple[tuple[str, Any], ...]) -> Case:
        base = self.base[i]
        if not key or base.error:
            return base
        dtpo = self._done[(i, key)]
        if dtpo.error:
            return Case(base.trace, base.gpu, base.metric, base.noise, base.seed, base.oracle_w, {}, {}, dtpo.error,
                        base.repeat)
        return Case(base.trace, base.gpu, base.metric, base.noise, base.seed, base.oracle_w,
                    {"zeus": base.scores["zeus"], "dtpo": dtpo.scores["dtpo"]}, {}, None, base.repeat)


@dataclass
class Search:
    """What the coordinate search chose on the fitting traces, and its trail."""

    chosen: Constants
    default_score: FitScore
    chosen_score: FitScore
    trail: list[dict[str, Any]] = field(default_factory=list)


def coordinate_search(evaluator: Evaluator, fit: Sequence[int], tunables: Sequence[Tunable], job_steps: int,
                      label: str) -> Search:
    """One pass over ``tunables`` from the defaults, on the cases ``fit`` (see the module docs)."""
    current: Constants = {}
    (cases,) = evaluator.cases(fit, [current], label)
    score = default_score = fit_score(cases, job_steps)
    trail: list[dict[str, Any]] = [{"constants": {}, "score": str(score)}]
    for tunable in tunables:
        sets = [{**current, tunable.name: value} for value in tunable.values]
        scored = [fit_score(cases, job_steps)
                  for cases in evaluator.cases(fit, sets, f"{label}: {tunable.name}")]
        trail += [{"constants": dict(s), "score": str(f)} for s, f in zip(sets, scored, strict=True)]
        best = min(range(len(sets)), key=lambda k: scored[k].key)
        if scored[best].beats(score):
            current, score = sets[best], scored[best]
    return Search(current, default_score, score, trail)


# -- the folds --------------------------------------------------------------------------------------------------


@dataclass
class Fold:
    """One GPU left out: the constants chosen on the others, and how they and the defaults do on it."""

    held_out: str
    fit_gpus: tuple[str, ...]
    fit_traces: int
    search: Search
    cases: list[Case]
    default_cases: list[Case]
    goals: list[Goal]
    default_goals: list[Goal]

    @property
    def label(self) -> str:
        """``fit on A40 → judged on V100``."""
        return f"fit on {'+'.join(self.fit_gpus)} → judged on {self.held_out}"

    def as_dict(self) -> dict[str, Any]:
        """Plain values for JSON."""
        return {"held_out": self.held_out, "fit_gpus": list(self.fit_gpus), "chosen": self.search.chosen,
                "fit_score_defaults": str(self.search.default_score), "fit_score_chosen": str(self.search.chosen_score),
                "search": self.search.trail, "goals": [asdict(g) for g in self.goals],
                "default_goals": [asdict(g) for g in self.default_goals], "runs": [c.as_dict() for c in self.cases]}


@dataclass
class Validation:
    """Every fold, and whether every held-out goal holds (``skipped``: why there was no fold)."""

    folds: list[Fold]
    runs: int
    runtime_s: float
    skipped: str | None = None

    @property
    def met(self) -> bool:
        """Every held-out goal of every fold met."""
        return all(g.met for fold in self.folds for g in fold.goals)

    def as_dict(self) -> dict[str, Any]:
        """Plain values for JSON."""
        return {"folds": [f.as_dict() for f in self.folds], "dtpo_runs": self.runs, "runtime_s": self.runtime_s,
                "skipped": self.skipped, "met": self.met}


def run_folds(cases: Sequence[Case], traces: Sequence[tuple[int, Trace]], options: Options,
              runner: CaseRunner) -> Validation:
    """Leave each GPU of the selected traces out in turn (see the module docs)."""
    started = time.perf_counter()
    gpus = sorted({trace.gpu for _, trace in traces})
    if len(gpus) < 2:
        return Validation([], 0, 0.0, f"the selected traces are of one GPU ({', '.join(gpus)}): nothing to leave out")
    tunables = [t for t in SEARCH if not options.quick or t.name in QUICK]
    evaluator = Evaluator(cases, all_tasks(traces, options), SEARCH, runner)
    folds = []
    for held in gpus:
        fit = [i for i, c in enumerate(cases) if c.gpu != held]
        judge = [i for i, c in enumerate(cases) if c.gpu == held]
        fit_gpus = tuple(g for g in gpus if g != held)
        search = coordinate_search(evaluator, fit, tunables, options.job_steps, f"fit on {'+'.join(fit_gpus)}")
        (held_cases,) = evaluator.cases(judge, [search.chosen], f"judge on {held}")
        default_cases = [cases[i] for i in judge]
        folds.append(Fold(held, fit_gpus, sum(1 for _, t in traces if t.gpu != held), search, held_cases,
                          default_cases, evaluate_goals(held_cases, options.job_steps),
                          evaluate_goals(default_cases, options.job_steps)))
    return Validation(folds, evaluator.runs, time.perf_counter() - started)


# -- report -----------------------------------------------------------------------------------------------------

SUMMARY_HEADERS = ("runs", "dtpo ×oracle", "Zeus ×oracle", "steps dtpo/Zeus", "dtpo job regret %", "Zeus job regret %",
                   "job dtpo/Zeus", "dtpo cheaper", "violations Z/d")


def fold_table(fold: Fold, job_steps: int, per_trace: bool) -> Table:
    """Per held-out trace (over its metrics and noise levels), the chosen constants' figures, then the summary rows
    of the chosen constants and of the defaults (median / worst, as in the main summary)."""
    table = Table(title=f"Leave-one-out, {fold.label}: per held-out trace, the constants chosen on the "
                        f"{fold.fit_traces} traces of {'+'.join(fold.fit_gpus)} (median / worst over its runs; job = "
                        f"{job_steps:,} steps including profiling)", title_justify="left")
    for header in ("trace", *SUMMARY_HEADERS):
        table.add_column(header, justify="left" if header == "trace" else "right")
    done = [c for c in fold.cases if not c.error]
    if per_trace:
        groups: dict[str, list[Case]] = {}
        for case in done:
            groups.setdefault(case.trace, []).append(case)
        for trace, group in groups.items():
            table.add_row(*summary_row((trace.removeprefix(f"{fold.held_out} "),), group))
        table.add_section()
    if done:
        table.add_row(*summary_row((f"all {fold.held_out}, chosen",), done), style="bold")
    defaults = [c for c in fold.default_cases if not c.error]
    if defaults and fold.search.chosen:
        table.add_row(*summary_row((f"all {fold.held_out}, defaults",), defaults))
    return table


def _print(console: Console, text: str, style: str | None = None) -> None:
    console.print(text, style=style, markup=False, highlight=False)


def report(console: Console, validation: Validation, options: Options) -> None:
    """Print each fold: the chosen constants, the table, the held-out goals, the defaults' figures; then the verdict."""
    if validation.skipped:
        _print(console, f"leave-one-out skipped: {validation.skipped}")
        return
    for fold in validation.folds:
        search = fold.search
        _print(console, f"Leave-one-out, {fold.label}: chosen constants: {_describe(search.chosen)} (scored on "
                        f"{'+'.join(fold.fit_gpus)}: defaults {search.default_score}; chosen {search.chosen_score}; "
                        f"{len(search.trail)} sets of constants scored)")
        console.print(fold_table(fold, options.job_steps, not options.summary_only))
        for line, goal in zip(goal_lines(fold.goals), fold.goals, strict=True):
            _print(console, f"HELD-OUT {line.removeprefix('GOAL ')} [{fold.label}]",
                   "green" if goal.met else "bold red")
        if search.chosen:
            for line in goal_lines(fold.default_goals):
                _print(console, f"  defaults on {fold.held_out} (chosen on every GPU, so not held out; no goal): "
                                f"{line.removeprefix('GOAL ')}")
        console.print()
    missed = [f"{fold.label}: {goal.name}" for fold in validation.folds for goal in fold.goals if not goal.met]
    if missed:
        _print(console, f"LEAVE-ONE-OUT MISSED: {'; '.join(missed)}", "bold red")
    else:
        _print(console, "LEAVE-ONE-OUT met: every held-out goal holds", "green")
    _print(console, f"leave-one-out: {validation.runs} runs of dtpo's tuner in {validation.runtime_s:.1f} s"
                    f"{' (--quick)' if options.quick else ''}")


def leave_one_out(cases: Sequence[Case], traces: Sequence[tuple[int, Trace]], options: Options, runner: CaseRunner,
                  console: Console) -> Validation:
    """Run the leave-one-out validation on the main run's ``cases`` and print it."""
    validation = run_folds(cases, traces, options, runner)
    report(console, validation, options)
    return validation
