"""What is written beside a finished run's record: its traces and its HTML report.

One entry point for both writers of a run's end, so they write the same files: the launcher (``dtpo launch``
and ``dtpo train``, once the record is final, restarts included) and the Session itself on rank 0 when no
dtpo launcher runs it. A failure here costs the artifact, never the run: it is logged and the run goes on.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from dtpo.core.errors import DtpoError
from dtpo.core.record import RunRecord
from dtpo.telemetry.trace import write_traces

log = logging.getLogger(__name__)


def telemetry_settings(record: RunRecord) -> dict[str, object]:
    """The run's ``telemetry`` configuration section as recorded (defaults for records without one)."""
    section = record.config.get("telemetry") if isinstance(record.config, dict) else None
    return {"trace": True, "report": True, **(section or {})}


REPORT_FILE = "report.html"


def write_artifacts(record: RunRecord, run_dir: str | os.PathLike[str], *, trace: bool | None = None,
                    report: bool | None = None) -> list[Path]:
    """Write the traces and the HTML report of ``record`` into ``run_dir`` (unless turned off in its
    configuration, or by ``trace`` / ``report``). The report reads the record from ``run_dir``, so call this
    after the record was saved there.

    Returns:
        The paths written.
    """
    settings = telemetry_settings(record)
    written: list[Path] = []
    if trace if trace is not None else settings["trace"]:
        try:
            path = write_traces(record, run_dir)
        except (OSError, ValueError) as exc:
            log.warning("cannot write the traces of %s (%s)", run_dir, exc)
        else:
            if path is not None:
                written.append(path)
    if report if report is not None else settings["report"]:
        path = write_report_beside(run_dir)
        if path is not None:
            written.append(path)
    return written


def write_report_beside(result_dir: str | os.PathLike[str]) -> Path | None:
    """Write ``report.html`` into a run, bench, plan or simulation directory; a failure is logged, not raised.

    Returns:
        The report's path, or ``None`` when it could not be written.
    """
    from dtpo.telemetry.report.html import write_report  # matplotlib: only when a report is written

    try:
        return write_report([Path(result_dir)], Path(result_dir) / REPORT_FILE)
    except (OSError, ValueError, DtpoError) as exc:
        log.warning("cannot write the report of %s (%s)", result_dir, exc)
        return None
