"""Concluding a launched run: make sure its record exists, print its summary."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from dtpo.core.record import RECORD_FILE, RunRecord
from dtpo.core.totals import record_from_partials
from dtpo.dist.launch import LaunchOutcome
from dtpo.telemetry.summary import make_console, print_summary


def conclude_run(outcome: LaunchOutcome, console: Console | None = None, quiet: bool = False) -> RunRecord | None:
    """After the workers of this node exit: load (or, for a failed run, assemble) the record and print it.

    Returns:
        The record, or ``None`` when this node holds none (a node other than rank 0's of a completed run,
        or a run that failed before measuring anything).
    """
    console = console or make_console()
    path = Path(outcome.run_dir) / RECORD_FILE
    record: RunRecord | None = None
    if not outcome.failed and path.is_file():
        record = RunRecord.load(path)
    elif outcome.failed:
        record = record_from_partials(outcome.run_dir, "failed", outcome.message)
        if record is not None:
            record.save(outcome.run_dir)
    if record is not None and not quiet:
        print_summary(record, console, record_path=str(path))
    return record
