"""``dtpo simulate --tune``: the power tuner that ``dtpo train --tune`` runs, on simulated GPUs in simulated time.

It prints what the tuner did (each setting it measured, with its interval and fate, and the order of visits),
then the result against the oracle (the best candidate of a full noise-free sweep; under a slowdown limit the
search may also hold a setting between two candidates, closer to the limit, and beat it): the cost of the choice, the
profiling steps next to a Zeus-style full sweep's, what profiling cost against staying at the default, and the
whole job's cost next to staying at the default and to holding the oracle from the first step. Every figure is
simulated, never measured.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from dtpo.simulation.data_parallel import SimulatedJob
from dtpo.simulation.tuning import SimulatedTuning, candidate_settings, summary, tune_on_simulated
from dtpo.tune.cost import CostMetric
from dtpo.tune.setting import GpuSetting

ZEUS_STEPS_PER_LIMIT = 50  # Zeus's GlobalPowerLimitOptimizer: 10 warm-up + 40 profiled steps per limit


def run_tuning(job: SimulatedJob, knob: str, cost: CostMetric, step_w: float = 25.0,
               progress: Any = None) -> SimulatedTuning:
    """Tune ``knob`` on the job's GPUs through the job's journaled controller, over the whole job."""
    return tune_on_simulated(job.gpus, cost, knob, job_steps=job.config.steps, step_w=step_w,
                             controller=job.controller, progress=progress)


def settings_table(run: SimulatedTuning, title: str) -> Table:
    """One row per measured setting: steps, figures per sample, cost with its interval, what became of it."""
    report = run.tuner.report()
    table = Table(title=title, title_justify="left")
    for name in ("limit W", "SM MHz", "steps", "warm-up", "ms/sample", "J/sample", "cost", "95 % interval",
                 "status"):
        table.add_column(name, justify="right" if name != "status" else "left", no_wrap=name != "status")
    for row in report["settings"]:
        status = row["status"] + (f": {row['reason']}" if row["reason"] else "")
        style = "bold green" if row["status"] == "chosen" else ""
        table.add_row(f"{row['power_limit_w']:g}", "-" if row["sm_clock_mhz"] is None else str(row["sm_clock_mhz"]),
                      str(row["steps"]), str(row["warmup_steps"]), f"{row['time_per_sample_s'] * 1e3:.4g}",
                      f"{row['energy_per_sample_j']:.4g}", f"{row['cost']:.4g}",
                      f"{row['cost_low']:.4g}-{row['cost_high']:.4g}", status, style=style)
    return table


def visits_line(run: SimulatedTuning) -> str:
    """The order of settings the tuner went through with the steps at each: ``300 W (6) -> 175 W (5) -> ...``."""
    parts: list[str] = []
    last = None
    for seg in run.segments:
        if seg.phase == "hold":
            break
        if seg.setting == last:
            steps = int(parts[-1].rsplit("(", 1)[1].rstrip(")")) + seg.steps
            parts[-1] = f"{seg.setting.label} ({steps})"
        else:
            parts.append(f"{seg.setting.label} ({seg.steps})")
        last = seg.setting
    return " -> ".join(parts)


def result_table(run: SimulatedTuning, job: SimulatedJob, knob: str, cost: CostMetric, step_w: float,
                 found: dict[str, Any]) -> Table:
    """The tuning run against the oracle (``found``: :func:`dtpo.simulation.tuning.summary`) and against a
    Zeus-style full sweep."""
    gpus = job.gpus
    steps = job.config.steps
    best, best_cost, chosen_cost = GpuSetting.from_dict(found["oracle"]), found["oracle_cost"], found["choice_cost"]
    sweep_steps = 1 + ZEUS_STEPS_PER_LIMIT * len(candidate_settings(gpus, knob, step_w))
    profile = run.tuner.profiling_cost() or {}
    table = Table(title="result (simulated; the oracle is the best candidate of a full noise-free sweep; under a "
                        "slowdown limit the search may also pick a setting between candidates)",
                  title_justify="left", show_header=False)
    table.add_column(justify="left")
    table.add_column(justify="left")
    table.add_row("choice", f"{run.choice.label}: {chosen_cost:.4g} {cost.unit} "
                            f"({(chosen_cost / best_cost - 1) * 100:+.2f} % against the oracle)")
    table.add_row("oracle", f"{best.label}: {best_cost:.4g} {cost.unit}")
    table.add_row("profiling", f"{run.profiling_steps} steps (a full sweep at Zeus's 50 steps per setting: "
                               f"{sweep_steps})")
    if profile:
        extra = f"{profile['extra_time_s']:+.1f} s and {profile['extra_energy_j'] / 1e3:+.2f} kJ"
        table.add_row("profiling cost", f"{extra} against the same steps at the default (as the simulation measured)")
    job_cost, default_cost, oracle_cost = found["job_cost"], found["default_job_cost"], found["oracle_job_cost"]
    table.add_row(f"job of {steps:,} steps", f"{job_cost:.4g} {cost.unit.split('/')[0]}: "
                                              f"{(job_cost / default_cost - 1) * 100:+.1f} % against the default, "
                                              f"{(job_cost / oracle_cost - 1) * 100:+.2f} % against the oracle "
                                              "held from the first step")
    return table


def print_tuning(console: Console, run: SimulatedTuning, job: SimulatedJob, knob: str, cost: CostMetric,
                 step_w: float) -> dict[str, Any]:
    """Print the tuning run and return it as plain values for ``--json``."""
    m = job.model
    title = (f"simulated tuning of the {knob}: {job.config.gpus} x {m.spec.name}, {m.workload}, batch "
             f"{m.batch_size}/GPU, noise {job.config.noise:g}, cost: {cost.describe()}")
    console.print(settings_table(run, title))
    console.print(f"visits: {visits_line(run)}")
    for line in run.tuner.history:
        console.print(f"decided: {line}")
    found = summary(run, job.gpus, cost, knob, job.config.steps, step_w)
    console.print(result_table(run, job, knob, cost, step_w, found))
    console.print("All figures are simulated, not measured. Communication and data loading are not modelled.",
                  style="dim")
    return {"tuning": run.tuner.report(), "result": found}
