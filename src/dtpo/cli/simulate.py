"""``dtpo simulate``: a training job on simulated GPUs, at one knob setting, swept over a knob, tuned by dtpo's
power tuner, or with per-rank straggler slowdown.

Each mode is a subcommand generated from :class:`~dtpo.core.simulate_config.SimulateConfig` with only its own
flags: ``run`` (one setting against the default), ``sweep KNOB``, ``tune KNOB`` (:mod:`dtpo.cli.simulate_tune`),
``stragglers`` (:mod:`dtpo.cli.simulate_stragglers`) and ``list``. The earlier spelling with flags only
(``dtpo simulate --sweep power-limit``, ``--tune both``, ``--tune stragglers``, ``--list``) is the group's own
hidden options, and runs the same mode functions with the same output.

Every figure it prints is simulated (from a model calibrated on measured traces, or the parametric
physical model), never a measurement; the output says which model ran and what it assumes.

``--trace FILE.csv`` calibrates the simulated GPUs on the user's own measured power-limit sweep, in the
columns of the shipped Zeus files (``power_limit,time_per_epoch,average_power``, optionally
``dataset,network,batch_size,optimizer``, ``samples_per_epoch`` and ``gpu``; see
:mod:`dtpo.devices.physics.user_trace`). ``--gpu`` names the GPU it was measured on (a sweep beyond that GPU's
power-limit range is refused); without it, the catalogued GPU the file's ``gpu`` column names, else a GPU outside
the catalogue whose power-limit range is the file's lowest to highest limit, said in one logged line (and as
``gpu_note`` in the result). The SM clocks of such a GPU are unknown, so only its power limit is swept or tuned.
``--workload`` and ``--batch-size`` pick one trace when the file holds several; ``list --trace FILE`` lists them.

``phases`` runs a job whose steps have the power phases of real training (every GPU computes near its limit, waits
for the slowest at idle, then communicates together; :mod:`dtpo.simulation.power_phases`) and writes it as a run
directory with a sampled power timeline per rank (``--run-dir``, default ``runs/simulate-<run id>``), which
``dtpo report`` and ``dtpo report --power-swing DIR`` read like a train run's, every figure labelled simulated.

``grid`` schedules a job against a grid signal (``--grid-signal FILE``: carbon intensity or a price over time) by
``--deadline`` hours, with each ``--grid-policy`` (signal-blind, throttle, pause, and the oracles that know the trace;
:mod:`dtpo.cli.simulate_grid`), and prints their carbon or cost, time and setting over time against signal-blind.

``stragglers`` runs a job whose ``--straggler`` ranks (``RANK:FACTOR[,RANK:FACTOR...]``, ``static``,
``drifting`` or ``intermittent`` by ``--straggler-pattern``, switching every ``--period`` steps) are slower, without
and with per-rank slowdown of the ranks that only wait for them. ``--tune rebalance`` (spelled with flags only:
``--straggler RANK:FACTOR --tune rebalance``, or ``rebalance,stragglers`` for both) runs the same job without and with
uneven per-rank batches that follow each rank's speed (with per-rank slowdown of what still waits), and prints the
throughput against no tuning and against the ideal, and each rank's share over the job. The other modes simulate one
straggler at most.

Every simulation writes its result (the JSON ``--json`` writes) into a run directory of its own,
``runs/simulate-<run id>/simulate.json`` (``--run-dir`` names another), and registers it in the run store
(``--store``; see ``dtpo runs``).
"""

from __future__ import annotations

import inspect
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table
from typer._click.core import ParameterSource  # typer vendors click

