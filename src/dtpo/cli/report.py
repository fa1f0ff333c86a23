"""``dtpo report RUN...``: one self-contained HTML report of train runs, benches, plans or simulations.

With one input the report goes beside it (``RUN_DIR/report.html``); with several, to ``report.html`` in the
current directory, with a comparison of them. ``--out FILE`` puts it elsewhere. The file needs nothing else to
be viewed: no scripts, nothing fetched (see :mod:`dtpo.telemetry.report.html`).

``--power-swing RUN`` prints one run's power swing instead (:mod:`dtpo.telemetry.power_swing_run`): per device
and for the job, the swing, ramps, band shares and dominant frequency, the fleet figures at ``--fleet-gpus``,
the what-ifs, and the verdicts of a ``--grid-spec`` file.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Annotated

import typer

from dtpo.core.errors import ConfigError
from dtpo.telemetry.power_fleet import read_spec
from dtpo.telemetry.power_swing_run import DEFAULT_FLEET_GPUS, swing_of_run
from dtpo.telemetry.power_swing_view import print_swing
from dtpo.telemetry.report.data import RunData, load_input
from dtpo.telemetry.report.html import REPORT_FILE, write_report
from dtpo.telemetry.summary import make_console

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
    power_swing: Annotated[bool, typer.Option("--power-swing", help="Print one run's power swing (swing, ramps, "
                                              "band shares, fleet figures, what-ifs) instead of writing the "
                                              "report.")] = False,
    fleet_gpus: Annotated[int | None, typer.Option("--fleet-gpus", help="With --power-swing: the fleet size to "
                                                   "extrapolate to (default: the spec's, else "
                                                   f"{DEFAULT_FLEET_GPUS:,}).", show_default=False)] = None,
    grid_spec: Annotated[Path | None, typer.Option("--grid-spec", help="With --power-swing: a TOML or JSON file "
                                                   "(band_hz, max_band_share, max_ramp_mw_per_s) to judge against.",
                                                   show_default=False)] = None,
) -> None:
    """Write a self-contained HTML report: step breakdown, step time, power, energy, tuning, scaling, plans."""
    if power_swing:
        print_power_swing(runs, fleet_gpus, grid_spec)
        return
    if fleet_gpus is not None or grid_spec is not None:
        raise ConfigError("--fleet-gpus and --grid-spec go with --power-swing")
    target = out if out is not None else default_out(runs)
    check_out(target, given=out is not None)
    try:
        path = write_report(runs, target)
    except OSError as exc:
        raise ConfigError(f"cannot write the report {target} ({exc.strerror or exc})") from None
    log.debug("report of %s written to %s", ", ".join(map(str, runs)), path)
    typer.echo(f"report: {path}")


def print_power_swing(runs: list[Path], fleet_gpus: int | None, grid_spec: Path | None) -> None:
    """``--power-swing``: one run's power swing on the terminal.

    Raises:
        ConfigError: Not exactly one run, not a run with a power timeline, or a bad spec or fleet size.
    """
    if len(runs) != 1:
        raise ConfigError(f"--power-swing takes one run, got {len(runs)}")
    spec = read_spec(grid_spec) if grid_spec is not None else None
    data = load_input(runs[0])
    if not isinstance(data, RunData):
        raise ConfigError(f"--power-swing needs a train run or a simulated job's run directory; {runs[0]} is a "
                          f"{data.kind}")
    print_swing(make_console(), swing_of_run(data, fleet_gpus, spec))
