"""``dtpo report RUN...``: one self-contained HTML report of train runs, benches, plans or simulations.

With one input the report goes beside it (``RUN_DIR/report.html``); with several, to ``report.html`` in the
current directory, with a comparison of them. ``--out FILE`` puts it elsewhere. The file needs nothing else to
be viewed: no scripts, nothing fetched (see :mod:`dtpo.telemetry.report.html`).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Annotated

import typer

from dtpo.core.errors import ConfigError
from dtpo.telemetry.report.html import REPORT_FILE, write_report

log = logging.getLogger(__name__)


def default_out(runs: list[Path]) -> Path:
    """Where the report goes without ``--out``: beside a single input, else ``report.html`` here."""
    if len(runs) == 1:
        only = runs[0]
        return (only if only.is_dir() else only.parent) / REPORT_FILE
    return Path(REPORT_FILE)


def check_out(out: Path, given: bool) -> None:
    """Refuse a report path that cannot take the file, before anything is drawn.

    Raises:
        ConfigError: ``out`` is a directory, its folder does not exist or is not writable.
    """
    flag = "--out " if given else ""
    if str(out) == "" or out.is_dir():
        raise ConfigError(f"{flag}{str(out) or '.'!r} is a directory; name a file, e.g. {out / REPORT_FILE}")
    parent = out.absolute().parent
    if not parent.is_dir():
        what = "is not a directory" if parent.exists() else "does not exist"
        raise ConfigError(f"{flag}{out}: the folder {parent} {what}")
    if not os.access(parent, os.W_OK):
        hint = "" if given else " (name another place with --out FILE)"
        raise ConfigError(f"{flag}{out}: cannot write in {parent}{hint}")


def report_command(
    runs: Annotated[list[Path], typer.Argument(help="Run, bench, plan or simulation directories (or their JSON "
                                               "files); several are compared.", show_default=False)],
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Write the report here (default: RUN_DIR/"
                                             "report.html for one input, ./report.html for several).",
                                             show_default=False)] = None,
) -> None:
    """Write a self-contained HTML report: step breakdown, step time, power, energy, tuning, scaling, plans."""
    target = out if out is not None else default_out(runs)
    check_out(target, given=out is not None)
    try:
        path = write_report(runs, target)
    except OSError as exc:
        raise ConfigError(f"cannot write the report {target} ({exc.strerror or exc})") from None
    log.debug("report of %s written to %s", ", ".join(map(str, runs)), path)
    typer.echo(f"report: {path}")
