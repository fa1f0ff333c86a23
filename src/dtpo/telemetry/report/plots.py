"""The figures of a train run in the HTML report, each an SVG string: step breakdown, step time, power,
energy, and the comparison of several runs.

Every function takes plain data (records, dicts) and returns SVG text (see :mod:`dtpo.telemetry.report.svg`),
or ``None`` where the run has nothing to draw. Labels say *estimated* where a figure comes from a model.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from matplotlib.figure import Figure

from dtpo.core.measurement import Measurement
from dtpo.core.record import RankRecord
from dtpo.core.totals import measured_steps
from dtpo.telemetry.report.data import PowerTimeline
from dtpo.telemetry.report.svg import GREY, PART_COLOURS, PARTS, UNSPLIT, colour, render, thin

MANY_RANKS = 8  # more ranks than this: step time as median and range, not one line each
MAX_POWER_PANELS = 8  # power timelines drawn (one panel each); the rest are named in the caption
MAX_BAR_LABELS = 40  # more bars than this: only every k-th is named


def mean_parts(rank: RankRecord) -> dict[str, float] | None:
    """Mean seconds per measured step of each part of the step (``None`` without measured steps).

    Where the tail was never split into sync wait and exposed communication, it is one part, *not split*.
    """
    steps = measured_steps(rank)
    if not steps:
        return None
    out: dict[str, float] = {}
    split = all(s.comm_exposed_s is not None and s.sync_wait_s is not None for s in steps)
    for name, attr, _ in PARTS:
        values = [getattr(s, attr) for s in steps]
        if None in values:
            continue
        out[name] = sum(values) / len(steps)
    if not split and any(s.tail_s is not None for s in steps):
        out[UNSPLIT[0]] = sum(s.tail_s or 0.0 for s in steps) / len(steps)
    return out


def parts_svg(labels: Sequence[str], parts: Sequence[dict[str, float]], ylabel: str = "") -> str:
    """Stacked horizontal bars: milliseconds per step of each part, one bar per label (rank or run)."""
    names = [n for n in PART_COLOURS if any(n in p for p in parts)]
    height = min(1.3 + 0.32 * len(labels), 9.0)

    def draw(fig: Figure) -> None:
        ax = fig.add_subplot()
        y = list(range(len(labels)))
        left = [0.0] * len(labels)
        for name in names:
            widths = [1e3 * p.get(name, 0.0) for p in parts]
            ax.barh(y, widths, left=left, color=PART_COLOURS[name], label=name, height=0.65,
                    edgecolor="white", linewidth=0.5)
            left = [a + b for a, b in zip(left, widths, strict=True)]
        every = math.ceil(len(labels) / MAX_BAR_LABELS)  # many bars: label some, write no totals
        if every == 1:
            for i, total in enumerate(left):
                ax.text(total, i, f" {total:.3g} ms", va="center", fontsize=8)
        ax.set_yticks(y[::every], list(labels)[::every])
        ax.invert_yaxis()
        ax.set_xlabel("mean time per measured step (ms)")
        ax.set_ylabel(ylabel)
        ax.set_xlim(0, max(left, default=1.0) * 1.15 or 1.0)
        ax.grid(axis="y", visible=False)
        ax.legend(loc="lower left", bbox_to_anchor=(0, 1.0), ncol=len(names), fontsize=8)

    return render(draw, (9.0, height))


def breakdown_svg(ranks: Sequence[RankRecord]) -> str | None:
    """Per-rank step breakdown (stacked, measured steps only); ``None`` when no rank has a measured step."""
    rows = [(f"rank {r.rank}", p) for r in ranks if (p := mean_parts(r)) is not None]
    if not rows:
        return None
    return parts_svg([label for label, _ in rows], [p for _, p in rows])


def step_time_svg(ranks: Sequence[RankRecord], switches: Sequence[dict] = ()) -> str | None:
    """Step time against step index, per rank (median and range over ranks when there are many), warm-up steps
    shaded, setting switches marked; ``None`` without steps."""
    ranks = [r for r in ranks if r.steps]
    if not ranks:
        return None

    def draw(fig: Figure) -> None:
        ax = fig.add_subplot()
        warm = sorted({s.step for r in ranks for s in r.steps if s.warmup})
        if warm:
            ax.axvspan(warm[0] - 0.5, warm[-1] + 0.5, color=GREY, alpha=0.18, lw=0, label="warm-up (not counted)")
        bucket = 1
        if len(ranks) <= MANY_RANKS:
            for i, r in enumerate(ranks):
                xs, ys, bucket = thin([s.step for s in r.steps], [1e3 * s.step_s for s in r.steps])
                ax.plot(xs, ys, color=colour(i), lw=1.0, label=f"rank {r.rank}")
        else:
            by_step: dict[int, list[float]] = {}
            for r in ranks:
                for s in r.steps:
                    by_step.setdefault(s.step, []).append(1e3 * s.step_s)
            steps = sorted(by_step)
            xs, med, bucket = thin(steps, [statistics.median(by_step[s]) for s in steps])
            _, low, _ = thin(steps, [min(by_step[s]) for s in steps])
            _, high, _ = thin(steps, [max(by_step[s]) for s in steps])
            ax.fill_between(xs, low, high, color=colour(0), alpha=0.2, lw=0, label=f"range over {len(ranks)} ranks")
            ax.plot(xs, med, color=colour(0), lw=1.0, label="median rank")
        marked = sorted({(s["step"], f"{s.get('setting')}={s.get('value')}") for s in switches if "step" in s})
        for step, text in marked:
            ax.axvline(step - 0.5, color="#444444", lw=0.7, ls=":")
            if len(marked) <= 12:
                ax.annotate(text, (step - 0.5, 1.0), xycoords=("data", "axes fraction"), rotation=90, fontsize=7,
                            va="top", ha="right", color="#444444", xytext=(-2, -2),
                            textcoords="offset points")
        ax.set_xlabel("optimizer step" + (f" (mean of every {bucket} steps)" if bucket > 1 else ""))
        ax.set_ylabel("step time (ms)")
        ax.set_ylim(bottom=0)
        ax.legend(loc="lower left", bbox_to_anchor=(0, 1.0), ncol=min(len(ranks) + 1, 6))

    return render(draw, (9.0, 3.2))


def power_svg(timelines: Sequence[PowerTimeline], measured_from: dict[int, float | None] | None = None) -> str | None:
    """Each rank's power timeline, one panel per rank, one line per device (estimated devices say so); the
    time before the first measured step shaded. ``None`` without timelines."""
    shown = list(timelines)[:MAX_POWER_PANELS]
    if not shown:
        return None
    measured_from = measured_from or {}

    def draw(fig: Figure) -> None:
        axes = fig.subplots(len(shown), 1, sharex=True, squeeze=False)[:, 0]
        for ax, tl in zip(axes, shown, strict=True):
            start = measured_from.get(tl.rank)
            if start is not None and start > 0:
                ax.axvspan(0, start, color=GREY, alpha=0.18, lw=0, label="before the measured steps")
            for i, (device, watts) in enumerate(tl.watts.items()):
                xs, ys, _ = thin(tl.t_s, watts)
                label = device if device not in tl.estimated or "modelled" in device else f"{device} (estimated)"
                ax.plot(xs, ys, color=colour(i), lw=1.0, label=label)
            est = " (estimated: modelled devices)" if tl.estimated else ""
            ax.set_title(f"rank {tl.rank}{est}", fontsize=9)
            ax.set_ylabel("W")
            ax.set_ylim(bottom=0)
            ax.legend(loc="lower right", bbox_to_anchor=(1, 1.0), ncol=3, fontsize=7)
        axes[-1].set_xlabel("seconds from the first power sample")

    return render(draw, (9.0, 0.8 + 1.9 * len(shown)))


def energy_svg(by_source: dict[str, float], by_device: dict[str, tuple[float, str]],
               estimated_sources: set[str]) -> str | None:
    """Energy by source (left) and by device, coloured by source (right), in joules; ``None`` without any."""
    if not by_source and not by_device:
        return None
    sources = sorted(set(by_source) | {src for _, src in by_device.values()})
    colours = {src: colour(i) for i, src in enumerate(sources)}

    def name(src: str) -> str:
        return f"{src} (estimated)" if src in estimated_sources else src

    def draw(fig: Figure) -> None:
        left, right = fig.subplots(1, 2, width_ratios=(1, 1.4))
        items = sorted(by_source.items(), key=lambda kv: -kv[1])
        left.barh([name(k) for k, _ in items], [v for _, v in items], color=[colours[k] for k, _ in items],
                  height=0.6)
        left.set_title("by source")
        devices = sorted(by_device.items(), key=lambda kv: -kv[1][0])
        right.barh([k for k, _ in devices], [v for _, (v, _) in devices],
                   color=[colours.get(src, GREY) for _, (_, src) in devices], height=0.6)
        right.set_title("by device (measured window)")
        for ax in (left, right):
            ax.invert_yaxis()
            ax.set_xlabel("energy (J)")
            ax.grid(axis="y", visible=False)

    rows = max(len(by_source), len(by_device), 1)
    return render(draw, (9.0, 1.4 + 0.35 * min(rows, 20)))


def compare_totals_svg(labels: Sequence[str], throughput: Sequence[Measurement | None],
                       per_sample: Sequence[Measurement | None]) -> str:
    """Throughput and energy per sample, one bar per run (an estimated figure is hatched and says so)."""

    def draw(fig: Figure) -> None:
        axes = fig.subplots(1, 2, sharey=True)
        for ax, figures, title in ((axes[0], throughput, "throughput (samples/s)"),
                                   (axes[1], per_sample, "energy per sample (J)")):
            values = [m.value if m is not None and m.value is not None else math.nan for m in figures]
            est = [m is not None and m.estimated for m in figures]
            bars = ax.barh(range(len(labels)), [0 if math.isnan(v) else v for v in values],
                           color=[colour(i) for i in range(len(labels))], height=0.6)
            for bar, e, v in zip(bars, est, values, strict=True):
                if e:
                    bar.set_hatch("//")
                ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2,
                        " n/a" if math.isnan(v) else f" {v:.4g}" + (" (est.)" if e else ""), va="center", fontsize=8)
            ax.set_title(title + (" (hatched: estimated)" if any(est) else ""))
            ax.set_xlim(0, max((v for v in values if not math.isnan(v)), default=1.0) * 1.3 or 1.0)
            ax.grid(axis="y", visible=False)
        axes[0].set_yticks(range(len(labels)), labels)
        axes[0].invert_yaxis()

    return render(draw, (9.0, 1.3 + 0.4 * len(labels)))
