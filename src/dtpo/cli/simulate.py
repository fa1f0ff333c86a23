"""``dtpo simulate``: a training job on simulated GPUs, at one knob setting or swept over a knob.

Every figure it prints is simulated (from a model calibrated on measured traces, or the parametric
physical model), never a measurement; the output says which model ran and what it assumes.

``--trace FILE.csv`` calibrates the simulated GPUs on the user's own measured power-limit sweep, in the
columns of the shipped Zeus files (``power_limit,time_per_epoch,average_power``, optionally
``dataset,network,batch_size,optimizer`` and ``samples_per_epoch``; see
:mod:`dtpo.devices.physics.user_trace`). ``--gpu`` names the GPU it was measured on; ``--workload`` and
``--batch-size`` pick one trace when the file holds several; ``--list --trace FILE`` lists them.

``--tune stragglers`` runs a job whose ``--straggler`` ranks (``RANK:FACTOR[,RANK:FACTOR...]``, ``static``,
``drifting`` or ``intermittent`` by ``--straggler-pattern``, switching every ``--period`` steps) are slower, without
and with per-rank slowdown of the ranks that only wait for them (:mod:`dtpo.cli.simulate_stragglers`). The other
commands simulate one straggler at most.

Every simulation writes its result (the JSON ``--json`` writes) into a run directory of its own,
``runs/simulate-<run id>/simulate.json`` (``--run-dir`` names another), and registers it in the run store
(``--store``; see ``dtpo runs``).
"""

from __future__ import annotations

import logging
import math
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

from dtpo.cli import simulate_stragglers
from dtpo.cli.register import check_result_target, save_result
from dtpo.cli.simulate_tune import print_tuning, run_tuning
from dtpo.core.config import TUNE_KNOBS
from dtpo.core.errors import ConfigError
from dtpo.core.record import write_json_atomic
from dtpo.devices.physics.gpu_model import known_workloads
from dtpo.devices.physics.power_specs import POWER_SPECS, find_power_spec
from dtpo.devices.physics.user_trace import describe_trace, load_trace_file
from dtpo.simulation.data_parallel import SWEEPS, SettingResult, SimulatedJob, optimal, sweep_values
from dtpo.simulation.job import MAX_GPUS, MAX_STEPS, PATTERNS, JobConfig
from dtpo.simulation.job import Progress as StepsDone
from dtpo.telemetry.store_paths import now_iso
from dtpo.telemetry.summary import make_console
from dtpo.tune.cost import CostMetric, parse_cost

log = logging.getLogger(__name__)

SIMULATE_SCHEMA = "dtpo.simulate/1"
MODEL_CHOICES = ("auto", "calibrated", "parametric")
DEFAULT_WORKLOAD = "resnet50"
BAR_WIDTH = 10
PROGRESS_GPU_STEPS = 20_000_000  # show a progress bar (on a terminal) from about this much work: a few seconds
MIN_COUNTER_PERIODS = 20  # fewer energy-counter periods per setting: its energy may be off by over 10 %
STRAGGLER_TUNE = "stragglers"  # --tune stragglers: per-rank slowdown, simulate only (not a TUNE_KNOBS value)
DEFAULT_COST = "zeus:0.5"
DEFAULT_TUNE_STEP_W = 25.0
DEFAULT_COUNTER_PERIOD_S = 0.1
DEFAULT_PATTERN = "static"
DEFAULT_PERIOD_STEPS = 500


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


def check_finite(flag: str, value: float | None) -> None:
    """Refuse nan and inf for a float option."""
    if value is not None and not math.isfinite(value):
        raise ConfigError(f"{flag} must be a finite number, got {value:g}")


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


