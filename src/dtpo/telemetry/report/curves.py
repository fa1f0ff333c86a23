"""Curves of the HTML report, each an SVG string: tuning trajectories, bench scaling, planner predictions and
simulations.

They take the plain dicts the records and JSON files hold (a tuner's report, ``bench.json`` rows, ``plan.json``
plans, ``simulate.json``), so this module needs neither the tuner nor the planner. :func:`draw_plan_curves` is
also what ``dtpo plan --plot`` draws.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from matplotlib.figure import Figure

from dtpo.telemetry.job_tuning import setting_label
from dtpo.telemetry.rebalance import SharesOverRun
from dtpo.telemetry.report.svg import BLACK, BLUE, GREY, PALETTE, VERMILLION, colour, render

PHASE_MARKERS = {"wait": ".", "warmup": "^", "profile": "o", "hold": "s"}
STATUS_STYLES = {"chosen": ("*", VERMILLION, 14), "measured": ("o", BLUE, 6)}  # other statuses: a grey cross
MAX_STRAGGLER_RANKS = 8


def _gpu_axis(settings: Sequence[dict[str, Any]]) -> tuple[str, Any]:
    """The x axis of GPU settings: power limit, SM clock, or both as text where both vary."""
    limits = {s.get("power_limit_w") for s in settings}
    clocks = {s.get("sm_clock_mhz") for s in settings}
    if len(clocks) > 1 and len(limits) == 1:
        return "SM clock (MHz)", lambda s: s.get("sm_clock_mhz")
    if len(clocks) <= 1:
        return "power limit (W)", lambda s: s.get("power_limit_w")
    return "setting", lambda s: f"{s.get('power_limit_w'):g} W, {s.get('sm_clock_mhz') or 'free'} MHz"


def power_tuning_svg(report: dict[str, Any], suffix: str = "") -> str | None:
    """A GPU-knob tuner's report: cost against setting (interval of each estimate; the choice starred, dropped
    settings crossed) and, beside it, the setting it held step by step. A model figure says so.

    Args:
        report: The tuner's report (``ranks[].tuning``, or ``tuning`` of ``simulate.json``).
        suffix: Added to the titles, e.g. ``"(simulated)"``.
    """
    settings, choice = report.get("settings") or [], report.get("choice")
    model = report.get("model")
    if report.get("source") == "model" and isinstance(model, dict) and model.get("settings"):
        settings, choice, suffix = model["settings"], model.get("choice"), f"{suffix} (model figure, estimated)"
    if not settings:
        return None
    xlabel, key = _gpu_axis(settings)
    segments = report.get("segments") or []

    def draw(fig: Figure) -> None:
        axes = fig.subplots(1, 2 if segments else 1, squeeze=False)[0]
        ax = axes[0]
        marked = list(settings)
        if choice and not any(s.get("status") == "chosen" for s in marked):  # a model figure's choice: by setting
            marked = [{**s, "status": "chosen"} if all(s.get(k) == v for k, v in choice.items()) else s
                      for s in marked]
        order = ["chosen", "measured"]
        for status in sorted({s.get("status") or "measured" for s in marked},
                             key=lambda x: (order.index(x) if x in order else len(order), x)):
            marker, col, size = STATUS_STYLES.get(status, ("x", GREY, 7))
            rows = [s for s in marked if (s.get("status") or "measured") == status]
            xs, ys = [key(s) for s in rows], [s["cost"] for s in rows]
            err = [[max(s["cost"] - s.get("cost_low", s["cost"]), 0) for s in rows],
                   [max(s.get("cost_high", s["cost"]) - s["cost"], 0) for s in rows]]
            ax.errorbar(xs, ys, yerr=err, fmt=marker, color=col, ms=size, capsize=2, lw=0.8, label=status, zorder=3)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(f"{report.get('metric_description') or report.get('metric')} ({report.get('unit', '')})")
        ax.set_title(f"cost per setting{suffix}")
        ax.legend(fontsize=7)
        if segments:
            ax2 = axes[1]
            at = 0
            for seg in segments:  # a line as long as the segment, a dot where it starts (short ones stay visible)
                x = key(seg)
                col = colour(list(PHASE_MARKERS).index(seg["phase"])) if seg.get("phase") in PHASE_MARKERS else GREY
                ax2.plot([at, at + seg["steps"]], [x, x], color=col, lw=3, solid_capstyle="butt")
                ax2.plot([at], [x], "o", color=col, ms=3.5)
                at += seg["steps"]
            for i, phase in enumerate(PHASE_MARKERS):
                if any(seg.get("phase") == phase for seg in segments):
                    ax2.plot([], [], color=colour(i), lw=3, label=phase)
            ax2.set_xlabel("tuned steps")
            ax2.set_ylabel(xlabel)
            ax2.set_title(f"setting held, step by step{suffix}")
            ax2.legend(fontsize=7)

    return render(draw, (9.0, 3.3))


def job_tuning_svg(report: dict[str, Any], estimated: bool) -> str | None:
    """The job-knob tuner's candidates against J/sample (the choice, the dropped and the guard's rejections
    marked) and the J/sample of each block of steps it measured, over the run."""
    settings = sorted(report.get("settings") or [], key=lambda r: r.get("cost", math.inf))
    rejected = report.get("rejected") or []
    if not settings and not rejected:
        return None
    unit = "J/sample (estimated)" if estimated else "J/sample"
    blocks = [b for b in report.get("trajectory") or [] if b.get("samples")]

    def draw(fig: Figure) -> None:
        top, bottom = fig.subplots(2, 1, height_ratios=(max(len(settings) + len(rejected), 2), 4))
        labels, values, notes, refused = [], [], [], []
        for row in settings:
            refuse = row.get("status") == "rejected" or (row.get("guard") or {}).get("accepted") is False
            status = row.get("status", "measured")
            reason = row.get("reason") or ((row.get("guard") or {}).get("reason") if refuse else "")
            labels.append(setting_label(row))
            values.append(row.get("energy_per_sample_j") or 0.0)
            notes.append(("★ " if status == "chosen" else "") + (f"{status}: {reason}"[:70] if reason else status))
            refused.append(refuse)
        for rej in rejected:
            labels.append(rej.get("label") or setting_label(rej))
            values.append(0.0)
            notes.append(f"rejected by the guard before training: {rej.get('reason', '')}"[:70])
            refused.append(True)
        order = list(dict.fromkeys([b["setting"] for b in blocks] + labels))  # one colour per setting, both panels
        colours = {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(order)}
        bars = top.barh(range(len(labels)), values, color=[colours[n] for n in labels], height=0.6)
        for bar, note, value, refuse in zip(bars, notes, values, refused, strict=True):
            if refuse:
                bar.set_hatch("xx")
                bar.set_edgecolor(VERMILLION)
            if note.startswith("★"):
                bar.set_edgecolor(BLACK)
                bar.set_linewidth(1.5)
            top.text(value, bar.get_y() + bar.get_height() / 2, f" {value:.3g}  {note}" if value else f" {note}",
                     va="center", fontsize=7, color=VERMILLION if refuse else BLACK)
        top.set_yticks(range(len(labels)), labels)
        top.invert_yaxis()
        top.set_xlim(0, max(values, default=1.0) * 2.2 or 1.0)
        top.set_xlabel(unit)
        top.grid(axis="y", visible=False)
        top.set_title(f"candidates for {report.get('metric_description') or report.get('metric')}, as profiled")
        for name in dict.fromkeys(b["setting"] for b in blocks):
            labelled = False
            for phase in dict.fromkeys(b.get("phase") for b in blocks):
                marker = PHASE_MARKERS.get(phase, "x")
                mine = [b for b in blocks if b["setting"] == name and b.get("phase") == phase]
                if mine:
                    bottom.plot([b["step"] for b in mine], [b["energy_j"] / b["samples"] for b in mine], marker,
                                color=colours[name], ms=5, ls="none", label=None if labelled else name)
                    labelled = True
        if not blocks:
            bottom.axis("off")
            bottom.text(0.5, 0.5, "no per-block trajectory in this record", ha="center", va="center")
        else:
            bottom.set_xlabel("optimizer step (dot: waiting, triangle: warm-up, circle: profiling, square: holding)")
            bottom.set_ylabel(unit)
            bottom.set_title("J/sample of each block of steps, by the setting in force")
            bottom.legend(fontsize=7, ncol=2)

    return render(draw, (9.0, 3.4 + 0.3 * (len(settings) + len(rejected))))


def bench_svg(benches: dict[str, list[dict[str, Any]]]) -> str | None:
    """Throughput (with ideal linear scaling for a single bench), scaling efficiency and energy per sample
    against worker count, one line per bench. ``None`` without rows."""
    if not any(benches.values()):
        return None

    def value(m: dict[str, Any] | None, scale: float = 1.0) -> float:
        return math.nan if not m or m.get("value") is None else m["value"] * scale

    estimated = any((r.get("energy_per_sample_j") or {}).get("source") == "estimated"
                    for rows in benches.values() for r in rows)

    def draw(fig: Figure) -> None:
        axes = fig.subplots(1, 3)
        for i, (label, rows) in enumerate(benches.items()):
            workers = [r["workers"] for r in rows]
            for ax, name, scale in ((axes[0], "throughput", 1.0), (axes[1], "scaling_efficiency", 100.0),
                                    (axes[2], "energy_per_sample_j", 1.0)):
                ax.plot(workers, [value(r.get(name), scale) for r in rows], marker="o", color=colour(i), label=label)
            base = value(rows[0].get("throughput")) if rows else math.nan
            if len(benches) == 1 and not math.isnan(base):
                axes[0].plot(workers, [base * w / workers[0] for w in workers], ls="--", color=GREY, label="linear")
        titles = ("throughput (samples/s)", "scaling efficiency (%)",
                  "energy per sample (J, estimated)" if estimated else "energy per sample (J)")
        counts = sorted({r["workers"] for rows in benches.values() for r in rows})
        for ax, title in zip(axes, titles, strict=True):
            ax.set_title(title, fontsize=9)
            ax.set_xlabel("workers")
            ax.set_xticks(counts, [str(c) for c in counts])
            ax.set_ylim(0, ax.get_ylim()[1] * 1.08)
        axes[0].legend(fontsize=7)

    return render(draw, (9.0, 3.0))


def draw_plan_curves(fig: Figure, plans: Sequence[dict[str, Any]], title: str,
                     labels: Sequence[str] | None = None) -> None:
    """Throughput, scaling efficiency and J/sample against GPU count, one line per plan (``plan_dict`` form);
    points beyond what the calibration measured (extrapolated) hollow.

    Args:
        fig: The figure to draw on.
        plans: The plans.
        title: The figure's title.
        labels: One legend label per plan (default: its inter-node link).
    """
    axes = fig.subplots(1, 3)
    labels = list(labels) if labels is not None else [p.get("inter_link", "?") for p in plans]
    for i, (plan, label) in enumerate(zip(plans, labels, strict=True)):
        rows = plan["predictions"]
        gpus = [p["gpus"] for p in rows]
        for ax, name, scale in ((axes[0], "throughput", 1.0), (axes[1], "scaling_efficiency", 100.0),
                                (axes[2], "joules_per_sample", 1.0)):
            ys = [p[name] * scale for p in rows]
            line = ax.plot(gpus, ys, marker="o", color=PALETTE[i % len(PALETTE)], label=label)[0]
            far = [(g, y) for g, y, p in zip(gpus, ys, rows, strict=True) if p.get("extrapolated")]
            if far:
                ax.plot([g for g, _ in far], [y for _, y in far], "o", mfc="white", color=line.get_color())
    counts = sorted({p["gpus"] for plan in plans for p in plan["predictions"]})
    for ax, name in zip(axes, ("throughput (samples/s)", "scaling efficiency (%)", "energy per sample (J, model)"),
                        strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xticks(counts, [str(c) for c in counts])
        ax.set_xlabel("GPUs")
        ax.set_title(name, fontsize=9)
        ax.grid(True, alpha=0.3)
    axes[0].set_yscale("log")
    axes[0].legend(title="inter-node link", fontsize=7, title_fontsize=8)
    fig.suptitle(title, fontsize=9)


def plan_svg(plans: Sequence[dict[str, Any]], title: str, labels: Sequence[str] | None = None) -> str | None:
    """:func:`draw_plan_curves` as SVG; ``None`` without predictions."""
    if not any(p.get("predictions") for p in plans):
        return None
    return render(lambda fig: draw_plan_curves(fig, plans, title, labels), (9.0, 3.2))


def sweep_svg(data: dict[str, Any]) -> str | None:
    """A simulated sweep (``results`` of ``simulate.json``): J/sample and samples/s against the swept knob, the
    default setting as a dashed line. ``None`` without results."""
    results = data.get("results") or []
    if not results:
        return None
    xlabel, key = _gpu_axis(results)
    baseline = data.get("baseline") or {}

    def draw(fig: Figure) -> None:
        axes = fig.subplots(1, 2)
        for ax, name, title in ((axes[0], "joules_per_sample", "energy per sample (J, simulated)"),
                                (axes[1], "samples_per_s", "throughput (samples/s, simulated)")):
            ax.plot([key(r) for r in results], [r.get(name, math.nan) for r in results], marker="o", color=BLUE)
            if baseline.get(name) is not None:
                ax.axhline(baseline[name], ls="--", color=GREY, lw=1, label="default setting")
                ax.legend(fontsize=7)
            ax.set_xlabel(xlabel)
            ax.set_title(title, fontsize=9)

    return render(draw, (9.0, 3.0))


def straggler_clocks_svg(data: dict[str, Any]) -> str | None:
    """The SM clock each rank held, window by window, in a simulated ``--tune stragglers`` run; ``None`` when
    there is no such schedule."""
    segments = (data.get("clocks") or {}).get("segments") or []
    if not segments:
        return None
    ranks = min(len(segments[0].get("clock_mhz") or []), MAX_STRAGGLER_RANKS)

    def draw(fig: Figure) -> None:
        ax = fig.add_subplot()
        for r in range(ranks):
            xs, ys = [], []
            for seg in segments:
                clock = (seg.get("clock_mhz") or [])[r] if r < len(seg.get("clock_mhz") or []) else math.nan
                xs += [seg["first_step"], seg["last_step"] + 1]
                ys += [clock, clock]
            ax.plot(xs, ys, color=colour(r), label=f"rank {r}")
        ax.set_xlabel("step")
        ax.set_ylabel("SM clock (MHz)")
        ax.set_title("SM clock per rank with per-rank slowdown (simulated)")
        ax.legend(fontsize=7, ncol=4)

    return render(draw, (9.0, 3.0))


def shares_plan(run: SharesOverRun, limit: int = MAX_STRAGGLER_RANKS) -> tuple[list[int], list[int]]:
    """Which ranks :func:`shares_svg` draws one line each (all up to ``limit`` ranks; in a larger world the
    ``limit`` whose share moved farthest from even, in rank order) and which it draws as one "other ranks" line."""
    if run.world <= limit:
        return list(range(run.world)), []
    schedule = run.schedule()
    farthest = {r: max(abs(shares[r] - run.initial[r]) for _, shares in schedule) for r in run.ever_moved()}
    drawn = sorted(sorted(farthest, key=lambda r: (-farthest[r], r))[:limit])
    return drawn, [r for r in range(run.world) if r not in drawn]


def shares_svg(run: SharesOverRun, last_step: int) -> str | None:
    """Samples per step of each rank over a ``--tune rebalance`` run: one step line per rank from the even
    split through every change to the run's last step, the even share dashed, the changes dotted. In a world of
    more than :data:`MAX_STRAGGLER_RANKS` ranks, the ranks that moved most get a line each and the others one
    grey line (their mean) over a band (their range). ``None`` without ranks."""
    if not run.world:
        return None
    schedule = run.schedule()
    end = max(last_step + 1, schedule[-1][0] + 1)
    xs = [step for step, _ in schedule] + [end]
    drawn, others = shares_plan(run)

    def series(values: list[float]) -> list[float]:
        return [*values, values[-1]]  # the last shares hold to the end

    def draw(fig: Figure) -> None:
        ax = fig.add_subplot()
        ax.axhline(run.global_batch / run.world, ls="--", color=GREY, lw=1, label="even share")
        for i, r in enumerate(drawn):
            ax.step(xs, series([float(shares[r]) for _, shares in schedule]), where="post", color=colour(i),
                    label=f"rank {r}")
        if others:
            low = series([float(min(shares[r] for r in others)) for _, shares in schedule])
            high = series([float(max(shares[r] for r in others)) for _, shares in schedule])
            mean = series([sum(shares[r] for r in others) / len(others) for _, shares in schedule])
            ax.fill_between(xs, low, high, step="post", color=GREY, alpha=0.25, lw=0)
            ax.step(xs, mean, where="post", color="#555555", lw=1.2, ls="-.",
                    label=f"other {len(others)} ranks (mean; band: min-max)")
        for step, _ in schedule[1:]:
            ax.axvline(step, color="#444444", lw=0.7, ls=":")
        ax.set_xlim(0, end)
        ax.set_ylim(0, max(max(shares) for _, shares in schedule) * 1.15)
        ax.set_xlabel("optimizer step (dotted: a change of the shares)")
        ax.set_ylabel("samples per step")
        ax.set_title(f"each rank's share of the global batch ({run.global_batch} samples per step)")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))

    return render(draw, (9.0, 3.2))
