"""``dtpo runs``: the run store - list, show, compare and export the registered runs, or rebuild the store.

Every ``dtpo train``, ``bench``, ``simulate`` and ``plan`` registers its result in the project's run store
(``runs/dtpo.sqlite``; ``--store`` names another). The run directories' JSON stays the source of truth:
``dtpo runs reindex`` rebuilds the store from it. A figure from a model is always marked: "simulated" for
``dtpo simulate``'s, "estimated" for any other model's (a plan, energy without a hardware counter).
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from dtpo.core.errors import ConfigError
from dtpo.telemetry.store.database import RunStore
from dtpo.telemetry.store.figures import SIMULATED_NOTE, Figure
from dtpo.telemetry.store.paths import StoreMissing, store_path
from dtpo.telemetry.store.query import Comparison, FigureDiff
from dtpo.telemetry.store.reindex import reindex
from dtpo.telemetry.store.rows import StoredRun
from dtpo.telemetry.summary import format_value, make_console
from dtpo.tune.cost import parse_cost
from dtpo.tune.setting import GpuSetting

CONTEXT = {"help_option_names": ["-h", "--help"]}
HELP = ("The run store: every train, bench, simulate and plan run, listed, shown, compared and exported "
        "(`dtpo runs COMMAND --help`).")

runs_app = typer.Typer(name="runs", help=HELP, no_args_is_help=True, add_completion=False,
                       pretty_exceptions_enable=False, context_settings=CONTEXT)

StoreOption = Annotated[str | None, typer.Option(
    "--store", metavar="PATH",
    help="SQLite run store (default: $DTPO_STORE, else runs/dtpo.sqlite in the working directory).",
    show_default=False)]

HEADLINES = {
    "train": ("throughput", "energy_per_sample_j", "mfu"),
    "tune": ("throughput", "energy_per_sample_j", "mfu"),
    "simulate": ("joules_per_sample", "energy_optimal.joules_per_sample", "energy_saved_share", "choice_cost",
                 "job_cost_vs_default", "samples_per_s"),
}
"""The figures the list shows for each kind (bench and plan: their largest worker / GPU count's)."""
STATUS_STYLE = {"completed": "green", "running": "yellow", "failed": "red", "diverged": "red", "stalled": "red",
                "interrupted": "magenta"}


def _open(store: str | None) -> RunStore | None:
    """The store, or ``None`` when there is none at the path yet."""
    try:
        return RunStore.open(store, create=False, write=False)
    except StoreMissing:
        return None


def origin(item: Figure) -> str:
    """How a figure's origin is marked: ``simulated`` (``dtpo simulate``'s model), ``estimated`` (any other model)
    or nothing (measured or derived from measurements)."""
    if not item.estimated:
        return ""
    return "simulated" if item.note == SIMULATED_NOTE else "estimated"


def _figure_text(item: Figure | None, marked: bool = True) -> str:
    """The figure's value and unit, with its origin in brackets unless ``marked`` is false."""
    if item is None:
        return "-"
    text = format_value({"value": item.value, "unit": item.unit})
    mark = origin(item) if marked else ""
    return f"{text} ({mark})" if mark else text


SETTING_FIGURES = {"choice_cost": ("choice", "choice {setting} (cost {value})"),
                   "energy_optimal.joules_per_sample": ("energy_optimal", "energy-optimal {setting}: {value}")}
"""Figures shown with the GPU setting they belong to: the prefix of the setting's figures and the text."""


def setting_label(run: StoredRun, prefix: str) -> str | None:
    """The GPU setting stored as ``PREFIX.power_limit_w`` (and ``PREFIX.sm_clock_mhz``), e.g. ``225 W``."""
    power, clock = run.figures.get(f"{prefix}.power_limit_w"), run.figures.get(f"{prefix}.sm_clock_mhz")
    if power is None or power.value is None:
        return None
    return GpuSetting(power.value, None if clock is None or clock.value is None else int(clock.value)).label


def headline(run: StoredRun, limit: int = 2) -> str:
    """A few key figures of a run for the list, with units and their origin: each estimated one marked, and a
    simulation's marked once as simulated; a tuning simulation's choice shown as the setting with its cost."""
    names = list(HEADLINES.get(run.kind, ()))
    if run.kind == "bench" and run.workers:
        names = [f"throughput@{run.workers}w", f"scaling_efficiency@{run.workers}w",
                 f"energy_per_sample_j@{run.workers}w"]
    elif run.kind == "plan" and run.workers:
        names = [f"throughput@{run.workers}gpu", f"joules_per_sample@{run.workers}gpu"]
    picked = [run.figures[n] for n in names if n in run.figures and run.figures[n].value is not None][:limit]
    simulated = bool(picked) and all(origin(f) == "simulated" for f in picked)
    texts = []
    for item in picked:
        value = _cost_text(item) if item.name == "choice_cost" else _figure_text(item, marked=not simulated)
        prefix, shown = SETTING_FIGURES.get(item.name, ("", ""))
        setting = setting_label(run, prefix) if prefix else None
        texts.append(shown.format(setting=setting, value=value) if setting else _label(item.name) + value)
    return ", ".join(texts) + (" (simulated)" if simulated else "") or "-"


def _cost_text(item: Figure) -> str:
    """A tuning simulation's cost per sample: its unit is the cost metric's name (``zeus:0.5``), so show the metric's
    own unit with the name after it (``0.7574 J/sample, zeus:0.5``)."""
    try:
        unit = parse_cost(item.unit).unit
    except ConfigError:
        return _figure_text(item, marked=False)
    return f"{format_value({'value': item.value, 'unit': unit})}, {item.unit}"


LABELS = {"throughput": "", "energy_per_sample_j": "", "joules_per_sample": "", "samples_per_s": "", "mfu": "MFU ",
          "scaling_efficiency": "efficiency ", "energy_optimal.joules_per_sample": "energy-optimal ",
          "energy_saved_share": "energy saved ", "choice_cost": "choice cost ",
          "job_cost_vs_default": "job cost vs default "}


def _label(name: str) -> str:
    """Nothing for figures whose unit says what they are, else a short name."""
    base = name.split("@", 1)[0]
    return LABELS.get(base, base.replace("_", " ") + " ")


def _time(text: str | None) -> str:
    return "-" if not text else text.replace("T", " ")[:19]


def list_table(runs: list[StoredRun], title: str) -> Table:
    """The runs, newest first: id, kind, status, start, workload, workers, steps, key figures, directory."""
    table = Table(title=title, title_justify="left",
                  caption="(simulated): from dtpo simulate's model of the GPUs; (estimated): from another model "
                          "(energy without a hardware counter, a plan); neither is measured",
                  caption_justify="left")
    for name in ("id", "kind", "status", "started (UTC)", "workload", "workers", "steps", "key figures", "run dir"):
        table.add_column(name, no_wrap=name in ("id", "started (UTC)"),
                         justify="right" if name in ("workers", "steps") else "left")
    for run in runs:
        style = STATUS_STYLE.get(run.status, "")
        table.add_row(escape(run.id), run.kind, f"[{style}]{run.status}[/]" if style else run.status,
                      _time(run.started_at), escape(run.workload or "-"), _int(run.workers), _int(run.steps),
                      escape(headline(run)), escape(_short_dir(run.run_dir)))
    return table


def _int(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _short_dir(path: str) -> str:
    try:
        return str(Path(path).relative_to(Path.cwd()))
    except ValueError:
        return path


def _parse_filters(filters: list[str] | None) -> list[str]:
    return list(filters or [])


@runs_app.command("list")
def list_command(
    filters: Annotated[list[str] | None, typer.Option(
        "--filter", "-f", metavar="KEY=VALUE",
        help="KEY=VALUE (also !=, >, <, >=, <=; * and ? match any text), repeated: all must hold. Keys: id, name, "
             "kind, status, workload, workers, steps, parent, hostname, run_dir, started_at, finished_at, error, "
             "config.SECTION.FIELD.",
        show_default=False)] = None,
    limit: Annotated[int | None, typer.Option("--limit", "-n", metavar="N", help="Show at most N runs (the newest).",
                                              show_default=False)] = None,
    store: StoreOption = None,
) -> None:
    """List the registered runs, newest first."""
    if limit is not None and limit < 1:
        raise ConfigError(f"--limit must be >= 1, got {limit}")
    console = make_console()
    opened = _open(store)
    if opened is None:
        console.print(f"no run store at {store_path(store)} yet: no runs registered", markup=False, highlight=False)
        return
    runs = opened.list_runs(_parse_filters(filters), limit)
    if not runs:
        what = f" matching {', '.join(filters)}" if filters else ""
        console.print(f"no runs{what} in {opened.path}", markup=False, highlight=False)
        return
    console.print(list_table(runs, f"runs in {opened.path}"))


def run_table(run: StoredRun) -> Table:
    """Every column of one run, as rows."""
    table = Table(title=f"run {escape(run.id)}", title_justify="left", show_header=False)
    table.add_column(justify="left", no_wrap=True)
    table.add_column(justify="left")
    for name, value in (("id", run.id), ("name", run.name), ("kind", run.kind), ("status", run.status),
                        ("error", run.error), ("started (UTC)", _time(run.started_at)),
                        ("finished (UTC)", _time(run.finished_at)), ("workload", run.workload),
                        ("workers", run.workers), ("steps", run.steps), ("part of", run.parent),
                        ("run dir", run.run_dir), ("registered by", f"pid {run.pid} on {run.hostname}"
                                                    if run.pid is not None else None)):
        if value is not None and value != "":
            table.add_row(name, escape(str(value)))
    return table


def figures_table(run: StoredRun) -> Table:
    """A run's key figures: value with unit (and *estimated* where modelled), source and note."""
    table = Table(title="figures", title_justify="left")
    for name in ("figure", "value", "source", "note"):
        table.add_column(name, justify="right" if name == "value" else "left", no_wrap=name != "note")
    for item in run.figures.values():
        table.add_row(escape(item.name), escape(_figure_text(item)), item.source, escape(item.note))
    return table


@runs_app.command("show")
def show_command(
    run_id: Annotated[str, typer.Argument(metavar="ID", help="Run id (or a unique prefix of it, or its run dir).")],
    store: StoreOption = None,
) -> None:
    """Show one run: every column, its figures with units (estimated ones marked) and its configuration."""
    run = _require(store).get(run_id)
    console = make_console()
    console.print(run_table(run))
    if run.figures:
        console.print(figures_table(run))
    else:
        console.print("no figures recorded", style="dim")
    console.print("[bold]config[/bold]")
    console.print(json.dumps(run.config, indent=1, sort_keys=False, default=str), markup=False, highlight=False)


def _require(store: str | None) -> RunStore:
    opened = _open(store)
    if opened is None:
        raise ConfigError(f"no run store at {store_path(store)} yet (no run registered there); "
                          "`dtpo runs reindex` builds it from run directories")
    return opened


def _signed(item: FigureDiff) -> str:
    diff = item.difference
    if diff is None:
        return "-"
    unit = item.unit
    text = format_value({"value": abs(diff), "unit": unit, "source": "measured"})
    return ("+" if diff >= 0 else "-") + text


def compare_table(comparison: Comparison) -> Table:
    """Each figure of two runs side by side with the absolute and the relative difference (B - A)."""
    a, b = comparison.a, comparison.b
    table = Table(title=f"A: {escape(a.id)} ({a.kind}, {a.status})  vs  B: {escape(b.id)} ({b.kind}, {b.status})",
                  title_justify="left", caption="difference: B - A; (simulated), (estimated): from a model, not "
                                                 "measured", caption_justify="left")
    for name in ("figure", "A", "B", "B - A", "relative"):
        table.add_column(name, justify="left" if name == "figure" else "right", no_wrap=True)
    for item in comparison.figures:
        rel = item.relative
        marks = {origin(f) for f in (item.a, item.b) if f is not None} - {""}
        mark = "" if item.difference is None or not marks else "simulated" if marks == {"simulated"} else "estimated"
        table.add_row(escape(item.name), escape(_figure_text(item.a)), escape(_figure_text(item.b)),
                      escape(_signed(item)) + (f" ({mark})" if mark else ""), "-" if rel is None else f"{rel:+.1%}")
    return table


def config_table(comparison: Comparison) -> Table:
    """The configuration keys whose values differ."""
    table = Table(title="config that differs", title_justify="left")
    for name in ("key", "A", "B"):
        table.add_column(name, justify="left")
    for key, va, vb in comparison.config:
        table.add_row(escape(key), escape(_json(va)), escape(_json(vb)))
    return table


def _json(value: Any) -> str:
    return "-" if value is None else json.dumps(value, default=str) if not isinstance(value, str) else value


@runs_app.command("compare")
def compare_command(
    a: Annotated[str, typer.Argument(metavar="A", help="First run id (or unique prefix).")],
    b: Annotated[str, typer.Argument(metavar="B", help="Second run id (or unique prefix).")],
    store: StoreOption = None,
) -> None:
    """Compare two runs: their figures side by side with the differences, and the config that differs."""
    comparison = _require(store).compare(a, b)
    console = make_console()
    console.print(compare_table(comparison))
    if comparison.config:
        console.print(config_table(comparison))
    else:
        console.print("same config", style="dim")


@runs_app.command("export")
def export_command(
    csv_path: Annotated[str, typer.Option("--csv", metavar="FILE", help="Write a CSV file (- for stdout): one row "
                                          "per run, one column per figure, the estimated ones named in "
                                          "'estimated'.", show_default=False)],
    filters: Annotated[list[str] | None, typer.Option("--filter", "-f", metavar="KEY=VALUE",
                                                      help="As for `dtpo runs list`.",
                                                      show_default=False)] = None,
    store: StoreOption = None,
) -> None:
    """Export the registered runs as CSV."""
    target = None if csv_path == "-" else Path(csv_path)
    if target is not None:
        if not csv_path.strip() or target.is_dir():
            raise ConfigError(f"--csv {csv_path!r} is a directory; name a file, e.g. runs.csv")
        if not target.parent.is_dir():
            raise ConfigError(f"--csv {csv_path}: folder {target.parent} does not exist")
    opened = _open(store)
    header, rows = opened.export_rows(_parse_filters(filters)) if opened is not None else ([], [])
    if target is None:
        _write_csv(sys.stdout, header, rows)
        return
    try:
        with target.open("w", newline="") as fh:
            _write_csv(fh, header, rows)
    except OSError as exc:
        raise ConfigError(f"--csv {csv_path}: cannot write it ({exc.strerror or exc})") from None
    Console(stderr=True).print(f"{len(rows)} run(s) written to {target}", markup=False, highlight=False)


def _write_csv(fh: Any, header: list[str], rows: list[list[Any]]) -> None:
    writer = csv.writer(fh)
    if header:
        writer.writerow(header)
    writer.writerows([["" if v is None else v for v in row] for row in rows])


@runs_app.command("reindex")
def reindex_command(
    dirs: Annotated[list[Path] | None, typer.Argument(metavar="DIR", help="Folders of run directories "
                                                      "(default: runs/).", show_default=False)] = None,
    store: StoreOption = None,
) -> None:
    """Rebuild the run store from run directories (record.json, bench.json, simulate.json, plan.json)."""
    report = reindex(store, list(dirs or []))
    console = make_console()
    kinds = ", ".join(f"{kind} {count}" for kind, count in sorted(report.counts.items())) or "none"
    console.print(f"reindexed {report.total} run(s) into {report.path} ({kinds})", markup=False, highlight=False)
    if report.kept:
        console.print(f"kept {report.kept} row(s) written by runs registering meanwhile", markup=False)
    if report.dropped:
        console.print(f"dropped {report.dropped} row(s) whose run directory is gone", markup=False)
    for path, why in report.skipped:
        console.print(f"skipped {path}: {why}", markup=False, highlight=False)
    if report.corrupt_copy is not None:
        console.print(f"the corrupt store was kept as {report.corrupt_copy}", markup=False, highlight=False)
