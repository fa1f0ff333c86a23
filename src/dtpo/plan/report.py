"""What ``dtpo plan`` shows: the table per GPU count, what was assumed, the plot, and a JSON form."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from dtpo.core.errors import ConfigError
from dtpo.plan.batch_fit import CONFIDENCE
from dtpo.plan.calibration import SENSITIVITY_SHARES, Calibration
from dtpo.plan.predict import Plan, losses_text

PLOT_SUFFIXES = (".png", ".svg", ".pdf")


def plan_table(result: Plan) -> Table:
    """One row per GPU count: step split, throughput, efficiency, energy, cost, what limits it (* marks a
    figure beyond what the calibration measured)."""
    s = result.scenario
    work = s.work.total_samples if s.work else None
    title = (f"dtpo plan: {s.gpu}, {s.gpus_per_node} per node, {result.fabric.intra.name} + "
             f"{s.nics_per_node} x {result.fabric.inter.name}, {s.strategy}, {s.precision}")
    sensitive = any(p.sensitivity is not None for p in result.predictions)
    assumed = result.calibration.fixed_assumed
    shares = " / ".join(f"{share:.0%}" for share in SENSITIVITY_SHARES)
    moved_header = f"fixed {shares}" if assumed else "fit range"
    caption = ("* beyond what the calibration measured (extrapolated); energy and cost are model figures; lost to: "
               "shares of the step spent waiting on the network, on the slowest GPU, on fixed per-step work "
               "(launches, optimizer) and on the framework across nodes")
    if sensitive and assumed:
        caption += (f"; fixed {shares}: {s.unit} if that share of a micro-batch were fixed instead (one batch size "
                    "measured: the split is assumed)")
    elif sensitive:
        caption += (f"; fit range: {s.unit} with the micro-batch's fixed part at the low and the high end of its "
                    f"{CONFIDENCE:.0%} confidence interval (fitted from times at several batch sizes)")
    table = Table(title=escape(title), title_justify="left", caption=caption)
    varying_batch = not isinstance(s.per_gpu_batch, int)
    columns = ["GPUs", "nodes", *(["batch"] if varying_batch else []), "accum", "step ms", "compute ms",
               "exposed comm ms", "straggler wait ms", "optimizer ms",
               *(["framework ms"] if result.calibration.framework_s else []), s.unit,
               *([moved_header] if sensitive else []), "scaling eff.", "J/sample"]
    if work:
        columns += ["hours", "kWh", "cost"]
    columns += ["limited by", "lost to"]
    for name in columns:
        table.add_column(name, justify="left" if name in ("limited by", "lost to") else "right")
    for p in result.predictions:
        st = p.step
        mark = "*" if p.extrapolated else ""
        row = [f"{p.gpus}{mark}", str(st.nodes), *([str(s.batch_at(p.gpus))] if varying_batch else []),
               str(st.grad_accum), _ms(st.step_s), _ms(st.compute_s),
               _ms(st.exposed_comm_s), _ms(st.sync_wait_s), _ms(st.optimizer_s),
               *([_ms(st.framework_s)] if result.calibration.framework_s else []),
               f"{p.throughput * s.units_per_sample:,.1f}",
               *([" / ".join(f"{round(m * 100, 1) + 0.0:+.1f} %" for m in p.sensitivity or ())] if sensitive else []),
               f"{p.scaling_efficiency * 100:.1f} %", f"{p.energy.joules_per_sample:.4g}"]
        if work:
            cost = p.cost
            assert cost is not None
            row += [f"{cost.hours:,.2f}", f"{cost.kwh:,.1f}", f"{cost.total:,.2f}" if cost.total is not None else "-"]
        row += [p.limit, losses_text(st)]
        table.add_row(*row)
    return table


def _ms(seconds: float) -> str:
    """Milliseconds with three significant figures below 100 ms, one decimal above."""
    ms = seconds * 1e3
    return f"{ms:,.1f}" if ms >= 100 else f"{ms:.3g}"


def assumptions_text(result: Plan) -> list[str]:
    """Every assumption the plan used, one per line."""
    return [f"- {a}" for a in result.assumptions]


def sensitivity_keys(calibration: Calibration) -> tuple[str, ...]:
    """The JSON names of a prediction's sensitivity figures: ``fixed_0`` and ``fixed_0.2`` where the micro-batch's
    fixed part is assumed, ``fit_low`` and ``fit_high`` (the ends of its confidence interval) where it was fitted."""
    if calibration.fixed_assumed:
        return tuple(f"fixed_{share:g}" for share in SENSITIVITY_SHARES)
    return ("fit_low", "fit_high")


def plan_dict(result: Plan) -> dict[str, Any]:
    """Plain values for JSON."""
    rows = []
    for p in result.predictions:
        st = p.step
        rows.append({"gpus": p.gpus, "nodes": st.nodes, "per_gpu_batch": result.scenario.batch_at(p.gpus),
                     "grad_accum": st.grad_accum, "step_s": st.step_s,
                     "compute_s": st.compute_s, "comm_s": st.comm_s, "exposed_comm_s": st.exposed_comm_s,
                     "optimizer_s": st.optimizer_s, "sync_wait_s": st.sync_wait_s,
                     "interference_s": st.interference_s, "fixed_s": st.fixed_s, "framework_s": st.framework_s,
                     "losses": p.losses, "throughput": p.throughput,
                     "throughput_in_unit": p.throughput * result.scenario.units_per_sample,
                     "sensitivity": None if p.sensitivity is None else dict(zip(
                         sensitivity_keys(result.calibration), p.sensitivity, strict=True)),
                     "scaling_efficiency": p.scaling_efficiency, "joules_per_sample": p.energy.joules_per_sample,
                     "cost": None if p.cost is None else vars(p.cost), "limit": p.limit,
                     "extrapolated": p.extrapolated})
    return {"gpu": result.scenario.gpu, "intra_link": result.fabric.intra.name,
            "inter_link": result.fabric.inter.name, "calibration": result.calibration.source,
            "unit": result.scenario.unit,
            "assumptions": list(result.assumptions), "predictions": rows}


def write_plot(results: list[Plan], path: Path) -> None:
    """Throughput, scaling efficiency and J/sample against GPU count, one line per plan (inter-node link), as
    the HTML report draws them (:func:`dtpo.telemetry.report.curves.draw_plan_curves`).

    Raises:
        ConfigError: An unknown file type.
    """
    if path.suffix.lower() not in PLOT_SUFFIXES:
        raise ConfigError(f"--plot must end in {', '.join(PLOT_SUFFIXES)}, got {path.name!r}")
    from matplotlib.figure import Figure

    from dtpo.telemetry.report.curves import draw_plan_curves

    fig = Figure(figsize=(13, 4), layout="constrained")
    s = results[0].scenario
    draw_plan_curves(fig, [plan_dict(r) for r in results],
                     f"dtpo plan: {s.gpu}, {s.gpus_per_node} per node ({results[0].calibration.source})")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
