"""``dtpo report --power-swing RUN`` on the terminal: the run's power swing as rich tables.

Tables: each device's figures (the first :data:`MAX_DEVICE_ROWS`, then the spread over the rest), the job's sum
with its band shares, the fleet figures, the what-ifs with their energy cost, and a grid spec's verdicts. Every
title says whether the power is measured, *estimated* (modelled devices) or *simulated*, and a band the timeline
cannot resolve reads *not seen*.
"""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from dtpo.telemetry.power_swing import BANDS, RAMP_LAGS_S, SwingFigures, share_in, watts_text
from dtpo.telemetry.power_swing_run import RunSwing

MAX_DEVICE_ROWS = 16
STATUS_STYLE = {"pass": "green", "fail": "bold red", "not judged": "yellow"}


def provenance(swing: RunSwing) -> str:
    """``simulated``, ``estimated`` or ``measured``: what the power figures are."""
    return "simulated" if swing.simulated else "estimated" if swing.estimated else "measured"


def watts(value: float | None) -> str:
    """Watts with a unit that fits (W, kW or MW), ``not seen`` for ``None``."""
    return "not seen" if value is None else watts_text(value)


def ramp(value: float | None) -> str:
    """A ramp in W/s (kW/s, MW/s), ``not seen`` where the timeline cannot show it."""
    return "not seen" if value is None else f"{watts(value)}/s"


def share(value: float | None) -> str:
    """A share in per cent, ``not seen`` for ``None``."""
    return "not seen" if value is None else f"{100 * value:.1f} %"


def figures_row(f: SwingFigures) -> list[str]:
    """One timeline's headline figures as table cells."""
    dominant = "none" if f.dominant_hz is None else f"{f.dominant_hz:.3g} Hz"
    return [escape(f.name), escape(f.source + (" (estimated)" if f.estimated else "")), watts(f.mean_w),
            f"{watts(f.p5_w)} / {watts(f.p95_w)}", watts(f.swing_w), f"{100 * f.swing_share:.1f} %",
            *[ramp(f.ramps_w_per_s.get(lag)) for lag in RAMP_LAGS_S], dominant, escape(f.harmonic)]


def figures_table(swing: RunSwing) -> Table:
    """Each device's figures and the job's sum."""
    table = Table(title=f"Power swing of {escape(swing.label)} ({provenance(swing)})", title_justify="left",
                  box=box.SIMPLE_HEAD)
    for column in ("timeline", "source", "mean", "p5 / p95", "swing", "swing %",
                   *[f"ramp {lag:g} s" for lag in RAMP_LAGS_S], "dominant", "against the steps"):
        table.add_column(column, justify="left" if column in ("timeline", "source", "against the steps") else "right")
    shown = swing.devices[:MAX_DEVICE_ROWS]
    for f in shown:
        table.add_row(*figures_row(f))
    rest = swing.devices[MAX_DEVICE_ROWS:]
    if rest:
        swings = sorted(f.swing_w for f in rest)
        table.add_row(f"{len(rest)} more {swing.unit}s", "", "", "", f"{watts(swings[0])} to {watts(swings[-1])}",
                      "", "", "", "", "", style="dim")
    table.add_row(*figures_row(swing.job), style="bold")
    return table


def bands_table(swing: RunSwing) -> Table:
    """The job's oscillating energy by band, with what the timeline can resolve."""
    job = swing.job
    seen = job.resolvable
    table = Table(title=f"Oscillation of the job's power by band (resolves {seen.low_hz:.3g}-{seen.high_hz:.3g} Hz: "
                        f"{escape(seen.why)})", title_justify="left", box=box.SIMPLE_HEAD)
    for column in ("band", "share of the oscillating energy", "seen"):
        table.add_column(column, justify="right")
    lowest, highest = job.bands[0].low_hz, job.bands[-1].high_hz
    table.add_row(f"below {lowest:g} Hz", share(job.below_share), "no" if job.below_share is None else "yes")
    for band in job.bands:
        table.add_row(band.label, share(band.share) + (" of the part seen" if band.seen == "partly" else ""),
                      {"seen": "yes", "partly": "partly", "not seen": "no"}[band.seen],
                      style="yellow" if band.seen == "not seen" else None)
    table.add_row(f"above {highest:g} Hz", share(job.above_share), "no" if job.above_share is None else "yes")
    return table