def parse_stragglers(text: str | None) -> tuple[tuple[int, float], ...]:
    """``"3:1.25"`` -> rank 3 computes 1.25x slower; ``"3:1.2,5:1.1"`` -> two stragglers; ``None`` -> none."""
    if not text:
        return ()
    out: list[tuple[int, float]] = []
    for item in text.split(","):
        rank, sep, factor = item.strip().partition(":")
        try:
            if not sep:
                raise ValueError
            parsed = int(rank), float(factor)
        except ValueError:
            raise ConfigError(f"--straggler must be RANK:FACTOR[,RANK:FACTOR...], e.g. 3:1.2, got {text!r}") from None
        if not math.isfinite(parsed[1]) or parsed[1] <= 0:
            raise ConfigError(f"--straggler factor must be a finite number > 0, got {factor.strip()!r}")
        if parsed[0] in (r for r, _ in out):
            raise ConfigError(f"--straggler names rank {parsed[0]} twice")
        out.append(parsed)
    return tuple(out)


def parse_straggler(text: str | None) -> tuple[int, float] | None:
    """The one straggler of the plain simulation and the power tuner: ``"3:1.25"`` -> rank 3 computes 1.25x
    slower; several are refused (only ``--tune stragglers`` simulates several)."""
    parsed = parse_stragglers(text)
    if len(parsed) > 1:
        raise ConfigError(f"--straggler {text} names {len(parsed)} stragglers; only --tune {STRAGGLER_TUNE} "
                          "simulates several (the other modes take one RANK:FACTOR)")
    return parsed[0] if parsed else None


def _bar(value: float, low: float, high: float) -> str:
    """A bar whose length grows from the best (``low``) to the worst (``high``) value."""
    if high <= low:
        return "▏"
    filled = 1 + round((value - low) / (high - low) * (BAR_WIDTH - 1))
    return "█" * filled


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
            f"{(r.energy_j / reference.energy_j - 1) * 100:+.1f}%", f"{(r.time_s / reference.time_s - 1) * 100:+.1f}%",
            *([_bar(r.joules_per_sample, low, high), ", ".join(marks)] if sweep else []))
    return table


