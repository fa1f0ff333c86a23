"""dtpo's power-limit tuner against Zeus's own ``GlobalPowerLimitOptimizer``, on GPUs calibrated on measured traces.

What runs: for every shipped trace (Zeus NSDI '23: 111 workloads measured on an A40 or a V100 at every power
limit) one simulated GPU (:class:`dtpo.devices.simulated.SimulatedGpu`, calibrated on the trace, one GPU per
job at the trace's batch size), for each cost metric (``--costs``) and each noise level (``--noise``: relative
standard deviation of both step time and power), twice with the same seed:

* Zeus 0.16.0, unmodified (``pip install -e '.[bench]'`` or ``make bench-zeus``): ``GlobalPowerLimitOptimizer``
  with its defaults (wait 1 step, then per limit 10 warm-up and 40 profiled steps, every 25 W from the maximum
  down to the minimum), driven step by step as a training loop does (``on_step_begin``, one step,
  ``on_step_end``) until its state is ``Done``. It sees the simulated GPU through a fake ``pynvml`` and measures
  simulated time (``benchmarks/zeus_sim.py``). Selectors: ``Energy``, ``ZeusCost(eta, world_size=1)``,
  ``MaxSlowdownConstraint(factor)``, ``Time``.
* dtpo: ``dtpo.simulation.tuning.tune_on_simulated`` with the same metric, until its tuner holds its choice.

How it is judged, always on the noise-free model (the truth) over Zeus's grid of limits:

* the oracle is the grid limit of least true cost (``slowdown:F``: least true energy among limits whose true
  time is at most F times the true time at the maximum limit);
* each tuner's choice costs ``true cost / oracle cost`` (for ``slowdown:F`` the cost is energy; a choice whose
  true time is more than F times the maximum limit's, beyond the noise interval ``2 σ sqrt(2/40)`` of a time
  ratio measured over Zeus's 40-step windows (0.45 % at σ 1 %, 1.3 % at σ 3 %), is flagged as a violation and
  misses the oracle goal);
* profiling: steps until the choice was held, their measured time and energy (simulated clock and energy
  counter), and what they cost beyond running the same steps at the default (maximum) limit;
* a whole job of ``--job-steps`` steps: the true per-step cost of every step at the setting in force. Zeus
  holds its choice from the end of its sweep; dtpo's tuner runs through the whole job, because its choice can
  still change while held (under ``slowdown:F`` a choice interpolated between two limits is measured while it
  trains, and should it prove too slow the limit above it is held instead; under the other metrics a choice
  that the search could not tell from a runner-up is trained at in turn with it, a hold block each, until one
  is clearly cheaper: ``dtpo.tune.hold_refine``): its choice is the one it holds at the end, and its profiling
  steps are those before it first held a choice. Every step after that, at whichever setting, counts in the job
  cost, and the steps spent at a runner-up are printed under the summary.

Goals (exit 1 when one is missed; each is printed as met or missed with its figure):

1. dtpo within 2 % of the oracle's cost on every trace, for every metric and noise level;
2. dtpo's profiling steps at most one third of Zeus's, on every run (the worst ratio is printed);
3. dtpo's whole job cheaper than Zeus's on at least 90 % of the traces, for every metric and noise level
   and over all runs.

Two things to know when reading ``slowdown:F`` results. Zeus's ``MaxSlowdownConstraint`` picks the *lowest
limit* whose measured time is within the factor, not the least energy, so where energy is not monotonic in the
limit (the ncf traces) its choice costs more than the oracle's even without noise. And the job cost is energy
alone: profiling steps at limits slower than the factor count only for the energy they save, which favours the
tuner that spends the most steps at low limits (Zeus sweeps down to the minimum). Under ``slowdown:F`` dtpo's
search may also hold a limit between two grid limits, moved towards the factor (``dtpo.tune.boundary``); its
true cost can then be below the grid oracle's (a ratio under 1), and the violation check above applies to it
as to any choice.

One run of every trace draws one noise sequence per trace, and at σ 3 % a handful of the 666 runs decide
the first and third goals: ``--repeats N`` runs every trace with N seeds (``--seed`` to ``--seed + N - 1``,
the same runs as N separate ``--seed`` runs), judges the goals over all of them, and prints the job goal's
lowest cell and the runs off the oracle for each seed on its own. A trace's seed is ``--seed`` plus its index in
the full list (plus the repeat), whatever ``--gpu``, ``--only`` or ``--limit`` leave out, so ``--only 'V100
resnet50/imagenet b32' --costs slowdown:1.1 --noise 0.03 --history`` replays that run of the full benchmark and
prints every decision dtpo's tuner made in it.

``--counter-period 0`` (the default) makes the simulated energy counter continuous. A nonzero period makes it
advance only at multiples of the period, like NVML's: both tuners' energy windows are then quantised to it,
which adds error to short windows.

Leave-one-out (``benchmarks/leave_one_out.py``; ``--no-loo`` skips it, ``--quick`` searches fewer constants):
dtpo's tuner constants (``TunerOptions``) were chosen on these very traces. For each GPU in turn, a coordinate
search chooses them on the other GPUs' traces, scored by the goals above, and the goals are judged again on the GPU
left out, with the chosen constants (exit 1 when one is missed): chosen on the A40, judged on the V100, and the
other way round. Only dtpo's runs are repeated (Zeus's do not depend on dtpo's constants).

Extra traces (``--trace``: a CSV file in the columns ``dtpo.devices.physics.user_trace`` reads, or a folder of
them) are judged like the shipped ones, after them (the shipped ones keep their seeds), and are one more GPU to
leave out; their GPU is ``--trace-gpu`` (one for all, or one per ``--trace``) or the file's own ``gpu`` column.
Runs go to ``--jobs`` processes (default: the CPUs this one may use), with the same figures as in one.

Exit status: 0 all goals met, 1 a goal missed, 2 a bad flag (one line on stderr), 3 Zeus or dtpo's simulated
tuner missing.

    python benchmarks/tuner_vs_zeus.py [--noise 0.01,0.03] [--costs energy,zeus:0.5,slowdown:1.1] [--seed 0]
        [--repeats 1] [--job-steps 10000] [--counter-period 0] [--gpu A40] [--limit N] [--only TEXT] [--history]
        [--trace FILE.csv|DIR [--trace-gpu GPU]] [--json FILE] [--summary-only] [--zeus-log FILE] [--verbose]
        [--jobs N] [--quick] [--no-loo]
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, NoReturn

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))  # zeus_sim and bench_cli, next to this file
from bench_cli import OneLineParser  # noqa: E402
from bench_cli import bad_flag as _bad_flag  # noqa: E402
from task_pool import TaskPool  # noqa: E402

from dtpo.core.errors import DtpoError, first_line  # noqa: E402
from dtpo.devices.base import KnobState  # noqa: E402
from dtpo.devices.physics.gpu_model import CalibratedModel, GpuModel  # noqa: E402
from dtpo.devices.physics.traces import Trace, load_traces  # noqa: E402
from dtpo.devices.simulated import SimulatedGpu, SimulatedGpuConfig, operating_point  # noqa: E402
from dtpo.tune.cost import CostContext, CostMetric, Energy, MaxSlowdown, Time, ZeusCost, parse_cost  # noqa: E402
from dtpo.tune.setting import GpuSetting, Segment  # noqa: E402
from dtpo.tune.tuner_types import TunerOptions  # noqa: E402

log = logging.getLogger("tuner_vs_zeus")

ORACLE_GOAL = 1.02  # dtpo's true cost at most 2 % above the oracle's
STEPS_GOAL = 1 / 3  # dtpo's profiling steps at most a third of Zeus's
WIN_GOAL = 0.90  # dtpo's whole job cheaper than Zeus's on at least 90 % of the traces
ZEUS_STEP_W = 25  # Zeus's default pl_step: its grid, and the oracle's
TUNERS = ("zeus", "dtpo")


# -- options --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    """The command line, checked."""

    noises: tuple[float, ...]
    costs: tuple[CostMetric, ...]
    seed: int
    repeats: int
    job_steps: int
    counter_period_s: float
    gpu: str | None
    limit: int | None
    only: str | None
    history: bool
    trace_files: tuple[Path, ...]
    trace_gpu: str | None
    json_path: Path | None
    summary_only: bool
    zeus_log: Path | None
    verbose: bool
    jobs: int = 1
    quick: bool = False
    leave_one_out: bool = True
    trace_gpus: tuple[str, ...] = ()


def bad_flag(message: str) -> NoReturn:
    """One line on stderr, exit 2."""
    _bad_flag("tuner_vs_zeus.py", message)


def _numbers(text: str, what: str) -> tuple[float, ...]:
    try:
        values = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        bad_flag(f"{what}: expected comma-separated numbers, got {text!r}")
    if not values or any(not math.isfinite(v) or v < 0 for v in values):
        bad_flag(f"{what}: expected finite numbers >= 0, got {text!r}")
    return values


def _cost(text: str) -> CostMetric:
    if text.strip().lower().startswith("dollars"):
        bad_flag("--costs: Zeus has no selector for dollars; choose from energy, time, zeus:ETA, slowdown:FACTOR")
    try:
        metric = parse_cost(text)
    except DtpoError as exc:
        bad_flag(str(exc))
    if not isinstance(metric, (Energy, Time, ZeusCost, MaxSlowdown)):
        bad_flag(f"--costs: Zeus has no selector for {text!r}; choose from energy, time, zeus:ETA, slowdown:FACTOR")
    return metric


def parse_options(argv: Sequence[str] | None = None) -> Options:
    """Read and check the command line (a bad flag ends the program: one line, exit 2)."""
    parser = OneLineParser(prog="tuner_vs_zeus.py", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--noise", default="0.01,0.03", help="noise levels, relative std of time and power")
    parser.add_argument("--costs", default="energy,zeus:0.5,slowdown:1.1",
                        help="cost metrics: energy, time, zeus:ETA, slowdown:FACTOR (comma-separated)")
    parser.add_argument("--seed", type=int, default=0, help="noise seed (trace i uses seed + i)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="run every trace N times, with seeds seed .. seed+N-1 (each + i for trace i); the "
                             "goals are judged over all runs, and the job goal is also shown per seed")
    parser.add_argument("--job-steps", type=int, default=10_000, help="steps of the whole job")
    parser.add_argument("--counter-period", type=float, default=0.0,
                        help="energy counter period in s (0: continuous; >0 quantises both tuners' windows)")
    parser.add_argument("--gpu", help="only traces of this GPU, e.g. A40")
    parser.add_argument("--limit", type=int, help="only the first N traces (a quick run)")
    parser.add_argument("--only", metavar="TEXT",
                        help="only traces whose label contains TEXT (case-insensitive), e.g. 'V100 resnet50/imagenet "
                             "b32'; every trace keeps the seed it has in the full run, so one run can be replayed")
    parser.add_argument("--history", action="store_true",
                        help="print dtpo's decisions (its tuner's history) for every run; best with --only")
    parser.add_argument("--trace", "--traces", action="append", default=[], metavar="FILE.csv|DIR",
                        help="extra measured traces: a CSV file in the Zeus columns, or a folder of them (repeatable)")
    parser.add_argument("--trace-gpu", action="append", default=[], metavar="GPU",
                        help="the GPU the --trace files were measured on: once for all, or once per --trace in "
                             "order (without it, each file's own gpu column)")
    parser.add_argument("--json", type=Path, help="write every run and the goals to this file")
    parser.add_argument("--summary-only", action="store_true", help="skip the per-trace tables")
    parser.add_argument("--zeus-log", type=Path, help="write Zeus's own log (INFO) to this file")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress (INFO)")
    parser.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                        else os.cpu_count() or 1, help="processes to run in (default: the CPUs this one may use)")
    parser.add_argument("--quick", action="store_true", help="leave-one-out: search fewer constants")
    parser.add_argument("--no-loo", action="store_true", help="skip the leave-one-out validation")
    args = parser.parse_args(argv)

    noises = _numbers(args.noise, "--noise")
    costs = tuple(_cost(text) for text in args.costs.split(",") if text.strip())
    if not costs:
        bad_flag("--costs: name at least one metric")
    if args.seed < 0:
        bad_flag(f"--seed must be >= 0, got {args.seed}")
    if args.repeats < 1:
        bad_flag(f"--repeats must be >= 1, got {args.repeats}")
    if args.job_steps < 1:
        bad_flag(f"--job-steps must be >= 1, got {args.job_steps}")
    if not (math.isfinite(args.counter_period) and args.counter_period >= 0):
        bad_flag(f"--counter-period must be a number >= 0 s, got {args.counter_period:g}")
    if args.limit is not None and args.limit < 1:
        bad_flag(f"--limit must be >= 1, got {args.limit}")
    if args.trace_gpu and not args.trace:
        bad_flag("--trace-gpu without --trace")
    if len(args.trace_gpu) > 1 and len(args.trace_gpu) != len(args.trace):
        bad_flag(f"--trace-gpu: give one GPU for every --trace, or one per --trace ({len(args.trace)}), "
                 f"not {len(args.trace_gpu)}")
    if args.jobs < 1:
        bad_flag(f"--jobs must be >= 1, got {args.jobs}")
    return Options(noises=noises, costs=costs, seed=args.seed, repeats=args.repeats, job_steps=args.job_steps,
                   counter_period_s=args.counter_period, gpu=args.gpu, limit=args.limit, only=args.only,
                   history=args.history, trace_files=tuple(Path(p) for p in args.trace),
                   trace_gpu=args.trace_gpu[0] if len(args.trace_gpu) == 1 else None, json_path=args.json,
                   summary_only=args.summary_only, zeus_log=args.zeus_log, verbose=args.verbose, jobs=args.jobs,
                   quick=args.quick, leave_one_out=not args.no_loo, trace_gpus=tuple(args.trace_gpu))


def select_traces(options: Options) -> list[tuple[int, Trace]]:
    """The shipped traces and the user's (after them, so the shipped ones keep their seeds), filtered by ``--gpu``
    and ``--only``, cut to ``--limit``; each with its index in the unfiltered list (which sets its seed, so a
    filtered run repeats the full run's)."""
    traces: list[Trace] = list(load_traces())
    if options.trace_files:
        from trace_files import load_user_traces

        try:
            traces.extend(load_user_traces(options.trace_files, options.trace_gpus))
        except (DtpoError, OSError) as exc:
            bad_flag(f"--trace: {exc}")
    indexed = list(enumerate(traces))
    if options.gpu:
        indexed = [(i, t) for i, t in indexed if t.gpu.lower() == options.gpu.lower()]
        if not indexed:
            known = sorted({t.gpu for t in traces})
            bad_flag(f"--gpu {options.gpu}: no trace of that GPU (traces: {', '.join(known)})")
    if options.only:
        indexed = [(i, t) for i, t in indexed if options.only.lower() in t.label.lower()]
        if not indexed:
            bad_flag(f"--only {options.only!r}: no trace label contains it (labels look like "
                     f"'{traces[0].label}')")
    return indexed[:options.limit] if options.limit else indexed


# -- the truth ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Truth:
    """The noise-free model of one trace under one metric, and the oracle over Zeus's grid.

    Attributes:
        model: The calibrated model.
        metric: The cost metric.
        context: One GPU and its maximum limit.
        grid_w: Zeus's grid, from the maximum limit down.
        oracle_w: The grid limit of least true cost (among feasible limits for ``slowdown``).
    """

    model: GpuModel
    metric: CostMetric
    context: CostContext
    grid_w: tuple[float, ...]
    oracle_w: float

    def step(self, setting: GpuSetting) -> tuple[float, float]:
        """True ``(seconds, joules)`` of one step at ``setting``."""
        clock = setting.sm_clock_mhz
        point = operating_point(self.model, KnobState(setting.power_limit_w, (clock, clock) if clock else None))
        samples = self.model.batch_size
        return point.time_per_sample_s * samples, point.time_per_sample_s * point.power_w * samples

    def cost(self, setting: GpuSetting) -> float:
        """True cost of one step at ``setting`` (``slowdown``: its energy)."""
        seconds, joules = self.step(setting)
        samples = self.model.batch_size
        return self.metric.per_sample(seconds / samples, joules / samples, self.context) * samples

    def feasible(self, setting: GpuSetting) -> bool:
        """Whether ``setting`` meets the metric's constraint (``slowdown``: true time within the factor)."""
        return self.metric.feasible(self.step(setting)[0], self.default_step()[0])

    def default(self) -> GpuSetting:
        """The maximum limit, clocks floating."""
        return GpuSetting(self.context.max_power_w)

    def default_step(self) -> tuple[float, float]:
        """True ``(seconds, joules)`` of one step at the default setting."""
        return self.step(self.default())

    @property
    def oracle_cost(self) -> float:
        """True cost of one step at the oracle's limit."""
        return self.cost(GpuSetting(self.oracle_w))


def zeus_grid(model: GpuModel) -> tuple[float, ...]:
    """Zeus's limits: from the maximum down to the minimum in 25 W steps (``range(max, min - 1, -25)`` in mW)."""
    top, bottom = round(model.spec.max_power_w * 1000), round(model.spec.min_power_w * 1000)
    return tuple(mw / 1000 for mw in range(top, bottom - 1, -ZEUS_STEP_W * 1000))


def make_truth(model: GpuModel, metric: CostMetric) -> Truth:
    """The truth and oracle of ``model`` under ``metric``."""
    context = CostContext(gpus=1, max_power_w=model.spec.max_power_w)
    grid = zeus_grid(model)
    truth = Truth(model, metric, context, grid, oracle_w=grid[0])
    candidates = [w for w in grid if truth.feasible(GpuSetting(w))]
    oracle = min(candidates, key=lambda w: (truth.cost(GpuSetting(w)), -w))
    return Truth(model, metric, context, grid, oracle_w=oracle)


# -- the tuners -----------------------------------------------------------------------------------------


@dataclass
class TunerRun:
    """What one tuner did, in the same terms for both.

    Attributes:
        choice: The setting it held at the end.
        profiling_steps: Steps from the start until it held its choice.
        profile_time_s: Their measured (simulated) seconds.
        profile_energy_j: Their measured joules (energy counter).
        schedule: ``(setting, steps)`` in order: Zeus's profiling steps (its choice holds for the rest of the
            job), dtpo's whole job.
        detail: Tuner-specific extras for the JSON file.
    """

    choice: GpuSetting
    profiling_steps: int
    profile_time_s: float
    profile_energy_j: float
    schedule: list[tuple[GpuSetting, int]]
    detail: dict[str, Any] = field(default_factory=dict)


def run_length(limits_w: Iterable[float]) -> list[tuple[GpuSetting, int]]:
    """``[(setting, steps), ...]`` of consecutive equal limits."""
    schedule: list[tuple[GpuSetting, int]] = []
    for limit in limits_w:
        if schedule and schedule[-1][0].power_limit_w == limit:
            schedule[-1] = (schedule[-1][0], schedule[-1][1] + 1)
        else:
            schedule.append((GpuSetting(limit), 1))
    return schedule


def zeus_selector(metric: CostMetric) -> Any:
    """Zeus's optimum selector for ``metric``."""
    from zeus.optimizer.power_limit import Energy as ZeusEnergy
    from zeus.optimizer.power_limit import MaxSlowdownConstraint
    from zeus.optimizer.power_limit import Time as ZeusTime
    from zeus.optimizer.power_limit import ZeusCost as ZeusZeusCost

    if isinstance(metric, ZeusCost):
        return ZeusZeusCost(eta_knob=metric.eta, world_size=1)
    if isinstance(metric, MaxSlowdown):
        return MaxSlowdownConstraint(factor=metric.factor)
    if isinstance(metric, Time):
        return ZeusTime()
    return ZeusEnergy()


Constants = Mapping[str, Any]  # TunerOptions fields and the values that replace their defaults (empty: none)


def run_zeus_tuner(gpu: SimulatedGpu, metric: CostMetric, job_steps: int, journal_dir: Path,
                   constants: Constants) -> TunerRun:
    """Zeus's ``GlobalPowerLimitOptimizer`` with its defaults on ``gpu`` until it is ``Done`` (``constants`` are
    dtpo's, not Zeus's: ignored)."""
    from zeus_sim import run_zeus

    run = run_zeus(gpu, zeus_selector(metric))
    return TunerRun(choice=GpuSetting(run.choice_w), profiling_steps=run.profiling_steps,
                    profile_time_s=run.profile_time_s, profile_energy_j=run.profile_energy_j,
                    schedule=run_length(run.limits_w),
                    detail={"measurements": [{"power_limit_w": w, "time_s": t, "energy_j": e}
                                             for w, t, e in run.measurements]})


def profiling_segments(segments: Sequence[Segment], steps: int) -> list[Segment]:
    """The segments that cover the first ``steps`` steps (the hold after them left out)."""
    covered, kept = 0, []
    for segment in segments:
        if covered >= steps:
            break
        if segment.phase == "hold" and covered + segment.steps > steps:
            break
        kept.append(segment)
        covered += segment.steps
    if covered != steps:
        log.warning("dtpo's segments before the hold cover %d steps, its profiling_steps say %d", covered, steps)
    return kept


def dtpo_options(gpu: SimulatedGpu, constants: Constants) -> TunerOptions | None:
    """dtpo's tuner options with ``constants`` in place of their defaults; ``None`` (``tune_on_simulated``'s own
    options, the same values) when there are none. Blocks and warm-ups span the energy counter's updates, as
    ``tune_on_simulated`` has them."""
    if not constants:
        return None
    period = gpu.config.counter_period_s
    return replace(TunerOptions(min_block_s=2.0 * period, min_warmup_s=period), **constants)


def run_dtpo_tuner(gpu: SimulatedGpu, metric: CostMetric, job_steps: int, journal_dir: Path,
                   constants: Constants) -> TunerRun:
    """dtpo's tuner on ``gpu`` through the whole job (``dtpo.simulation.tuning.tune_on_simulated``), with
    ``constants`` in place of its defaults: its choice can still change while held (an interpolated ``MaxSlowdown``
    choice that proves too slow gives way to the setting above it), so the job's schedule is every step it ran, and
    the choice is what it held at the end."""
    from dtpo.simulation.tuning import tune_on_simulated

    result = tune_on_simulated(gpu, metric, knob="power-limit", max_steps=job_steps, job_steps=job_steps,
                               journal_dir=journal_dir, options=dtpo_options(gpu, constants))
    kept = profiling_segments(result.segments, result.profiling_steps)
    return TunerRun(choice=result.choice, profiling_steps=result.profiling_steps,
                    profile_time_s=sum(s.time_s for s in kept), profile_energy_j=sum(s.energy_j for s in kept),
                    schedule=[(s.setting, s.steps) for s in result.segments],
                    detail={"segments": [s.as_dict() for s in kept], "steps_back": result.tuner.steps_back,
                            "first_choice": _first_hold(result.segments), "refined": result.tuner.refined,
                            "history": list(result.tuner.history)})


def _first_hold(segments: Sequence[Segment]) -> dict[str, Any] | None:
    """The setting of the first hold segment (what the search chose before anything held proved too slow)."""
    return next((s.setting.as_dict() for s in segments if s.phase == "hold"), None)


RUNNERS: dict[str, Callable[[SimulatedGpu, CostMetric, int, Path, Constants], TunerRun]] = {
    "zeus": run_zeus_tuner, "dtpo": run_dtpo_tuner}


# -- scoring --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Score:
    """One tuner's run judged on the truth.

    Attributes:
        choice_w: The chosen power limit (W).
        ratio: True cost of the choice over the oracle's.
        violation: The choice breaks the metric's constraint (``slowdown``: too slow).
        profiling_steps: Steps until the choice was held.
        profile_time_s: Measured seconds of those steps.
        profile_energy_j: Measured joules of those steps.
        extra_time_s: ``profile_time_s`` minus the same steps' true time at the default limit.
        extra_energy_j: ``profile_energy_j`` minus the same steps' true energy at the default limit.
        job_cost: True cost of the whole job: profiling, then the choice.
        job_ratio: ``job_cost`` over the oracle's whole job (no profiling).
    """

    choice_w: float
    ratio: float
    violation: bool
    profiling_steps: int
    profile_time_s: float
    profile_energy_j: float
    extra_time_s: float
    extra_energy_j: float
    job_cost: float
    job_ratio: float

    @property
    def meets_oracle(self) -> bool:
        """Within the oracle goal and no violation."""
        return self.ratio <= ORACLE_GOAL and not self.violation


def job_cost(truth: Truth, run: TunerRun, job_steps: int) -> float:
    """True cost of a ``job_steps`` job: the schedule (cut to the job), then the choice for what is left."""
    left, total = job_steps, 0.0
    for setting, steps in run.schedule:
        take = min(steps, left)
        total += take * truth.cost(setting)
        left -= take
    return total + left * truth.cost(run.choice)


def slowdown_tolerance(noise: float) -> float:
    """How far past a slowdown factor a choice may land before it counts as a violation: two standard errors of
    the ratio of two 40-step mean step times at this noise (Zeus's profile length), i.e. the noise interval
    within which no tuner measuring that long can tell a setting's slowdown from the factor."""
    return 2.0 * noise * math.sqrt(2.0 / 40.0)


def score(truth: Truth, run: TunerRun, job_steps: int, noise: float) -> Score:
    """Judge ``run`` on the noise-free model."""
    default_s, default_j = truth.default_step()
    oracle = truth.oracle_cost
    job = job_cost(truth, run, job_steps)
    violation = False
    if isinstance(truth.metric, MaxSlowdown):
        slowdown = truth.step(run.choice)[0] / default_s
        violation = slowdown > truth.metric.factor * (1.0 + slowdown_tolerance(noise))
    return Score(
        choice_w=run.choice.power_limit_w, ratio=truth.cost(run.choice) / oracle,
        violation=violation, profiling_steps=run.profiling_steps,
        profile_time_s=run.profile_time_s, profile_energy_j=run.profile_energy_j,
        extra_time_s=run.profile_time_s - run.profiling_steps * default_s,
        extra_energy_j=run.profile_energy_j - run.profiling_steps * default_j,
        job_cost=job, job_ratio=job / (job_steps * oracle))


# -- one case: a trace, a metric, a noise level ------------------------------------------------------------


@dataclass
class Case:
    """Both tuners on one trace under one metric and noise level (``error``: a tuner raised, no scores then)."""

    trace: str
    gpu: str
    metric: str
    noise: float
    seed: int
    oracle_w: float
    scores: dict[str, Score]
    details: dict[str, dict[str, Any]]
    error: str | None = None
    repeat: int = 0

    @property
    def steps_ratio(self) -> float:
        """dtpo's profiling steps over Zeus's."""
        return self.scores["dtpo"].profiling_steps / self.scores["zeus"].profiling_steps

    @property
    def dtpo_cheaper(self) -> bool:
        """dtpo's whole job costs less than Zeus's."""
        return self.scores["dtpo"].job_cost < self.scores["zeus"].job_cost

    def as_dict(self) -> dict[str, Any]:
        """Plain values for JSON."""
        return {"trace": self.trace, "gpu": self.gpu, "metric": self.metric, "noise": self.noise,
                "seed": self.seed, "repeat": self.repeat, "oracle_w": self.oracle_w, "error": self.error,
                "tuners": {name: {**asdict(s), "detail": self.details.get(name, {})}
                           for name, s in self.scores.items()}}


def simulated_gpu(trace: Trace, model: GpuModel, noise: float, seed: int, period_s: float,
                  state_path: Path) -> SimulatedGpu:
    """A fresh simulated GPU on ``trace`` (clock and counter at 0, maximum limit)."""
    config = SimulatedGpuConfig(gpu=trace.gpu, workload=trace.workload, batch_size=trace.batch_size, seed=seed,
                                time_noise=noise, power_noise=noise, counter_period_s=period_s)
    return SimulatedGpu(config, state_path=state_path, model=model)


def run_case(trace: Trace, model: GpuModel, metric: CostMetric, noise: float, seed: int, options: Options,
             workdir: Path, tuners: Sequence[str] = TUNERS, constants: Constants | None = None,
             details: bool = True) -> Case:
    """``tuners`` (Zeus and dtpo, dtpo with ``constants`` in place of its defaults) on the same trace, metric, noise
    and seed; a tuner that raises is logged and recorded. ``details``: keep what each tuner did for the JSON."""
    truth = make_truth(model, metric)
    case = Case(trace=trace.label, gpu=trace.gpu, metric=metric.name, noise=noise, seed=seed,
                oracle_w=truth.oracle_w, scores={}, details={})
    for name in tuners:
        gpu = simulated_gpu(trace, model, noise, seed, options.counter_period_s, workdir / f"{name}.json")
        journal = workdir / f"journal-{name}"
        journal.mkdir(exist_ok=True)
        try:
            run = RUNNERS[name](gpu, metric, options.job_steps, journal, constants or {})
        except Exception as exc:  # recorded as a failed run (all goals missed), so the other runs still report
            case.error = f"{name} raised {type(exc).__name__}: {first_line(str(exc))}"
            log.error("%s, %s, noise %g, seed %d: %s%s", trace.label, metric, noise, seed, case.error,
                      "" if options.verbose else " (traceback with --verbose)", exc_info=options.verbose)
            return case
        case.scores[name] = score(truth, run, options.job_steps, noise)
        case.details[name] = run.detail if details else {}
        log.info("%s %s σ=%g %s: %s (×%.4f oracle), %d steps", trace.label, metric, noise, name,
                 run.choice.label, case.scores[name].ratio, run.profiling_steps)
    return case


@dataclass(frozen=True)
class CaseTask:
    """One case to run: its trace's index in the unfiltered list, metric, noise, seed and repeat; which tuners, dtpo's
    with which constants (``(name, value)`` pairs); whether to keep the tuners' details."""

    trace: int
    metric: CostMetric
    noise: float
    seed: int
    repeat: int = 0
    tuners: tuple[str, ...] = TUNERS
    constants: tuple[tuple[str, Any], ...] = ()
    details: bool = True


_WORKER: dict[str, Any] = {}  # what a process running tasks knows: the traces, the options, its scratch folder


def _start_worker(traces: dict[int, Trace], options: Options, scratch: str) -> None:
    _WORKER.update(traces=traces, options=options, scratch=scratch, models={})


def _run_task(task: CaseTask) -> Case:
    trace = _WORKER["traces"][task.trace]
    models: dict[int, GpuModel] = _WORKER["models"]
    if task.trace not in models:
        models[task.trace] = CalibratedModel(trace)
    model = models[task.trace]
    with tempfile.TemporaryDirectory(dir=_WORKER["scratch"]) as workdir:
        case = run_case(trace, model, task.metric, task.noise, task.seed, _WORKER["options"], Path(workdir),
                        task.tuners, dict(task.constants), task.details)
    case.repeat = task.repeat
    return case


CaseRunner = TaskPool[CaseTask, Case]


def case_runner(traces: Sequence[tuple[int, Trace]], options: Options) -> CaseRunner:
    """Runs :class:`CaseTask` s in ``options.jobs`` processes (:mod:`task_pool`)."""
    return TaskPool(_run_task, _start_worker, (dict(traces), options), options.jobs,
                    lambda c: f"{c.trace} {c.metric} σ={c.noise:g}", "dtpo-vs-zeus-")


def all_tasks(traces: Sequence[tuple[int, Trace]], options: Options) -> list[CaseTask]:
    """Every trace × metric × noise level × repeat, in the order of the tables (a trace's seed: ``--seed``, plus its
    index in the unfiltered list, plus the repeat)."""
    return [CaseTask(index, metric, noise, options.seed + repeat + index, repeat)
            for index, _ in traces for metric in options.costs for noise in options.noises
            for repeat in range(options.repeats)]


def run_all(traces: Sequence[tuple[int, Trace]], options: Options, runner: CaseRunner) -> list[Case]:
    """Both tuners on every task of :func:`all_tasks`, in that order."""
    return runner.run(all_tasks(traces, options))


# -- goals ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Goal:
    """One goal, met or missed, with the figure that decides it."""

    name: str
    met: bool
    figure: str


def _groups(cases: Sequence[Case], key: Callable[[Case], Any]) -> dict[Any, list[Case]]:
    groups: dict[Any, list[Case]] = {}
    for case in cases:
        groups.setdefault(key(case), []).append(case)
    return groups


def oracle_goal(cases: Sequence[Case]) -> Goal:
    """dtpo within 2 % of the oracle (and no violation) on every run."""
    worst = max(cases, key=lambda c: c.scores["dtpo"].ratio)
    misses = [c for c in cases if not c.scores["dtpo"].meets_oracle]
    violations = sum(c.scores["dtpo"].violation for c in cases)
    figure = (f"worst ×{worst.scores['dtpo'].ratio:.4f} ({worst.trace}, {worst.metric}, σ {worst.noise:g}); "
              f"{len(misses)} of {len(cases)} runs missed, {violations} violations")
    return Goal(f"dtpo within {(ORACLE_GOAL - 1) * 100:g} % of the oracle on every trace", not misses, figure)


def steps_goal(cases: Sequence[Case]) -> Goal:
    """dtpo's profiling steps at most a third of Zeus's on every run."""
    worst = max(cases, key=lambda c: c.steps_ratio)
    misses = sum(c.steps_ratio > STEPS_GOAL + 1e-12 for c in cases)
    figure = (f"worst ratio {worst.steps_ratio:.3f} ({worst.scores['dtpo'].profiling_steps} vs "
              f"{worst.scores['zeus'].profiling_steps} steps, {worst.trace}, {worst.metric}, σ {worst.noise:g}); "
              f"{misses} of {len(cases)} runs above")
    return Goal("dtpo's profiling steps <= 1/3 of Zeus's on every run", misses == 0, figure)


def _lowest_win_share(cases: Sequence[Case]) -> tuple[float, str, float]:
    """The lowest share of runs where dtpo's job is cheaper, over the metric x noise cells: (share, metric, noise)."""
    shares = {key: sum(c.dtpo_cheaper for c in group) / len(group)
              for key, group in _groups(cases, lambda c: (c.metric, c.noise)).items()}
    (metric, noise), lowest = min(shares.items(), key=lambda item: item[1])
    return lowest, metric, noise


def wins_goal(cases: Sequence[Case], job_steps: int) -> Goal:
    """dtpo's whole job cheaper than Zeus's on >= 90 % of traces, per metric and noise and overall."""
    overall = sum(c.dtpo_cheaper for c in cases) / len(cases)
    lowest, metric, noise = _lowest_win_share(cases)
    figure = f"overall {overall:.1%}; lowest {lowest:.1%} ({metric}, σ {noise:g})"
    met = overall >= WIN_GOAL and lowest >= WIN_GOAL
    return Goal(f"dtpo's {job_steps:,}-step job cheaper than Zeus's on >= {WIN_GOAL:.0%} of traces", met, figure)


def completed_goal(cases: Sequence[Case]) -> Goal:
    """Both tuners finished every run (a run where one raised misses every goal)."""
    failed = [c for c in cases if c.error]
    return Goal("both tuners completed every run", not failed, f"{len(cases) - len(failed)} of {len(cases)}")


def evaluate_goals(cases: Sequence[Case], job_steps: int) -> list[Goal]:
    """The three goals on the completed runs, and whether every run completed."""
    done = [c for c in cases if not c.error]
    if not done:
        return [completed_goal(cases)]
    return [oracle_goal(done), steps_goal(done), wins_goal(done, job_steps), completed_goal(cases)]


# -- tables ---------------------------------------------------------------------------------------------


def per_seed_lines(cases: Sequence[Case], options: Options) -> list[str]:
    """With ``--repeats``: the job goal's lowest cell for each seed on its own (one run of every trace, as a
    single benchmark run judges it), so the spread a single run's verdict has is in view."""
    if options.repeats < 2:
        return []
    lines = []
    met = 0
    for repeat, group in sorted(_groups(cases, lambda c: c.repeat).items()):
        lowest, metric, noise = _lowest_win_share(group)
        met += lowest >= WIN_GOAL
        lines.append(f"seed {options.seed + repeat}: job cheaper than Zeus on {lowest:.1%} of traces in the lowest "
                     f"cell ({metric}, σ {noise:g}); runs >2 % off the oracle: "
                     f"{sum(c.scores['dtpo'].ratio > ORACLE_GOAL or c.scores['dtpo'].violation for c in group)}")
    lines.append(f"the job goal holds in every cell on {met} of {options.repeats} seeds")
    return lines


def _ratio(score: Score) -> str:
    text = f"{score.ratio:.3f}"
    if score.violation:
        return f"[red]{text}![/]"
    return f"[yellow]{text}[/]" if score.ratio > ORACLE_GOAL else text


def _signed(value: float, scale: float = 1.0) -> str:
    return f"{value / scale:+.3g}"


def detail_table(gpu: str, metric: str, cases: Sequence[Case]) -> Table:
    """One row per trace and noise level: both tuners' choice, steps, profiling overhead and job cost."""
    table = Table(title=f"{gpu}, {metric}: per trace (ratio = true cost / oracle's; ! = constraint violated)",
                  title_justify="left")
    for header in ("trace", "σ", "oracle W", "Zeus W", "Zeus ×", "dtpo W", "dtpo ×", "Zeus steps", "dtpo steps",
                   "Zeus +kJ", "dtpo +kJ", "Zeus +s", "dtpo +s", "job dtpo/Zeus"):
        table.add_column(header, justify="left" if header == "trace" else "right")
    for case in cases:
        zeus, dtpo = case.scores["zeus"], case.scores["dtpo"]
        job = dtpo.job_cost / zeus.job_cost
        table.add_row(case.trace.removeprefix(f"{gpu} "), f"{case.noise:g}", f"{case.oracle_w:g}",
                      f"{zeus.choice_w:g}", _ratio(zeus), f"{dtpo.choice_w:g}", _ratio(dtpo),
                      str(zeus.profiling_steps), str(dtpo.profiling_steps),
                      _signed(zeus.extra_energy_j, 1000), _signed(dtpo.extra_energy_j, 1000),
                      _signed(zeus.extra_time_s), _signed(dtpo.extra_time_s),
                      f"{job:.4f}" if job < 1 else f"[yellow]{job:.4f}[/]")
    return table


def _median_worst(values: Sequence[float]) -> str:
    return f"{statistics.median(values):.4f} / {max(values):.4f}"


def summary_row(label: Sequence[str], cases: Sequence[Case]) -> list[str]:
    """Medians and worst cases of one group of runs."""
    zeus = [c.scores["zeus"] for c in cases]
    dtpo = [c.scores["dtpo"] for c in cases]
    job = [d.job_cost / z.job_cost for d, z in zip(dtpo, zeus, strict=True)]
    steps = [c.steps_ratio for c in cases]
    return [*label, str(len(cases)), _median_worst([s.ratio for s in dtpo]), _median_worst([s.ratio for s in zeus]),
            f"{statistics.median(steps):.3f} / {max(steps):.3f}",
            f"{(statistics.median([s.job_ratio for s in dtpo]) - 1) * 100:.2f}",
            f"{(statistics.median([s.job_ratio for s in zeus]) - 1) * 100:.2f}",
            f"{statistics.median(job):.4f} / {max(job):.4f}",
            f"{sum(c.dtpo_cheaper for c in cases) / len(cases):.1%}",
            f"{sum(s.violation for s in zeus)} / {sum(s.violation for s in dtpo)}"]


def summary_table(cases: Sequence[Case], job_steps: int) -> Table:
    """Per metric, noise level and GPU, then over all: medians / worst cases."""
    table = Table(title=f"Summary (median / worst; job = {job_steps:,} steps including profiling)",
                  title_justify="left")
    for header in ("metric", "σ", "GPU", "runs", "dtpo ×oracle", "Zeus ×oracle", "steps dtpo/Zeus",
                   "dtpo job regret %", "Zeus job regret %", "job dtpo/Zeus", "dtpo cheaper", "violations Z/d"):
        table.add_column(header, justify="left" if header in ("metric", "GPU") else "right")
    for (metric, noise), group in _groups(cases, lambda c: (c.metric, c.noise)).items():
        for gpu, per_gpu in _groups(group, lambda c: c.gpu).items():
            table.add_row(*summary_row((metric, f"{noise:g}", gpu), per_gpu))
        table.add_row(*summary_row((metric, f"{noise:g}", "all"), group), style="bold")
    table.add_section()
    table.add_row(*summary_row(("all", "all", "all"), cases), style="bold")
    return table


def goal_lines(goals: Sequence[Goal]) -> list[str]:
    """``GOAL met: name: figure`` per goal."""
    return [f"GOAL {'met' if g.met else 'MISSED'}: {g.name}: {g.figure}" for g in goals]


def off_grid_lines(cases: Sequence[Case]) -> list[str]:
    """Per metric and noise level where dtpo held limits off Zeus's grid (a ``slowdown`` search moving towards the
    factor): on how many runs, and their true cost against the grid oracle (median, best, worst)."""
    lines = []
    for (metric, noise), group in _groups(cases, lambda c: (c.metric, c.noise)).items():
        ratios = [c.scores["dtpo"].ratio for c in group
                  if round(c.scores["dtpo"].choice_w / ZEUS_STEP_W) * ZEUS_STEP_W != c.scores["dtpo"].choice_w]
        if ratios:
            lines.append(f"{metric}, σ {noise:g}: dtpo held a limit between grid limits on {len(ratios)} of "
                         f"{len(group)} runs; ×oracle median {statistics.median(ratios):.4f}, best {min(ratios):.4f}, "
                         f"worst {max(ratios):.4f}")
        back = sum(1 for c in group if c.details.get("dtpo", {}).get("steps_back"))
        if back:
            lines.append(f"{metric}, σ {noise:g}: on {back} of {len(group)} runs dtpo's interpolated choice proved too "
                         "slow while held and it went back to the limit above (counted in the job)")
        refined = [c for c in group if c.details.get("dtpo", {}).get("refined")]
        if refined:
            runner = [c.details["dtpo"]["refined"]["steps_at_runner_up"] for c in refined]
            switched = sum(1 for c in refined if c.details["dtpo"]["first_choice"]["power_limit_w"]
                           != c.scores["dtpo"].choice_w)
            lines.append(f"{metric}, σ {noise:g}: on {len(refined)} of {len(group)} runs dtpo held a near-tie and "
                         f"trained at it and its runner-up in turn (steps at the runner-up: median "
                         f"{statistics.median(runner):,.0f}, most {max(runner):,}; counted in the job, not in the "
                         f"profiling steps); {switched} ended on the runner-up")
    return lines


def report(console: Console, cases: Sequence[Case], goals: Sequence[Goal], options: Options, runtime_s: float) -> None:
    """Print the per-trace tables (unless ``--summary-only``), the summary and the goals."""
    done = [c for c in cases if not c.error]
    if not options.summary_only:
        for (gpu, metric), group in _groups(done, lambda c: (c.gpu, c.metric)).items():
            console.print(detail_table(gpu, metric, group))
            console.print()
    if done:
        console.print(summary_table(done, options.job_steps))
        for line in [*off_grid_lines(done), *per_seed_lines(done, options)]:
            console.print(line, markup=False, highlight=False)
    if options.history:
        for case in done:
            dtpo = case.scores["dtpo"]
            console.print(f"dtpo on {case.trace}, {case.metric}, σ {case.noise:g}, seed {case.seed}: held "
                          f"{dtpo.choice_w:g} W (×{dtpo.ratio:.4f} the oracle's {case.oracle_w:g} W) after "
                          f"{dtpo.profiling_steps} profiling steps", markup=False, highlight=False)
            for line in case.details["dtpo"].get("history", []):
                console.print(f"  {line}", markup=False, highlight=False)
    for case in [c for c in cases if c.error]:
        console.print(f"FAILED: {case.trace}, {case.metric}, noise {case.noise:g}, seed {case.seed}: {case.error}",
                      style="red", markup=False, highlight=False)
    for line, goal in zip(goal_lines(goals), goals, strict=True):
        console.print(line, style="green" if goal.met else "bold red", markup=False, highlight=False)
    console.print(f"{len(cases)} runs of each tuner in {runtime_s:.1f} s", markup=False, highlight=False)


def write_json(path: Path, cases: Sequence[Case], goals: Sequence[Goal], options: Options, runtime_s: float,
               leave_one_out: dict[str, Any] | None = None) -> None:
    """Every run, the goals, the options and the leave-one-out validation, as JSON."""
    data = {"options": {"noise": list(options.noises), "costs": [c.name for c in options.costs],
                        "seed": options.seed, "repeats": options.repeats, "job_steps": options.job_steps,
                        "counter_period_s": options.counter_period_s, "gpu": options.gpu, "limit": options.limit,
                        "only": options.only, "traces": [str(p) for p in options.trace_files],
                        "trace_gpu": list(options.trace_gpus), "quick": options.quick},
            "goals": [asdict(g) for g in goals], "runtime_s": runtime_s, "runs": [c.as_dict() for c in cases],
            "leave_one_out": leave_one_out}
    path.write_text(json.dumps(data, indent=1) + "\n")


# -- main -----------------------------------------------------------------------------------------------


def configure_logging(options: Options) -> None:
    """Diagnostics on stderr; Zeus's own log silenced, or at INFO into ``--zeus-log``."""
    logging.basicConfig(level=logging.INFO if options.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    zeus_logger = logging.getLogger("zeus")
    zeus_logger.propagate = False
    if options.zeus_log:
        handler = logging.FileHandler(options.zeus_log, mode="w")
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s"))
        zeus_logger.addHandler(handler)
        zeus_logger.setLevel(logging.INFO)
    else:
        zeus_logger.addHandler(logging.NullHandler())
        zeus_logger.setLevel(logging.ERROR)


def check_tuners() -> str | None:
    """Why the benchmark cannot run (Zeus or dtpo's simulated tuner missing), or None."""
    try:
        import zeus.optimizer.power_limit  # noqa: F401
    except ImportError as exc:
        return f"Zeus is not importable ({exc}); run `make bench-zeus` or pip install -c constraints.txt '.[bench]'"
    try:
        import dtpo.simulation.tuning  # noqa: F401
    except ImportError as exc:
        return f"dtpo's simulated tuner is not importable ({exc})"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; 0 when every goal is met, 1 otherwise."""
    options = parse_options(argv)
    configure_logging(options)
    traces = select_traces(options)
    problem = check_tuners()
    if problem:
        log.error("%s", problem)
        return 3
    from leave_one_out import leave_one_out

    started = time.perf_counter()
    console = Console(width=None if sys.stdout.isatty() else 200)
    validation = None
    with case_runner(traces, options).running() as runner:
        cases = run_all(traces, options, runner)
        runtime_s = time.perf_counter() - started
        goals = evaluate_goals(cases, options.job_steps)
        report(console, cases, goals, options, runtime_s)
        if options.leave_one_out:
            console.print()
            validation = leave_one_out(cases, traces, options, runner, console)
    if options.json_path:
        write_json(options.json_path, cases, goals, options, runtime_s,
                   None if validation is None else validation.as_dict())
    console.print(f"whole benchmark in {time.perf_counter() - started:.1f} s ({options.jobs} processes)", markup=False,
                  highlight=False)
    return 0 if all(g.met for g in goals) and (validation is None or validation.met) else 1


if __name__ == "__main__":
    import tuner_vs_zeus  # this file under its own name, so leave_one_out and the worker processes share its classes

    sys.exit(tuner_vs_zeus.main())
