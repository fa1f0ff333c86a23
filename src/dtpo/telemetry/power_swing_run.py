"""The power swing of one run, from its power timelines and its step marks: what ``dtpo report --power-swing``
prints and the HTML report's swing section draws.

Per device (every GPU; on a machine without GPUs, every device the run measured, its CPU and DRAM modelled and so
*estimated*) and for the job's sum: the figures of :mod:`dtpo.telemetry.power_swing`; the step rate and the
communication gaps from the record's step marks; the mean cross-rank correlation; the fleet figures of
:mod:`dtpo.telemetry.power_fleet` and the what-ifs of :mod:`dtpo.telemetry.power_whatif` on the job's sum.

Ranks' timelines are put on one clock by the Unix time of each one's first sample (the record keeps it); where
a rank's is missing they are taken to start together, and the notes say so. A run's power limit is the one the
record names for its GPUs; without it the highest power measured stands in, and the notes say that too.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import numpy as np

from dtpo.core.errors import ConfigError
from dtpo.core.record import RunRecord
from dtpo.core.totals import measured_steps
from dtpo.telemetry.power_fleet import FleetFigures, GridSpec, Verdict, fleet_figures, judge
from dtpo.telemetry.power_swing import (
    SOURCE_AVERAGING_S,
    PowerSeries,
    SwingFigures,
    UniformGrid,
    align,
    analyse,
    analyse_grid,
    mean_correlation,
)
from dtpo.telemetry.power_whatif import (
    DEFAULT_BUFFER_STEPS,
    WhatIf,
    energy_buffer,
    fill_gaps,
    power_floor,
    ramp_limiter,
)
from dtpo.telemetry.report.data import PowerTimeline, RunData

DEFAULT_FLEET_GPUS = 10_000
FALLBACK_STEP_S = 2.0  # buffer sizing when the run has no step marks


@dataclass(frozen=True)
class WhatIfFigures:
    """A what-if on the job's sum and the swing figures of the power it leaves.

    Attributes:
        what_if: The mitigation and its energy cost.
        figures: The swing figures of the power the grid would see.
    """

    what_if: WhatIf
    figures: SwingFigures


@dataclass
class RunSwing:
    """The power swing of one run.

    Attributes:
        label: The run's name.
        devices: Each device's figures (:attr:`unit` says whether they are GPUs).
        unit: ``"GPU"``, or ``"device"`` on a run that measured no GPU.
        job: The figures of all devices' power summed.
        correlation: The mean cross-rank correlation of the units' power (``None`` with one unit).
        step_rate_hz: Measured steps per second (the median step's), if the record has steps.
        limit_w: The job's power limit (the sum of its units').
        fleet: The job's units scaled to a fleet.
        what_ifs: Mitigations on the job's sum.
        verdicts: A grid spec's checks, if one was given.
        estimated: True where any device's power is modelled.
        simulated: True where the power comes from simulated GPUs.
        notes: What the figures rest on, in words.
    """

    label: str
    devices: list[SwingFigures]
    unit: str
    job: SwingFigures
    correlation: float | None
    step_rate_hz: float | None
    limit_w: float
    fleet: FleetFigures
    what_ifs: list[WhatIfFigures] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)
    estimated: bool = False
    simulated: bool = False
    notes: list[str] = field(default_factory=list)


def device_series(record: RunRecord, timelines: list[PowerTimeline]) -> tuple[list[PowerSeries], list[float]]:
    """Every device's timeline as a :class:`PowerSeries`, and the offset that puts each on the Unix clock."""
    series, offsets = [], []
    for tl in timelines:
        rank = next((r for r in record.ranks if r.rank == tl.rank), None)
        infos = {d.get("name"): d for d in ((rank.energy or {}).get("devices") or [] if rank else [])}
        for device, watts in tl.watts.items():
            info = infos.get(device, {})
            source = str(info.get("source", "modelled" if "modelled" in device else ""))
            series.append(PowerSeries(
                name=f"rank {tl.rank} / {device}", t_s=np.asarray(tl.t_s, dtype=float),
                watts=np.asarray(watts, dtype=float), source=source,
                estimated=bool(info.get("estimated", device in tl.estimated)),
                averaging_s=SOURCE_AVERAGING_S.get(source, 0.0), kind=str(info.get("kind", "gpu"))))
            offsets.append(tl.started_at if tl.started_at is not None else 0.0)
    return series, offsets