def simulate_command(
    gpu: str = typer.Option("A40", "--gpu", help="GPU model: A40, V100, H100-SXM, A100-SXM, MI250X "
                                                 "(with --trace: the GPU the trace was measured on)."),
    workload: str | None = typer.Option(
        None, "--workload", "-w",
        help=f"Workload (see --list; default {DEFAULT_WORKLOAD}). With --trace: which of the file's traces, as "
             "NETWORK, NETWORK/DATASET or NETWORK/DATASET/OPTIMIZER (default: the file's only one)."),
    batch_size: int | None = typer.Option(
        None, "--batch-size",
        help="Per-GPU batch (default: the model's). With --trace: picks the file's trace of that batch, or is "
             "the batch of a file without a batch_size column (default 1)."),
    gpus: int = typer.Option(8, "--gpus", help=f"Number of data-parallel GPUs (at most {MAX_GPUS:,})."),
    steps: int = typer.Option(1000, "--steps", help=f"Training steps per setting (at most {MAX_STEPS:,})."),
    power_limit: float | None = typer.Option(None, "--power-limit", help="Power limit in watts on every GPU."),
    sm_clock: int | None = typer.Option(None, "--sm-clock", help="Lock SM clocks at this supported MHz."),
    sweep: str | None = typer.Option(None, "--sweep", help="Sweep a knob: power-limit or sm-clock."),
    model: str = typer.Option("auto", "--model",
                              help="auto (calibrated where a measured trace exists), calibrated, parametric."),
    straggler: str | None = typer.Option(
        None, "--straggler",
        help="RANK:FACTOR, one GPU that much slower; with --tune stragglers a comma-separated list of them.",
        show_default=False),
    straggler_pattern: str | None = typer.Option(
        None, "--straggler-pattern",
        help=f"With --tune stragglers: {', '.join(PATTERNS)} (default {DEFAULT_PATTERN}): the slow ranks stay, "
             "move on to the next rank every --period steps, or are slow for --period steps and then not.",
        show_default=False),
    period: int | None = typer.Option(
        None, "--period", help="With --tune stragglers: steps between a drifting straggler's moves or an "
                               f"intermittent one's switches (default {DEFAULT_PERIOD_STEPS}).", show_default=False),
    noise: float = typer.Option(0.01, "--noise", help="Relative noise (std) on step time and power."),
    counter_period: float | None = typer.Option(
        None, "--counter-period", help=f"Energy-counter update period (s; default {DEFAULT_COUNTER_PERIOD_S:g}).",
        show_default=False),
    seed: int = typer.Option(0, "--seed", help="Noise seed."),
    json_out: Path | None = typer.Option(None, "--json", help="Also write the results to this JSON file."),
    run_dir: Path | None = typer.Option(
        None, "--run-dir", help="Write the results here as simulate.json (default: runs/simulate-<run id>).",
        show_default=False),
    store: str | None = typer.Option(
        None, "--store",
        help="SQLite run store the result is registered in (default: $DTPO_STORE, else runs/dtpo.sqlite).",
        show_default=False),
    list_models: bool = typer.Option(False, "--list", help="List GPU models and workloads (with --trace: the "
                                                           "file's traces), then exit."),
    tune: str | None = typer.Option(
        None, "--tune", help="Run dtpo's tuner on the simulated job: power-limit, sm-clock or both (see --cost); "
                             f"or {STRAGGLER_TUNE}: slow down the ranks that only wait for the --straggler ranks."),
    cost: str | None = typer.Option(
        None, "--cost", help="What --tune minimises: energy, time, zeus:ETA, slowdown:FACTOR or "
                             f"dollars:PRICE_PER_KWH,PRICE_PER_GPU_HOUR (default {DEFAULT_COST}).",
        show_default=False),
    tune_step: float | None = typer.Option(
        None, "--tune-step", help=f"Power-limit grid of --tune, in watts (default {DEFAULT_TUNE_STEP_W:g}).",
        show_default=False),
    trace: Path | None = typer.Option(
        None, "--trace",
        help="Calibrate on your own measured power-limit sweep: a CSV with the shipped Zeus columns "
             "power_limit,time_per_epoch,average_power (W, s, W), optionally dataset,network,batch_size,"
             "optimizer and samples_per_epoch (needed unless the dataset is one dtpo knows). Name its GPU with "
             "--gpu."),
) -> None:
    """Simulate a training job on GPUs under power limits and SM clocks: time, energy, J/sample.

    With --trace FILE.csv the GPUs are calibrated on your own measured power-limit sweep instead of the
    shipped Zeus traces.
    """
    console = make_console()
    if trace is not None and model == "parametric":
        raise ConfigError("--model parametric cannot use --trace: a measured trace gives a calibrated model")
    if list_models and trace is not None:
        _list_traces(console, trace, gpu, batch_size)
        return
    if list_models:
        console.print("GPU models: " + ", ".join(f"{s.name} ({s.min_power_w:g}-{s.max_power_w:g} W)"
                                                 for s in POWER_SPECS))
        console.print("workloads: " + ", ".join(known_workloads()))
        return
    if model not in MODEL_CHOICES:
        raise ConfigError(f"--model must be one of {', '.join(MODEL_CHOICES)}, got {model!r}")
    if sweep is not None and sweep not in SWEEPS:
        raise ConfigError(f"--sweep must be one of {', '.join(SWEEPS)}, got {sweep!r}")
    if sweep == "power-limit" and power_limit is not None or sweep == "sm-clock" and sm_clock is not None:
        raise ConfigError(f"--sweep {sweep} already sets that knob; drop the fixed value")
    for flag, value in (("--power-limit", power_limit), ("--noise", noise), ("--counter-period", counter_period)):
        check_finite(flag, value)
    check_result_target("simulate", run_dir, store)
    started_at = now_iso()
    if tune == STRAGGLER_TUNE:
        _check_straggler_tuning(sweep=sweep, power_limit=power_limit, sm_clock=sm_clock, trace=trace, model=model,
                                cost=cost, tune_step=tune_step, counter_period=counter_period)
        job = JobConfig(gpu=gpu, workload=DEFAULT_WORKLOAD if workload is None else workload, gpus=gpus, steps=steps,
                        stragglers=parse_stragglers(straggler),
                        pattern=DEFAULT_PATTERN if straggler_pattern is None else straggler_pattern,
                        period_steps=DEFAULT_PERIOD_STEPS if period is None else period, noise=noise, seed=seed,
                        batch_size=batch_size, counter_period_s=0.0)
        data = _simulate_stragglers(console, job, json_out)
        save_result("simulate", data, run_dir, store, started_at, console)
        return
    if straggler_pattern is not None or period is not None:
        raise ConfigError(f"--straggler-pattern and --period apply only to --tune {STRAGGLER_TUNE}")
    cost = DEFAULT_COST if cost is None else cost
    tune_step = DEFAULT_TUNE_STEP_W if tune_step is None else tune_step
    counter_period = DEFAULT_COUNTER_PERIOD_S if counter_period is None else counter_period
    metric = _check_tuning(tune, cost, tune_step, sweep, power_limit, sm_clock)
    if json_out is not None:
        check_json_path(json_out)
    if workload is None:
        workload = "" if trace is not None else DEFAULT_WORKLOAD
    config = JobConfig(gpu=gpu, workload=workload, gpus=gpus, steps=steps, batch_size=batch_size,
                       calibrated={"auto": None, "calibrated": True, "parametric": False}[model], seed=seed,
                       noise=noise, counter_period_s=counter_period,
                       stragglers=tuple(filter(None, [parse_straggler(straggler)])),
                       trace_file=None if trace is None else str(trace))
    if tune is not None and metric is not None:
        with SimulatedJob(config) as job, progress_bar(steps, gpus) as progress:
            run = run_tuning(job, tune, metric, tune_step, progress)
            data = print_tuning(console, run, job, tune, metric, tune_step)
        result = {"schema": SIMULATE_SCHEMA, "config": asdict(config), "gpu": job.model.spec.name,
                  "workload": job.model.workload, "knob": tune, "cost": metric.name, **data}
        if json_out is not None:
            _write_json(json_out, result)
            console.print(f"results written to {json_out}")
        save_result("simulate", result, run_dir, store, started_at, console)
        return
    with SimulatedJob(config) as job:
        settings = 2 if sweep is None else 1 + len(sweep_values(job.gpus, sweep))
        with progress_bar(settings * steps, gpus) as progress:
            baseline = job.run(progress=progress)  # the default settings: maximum power limit, clocks floating
            if sweep is None:
                results = [job.run(power_limit, sm_clock, progress)]
            else:
                results = job.sweep(sweep, power_limit_w=power_limit, sm_clock_mhz=sm_clock, progress=progress)
        m = job.model
    warn_if_coarse(min(r.time_s for r in (baseline, *results)), counter_period)
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
    for rank, factor in config.stragglers:
        caption += f" Straggler: rank {rank} x{factor:g}."
    console.print(results_table(results, baseline, title, caption))
    if len(results) > 1:
        best_energy, best_time = optimal(results)
        console.print(f"energy-optimal: {_setting(best_energy)}, {best_energy.joules_per_sample:.4g} J/sample; "
                      f"time-optimal: {_setting(best_time)}, {best_time.samples_per_s:,.1f} samples/s")
    console.print("model assumptions: " + "; ".join(m.assumptions), style="dim")
    result = {"schema": SIMULATE_SCHEMA, "config": asdict(config), "gpu": m.spec.name, "workload": m.workload,
              "batch_size": m.batch_size, "calibrated": m.calibrated, "assumptions": list(m.assumptions),
              "baseline": baseline.as_dict(), "results": [r.as_dict() for r in results]}
    if json_out is not None:
        _write_json(json_out, result)
        console.print(f"results written to {json_out}")
    save_result("simulate", result, run_dir, store, started_at, console)


