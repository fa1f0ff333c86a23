"""The grid-signal part of a train run's section in the HTML report (``--grid-signal``): a figure and a table.

The figure has two panels over the run's hours in the signal's time: the signal (carbon intensity or price) of
each interval the run spanned, with the threshold a pause chose where there is one; and what the run did in each
stretch: the power limit it held (throttle), or running and paused (pause), the sweep or measuring at the start
shaded. The table compares the cost as measured with the estimate against a signal-blind run.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from matplotlib.figure import Figure

from dtpo.core.record_sections import GridSection
from dtpo.telemetry.report.data import RunData
from dtpo.telemetry.report.markup import Html, Page, badge, figure, para, table
from dtpo.telemetry.report.svg import BLUE, GREY, VERMILLION, render
from dtpo.telemetry.summary import grid_summary

PAUSED_LEVEL = 0.0
RUNNING_LEVEL = 1.0


def _hours(section: GridSection) -> list[tuple[float, float, dict[str, Any]]]:
    """Each segment of the record as (start, end) in hours from the run's start, in the signal's time."""
    start = datetime.fromisoformat(section.signal["start"])
    out = []
    for segment in section.intervals:
        begin = (datetime.fromisoformat(segment["start"]) - start).total_seconds() / 3600
        out.append((begin, begin + segment["seconds"] / 3600, segment))
    return out


def grid_svg(section: GridSection) -> str | None:
    """The signal over the run (top) and the setting held in each stretch (bottom); ``None`` without intervals."""
    values = section.signal.get("values") or []
    if not values or not section.intervals or "start" not in section.signal:
        return None
    stretches = _hours(section)
    interval_h = float(section.signal["interval_s"]) / 3600
    start = datetime.fromisoformat(section.signal["start"])
    values_from = datetime.fromisoformat(section.signal.get("values_from") or section.signal["start"])
    anchor_start_h = (values_from - start).total_seconds() / 3600
    pause = section.policy == "pause"
    unit = section.signal.get("unit", "")

    def draw(fig: Figure) -> None:
        top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(1.4, 1))
        xs = [anchor_start_h + k * interval_h for k in range(len(values) + 1)]
        decided = "; decisions on its forecast" if section.signal.get("decided_on") == "forecast" else ""
        top.stairs(values, xs, color=GREY, lw=1.3, label=f"signal (actual values{decided})")
        thresholds = [(b, e, s["decision"]["threshold"]) for b, e, s in stretches
                      if s.get("decision") and s["decision"].get("threshold") is not None]
        for i, (b, e, value) in enumerate(thresholds):
            top.hlines(value, b, e, color=VERMILLION, lw=1.0, ls="--", label="threshold chosen" if i == 0 else None)
        if section.deadline_h is not None:
            for ax in (top, bottom):
                ax.axvline(section.deadline_h, color="#444444", lw=0.8, ls=":")
            top.text(section.deadline_h, 1.0, " deadline", transform=top.get_xaxis_transform(), va="top", fontsize=8)
        top.set_ylabel(unit)
        top.set_title(f"grid signal over the run ({section.signal.get('source', '')})")
        top.legend(fontsize=7, loc="upper right")
        for b, e, segment in stretches:
            phase = segment["phase"]
            if pause:
                level = PAUSED_LEVEL if phase == "paused" else RUNNING_LEVEL
            else:
                level = segment.get("power_limit_w")
            if level is None:
                continue
            colour = VERMILLION if phase == "paused" else GREY if phase in ("sweep", "measure", "resumed") else BLUE
            bottom.hlines(level, b, e, color=colour, lw=4)
        if pause:
            bottom.set_yticks([PAUSED_LEVEL, RUNNING_LEVEL], ["paused", "running"])
            bottom.set_ylim(-0.5, 1.5)
        else:
            bottom.set_ylabel("power limit (W)")
        bottom.set_xlabel("hours from the run's start, signal time (grey: measuring at the start)")
        bottom.set_title("what the run did")

    return render(draw, (9.0, 3.8))


def grid_part(page: Page, data: RunData, sid: str, level: int) -> list[Html]:
    """The run's grid schedule (nothing where the run followed no grid signal)."""
    section = next((r.grid for r in data.record.ranks if r.grid is not None), None)
    if section is None:
        return []
    label = badge("simulated", "sim") if section.source == "simulated" else Html("")
    out = [page.heading(level, f"{sid}-grid", "Grid signal", label),
           para(f"{section.policy.capitalize()}: {grid_summary(data.record) or ''}")]
    svg = grid_svg(section)
    if svg is not None:
        what = ("running (blue) or paused (red)" if section.policy == "pause"
                else "the power limit held in each stretch (blue)")
        out.append(figure(f"{sid}-grid-plot", svg, f"Top: the signal in each interval the run spanned (dashed: the "
                          f"threshold a pause decision chose). Bottom: {what}; grey: measuring the run's own figures "
                          "before the first decision. Dotted: the deadline."))
    outcome = section.outcome or {}
    estimate = outcome.get("estimated")
    if outcome:
        unit = outcome.get("cost_unit", "")
        rows = [("as measured", f"{outcome['cost']:.4g} {unit}", f"{outcome['energy_j']:.4g} J",
                 f"{outcome['finished_h']:.3g} h", outcome.get("energy_source", ""))]
        if estimate:
            blind_h = estimate.get("blind_finished_h")
            rows += [("replayed (estimate)", f"{estimate['cost']:.4g} {unit}", f"{estimate['energy_j']:.4g} J", "",
                      estimate["note"]),
                     ("signal-blind (estimate)", f"{estimate['blind_cost']:.4g} {unit}",
                      f"{estimate['blind_energy_j']:.4g} J", "" if blind_h is None else f"{blind_h:.3g} h",
                      f"{100 * estimate['saving']:+.1f} % saved by the schedule")]
        out.append(table(("", "cost", "energy", "finished", "note"), rows))
    return out