from dtpo.cli import simulate_grid, simulate_stragglers
from dtpo.cli.options import config_command
from dtpo.cli.register import check_result_target, save_result
from dtpo.cli.simulate_tune import print_tuning, run_tuning
from dtpo.core.errors import ConfigError
from dtpo.core.files import default_run_root
from dtpo.core.record import new_run_id, write_json_atomic
from dtpo.core.simulate_config import (
    DEFAULT_COST,
    DEFAULT_COUNTER_PERIOD_S,
    DEFAULT_GRID_SLACK,
    DEFAULT_PATTERN,
    DEFAULT_PERIOD_STEPS,
    DEFAULT_TUNE_STEP_W,
    DEFAULT_WORKLOAD,
    STRAGGLER_TUNE,
    SimulateConfig,
    rebalance_knob,
)
from dtpo.devices.physics.gpu_model import known_workloads
from dtpo.devices.physics.power_specs import POWER_SPECS, PowerSpec, find_power_spec
from dtpo.devices.physics.user_trace import describe_trace, read_trace_file
from dtpo.simulation.data_parallel import SettingResult, SimulatedJob, optimal, sweep_values
from dtpo.simulation.job import MAX_GPUS, MAX_STEPS, PATTERNS, JobConfig
from dtpo.simulation.job import Progress as StepsDone
from dtpo.simulation.power_phases import MAX_PHASED_STEPS, StepPhases, simulate_phases
from dtpo.telemetry.store.paths import now_iso
from dtpo.telemetry.summary import make_console
from dtpo.tune.cost import CostMetric, parse_cost
from dtpo.tune.grid_policy import DEFAULT_RESUME_S

log = logging.getLogger(__name__)

SIMULATE_SCHEMA = "dtpo.simulate/1"
BAR_WIDTH = 10
PROGRESS_GPU_STEPS = 20_000_000  # show a progress bar (on a terminal) from about this much work: a few seconds
MIN_COUNTER_PERIODS = 20  # fewer energy-counter periods per setting: its energy may be off by over 10 %
HELP_VALUES = {"MAX_GPUS": MAX_GPUS, "MAX_STEPS": MAX_STEPS, "PATTERNS": ", ".join(PATTERNS),
               "DEFAULT_WORKLOAD": DEFAULT_WORKLOAD, "DEFAULT_COST": DEFAULT_COST,
               "DEFAULT_TUNE_STEP_W": DEFAULT_TUNE_STEP_W, "DEFAULT_COUNTER_PERIOD_S": DEFAULT_COUNTER_PERIOD_S,
               "DEFAULT_PATTERN": DEFAULT_PATTERN, "DEFAULT_PERIOD_STEPS": DEFAULT_PERIOD_STEPS,
               "DEFAULT_GRID_SLACK": DEFAULT_GRID_SLACK, "DEFAULT_GRID_RESUME_S": DEFAULT_RESUME_S}


def check_json_path(path: Path) -> None:
    """Refuse an output path that cannot take the JSON file, before anything is simulated.

    Raises:
        ConfigError: ``path`` is a directory, its folder does not exist, or it cannot be written there.
    """
    if str(path) == "" or path.is_dir():
        raise ConfigError(f"--json {str(path)!r} is a directory; name a file, e.g. {path / 'simulate.json'}")
    folder = path.parent
    if not folder.is_dir():
        raise ConfigError(f"--json {path}: folder {folder} does not exist (dtpo does not create it)")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"--json {path}: cannot write in folder {folder}")


