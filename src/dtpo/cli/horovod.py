"""``dtpo horovod-timeline FILE``: a Horovod timeline read into dtpo's straggler table and trace.

Horovod (``HOROVOD_TIMELINE=file.json``) records when each rank asked for each tensor's collective; the command
derives the steps from it (:mod:`dtpo.telemetry.horovod_timeline`), prints per rank how often it was the last
to be ready and how late it was, and per step which rank was last, and writes a trace in dtpo's format (pid =
rank) beside the timeline (``<stem>.dtpo-trace.json``; ``--out`` names another file). ``--json FILE`` writes
the figures. dtpo does not depend on Horovod: the file is all it reads.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from dtpo.core.errors import ConfigError
from dtpo.core.record import write_json_atomic
from dtpo.telemetry.horovod_timeline import (
    DEFAULT_TIE_S,
    StragglerReport,
    analyse,
    default_trace_path,
    read_timeline,
    summary,
    trace_document,
)
from dtpo.telemetry.summary import make_console

log = logging.getLogger(__name__)

DEFAULT_TIE_MS = DEFAULT_TIE_S * 1e3
MAX_STEP_ROWS = 20  # per-step rows printed; beyond, the steps whose late rank led by most (all in --json)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def rank_table(report: StragglerReport) -> Table:
    """Per rank: how often it was the late rank, its lateness (mean, median, max) and its wait for the last."""
    table = Table(title=f"Horovod stragglers: {len(report.measured)} steps of {report.kind}", title_justify="left",
                  box=box.SIMPLE_HEAD)
    for column in ("rank", "steps", "last", "last %", "mean late", "median late", "max late", "mean wait"):
        table.add_column(column, justify="right")
    worst = max(report.ranks, key=lambda r: (r.last, r.mean_lateness_s))
    for r in report.ranks:
        style = "bold red" if r is worst and r.last else None
        table.add_row(str(r.rank), str(r.steps), str(r.last), f"{100 * r.last_share:.0f}%", _ms(r.mean_lateness_s),
                      _ms(r.median_lateness_s), _ms(r.max_lateness_s), _ms(r.mean_wait_s), style=style)
    return table


def step_table(report: StragglerReport) -> Table:
    """Per step: the late rank, how far behind the next rank it was, and the spread of readiness."""
    steps = report.measured
    shown = steps if len(steps) <= MAX_STEP_ROWS else sorted(
        sorted(steps, key=lambda s: s.lead_s, reverse=True)[:MAX_STEP_ROWS], key=lambda s: s.index)
    title = "per step" if shown is steps else f"per step: the {MAX_STEP_ROWS} with the largest lead (all in --json)"
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    for column in ("step", "tensors", "late rank", "lead", "spread", "step time"):
        table.add_column(column, justify="right")
    for s in shown:
        spread = max(s.lateness_s().values(), default=0.0)
        table.add_row(str(s.index), str(len(s.negotiations)), "tie" if s.late_rank is None else str(s.late_rank),
                      _ms(s.lead_s), _ms(spread), _ms((s.end_us - s.start_us) / 1e6))
    return table


def caption(report: StragglerReport) -> str:
    """What the figures rest on: steps left out, the tie threshold, a truncated file."""
    parts = [f"{len(report.steps)} steps derived (a step: one negotiation of each {report.kind} tensor); "
             f"readiness within {_ms(report.tie_s)} of the last rank's is a tie"]
    if report.cached:
        parts.append(f"{report.cached} steps negotiated by Horovod's response cache have no per-rank ticks "
                     "(HOROVOD_CACHE_CAPACITY=0 records them)")
    if report.incomplete:
        parts.append(f"{report.incomplete} incomplete steps left out")
    if report.timeline.truncated:
        parts.append("the file was cut short (read up to its last whole event)")
    return "; ".join(parts)


def print_report(console: Console, report: StragglerReport) -> None:
    """The straggler tables and their caption."""
    console.print(rank_table(report))
    if report.measured:
        console.print(step_table(report))
    console.print(escape(caption(report)), style="dim")


def _check_file(path: Path, flag: str) -> None:
    if path.is_dir():
        raise ConfigError(f"{flag} {str(path)!r} is a directory; name a file")
    folder = path.absolute().parent
    if not folder.is_dir():
        raise ConfigError(f"{flag} {path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise ConfigError(f"{flag} {path}: cannot write in {folder}")


def horovod_command(
    timeline: Annotated[Path, typer.Argument(help="The timeline Horovod wrote (HOROVOD_TIMELINE=FILE); a file cut "
                                             "short is read up to its last whole event.", show_default=False)],
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Write the trace here (default: "
                                             "<stem>.dtpo-trace.json beside the timeline).",
                                             show_default=False)] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write the figures as JSON to this file.",
                                                  show_default=False)] = None,
    op: Annotated[str | None, typer.Option("--op", help="The operation whose negotiations make the steps "
                                           "(ALLREDUCE, ADASUM, ALLGATHER...; default: the one negotiated most).",
                                           show_default=False)] = None,
    tie_ms: Annotated[float, typer.Option("--tie-ms", help="Readiness within this many ms of the last rank's names "
                                          "no late rank (Horovod takes requests once per HOROVOD_CYCLE_TIME).")
                      ] = DEFAULT_TIE_MS,
) -> None:
    """Read a Horovod timeline: which rank was ready last in each step, how late each rank was, and a trace."""
    if not (math.isfinite(tie_ms) and tie_ms >= 0):
        raise ConfigError(f"--tie-ms must be a finite number >= 0, got {tie_ms:g}")
    read = read_timeline(timeline)
    target = out if out is not None else default_trace_path(timeline)
    _check_file(target, "--out")
    if json_out is not None:
        _check_file(json_out, "--json")
    report = analyse(read, op, tie_ms / 1e3)
    print_report(make_console(), report)
    try:
        write_json_atomic(target, trace_document(report, timeline))
        if json_out is not None:
            write_json_atomic(json_out, summary(report))
    except OSError as exc:
        raise ConfigError(f"cannot write {exc.filename or target} ({exc.strerror or exc})") from None
    log.debug("horovod timeline %s: %d steps, trace %s", timeline, len(report.steps), target)
    typer.echo(f"trace: {target}")
    if json_out is not None:
        typer.echo(f"figures: {json_out}")