def warn_if_coarse(time_s: float, counter_period_s: float) -> None:
    """Warn when a setting runs so briefly that the energy counter's period blurs its energy.

    The counter lags by up to one period at each end of a setting, so its energy may be off by up to
    ``2 * period / time``; from :data:`MIN_COUNTER_PERIODS` periods down (over 10 %) this logs a warning.
    """
    if counter_period_s > 0 and time_s < MIN_COUNTER_PERIODS * counter_period_s:
        log.warning("a setting runs only %.3g s of simulated time, %.3g energy-counter periods of %g s: its energy "
                    "may be off by up to %.0f %%; raise --steps (or --batch-size)", time_s,
                    time_s / counter_period_s, counter_period_s, min(100.0, 200 * counter_period_s / time_s))


def _list_traces(console: Console, trace: Path, gpu: str, batch_size: int | None) -> None:
    """Print the traces of a user's trace file (``--list --trace FILE``)."""
    traces = load_trace_file(trace, gpu, batch_size=batch_size)
    spec = find_power_spec(gpu)
    console.print(f"traces in {trace} (measured on {spec.name}, power limits {spec.min_power_w:g}-"
                  f"{spec.max_power_w:g} W):")
    for item in traces:
        console.print(f"  {describe_trace(item)}", highlight=False, markup=False)


