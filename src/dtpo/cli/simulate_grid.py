"""``dtpo simulate grid``: a job on simulated GPUs scheduled against a grid signal (carbon intensity or price).

The simulated job is swept over its power limits (noise-free; :func:`dtpo.simulation.grid.measure_settings`), then
a job of ``--job-hours`` at the default setting runs from ``--start`` by ``--deadline`` under each policy of
``--grid-policy`` (:mod:`dtpo.tune.grid_policy`): signal-blind, throttle, pause, and the oracles that know the
actual trace. The policies decide on the file's forecast where it has one; every plan is accounted on its actual
values (the forecast itself where the file has nothing else, said in the output). It prints each policy's cost
(g CO2e, or the price's currency), energy and finish time against signal-blind, and the setting over time as a strip
under the signal's. Every figure is simulated.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from dtpo.core.errors import ConfigError
from dtpo.core.simulate_config import SimulateConfig
from dtpo.energy.grid_signal import GridSignal, load_grid_signals
from dtpo.simulation.grid import GridRun, default_setting, measure_settings, run_grid_job
from dtpo.simulation.job import JobConfig
from dtpo.tune.cost import JOULES_PER_KWH
from dtpo.tune.grid_policy import GRID_POLICIES, PAUSE, GridOutcome, GridSetting

__all__ = ["GRID_SCHEMA", "grid_strips", "parse_start", "simulate_grid"]

GRID_SCHEMA = "dtpo.simulate.grid/1"
LEVELS = "▁▂▃▄▅▆▇█"
PAUSED = "·"
ORACLE_WORDS = {"oracle-throttle": "oracle: best power limits", "oracle-pause": "oracle: best pauses",
                "oracle": "oracle: both"}


def parse_start(text: str | None) -> datetime | None:
    """``--start`` as a UTC time (a time without a zone is UTC); ``None`` for the signal's start.

    Raises:
        ConfigError: Not an ISO time.
    """
    if text is None:
        return None
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"--start must be an ISO time such as 2023-03-14T18:00Z, got {text!r}") from None
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


def _signals(path: Path) -> tuple[GridSignal, GridSignal | None, str]:
    """The values the plans are accounted on, the forecast they are decided on (``None``: the same), and a line
    saying which is which."""
    signals = load_grid_signals(path)
    actual, forecast = signals.get("actual"), signals.get("forecast")
    if actual is not None and forecast is not None:
        return actual, forecast, "policies decide on the file's forecast; every plan is accounted on its actual values"
    if actual is not None:
        return actual, None, "the file has no forecast: policies decide on the actual values (a perfect forecast)"
    assert forecast is not None
    return forecast, None, "the file has only a forecast: policies decide on it and are accounted on it too"


def simulate_grid(console: Console, config: SimulateConfig, job_config: JobConfig) -> dict[str, Any]:
    """Schedule the simulated job against ``--grid-signal``, print every policy against signal-blind, and return
    the result as JSON values (written to ``--json`` by the caller's rules).

    Raises:
        ConfigError: A bad signal file, start, deadline or job (one line).
    """
    grid = config.grid
    assert grid.signal is not None and grid.deadline is not None
    actual, forecast, decided = _signals(grid.signal)
    start = parse_start(grid.start)
    policies = GRID_POLICIES if grid.policy == "all" else ("blind", grid.policy)
    settings = measure_settings(job_config)
    run = run_grid_job(settings, actual, forecast=forecast, job_hours=grid.hours, deadline_hours=grid.deadline,
                       start=start, policies=policies, resume_s=grid.resume_s)
    spec = f"{job_config.gpus} x {job_config.gpu}, {job_config.workload or 'the trace'}"
    console.print(outcomes_table(run, settings, actual, spec))
    console.print(f"{decided}. Blind: {settings[default_setting(settings)].name} throughout, from the start. "
                  f"Each resume after a pause costs {run.job.resume_s:g} s. Every figure is simulated.",
                  style="dim", highlight=False)
    console.print(Text("setting over time (one mark per signal interval; higher = higher power limit, "
                       f"{PAUSED} = paused):", style="bold"))
    for line in grid_strips(run, settings, actual, console.width):
        console.print(line, highlight=False, markup=False, no_wrap=True, crop=False)
    return result_json(run, settings, actual, job_config, decided)


def outcomes_table(run: GridRun, settings: Sequence[GridSetting], actual: GridSignal, spec: str) -> Table:
    """One row per policy: cost, saving, energy, finish time and slowdown against blind, pauses, settings used."""
    hours = run.job.deadline_s / 3600
    unit = actual.per_kwh_name
    table = Table(title=f"Grid-aware schedule, simulated {spec}: {run.job.samples * _blind_time(run, settings):,.0f} "
                        f"s of work at the default setting, deadline {hours:g} h from {run.start:%Y-%m-%d %H:%M} UTC",
                  title_justify="left", caption=f"signal: {actual.source} ({actual.unit}). Oracles know the actual "
                  "trace (dynamic programming): the best any policy could do.", caption_justify="left")
    for column in ("policy", unit, "saved", "kWh", "finish h", "slower", "pauses", "settings held (share of time)"):
        table.add_column(column, justify="left" if column in ("policy", "settings held (share of time)") else "right",
                         no_wrap=column != "settings held (share of time)")
    for name, outcome in run.outcomes.items():
        used = sorted(outcome.settings_used.items(), key=lambda item: -item[1])
        total = sum(seconds for _, seconds in used) or 1.0
        held = ", ".join(f"{setting} {seconds / total:.0%}" for setting, seconds in used)
        late = "" if outcome.finished else " [red]late[/]"
        table.add_row(ORACLE_WORDS.get(name, name), f"{outcome.cost:,.0f}",
                      "-" if name == "blind" else f"{run.saving(name):.1%}",
                      f"{outcome.energy_j / JOULES_PER_KWH:,.1f}", f"{outcome.time_s / 3600:.2f}{late}",
                      "-" if name == "blind" else f"{run.slowdown(name):+.1%}", str(outcome.pauses), held)
    return table


def _blind_time(run: GridRun, settings: Sequence[GridSetting]) -> float:
    return settings[default_setting(settings)].time_per_sample_s


def grid_strips(run: GridRun, settings: Sequence[GridSetting], actual: GridSignal, width: int) -> list[str]:
    """The signal and each policy's setting over time as lines of marks, one mark per signal interval, folded to
    ``width`` columns: the signal's height from its lowest to its highest value in the window, a setting's from the
    lowest to the highest power limit, :data:`PAUSED` for a pause, blank once the job is done."""
    count = max(run.job.intervals, *(len(_held(run, outcome)) for outcome in run.outcomes.values()))
    first = actual.index_at(run.start)
    values = actual.values[first:first + count]
    low, high = float(values.min()), float(values.max())
    rows = [("signal", "".join(_level(v, low, high) for v in values))]
    limits = [s.power_limit_w for s in settings]
    for name, outcome in run.outcomes.items():
        marks = "".join(PAUSED if a == PAUSE else _level(settings[a].power_limit_w, min(limits), max(limits))
                        for a in _held(run, outcome))
        rows.append((ORACLE_WORDS.get(name, name).replace("oracle: ", "oracle "), marks))
    label = max(len(name) for name, _ in rows) + 1
    span = max(12, width - label - 1)
    deadline = run.job.intervals
    ruler = "".join("|" if i == deadline else "'" if i % max(1, round(3600 * 6 / run.job.interval_s)) == 0 else " "
                    for i in range(count + 1))
    rows.append(("", ruler))
    lines = [f"signal: {low:,.0f} to {high:,.0f} {actual.unit}; power limit: {min(limits):g} to {max(limits):g} W; "
             f"' every 6 h from the start, | the deadline"]
    for offset in range(0, count + 1, span):
        for name, marks in rows:
            lines.append(f"{name:<{label}}{marks[offset:offset + span]}".rstrip())
    return lines


def _held(run: GridRun, outcome: GridOutcome) -> list[int]:
    """The plan's actions up to the interval the job finished in (a plan may name actions past it: they do
    nothing)."""
    if not outcome.finished:
        return outcome.plan
    return outcome.plan[:math.ceil(outcome.time_s / run.job.interval_s - 1e-9)]


def _level(value: float, low: float, high: float) -> str:
    if high <= low:
        return LEVELS[-1]
    return LEVELS[min(len(LEVELS) - 1, int((value - low) / (high - low) * len(LEVELS)))]


def result_json(run: GridRun, settings: Sequence[GridSetting], actual: GridSignal, job_config: JobConfig,
                decided: str) -> dict[str, Any]:
    """The result as JSON values: the signal, the job, the settings measured and every policy's outcome."""
    outcomes = {}
    for name, outcome in run.outcomes.items():
        outcomes[name] = {
            "cost": outcome.cost, "energy_j": outcome.energy_j, "time_s": outcome.time_s if outcome.finished else None,
            "finished": outcome.finished, "pauses": outcome.pauses, "saving_share": run.saving(name),
            "slowdown_share": run.slowdown(name) if outcome.finished else None,
            "settings_used_s": outcome.settings_used,
            "plan": ["pause" if a == PAUSE else settings[a].name for a in _held(run, outcome)]}
    first = actual.index_at(run.start)
    count = max(run.job.intervals, *(len(_held(run, o)) for o in run.outcomes.values()))
    return {"schema": GRID_SCHEMA, "simulated": True, "config": asdict(job_config), "gpu": job_config.gpu,
            "workload": job_config.workload,
            "signal": {"source": actual.source, "unit": actual.unit, "kind": actual.kind,
                       "interval_s": actual.interval_s, "decided_on": run.forecast_source, "note": decided,
                       "values": [float(v) for v in actual.values[first:first + count]]},
            "job": {"start": run.start.isoformat(), "samples": run.job.samples, "deadline_s": run.job.deadline_s,
                    "interval_s": run.job.interval_s, "resume_s": run.job.resume_s},
            "settings": [asdict(s) for s in settings],
            "default_setting": settings[default_setting(settings)].name, "outcomes": outcomes}
