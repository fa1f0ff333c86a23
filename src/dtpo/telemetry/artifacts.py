"""What is written beside a finished run's record: its traces (and, when asked, its HTML report).

One entry point for both writers of a run's end, so they write the same files: the launcher (``dtpo launch``
and ``dtpo train``, once the record is final, restarts included) and the Session itself on rank 0 when no
dtpo launcher runs it. A failure here costs the artifact, never the run: it is logged and the run goes on.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from dtpo.core.record import RunRecord
from dtpo.telemetry.trace import write_traces

log = logging.getLogger(__name__)


def telemetry_settings(record: RunRecord) -> dict[str, object]:
    """The run's ``telemetry`` configuration section as recorded (defaults for records without one)."""
    section = record.config.get("telemetry") if isinstance(record.config, dict) else None
    return {"trace": True, "report": True, **(section or {})}


def write_artifacts(record: RunRecord, run_dir: str | os.PathLike[str], *, trace: bool | None = None) -> list[Path]:
    """Write the traces of ``record`` into ``run_dir`` (unless turned off in its configuration).

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
    return written