def _check_straggler_tuning(*, sweep: str | None, power_limit: float | None, sm_clock: int | None,
                            trace: Path | None, model: str, cost: str | None, tune_step: float | None,
                            counter_period: float | None) -> None:
    """A one-line error for an option that ``--tune stragglers`` cannot take."""
    if sweep is not None or power_limit is not None or sm_clock is not None:
        raise ConfigError(f"--tune {STRAGGLER_TUNE} chooses each rank's clock itself; drop --sweep, --power-limit "
                          "and --sm-clock")
    if trace is not None:
        raise ConfigError(f"--tune {STRAGGLER_TUNE} runs on the shipped models; it cannot use --trace yet")
    if model != "auto":
        raise ConfigError(f"--tune {STRAGGLER_TUNE} picks the model itself (calibrated where a trace exists); "
                          "drop --model")
    for flag, value in (("--cost", cost), ("--tune-step", tune_step), ("--counter-period", counter_period)):
        if value is not None:
            raise ConfigError(f"--tune {STRAGGLER_TUNE} does not use {flag} (it keeps each rank just ahead of the "
                              "slowest one, and its energy is exact)")


def _simulate_stragglers(console: Console, job: JobConfig, json_out: Path | None) -> dict[str, object]:
    """``--tune stragglers``: the job without and with per-rank slowdown, printed (and written to ``json_out``);
    returns the result as JSON values."""
    simulate_stragglers.check_job(job)
    if json_out is not None:
        check_json_path(json_out)
    with progress_bar(2 * job.steps, job.gpus, simulate_stragglers.PROGRESS_GPU_STEPS) as progress:
        run = simulate_stragglers.run_stragglers(job, progress)
    data = {"schema": SIMULATE_SCHEMA, **simulate_stragglers.print_stragglers(console, run)}
    if json_out is not None:
        _write_json(json_out, data)
        console.print(f"results written to {json_out}")
    return data


def _check_tuning(tune: str | None, cost: str, tune_step: float, sweep: str | None, power_limit: float | None,
                  sm_clock: int | None) -> CostMetric | None:
    """The cost metric of ``--tune`` (``None`` without it), or a one-line error for a request that cannot run."""
    metric = parse_cost(cost)
    if tune is None:
        return None
    if tune not in TUNE_KNOBS:
        raise ConfigError(f"--tune must be one of {', '.join(TUNE_KNOBS)}, got {tune!r} (or {STRAGGLER_TUNE}, with "
                          "--straggler, to slow down the ranks that wait for a straggler)")
    if sweep is not None or power_limit is not None or sm_clock is not None:
        raise ConfigError("--tune chooses the settings itself; drop --sweep, --power-limit and --sm-clock")
    check_finite("--tune-step", tune_step)
    if tune_step <= 0:
        raise ConfigError(f"--tune-step must be > 0 W, got {tune_step:g}")
    return metric


def _write_json(path: Path, data: dict[str, object]) -> None:
    check_json_path(path)  # again: the folder may have gone while the simulation ran
    try:
        write_json_atomic(path, data)
    except OSError as exc:
        raise ConfigError(f"--json {path}: cannot write it ({exc.strerror or exc})") from None


def _setting(result: SettingResult) -> str:
    text = f"{result.power_limit_w:g} W"
    return text + (f", SM {result.sm_clock_mhz} MHz" if result.sm_clock_mhz is not None else "")
