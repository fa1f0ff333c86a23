"""The summary table printed at the end of a run."""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from dtpo.core.record import RunRecord
from dtpo.core.totals import measured_steps


def _pct(part: float | None, whole: float) -> str:
    return "n/a" if part is None or whole <= 0 else f"{100 * part / whole:.1f}%"


def make_console() -> Console:
    """A console for tables: the terminal's width on a terminal, 120 columns in a log."""
    return Console() if sys.stdout.isatty() else Console(width=120)


def format_value(m: dict[str, Any] | None) -> str:
    """A measurement dict as text, with its unit and an *estimated* label where it is modelled."""
    if not m or m.get("value") is None:
        return "n/a"
    value, unit = m["value"], m["unit"]
    if unit == "fraction":
        text = f"{100 * value:.2f}%"
    elif unit == "s":
        text = f"{value * 1000:.2f} ms" if value < 1 else f"{value:.2f} s"
    elif unit == "FLOP/s":
        text = f"{value / 1e9:,.1f} GFLOP/s"
    elif isinstance(value, float):
        text = f"{value:,.4g} {unit}" if abs(value) < 1000 else f"{value:,.0f} {unit}"
    else:
        text = f"{value:,} {unit}"
    return text + (" (estimated)" if m.get("source") == "estimated" else "")


def breakdown_table(record: RunRecord) -> Table:
    """Per-rank breakdown of the measured steps."""
    table = Table(title=f"dtpo run {record.run_id} ({record.status})", title_justify="left")
    for name in ("rank", "node", "samples/s", "step", "data", "compute", "comm", "sync", "optim"):
        table.add_column(name, justify="left" if name == "node" else "right", no_wrap=True)
    for rank in record.ranks:
        steps = measured_steps(rank)
        wall = sum(s.step_s for s in steps)
        if not steps or wall <= 0:
            table.add_row(str(rank.rank), rank.node, *(["-"] * 7))
            continue

        def part(name: str, steps: list = steps, wall: float = wall) -> str:
            values = [getattr(s, name) for s in steps]
            return _pct(None if None in values else sum(values), wall)

        table.add_row(str(rank.rank), rank.node, f"{sum(s.samples for s in steps) / wall:,.1f}",
                      f"{1000 * wall / len(steps):.1f} ms", part("data_wait_s"), part("compute_s"),
                      part("comm_exposed_s"), part("sync_wait_s"), part("optimizer_s"))
    return table


def totals_table(record: RunRecord) -> Table:
    """The run's headline figures."""
    t = record.totals
    table = Table(show_header=False, box=None, padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    devices = sorted({r.device for r in record.ranks})
    rows = [
        ("workers", f"{len(record.ranks)} on {', '.join(devices)}"),
        ("measured steps", format_value(t.get("measured_steps"))),
        ("throughput", format_value(t.get("throughput"))),
        ("step time (median)", format_value(t.get("step_time_s"))),
        ("MFU", format_value(t.get("mfu"))),
        ("communication overhead", format_value(t.get("comm_overhead"))),
        ("sync latency (mean)", format_value(t.get("sync_latency_s"))),
        ("data-loading share", format_value(t.get("data_wait_fraction"))),
    ]
    if "loss_first" in t:
        rows.append(("loss", f"{t['loss_first']['value']:.4f} -> {t['loss_last']['value']:.4f}"))
    rows += energy_rows(record)
    for name, value in rows:
        table.add_row(name, value)
    return table


def energy_rows(record: RunRecord) -> list[tuple[str, str]]:
    """Energy lines of the summary; a modelled figure is labelled *estimated*."""
    e = record.energy
    if not e:
        return [("energy", "not measured")]
    sources = ", ".join(f"{k} {100 * v / max(sum(e['by_source_j'].values()), 1e-12):.0f}%"
                        for k, v in sorted(e["by_source_j"].items()))
    rows = [
        ("energy", f"{format_value(e['energy_j'])}  [{sources}]"),
        ("average power", format_value(e["average_power_w"])),
        ("energy per sample", format_value(e["energy_per_sample_j"])),
        ("emissions", f"{format_value(e['co2_g'])} at {e['co2_g'].get('note', '')}"),
    ]
    if "cost" in e:
        rows.append(("cost", format_value(e["cost"])))
    if e.get("lost"):
        rows.append(("energy lost", "; ".join(f"{k}: {v}" for k, v in e["lost"].items())))
    return rows


def print_summary(record: RunRecord, console: Console | None = None, record_path: str | None = None) -> None:
    """Print the breakdown and the headline figures of a run."""
    console = console or make_console()
    console.print(breakdown_table(record))
    console.print("[dim]share of step time: data = waiting for batches, comm = collectives not hidden behind "
                  "backward, sync = waiting for the slowest rank[/dim]")
    console.print(totals_table(record))
    if record.error:
        console.print(f"[red]run failed:[/red] {record.error}")
    if record_path:
        console.print(f"record: {record_path}")
