"""``dtpo dashboard``: write the Grafana dashboard of dtpo's live metrics (``--metrics-addr``) to a file."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import typer

from dtpo.core.errors import ConfigError
from dtpo.telemetry.dashboard import dashboard_json

log = logging.getLogger(__name__)


def write_dashboard(out: Path) -> None:
    """Write the dashboard JSON to ``out`` (``-``: standard output), replacing the file in one step.

    Raises:
        ConfigError: One line: ``out`` is a directory, its directory does not exist, or it cannot be written.
    """
    text = dashboard_json()
    if str(out) == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    if not str(out).strip() or out.is_dir():
        raise ConfigError(f"--out must name a file, got the directory {str(out) or '.'!r}")
    parent = out.absolute().parent
    if not parent.is_dir():
        raise ConfigError(f"--out {out}: the directory {parent} does not exist")
    tmp = parent / f".{out.name}.tmp"
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, out)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ConfigError(f"--out {out}: cannot write it ({exc.strerror or exc})") from None
    log.info("dashboard: wrote %s (import it in Grafana, with a Prometheus that scrapes --metrics-addr)", out)


def dashboard_command(
    out: Path = typer.Option(..., "--out", help="File to write the dashboard JSON to ('-' for standard output)."),
) -> None:
    """Write the Grafana dashboard of dtpo's live metrics: power, energy per run, throughput per watt, each
    rank's breakdown and sync wait, knobs and tuners."""
    write_dashboard(out)