@contextmanager
def progress_bar(total_steps: int, gpus: int, threshold: int = PROGRESS_GPU_STEPS) -> Iterator[StepsDone | None]:
    """A progress bar on stderr for long simulations (from ``threshold`` GPU-steps), only on a terminal (logs
    and pipes stay clean)."""
    if total_steps * gpus < threshold or not sys.stderr.isatty():
        yield None
        return
    columns = (TextColumn("simulating"), BarColumn(), MofNCompleteColumn(), TextColumn("steps"),
               TimeRemainingColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("simulate", total=total_steps)
        yield lambda steps: bar.advance(task, steps)


def _bar(value: float, low: float, high: float) -> str:
    """A bar whose length grows from the best (``low``) to the worst (``high``) value."""
    if high <= low:
        return "▏"
    filled = 1 + round((value - low) / (high - low) * (BAR_WIDTH - 1))
    return "█" * filled


def _change(value: float, reference: float) -> str:
    """``value`` against ``reference`` in per cent; ``-`` where the reference is 0 (a setting so short that the
    energy counter never advanced)."""
    return f"{(value / reference - 1) * 100:+.1f}%" if reference > 0 else "-"


def results_table(results: list[SettingResult], reference: SettingResult, title: str, caption: str) -> Table:
    """One row per setting: time, energy, power, J/sample, against ``reference``, the optima marked."""
    best_energy, best_time = optimal(results)
    table = Table(title=title, title_justify="left", caption=caption, caption_justify="left")
    sweep = len(results) > 1
    for name in ("limit W", "lock MHz", "SM MHz", "time s", "samples/s", "kJ", "W/GPU", "J/sample", "ΔE", "Δt"):
        table.add_column(name, justify="right", no_wrap=True)
    if sweep:
        table.add_column("J/sample", no_wrap=True)
        table.add_column("best", no_wrap=True)
    low = min(r.joules_per_sample for r in results)
    high = max(r.joules_per_sample for r in results)
    for r in results:
        marks = []
        if r is best_energy:
            marks.append("[green]energy[/]")
        if r is best_time:
            marks.append("[cyan]time[/]")
        table.add_row(
            f"{r.power_limit_w:g}", "-" if r.sm_clock_mhz is None else str(r.sm_clock_mhz),
            f"{r.effective_clock_mhz:,.0f}", f"{r.time_s:,.1f}", f"{r.samples_per_s:,.1f}",
            f"{r.energy_j / 1e3:,.1f}", f"{r.average_power_w:,.0f}", f"{r.joules_per_sample:.4g}",
            _change(r.energy_j, reference.energy_j), _change(r.time_s, reference.time_s),
            *([_bar(r.joules_per_sample, low, high), ", ".join(marks)] if sweep else []))
    return table


def simulate(config: SimulateConfig, *, gpu_named: bool = True) -> None:
    """Run what ``config`` asks for (:attr:`SimulateConfig.mode`), print it, and save its result in a run
    directory of its own, registered in the run store.

    ``gpu_named``: whether ``config.job.gpu`` was given (``--gpu``) rather than left at its default; with
    ``--trace`` and no GPU named, the trace file says which GPU it is (see :func:`trace_gpu`).
    """
    console = make_console()
    if config.mode == "list":
        list_models(console, config, gpu_named=gpu_named)
        return
    check_result_target("simulate", config.output.run_dir, config.output.store)
    started_at = now_iso()
    if config.grid.signal is not None:
        result = simulate_grid_job(console, config, gpu_named=gpu_named)
    elif config.mode in ("stragglers", "rebalance"):
        result = simulate_straggler_job(console, config)
    else:
        run = simulate_tuning if config.mode == "tune" else simulate_settings
        result = run(console, config, gpu_named=gpu_named)
    save_result("simulate", result, config.output.run_dir, config.output.store, started_at, console)


def trace_gpu(config: SimulateConfig, gpu_named: bool) -> tuple[PowerSpec, str | None]:
    """The GPU a ``--trace`` run simulates, and the line saying how it was found when ``--gpu`` was not given.

    With ``--gpu`` it is that GPU (a sweep beyond its range is refused when the file is read). Without, it is
    the catalogued model the file's ``gpu`` column names, else a GPU outside the catalogue whose power-limit range
    is the file's (:func:`dtpo.devices.physics.user_trace.read_trace_file`); that line is logged.

    Raises:
        ConfigError: An unknown ``--gpu`` (the message lists the choices), or a bad trace file.
    """
    assert config.job.trace is not None
    if gpu_named:
        try:
            return find_power_spec(config.job.gpu), None
        except ConfigError as exc:
            raise ConfigError(f"{exc} (or leave --gpu out to take the power-limit range from the trace)") from None
    read = read_trace_file(config.job.trace, None, batch_size=config.job.batch_size)
    if read.note:
        log.info("%s", read.note)
    return read.spec, read.note


def list_models(console: Console, config: SimulateConfig, *, gpu_named: bool = True) -> None:
    """The GPU models and workloads (``--trace``: the file's traces)."""
    if config.job.trace is not None:
        _list_traces(console, config, gpu_named)
        return
    console.print("GPU models: " + ", ".join(f"{s.name} ({s.min_power_w:g}-{s.max_power_w:g} W)"
                                             for s in POWER_SPECS))
    console.print("workloads: " + ", ".join(known_workloads()))


def simulate_straggler_job(console: Console, config: SimulateConfig) -> dict[str, object]:
    """``--tune stragglers``: the job without and with per-rank slowdown; ``--tune rebalance[,stragglers]``: without
    and with uneven per-rank batches (and per-rank slowdown) (see :mod:`dtpo.cli.simulate_stragglers`)."""
    job, stragglers = config.job, config.stragglers
    straggler_job = JobConfig(
        gpu=job.gpu, workload=DEFAULT_WORKLOAD if job.workload is None else job.workload, gpus=job.gpus,
        steps=job.steps, stragglers=stragglers.ranks,
        pattern=DEFAULT_PATTERN if stragglers.pattern is None else stragglers.pattern,
        period_steps=DEFAULT_PERIOD_STEPS if stragglers.period is None else stragglers.period, noise=job.noise,
        seed=job.seed, batch_size=job.batch_size, counter_period_s=0.0)
    with_clocks = rebalance_knob(config.tune.knob)
    if with_clocks is None:
        return _simulate_stragglers(console, straggler_job, config.output.json)
    return _simulate_stragglers(console, straggler_job, config.output.json, clocks=with_clocks, rebalance=True)


def simulate_grid_job(console: Console, config: SimulateConfig, *, gpu_named: bool = True) -> dict[str, object]:
    """``grid``: the job scheduled against ``--grid-signal`` by each policy (see :mod:`dtpo.cli.simulate_grid`)."""
    json_out = config.output.json
    if json_out is not None:
        check_json_path(json_out)
    if config.knobs.sweep is not None or config.knobs.fixed or config.tune.knob is not None:
        raise ConfigError("--grid-signal chooses the settings itself; drop --sweep, --power-limit, --sm-clock and "
                          "--tune")
    job_config, _ = _job_config(config, gpu_named)
    result = simulate_grid.simulate_grid(console, config, job_config)
    if json_out is not None:
        _write_json(json_out, result)
        console.print(f"results written to {json_out}")
    return result


def _job_config(config: SimulateConfig, gpu_named: bool = True) -> tuple[JobConfig, str | None]:
    """The simulated job of the setting, sweep and tuning modes (after ``--cost`` and ``--json`` were checked),
    and, for a trace whose GPU was not named, the line saying which GPU it is (:func:`trace_gpu`)."""
    job = config.job
    workload = job.workload
    if workload is None:
        workload = "" if job.trace is not None else DEFAULT_WORKLOAD
    gpu, note = job.gpu, None
    if job.trace is not None:
        spec, note = trace_gpu(config, gpu_named)
        gpu = spec.name
        _check_clock_knobs(config, spec)
    ranks = config.stragglers.ranks
    return JobConfig(gpu=gpu, workload=workload, gpus=job.gpus, steps=job.steps, batch_size=job.batch_size,
                     calibrated={"auto": None, "calibrated": True, "parametric": False}[job.model], seed=job.seed,
                     noise=job.noise, counter_period_s=_counter_period(config),
                     stragglers=tuple(ranks), trace_file=None if job.trace is None else str(job.trace)), note


def _check_clock_knobs(config: SimulateConfig, spec: PowerSpec) -> None:
    """Refuse SM-clock settings on a GPU outside the catalogue: its clocks are unknown."""
    knobs = config.knobs
    clock = ("--sm-clock" if knobs.sm_clock_mhz is not None else "--sweep sm-clock" if knobs.sweep == "sm-clock"
             else f"--tune {config.tune.knob}" if config.tune.knob in ("sm-clock", "both") else None)
    if spec.from_trace and clock is not None:
        raise ConfigError(f"{clock}: the SM clocks of {spec.name}, a GPU outside the catalogue, are unknown; sweep or "
                          "tune the power limit, or name the GPU with --gpu (dtpo simulate list)")


def _counter_period(config: SimulateConfig) -> float:
    period = config.job.counter_period
    return DEFAULT_COUNTER_PERIOD_S if period is None else period


def _cost(config: SimulateConfig) -> CostMetric:
    """``--cost`` (checked in every mode but per-rank slowdown, even where nothing is tuned)."""
    return parse_cost(DEFAULT_COST if config.tune.cost is None else config.tune.cost)


def simulate_tuning(console: Console, config: SimulateConfig, *, gpu_named: bool = True) -> dict[str, object]:
    """``--tune power-limit|sm-clock|both``: dtpo's power tuner on the simulated job (see
    :mod:`dtpo.cli.simulate_tune`)."""
    metric = _cost(config)
    knob = config.tune.knob
    assert knob is not None
    tune_step = DEFAULT_TUNE_STEP_W if config.tune.step_w is None else config.tune.step_w
    json_out = config.output.json
    if json_out is not None:
        check_json_path(json_out)
    job_config, note = _job_config(config, gpu_named)
    with SimulatedJob(job_config) as job, progress_bar(job_config.steps, job_config.gpus) as progress:
        run = run_tuning(job, knob, metric, tune_step, progress)
        data = print_tuning(console, run, job, knob, metric, tune_step)
    result = {"schema": SIMULATE_SCHEMA, "config": asdict(job_config), "gpu": job.model.spec.name,
              **({"gpu_note": note} if note else {}), "workload": job.model.workload, "knob": knob,
              "cost": metric.name, **data}
    if json_out is not None:
        _write_json(json_out, result)
        console.print(f"results written to {json_out}")
    return result


def simulate_settings(console: Console, config: SimulateConfig, *, gpu_named: bool = True) -> dict[str, object]:
    """One setting (``--power-limit``, ``--sm-clock`` or neither) or a ``--sweep`` of a knob, each against the
    default settings, in one table with the optima marked."""
    _cost(config)
    json_out = config.output.json
    if json_out is not None:
        check_json_path(json_out)
    job_config, note = _job_config(config, gpu_named)
    knobs, steps, gpus, trace = config.knobs, job_config.steps, job_config.gpus, config.job.trace
    sweep, power_limit, sm_clock = knobs.sweep, knobs.power_limit_w, knobs.sm_clock_mhz
    with SimulatedJob(job_config) as job:
        settings = 2 if sweep is None else 1 + len(sweep_values(job.gpus, sweep))
        with progress_bar(settings * steps, gpus) as progress:
            baseline = job.run(progress=progress)  # the default settings: maximum power limit, clocks floating
            if sweep is None:
                results = [job.run(power_limit, sm_clock, progress)]
            else:
                results = job.sweep(sweep, power_limit_w=power_limit, sm_clock_mhz=sm_clock, progress=progress)
        m = job.model
    warn_if_coarse(min(r.time_s for r in (baseline, *results)), job_config.counter_period_s)
    if trace is not None:
        kind = f"calibrated on your measured trace {trace}"
        origin = (f"All figures are simulated from your measured trace {trace} (interpolated between its power "
                  "limits), not measured in this run.")
    else:
        kind = "calibrated on a measured trace" if m.calibrated else "parametric model"
        origin = "All figures are simulated, not measured."
    title = (f"simulated: {gpus} x {m.spec.name}, {m.workload}, batch {m.batch_size}/GPU, {steps} steps "
             f"per setting ({kind})")
    caption = (f"{origin} Communication and data loading are not modelled. "
               "ΔE, Δt: energy and time against the default (maximum power limit, clocks floating).")
    for rank, factor in job_config.stragglers:
        caption += f" Straggler: rank {rank} x{factor:g}."
    console.print(results_table(results, baseline, title, caption))
    if len(results) > 1:
        best_energy, best_time = optimal(results)
        console.print(f"energy-optimal: {_setting(best_energy)}, {best_energy.joules_per_sample:.4g} J/sample; "
                      f"time-optimal: {_setting(best_time)}, {best_time.samples_per_s:,.1f} samples/s")
    console.print("model assumptions: " + "; ".join(m.assumptions), style="dim")
    result = {"schema": SIMULATE_SCHEMA, "config": asdict(job_config), "gpu": m.spec.name,
              **({"gpu_note": note} if note else {}), "workload": m.workload, "batch_size": m.batch_size,
              "calibrated": m.calibrated, "assumptions": list(m.assumptions),
              "baseline": baseline.as_dict(), "results": [r.as_dict() for r in results]}
    if json_out is not None:
        _write_json(json_out, result)
        console.print(f"results written to {json_out}")
    return result


def warn_if_coarse(time_s: float, counter_period_s: float) -> None:
    """Warn when a setting runs so briefly that the energy counter's period blurs its energy.

    The counter lags by up to one period at each end of a setting, so its energy may be off by up to
    ``2 * period / time``; from :data:`MIN_COUNTER_PERIODS` periods down (over 10 %) this logs a warning.
    """
    if counter_period_s > 0 and time_s < MIN_COUNTER_PERIODS * counter_period_s:
        log.warning("a setting runs only %.3g s of simulated time, %.3g energy-counter periods of %g s: its energy "
                    "may be off by up to %.0f %%; raise --steps (or --batch-size)", time_s,
                    time_s / counter_period_s, counter_period_s, min(100.0, 200 * counter_period_s / time_s))


def _list_traces(console: Console, config: SimulateConfig, gpu_named: bool) -> None:
    """Print the traces of a user's trace file (``--list --trace FILE``)."""
    trace, batch_size = config.job.trace, config.job.batch_size
    assert trace is not None
    spec, _ = trace_gpu(config, gpu_named)
    read = read_trace_file(trace, spec.name, batch_size=batch_size)
    console.print(f"traces in {trace} (measured on {spec.name}, power limits {spec.min_power_w:g}-"
                  f"{spec.max_power_w:g} W):")
    for item in read.traces:
        console.print(f"  {describe_trace(item)}", highlight=False, markup=False)


def _simulate_stragglers(console: Console, job: JobConfig, json_out: Path | None, *, clocks: bool = True,
                         rebalance: bool = False) -> dict[str, object]:
    """``--tune stragglers`` (or ``rebalance[,stragglers]``): the job without and with per-rank slowdown (or uneven
    per-rank batches, with per-rank slowdown where ``clocks``), printed (and written to ``json_out``); returns the
    result as JSON values."""
    simulate_stragglers.check_job(job, simulate_stragglers.tuning_name(clocks, rebalance))
    if json_out is not None:
        check_json_path(json_out)
    with progress_bar(2 * job.steps, job.gpus, simulate_stragglers.PROGRESS_GPU_STEPS) as progress:
        run = simulate_stragglers.run_stragglers(job, progress, clocks=clocks, rebalance=rebalance)
    printed = (simulate_stragglers.print_rebalance if rebalance else simulate_stragglers.print_stragglers)(console, run)
    data = {"schema": SIMULATE_SCHEMA, **printed}
    if json_out is not None:
        _write_json(json_out, data)
        console.print(f"results written to {json_out}")
    return data


def simulate_power_phases(config: SimulateConfig, phases: StepPhases, *, gpu_named: bool = True) -> Path:
    """``phases``: the job with each step's compute, wait and communication phases on the power meter, written as a
    run directory that ``dtpo report --power-swing`` reads. Returns the run directory.

    Raises:
        ConfigError: Bad phases, job or limit, or a ``--run-dir`` that already holds a run (one line).
    """
    phases.validate()
    if config.job.steps > MAX_PHASED_STEPS:
        raise ConfigError(f"--steps: a phased simulation runs at most {MAX_PHASED_STEPS:,} steps, got "
                          f"{config.job.steps:,}")
    check_result_target("simulate", config.output.run_dir, None)
    job_config, _ = _job_config(config, gpu_named)
    run = simulate_phases(job_config, phases, config.knobs.power_limit_w)
    folder = Path(config.output.run_dir) if config.output.run_dir is not None else \
        default_run_root() / f"simulate-{new_run_id()}"
    run.write_run(folder)
    console = make_console()
    console.print(f"simulated: {run.ranks} x {run.device}, {run.steps} steps of {run.duration_s / run.steps:.3g} s "
                  f"({100 * phases.comm_share:g} % communication at idle + {100 * phases.comm_power_share:g} % of the "
                  f"swing{_floor_words(phases)}), power sampled at {phases.sample_hz:g} Hz; every figure simulated",
                  highlight=False)
    console.print(f"run: {folder}", markup=False, highlight=False, soft_wrap=True)
    console.print(f"read it with: dtpo report --power-swing {folder}", markup=False, highlight=False, soft_wrap=True)
    return folder


def _floor_words(phases: StepPhases) -> str:
    return f", a power floor of {100 * phases.floor_share:g} % of the limit" if phases.floor_share > 0 else ""


def _write_json(path: Path, data: dict[str, object]) -> None:
    check_json_path(path)  # again: the folder may have gone while the simulation ran
    try:
        write_json_atomic(path, data)
    except OSError as exc:
        raise ConfigError(f"--json {path}: cannot write it ({exc.strerror or exc})") from None


def _setting(result: SettingResult) -> str:
    text = f"{result.power_limit_w:g} W"
    return text + (f", SM {result.sm_clock_mhz} MHz" if result.sm_clock_mhz is not None else "")


# -- the command: one subcommand per mode, and the earlier spelling (flags only) -----------------------------------

_JOB = ("job.gpu", "job.workload", "job.batch_size", "job.gpus", "job.steps", "job.model", "job.trace", "job.noise",
        "job.counter_period", "job.seed")
_KNOBS = ("knobs.power_limit_w", "knobs.sm_clock_mhz", "knobs.sweep")
_TUNE = ("tune.knob", "tune.cost", "tune.step_w")
_PATTERN = ("stragglers.pattern", "stragglers.period")
_GRID = ("grid.signal", "grid.policy", "grid.deadline", "grid.job_hours", "grid.start", "grid.resume_s")
_EVERY = (*_JOB, *_KNOBS, *_TUNE, "stragglers.straggler", *_PATTERN, *_GRID, "output.json", "output.run_dir",
          "output.store", "output.list")


def _gpu_named(ctx: typer.Context) -> bool:
    """Whether ``--gpu`` was given (on the command line or from the environment), not left at its default."""
    return ctx.get_parameter_source("job__gpu") not in (None, ParameterSource.DEFAULT)


def _simulate_command(ctx: typer.Context, config: SimulateConfig) -> None:
    simulate(config, gpu_named=_gpu_named(ctx))


def _mode_command(doc: str, *, takes: tuple[str, ...], fixed: dict[str, object] | None = None,
                  argument: str | None = None) -> object:
    """A subcommand taking the flags ``takes`` (and ``argument`` as its positional argument) of the tree."""
    taken = set(takes) | ({argument} if argument else set())
    return config_command(_simulate_command, tree=SimulateConfig, help_values=HELP_VALUES, doc=doc, fixed=fixed,
                          exclude=[p for p in _EVERY if p not in taken and p not in (fixed or {})],
                          arguments=[argument] if argument else (), pass_context=True)


_OUTPUT = ("output.json", "output.run_dir", "output.store")
_ONE_JOB = (*_JOB, "stragglers.straggler", *_OUTPUT)

run_command = _mode_command(
    "One setting (--power-limit, --sm-clock, or the default) on simulated GPUs, against the default settings: "
    "time, energy, J/sample.", takes=(*_ONE_JOB, "knobs.power_limit_w", "knobs.sm_clock_mhz"))
sweep_command = _mode_command(
    "Sweep a knob (power-limit or sm-clock) on simulated GPUs: time, energy and J/sample at every setting, the "
    "energy- and time-optimal ones marked.", takes=(*_ONE_JOB, "knobs.power_limit_w", "knobs.sm_clock_mhz"),
    argument="knobs.sweep")
tune_command = _mode_command(
    "Run dtpo's power tuner (power-limit, sm-clock or both) on simulated GPUs and judge its choice against the "
    "best setting of a full noise-free sweep.", takes=(*_ONE_JOB, "tune.cost", "tune.step_w"), argument="tune.knob")
stragglers_command = _mode_command(
    "Per-rank slowdown on simulated GPUs: the ranks that only wait for the --straggler ranks lock their SM clock "
    "lower; the job without and with it.",
    takes=("job.gpu", "job.workload", "job.batch_size", "job.gpus", "job.steps", "job.noise", "job.seed",
           "stragglers.straggler", *_PATTERN, *_OUTPUT), fixed={"tune.knob": STRAGGLER_TUNE})
_PHASE_DEFAULTS = StepPhases()
_PHASE_OPTIONS = [
    inspect.Parameter("comm_share", inspect.Parameter.KEYWORD_ONLY, annotation=float, default=typer.Option(
        _PHASE_DEFAULTS.comm_share, "--comm-share", help="Communication time per step, a share of the compute time.")),
    inspect.Parameter("comm_power", inspect.Parameter.KEYWORD_ONLY, annotation=float, default=typer.Option(
        _PHASE_DEFAULTS.comm_power_share, "--comm-power", help="Power while communicating: idle plus this share (0-1) "
        "of the swing from idle to computing.")),
    inspect.Parameter("sample_hz", inspect.Parameter.KEYWORD_ONLY, annotation=float, default=typer.Option(
        _PHASE_DEFAULTS.sample_hz, "--sample-hz", help="Rate of the simulated power sampler, Hz.")),
    inspect.Parameter("power_floor", inspect.Parameter.KEYWORD_ONLY, annotation=float, default=typer.Option(
        0.0, "--power-floor", help="A power floor (what power smoothing holds) in % of the power limit; 0: none.")),
]


def _phases_command(ctx: typer.Context, config: SimulateConfig, comm_share: float, comm_power: float,
                    sample_hz: float, power_floor: float) -> None:
    phases = StepPhases(comm_share=comm_share, comm_power_share=comm_power, sample_hz=sample_hz,
                        counter_period_s=config.job.counter_period or 0.0, floor_share=power_floor / 100.0)
    simulate_power_phases(config, phases, gpu_named=_gpu_named(ctx))


phases_command = config_command(
    _phases_command, tree=SimulateConfig, help_values=HELP_VALUES, pass_context=True, extra=_PHASE_OPTIONS,
    doc="A job whose steps have the power phases of training (compute near the limit, wait at idle, communicate), "
        "written as a run directory with each rank's sampled power timeline: read it with dtpo report --power-swing "
        "DIR. Every figure simulated.",
    exclude=[p for p in _EVERY if p not in (*_JOB, "stragglers.straggler", "knobs.power_limit_w", "output.run_dir")])


def _grid_command(ctx: typer.Context, config: SimulateConfig) -> None:
    if config.grid.signal is None:
        raise ConfigError("dtpo simulate grid needs --grid-signal FILE (a CSV or API JSON of carbon intensity or "
                          "price) and --deadline HOURS")
    simulate(config, gpu_named=_gpu_named(ctx))


grid_command = config_command(
    _grid_command, tree=SimulateConfig, help_values=HELP_VALUES, pass_context=True,
    doc="Schedule a job on simulated GPUs against a grid signal (carbon intensity or price) by a deadline: "
        "signal-blind, throttle (the power limit moves with the signal), pause, and the oracles that know the trace; "
        "their carbon or cost, time and setting over time. Every figure simulated.",
    exclude=[p for p in _EVERY if p not in ("job.gpu", "job.workload", "job.batch_size", "job.gpus", "job.steps",
                                            "job.model", "job.trace", *_GRID, *_OUTPUT)])
list_command = _mode_command(
    "List the GPU models and workloads that can be simulated (with --trace: the file's traces).",
    takes=("job.gpu", "job.batch_size", "job.trace"), fixed={"output.list": True})


def _earlier_spelling(ctx: typer.Context, config: SimulateConfig) -> None:
    """Simulate a training job on GPUs under power limits and SM clocks: time, energy, J/sample.

    Each mode is a subcommand: `dtpo simulate run|sweep|tune|stragglers|list --help`. The earlier spelling with
    flags only (`dtpo simulate --sweep power-limit`, `--tune both`, `--tune stragglers`, `--list`) still works.
    With --trace FILE.csv the GPUs are calibrated on your own measured power-limit sweep instead of the shipped
    Zeus traces.
    """
    if ctx.invoked_subcommand is None:
        simulate(config, gpu_named=_gpu_named(ctx))
        return
    typed = [p.opts[0] for p in ctx.command.params
             if p.name and ctx.get_parameter_source(p.name) not in (None, ParameterSource.DEFAULT)]
    if typed:
        raise ConfigError(f"put the options after the subcommand: dtpo simulate {ctx.invoked_subcommand} "
                          f"{' '.join(typed)} ...")


simulate_app = typer.Typer(name="simulate", invoke_without_command=True, add_completion=False,
                           context_settings={"help_option_names": ["-h", "--help"]})
simulate_app.callback()(config_command(_earlier_spelling, tree=SimulateConfig, help_values=HELP_VALUES,
                                       hidden=_EVERY, pass_context=True))
for _name, _command in (("run", run_command), ("sweep", sweep_command), ("tune", tune_command),
                        ("stragglers", stragglers_command), ("phases", phases_command), ("grid", grid_command),
                        ("list", list_command)):
    simulate_app.command(_name, context_settings={"help_option_names": ["-h", "--help"]})(_command)