def fleet_table(swing: RunSwing) -> Table:
    """The job's units scaled to a fleet: incoherent, expected (measured correlation) and coherent bounds."""
    fleet = swing.fleet
    basis = (f"mean cross-rank correlation {fleet.correlation:.2f}" if fleet.measured_correlation
             else f"one {swing.unit} measured: taken as in phase")
    table = Table(title=f"At {fleet.gpus:,} {swing.unit}s ({basis}; mean {watts(fleet.mean_mw * 1e6)}"
                        f"{', estimated' if fleet.estimated else ''})", title_justify="left", box=box.SIMPLE_HEAD)
    for column in ("figure", "independent (sqrt N)", "expected", "in phase (N)"):
        table.add_column(column, justify="right")
    table.add_row("swing", *[watts(v * 1e6) for v in fleet.swing_mw])
    for lag, values in fleet.ramps_mw_per_s.items():
        cells = ["not seen"] * 3 if values is None else [ramp(v * 1e6) for v in values]
        table.add_row(f"ramp over {lag:g} s", *cells)
    return table


def what_if_table(swing: RunSwing) -> Table:
    """Each mitigation on the job's sum: what is left of the swing, and its energy cost."""
    job = swing.job
    table = Table(title="What-ifs on the job's power", title_justify="left", box=box.SIMPLE_HEAD)
    for column in ("what-if", "settings", "swing", "ramp 1 s", "0.1-20 Hz share", "energy cost", "note"):
        table.add_column(column, justify="left" if column in ("what-if", "settings", "note") else "right")
    rows = [("as measured", "", job, 0.0, "")]
    rows += [(w.what_if.name, w.what_if.settings, w.figures, w.what_if.energy_cost_share,
              w.what_if.note + (f"; work delayed {w.what_if.delay_s:.3g} s" if w.what_if.delay_s > 0 else ""))
             for w in swing.what_ifs]
    for name, settings, f, cost, note in rows:
        table.add_row(escape(name), escape(settings), watts(f.swing_w), ramp(f.ramps_w_per_s.get(1.0)),
                      critical_share(f), f"{100 * cost:+.2f} %", escape(note.strip("; ")))
    return table


def verdict_table(swing: RunSwing) -> Table:
    """A grid spec's checks."""
    table = Table(title="Against the grid spec", title_justify="left", box=box.SIMPLE_HEAD)
    for column in ("check", "measured", "limit", "verdict", "because"):
        table.add_column(column)
    for v in swing.verdicts:
        table.add_row(escape(v.check), escape(v.measured), escape(v.limit),
                      f"[{STATUS_STYLE[v.status]}]{v.status}[/]", escape(v.why))
    return table


def print_swing(console: Console, swing: RunSwing) -> None:
    """Every table of the run's power swing, then the notes its figures rest on."""
    console.print(figures_table(swing))
    console.print(bands_table(swing))
    console.print(fleet_table(swing))
    console.print(what_if_table(swing))
    if swing.verdicts:
        console.print(verdict_table(swing))
    label = {"simulated": "every figure is simulated, none measured",
             "estimated": "power is estimated (modelled devices), not read from a counter",
             "measured": "power read from the devices' counters"}[provenance(swing)]
    for line in dict.fromkeys([label, swing.job.grid.note, *swing.notes]):
        console.print(escape(line), style="dim")


def critical_share(f: SwingFigures) -> str:
    """The share of the oscillation in the whole critical band (0.1-20 Hz), saying where only part of it is seen."""
    found = share_in(f.spectrum, f.resolvable, BANDS[0][0], BANDS[-1][1])
    return share(found.share) + (" (part seen)" if found.seen == "partly" else "")