def step_rate(record: RunRecord) -> float | None:
    """Steps per second of the median measured step over all ranks (``None`` without measured steps)."""
    times = [s.step_s for r in record.ranks for s in measured_steps(r) if s.step_s > 0]
    return 1.0 / statistics.median(times) if times else None


def communication_gaps(record: RunRecord) -> list[tuple[float, float]]:
    """Rank 0's communication gaps (its step tail: sync wait and exposed communication) in Unix time, from the
    measured steps' marks; empty where steps have no start time or no tail."""
    ranks = sorted(record.ranks, key=lambda r: r.rank)
    if not ranks:
        return []
    gaps = []
    for s in measured_steps(ranks[0]):
        tail = s.tail_s if s.tail_s is not None else (s.sync_wait_s or 0.0) + (s.comm_exposed_s or 0.0)
        if s.started_at is None or not tail or tail <= 0:
            continue
        begin = s.started_at + s.data_wait_s + s.compute_s
        gaps.append((begin, begin + tail))
    return gaps


def power_limit_w(record: RunRecord, units: list[PowerSeries]) -> tuple[float, str]:
    """The job's power limit: the record's limit per GPU times the GPUs, else the sum of each unit's highest power."""
    limits = [r.knobs.power_limit_w for r in record.ranks if r.knobs is not None and r.knobs.power_limit_w]
    gpus = [u for u in units if u.kind == "gpu"]
    if limits and gpus and len(gpus) == len(units):
        return float(max(limits)) * len(gpus), f"power limit {max(limits):g} W per GPU (from the record)"
    peak = float(sum(np.nanmax(u.watts) for u in units))
    return peak, "no power limit in the record: the highest power each device drew stands in for its limit"


def swing_of_run(data: RunData, fleet_gpus: int | None = None, spec: GridSpec | None = None) -> RunSwing:
    """The power swing of a run (see the module's docstring).

    Args:
        data: The run, as the report loads it.
        fleet_gpus: The fleet size to extrapolate to (default: the spec's, else :data:`DEFAULT_FLEET_GPUS`).
        spec: A grid spec to judge the run against.

    Raises:
        ConfigError: The run has no power timeline, or too few readings to analyse.
    """
    record = data.record
    if not data.power:
        raise ConfigError(f"{data.path} has no power timeline (energy was not measured, or the sampler was off)")
    series, offsets = device_series(record, data.power)
    notes = []
    if any(tl.started_at is None for tl in data.power) and len(data.power) > 1:
        notes.append("a rank's timeline has no start time: the ranks' timelines are taken to start together")
        offsets = [0.0] * len(series)
    units = [s for s in series if s.kind == "gpu"] or series
    limit, limit_note = power_limit_w(record, units)
    notes.append(limit_note)
    try:
        return swing_of(data.label, series, offsets, step_rate(record), communication_gaps(record), limit,
                        fleet_gpus, spec, notes)
    except ValueError as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"{data.path}: cannot analyse its power timeline ({exc})") from None


