"""The ``dtpo`` command: launch, train, bench, monitor, simulate, plan, report, dashboard, runs, restore,
horovod-timeline, virtual-gpus.

Errors a user can cause end in one line on stderr and exit code 2, never a traceback; an interrupt ends
with one line and 130 (SIGINT) or 143 (SIGTERM).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import typer
from typer.exceptions import TyperException

import dtpo
from dtpo.cli.bench import bench_command
from dtpo.cli.dashboard import dashboard_command
from dtpo.cli.horovod import horovod_command
from dtpo.cli.launch import HELP as LAUNCH_HELP
from dtpo.cli.launch import launch_command
from dtpo.cli.monitor import monitor_command
from dtpo.cli.plan import plan_command
from dtpo.cli.report import report_command
from dtpo.cli.restore import restore_at_start, restore_command
from dtpo.cli.runs import runs_app
from dtpo.cli.simulate import simulate_app
from dtpo.cli.train import train_command
from dtpo.cli.virtual_gpus import virtual_gpus_app
from dtpo.core.errors import DtpoError, first_line
from dtpo.core.logs import configure_logging

log = logging.getLogger(__name__)

HELP = ("Distributed Training Power Optimization: scale out, measure every worker, optimise throughput per watt. "
        "`dtpo COMMAND --help` describes a command.")
CONTEXT = {"help_option_names": ["-h", "--help"]}

app = typer.Typer(name="dtpo", no_args_is_help=False, add_completion=False, pretty_exceptions_enable=False,
                  help=HELP, context_settings=CONTEXT, invoke_without_command=True)
app.command("launch", help=LAUNCH_HELP, add_help_option=False,
            context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(launch_command)
app.command("train", context_settings=CONTEXT)(train_command)
app.command("bench", context_settings=CONTEXT)(bench_command)
app.command("monitor", context_settings=CONTEXT)(monitor_command)
app.command("restore", context_settings=CONTEXT)(restore_command)
app.command("plan", context_settings=CONTEXT)(plan_command)
app.command("report", context_settings=CONTEXT)(report_command)
app.command("dashboard", context_settings=CONTEXT)(dashboard_command)
app.command("horovod-timeline", context_settings=CONTEXT)(horovod_command)
app.add_typer(simulate_app, name="simulate", context_settings=CONTEXT)
app.add_typer(runs_app, name="runs")
app.add_typer(virtual_gpus_app, name="virtual-gpus")



def changes_knobs(command: str, args: list[str]) -> bool:
    """Whether this command line is about to change GPU settings (real or simulated): only then must an
    unreadable knob journal stop it; every other command goes on with a warning."""
    flags = {a.split("=", 1)[0] for a in args}
    observing = {"--dry-run"} & flags or any(a in ("dry-run", "observe") for a in args)
    if command in ("train", "bench"):
        return bool({"--power-limit", "--sm-clock", "--config", "--tune"} & flags) and not observing
    if command == "simulate":  # the earlier spelling (flags) or a subcommand that sets knobs
        after = args[args.index(command) + 1:] if command in args else []
        return bool({"--sweep", "--power-limit", "--sm-clock", "--tune"} & flags) or after[:1] in (
            ["sweep"], ["tune"], ["stragglers"])
    return False


@app.callback()
def _root(ctx: typer.Context,
          version: bool = typer.Option(False, "--version", help="Print dtpo's version and exit.")) -> None:
    if version:
        typer.echo(f"dtpo {dtpo.__version__}")
        raise typer.Exit(0)
    if ctx.invoked_subcommand is None:
        typer.echo(ctx.get_help())
        raise typer.Exit(0)


def _one_line(text: str) -> str:
    return first_line(text) or "error"


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    args = list(sys.argv[1:] if argv is None else argv)
    configure_logging()
    try:
        command = next((a for a in args if not a.startswith("-")), None)
        if command in app_commands() and command != "restore" and not {"-h", "--help"} & set(args):
            restore_at_start(changes_knobs=changes_knobs(command, args))
        result = build_cli().main(args=args, prog_name="dtpo", standalone_mode=False)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except TyperException as exc:  # usage errors: unknown option, bad value, missing argument
        print(f"dtpo: error: {_one_line(exc.format_message())}", file=sys.stderr)
        sys.exit(2)
    except typer.Abort:
        print("dtpo: interrupted", file=sys.stderr)
        sys.exit(130)
    except DtpoError as exc:
        print(f"dtpo: {'error: ' if exc.exit_code == 2 else ''}{_one_line(str(exc))}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        print("dtpo: interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(result if isinstance(result, int) else 0)


def build_cli() -> Any:
    """The click command behind the typer app, with on/off flags shown without a ``<bool>`` metavar."""
    command = typer.main.get_command(app)
    listed = getattr(command, "commands", {})  # typer lists groups after commands: list them as the help orders them
    command.commands = {name: listed[name] for name in sorted(listed, key=_help_position)}  # type: ignore[attr-defined]
    groups, pending = [], [command]
    while pending:  # the app, its commands, and the commands of its groups (dtpo runs ...)
        group = pending.pop()
        groups.append(group)
        pending.extend(getattr(group, "commands", {}).values())
    for group in groups:
        for param in group.params:
            if getattr(param, "is_flag", False) and param.metavar is None:
                param.metavar = ""
        group.get_help_option = _flag_without_metavar(group.get_help_option)
    return command


HELP_ORDER = ("launch", "train", "bench", "monitor", "restore", "simulate", "plan", "report", "dashboard", "runs",
              "horovod-timeline", "virtual-gpus")


def _help_position(name: str) -> int:
    return HELP_ORDER.index(name) if name in HELP_ORDER else len(HELP_ORDER)


def _flag_without_metavar(get_help_option: Any) -> Any:
    """Wrap a command's ``get_help_option`` so ``--help`` shows no ``<bool>`` either."""

    def wrapped(ctx: Any) -> Any:
        option = get_help_option(ctx)
        if option is not None:
            option.metavar = ""
        return option

    return wrapped


def app_commands() -> set[str]:
    """The names of dtpo's commands that start work (``dtpo runs`` only reads the run store)."""
    return {info.name for info in app.registered_commands if info.name} | {"simulate"}
