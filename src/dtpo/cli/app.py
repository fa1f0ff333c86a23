"""The ``dtpo`` command: launch, train, bench, monitor, simulate, restore.

Errors a user can cause end in one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import sys

import typer
from typer.exceptions import TyperException

from dtpo.cli.bench import bench_command
from dtpo.cli.launch import HELP as LAUNCH_HELP
from dtpo.cli.launch import launch_command
from dtpo.cli.monitor import monitor_command
from dtpo.cli.restore import restore_at_start, restore_command
from dtpo.cli.simulate import simulate_command
from dtpo.cli.train import train_command
from dtpo.core.errors import DtpoError, first_line
from dtpo.devices.base import DeviceError

app = typer.Typer(name="dtpo", no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="Distributed Training Power Optimization: scale out, measure every worker, "
                  "optimise throughput per watt.")
app.command("launch", help=LAUNCH_HELP, add_help_option=False,
            context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(launch_command)
app.command("train")(train_command)
app.command("bench")(bench_command)
app.command("monitor")(monitor_command)
app.command("restore")(restore_command)
app.command("simulate")(simulate_command)


def _one_line(text: str) -> str:
    return first_line(text) or "error"


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    try:
        if not (argv or sys.argv[1:]) or (argv or sys.argv[1:])[0] != "restore":
            restore_at_start()
        result = app(args=argv, prog_name="dtpo", standalone_mode=False)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except TyperException as exc:  # usage errors: unknown option, bad value, missing argument
        print(f"dtpo: error: {_one_line(exc.format_message())}", file=sys.stderr)
        sys.exit(2)
    except typer.Abort:
        print("dtpo: aborted", file=sys.stderr)
        sys.exit(130)
    except DtpoError as exc:
        print(f"dtpo: error: {_one_line(str(exc))}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except DeviceError as exc:  # a device the user pointed at cannot do what was asked
        print(f"dtpo: error: {_one_line(str(exc))}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("dtpo: interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(result if isinstance(result, int) else 0)
