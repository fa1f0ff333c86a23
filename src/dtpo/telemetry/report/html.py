"""The self-contained HTML report of one or more dtpo runs, benches, plans or simulations (``dtpo report``).

One HTML file, no script and nothing to fetch when it is viewed: the style sheet is inline and every plot is
an inline ``<svg>`` drawn by matplotlib (why, in :mod:`dtpo.telemetry.report.svg`). The page holds a table of
key figures, a table of contents, one section per input and, when two or more inputs are of one kind, a
comparison of them; the footer says which figures are estimated or simulated and what measured the others.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from dtpo.core.record import current_umask
from dtpo.telemetry.report.curves import bench_svg, plan_svg
from dtpo.telemetry.report.data import BenchData, PlanData, ReportInput, RunData, SimulateData, load_input
from dtpo.telemetry.report.markup import (
    CSS,
    Html,
    Page,
    badge,
    esc,
    figure,
    flatten,
    join,
    para,
    short_value,
    table,
    tag,
)
from dtpo.telemetry.report.plots import compare_totals_svg, mean_parts, parts_svg
from dtpo.telemetry.report.sections import (
    bench_section,
    estimated_sources,
    key_figures,
    plan_section,
    run_section,
    simulate_section,
)

REPORT_FILE = "report.html"
KIND_NAMES = {"run": "train run", "bench": "bench", "plan": "plan", "simulate": "simulation"}


def build_report(paths: Sequence[Path]) -> str:
    """The report of ``paths`` (run, bench, plan or simulation directories, or their JSON files) as HTML text.

    Raises:
        ConfigError: A path is not a dtpo output, or cannot be read.
    """
    return render_report([load_input(Path(p)) for p in paths])


def render_report(inputs: Sequence[ReportInput]) -> str:
    """The report of inputs already loaded (see :func:`dtpo.telemetry.report.data.load_input`)."""
    page = Page()
    sections, ids = [], []
    for i, item in enumerate(inputs, start=1):
        sid = page.unique(f"{item.kind}-{i}")
        ids.append(sid)
        if isinstance(item, RunData):
            sections.append(run_section(page, item, sid, f"Run {item.label}"))
        elif isinstance(item, BenchData):
            sections.append(bench_section(page, item, sid))
        elif isinstance(item, PlanData):
            sections.append(plan_section(page, item, sid))
        else:
            sections.append(simulate_section(page, item, sid))
    comparison = comparison_section(page, inputs)
    title = "dtpo report: " + ", ".join(item.label for item in inputs)
    body = join([
        Html('<header class="top">'), tag("h1", "dtpo report"),
        para(f"{len(inputs)} input(s) · generated {_dt.datetime.now(_dt.UTC):%Y-%m-%d %H:%M} UTC by dtpo "
             f"{_version()} · self-contained: no scripts, nothing loaded from elsewhere", "muted"),
        Html("</header>"), overview(inputs, ids), page.contents(), comparison, *sections, footer(inputs)])
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n<title>{esc(title)}</title>\n'
            f"<style>{CSS}</style>\n</head>\n<body>\n<main>\n{body}\n</main>\n</body>\n</html>\n")


def write_report(paths: Sequence[Path], out: Path) -> Path:
    """Write the report of ``paths`` to ``out`` atomically (a crash leaves the old file or the new one).

    Returns:
        ``out``.

    Raises:
        ConfigError: A path is not a dtpo output.
        OSError: ``out`` cannot be written.
    """
    text = build_report(paths)
    out = Path(out)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out


def overview(inputs: Sequence[ReportInput], ids: Sequence[str]) -> Html:
    """The key figures of every input, one row each, linked to its section."""
    rows = []
    for item, sid in zip(inputs, ids, strict=True):
        link = Html(f'<a href="#{esc(sid)}">{esc(item.label)}</a>')
        if isinstance(item, RunData):
            figures = dict(key_figures(item))
            rows.append((link, KIND_NAMES[item.kind], item.record.status, short_value(figures.get("throughput")),
                         short_value(figures.get("step time (median)")), short_value(figures.get("energy per sample")),
                         short_value(figures.get("energy")), short_value(figures.get("average power"))))
        elif isinstance(item, BenchData):
            counts = [str(r.get("workers")) for r in item.bench.get("rows") or []]
            rows.append((link, KIND_NAMES[item.kind], f"workers {', '.join(counts)}", *["–"] * 5))
        elif isinstance(item, PlanData):
            rows.append((link, KIND_NAMES[item.kind], badge("model, estimated", "est"), *["–"] * 5))
        else:
            rows.append((link, KIND_NAMES[item.kind], badge("simulated", "sim"), *["–"] * 5))
    return join([tag("h2", "Key figures", id="key-figures"),
                 table(("input", "kind", "status", "throughput", "step time (median)", "energy per sample", "energy",
                        "average power"), rows, "overview")])


def comparison_section(page: Page, inputs: Sequence[ReportInput]) -> Html:
    """Train runs, benches and plans side by side, where there are two or more of a kind (else nothing)."""
    runs = [i for i in inputs if isinstance(i, RunData)]
    benches = [i for i in inputs if isinstance(i, BenchData)]
    plans = [i for i in inputs if isinstance(i, PlanData)]
    if len(runs) < 2 and len(benches) < 2 and len(plans) < 2:
        return Html("")
    out = [page.heading(2, "comparison", "Comparison")]
    if len(runs) >= 2:
        labels = _distinct([r.label for r in runs])
        out.append(page.heading(3, "comparison-runs", "Train runs"))
        figures = [dict(key_figures(r)) for r in runs]
        names = list(dict.fromkeys(name for f in figures for name in f))
        out.append(table(("figure", *labels), [(name, *(short_value(f.get(name)) for f in figures)) for name in names]))
        parts = [_mean_over_ranks(r) for r in runs]
        out.append(figure("comparison-breakdown", parts_svg(labels, parts), "Mean time per measured step of each "
                          "part, averaged over each run's ranks."))
        out.append(figure("comparison-totals", compare_totals_svg(
            labels, [f.get("throughput") for f in figures], [f.get("energy per sample") for f in figures]),
            "Throughput and energy per sample of each run (hatched: estimated)."))
        out.append(_config_differences(runs, labels))
    if len(benches) >= 2:
        out.append(page.heading(3, "comparison-benches", "Benches"))
        svg = bench_svg(dict(zip(_distinct([b.label for b in benches]),
                                 [b.bench.get("rows") or [] for b in benches], strict=True)))
        if svg is not None:
            out.append(figure("comparison-scaling", svg, "Scaling of every bench, one line each."))
    if len(plans) >= 2:
        out.append(page.heading(3, "comparison-plans", "Plans"))
        labels = [f"{label}: {p.get('inter_link', '?')}" for label, data in zip(
            _distinct([p.label for p in plans]), plans, strict=True) for p in data.plans]
        svg = plan_svg([p for data in plans for p in data.plans], "plans compared (model predictions, estimated)",
                       labels)
        if svg is not None:
            out.append(figure("comparison-plan-curves", svg, "Every plan's predictions, one line per plan and link."))
    return join(out)


def _mean_over_ranks(run: RunData) -> dict[str, float]:
    parts = [p for r in run.record.ranks if (p := mean_parts(r)) is not None]
    names = {n for p in parts for n in p}
    return {n: sum(p.get(n, 0.0) for p in parts) / len(parts) for n in names} if parts else {}


def _config_differences(runs: Sequence[RunData], labels: Sequence[str]) -> Html:
    configs = [dict(flatten(r.record.config)) for r in runs]
    keys = sorted({k for c in configs for k in c} - {"launch.run_dir"})
    rows = [(k, *(c.get(k, "-") for c in configs)) for k in keys if len({c.get(k) for c in configs}) > 1]
    if not rows:
        return para("The runs' configurations are the same (run directories aside).", "muted")
    return join([tag("h4", "configuration differences"), table(("key", *labels), rows, "kv")])


def footer(inputs: Sequence[ReportInput]) -> Html:
    """Where each figure came from: what is estimated, what is simulated, what measured the rest."""
    lines = [tag("li", "Step times and their parts are measured on each rank's clock; throughput, shares and MFU "
                       "are derived from them (MFU against the peak its note names).")]
    for item in inputs:
        runs = [item] if isinstance(item, RunData) else list(item.runs.values()) if isinstance(item, BenchData) else []
        for run in runs:
            lines.append(tag("li", _energy_provenance(run)))
        if isinstance(item, PlanData):
            lines.append(tag("li", f"Plan {item.label}: every figure is a model prediction (estimated), calibrated "
                                   f"on {item.plans[0].get('calibration', '?') if item.plans else '?'}."))
        elif isinstance(item, SimulateData):
            lines.append(tag("li", f"Simulation {item.label}: every figure is simulated, none measured."))
    return join([Html("<footer>"), tag("h2", "About these figures", id="about"), tag("ul", join(lines)),
                 para("Figures marked estimated come from a model, not from a hardware counter or a clock."),
                 Html("</footer>")])


def _energy_provenance(run: RunData) -> Html:
    record = run.record
    estimated = [name for name, m in key_figures(run) if m.estimated]
    if record.energy is None:
        return join([f"Run {run.label}: energy not measured."])
    devices = {d.get("name"): d for r in record.ranks for d in (r.energy or {}).get("devices") or []}
    described = "; ".join(f"{name} by {d.get('source', '?')}" + (" (estimated" + (f": {d['detail']}" if d.get(
        "detail") else "") + ")" if d.get("estimated") else "") for name, d in devices.items())
    sources = ", ".join(sorted(record.energy.by_source_j)) or "none"
    parts = [f"Run {run.label}: energy from {sources}", f" ({described})" if described else "", "."]
    if estimated:
        parts.append(f" Estimated: {', '.join(estimated)}.")
    elif not estimated_sources(run):
        parts.append(" No figure is estimated.")
    return join(parts)


def _distinct(labels: Sequence[str]) -> list[str]:
    """Labels made unique by a ``(2)``, ``(3)``... suffix where two inputs share a name."""
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        out.append(label if seen[label] == 1 else f"{label} ({seen[label]})")
    return out


def _version() -> str:
    try:
        return importlib.metadata.version("dtpo")
    except importlib.metadata.PackageNotFoundError:
        return "(unknown version)"