def swing_of(label: str, series: list[PowerSeries], offsets: list[float], rate: float | None,
             gaps: list[tuple[float, float]], unit_limit_w: float, fleet_gpus: int | None = None,
             spec: GridSpec | None = None, notes: list[str] | None = None) -> RunSwing:
    """The power swing of timelines already read (what :func:`swing_of_run` does once it has read a run).

    Args:
        label: What to call the run.
        series: Every device's timeline.
        offsets: Added to each series' times to put them on one clock (the clock of ``gaps``).
        rate: Steps per second, if known.
        gaps: Communication gaps on that clock.
        unit_limit_w: The summed power limit of the units (GPUs, else every device).
        fleet_gpus: The fleet size to extrapolate to (default: the spec's, else :data:`DEFAULT_FLEET_GPUS`).
        spec: A grid spec to judge against.
        notes: What the caller's figures rest on, kept first in the result's notes.

    Raises:
        ValueError: Too few readings, or timelines that do not overlap.
    """
    notes = list(notes or [])
    gpus = [i for i, s in enumerate(series) if s.kind == "gpu"]
    chosen = gpus or list(range(len(series)))
    unit = "GPU" if gpus else "device"
    if not gpus:
        notes.append("no GPU in this run: every measured device is analysed, and the fleet figures scale a device")
    devices = [analyse(series[i], rate) for i in chosen]
    notes += list(dict.fromkeys(f"{d.name}: {d.grid.note}" for d in devices if d.grid.resampled))[:3]
    aligned = align(series, offsets)
    notes.append(aligned.note)
    rows = aligned.watts
    correlation = mean_correlation(rows[chosen]) if len(chosen) > 1 else None
    total = rows.sum(axis=0)
    dt = float(aligned.t_s[1] - aligned.t_s[0])
    grid = UniformGrid(dt, total, max(d.grid.effective_dt_s for d in devices), any(d.grid.resampled for d in devices),
                       aligned.note)
    estimated = any(s.estimated for s in series)
    job_series = PowerSeries(f"job ({len(series)} device(s) summed)", aligned.t_s, total,
                             source=", ".join(sorted({s.source for s in series if s.source})), estimated=estimated,
                             averaging_s=max(s.averaging_s for s in series))
    job = analyse_grid(job_series, grid, rate)
    limit = unit_limit_w + float(sum(np.nanmax(s.watts) for i, s in enumerate(series) if i not in chosen))
    if spec is not None and fleet_gpus is None:
        fleet_gpus = spec.gpus
    fleet = fleet_figures(devices, correlation, DEFAULT_FLEET_GPUS if fleet_gpus is None else fleet_gpus)
    what_ifs = [WhatIfFigures(w, analyse_grid(job_series, UniformGrid(dt, w.watts, grid.effective_dt_s,
                                                                      grid.resampled, grid.note), rate))
                for w in run_what_ifs(aligned.t_s, total, dt, limit, job.swing_w, rate, gaps)]
    if not any(w.what_if.name.startswith("fill") for w in what_ifs):
        notes.append("gap filling not computed: no communication gap in the step marks covers a sample of the "
                     "timeline")
    return RunSwing(label=label, devices=devices, unit=unit, job=job, correlation=correlation, step_rate_hz=rate,
                    limit_w=limit, fleet=fleet, what_ifs=what_ifs,
                    verdicts=judge(spec, job, fleet) if spec is not None else [], estimated=estimated,
                    simulated=any(s.source == "simulated" for s in series), notes=notes)


def run_what_ifs(t_s: np.ndarray, watts: np.ndarray, dt_s: float, limit_w: float, swing_w: float,
                 step_rate_hz: float | None, gaps: list[tuple[float, float]]) -> list[WhatIf]:
    """The default what-ifs on a job's summed power: a floor, the ramp limiter, a buffer sized to carry
    :data:`DEFAULT_BUFFER_STEPS` steps of the swing, and gap filling where the step marks give gaps."""
    step_s = 1.0 / step_rate_hz if step_rate_hz else FALLBACK_STEP_S
    out = [power_floor(watts, dt_s, limit_w), ramp_limiter(watts, dt_s, limit_w),
           energy_buffer(watts, dt_s, capacity_j=DEFAULT_BUFFER_STEPS * max(swing_w, 0.0) * step_s,
                         tau_s=max(10 * step_s, 1.0))]
    filled = fill_gaps(watts, t_s, dt_s, gaps)
    if filled is not None:
        out.append(filled)
    return out
