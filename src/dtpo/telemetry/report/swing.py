"""The power-swing part of a train run's section in the HTML report: a figure and three tables.

The figure has two panels: the job's summed power over time with what each what-if would leave of it, and
the spectrum of its oscillation (Welch) with the critical bands shaded, the frequencies the timeline cannot
resolve hatched and labelled *not seen*, and the step rate and its harmonics marked. The tables are the ones
``dtpo report --power-swing`` prints (:mod:`dtpo.telemetry.power_swing_view`), as HTML.
"""

from __future__ import annotations

import logging

import numpy as np
from matplotlib.figure import Figure

from dtpo.core.errors import ConfigError
from dtpo.telemetry.power_swing import BANDS, RAMP_LAGS_S
from dtpo.telemetry.power_swing_run import RunSwing, swing_of_run
from dtpo.telemetry.power_swing_view import critical_share, provenance, ramp, share, watts
from dtpo.telemetry.report.data import RunData
from dtpo.telemetry.report.markup import Html, Page, badge, figure, para, table
from dtpo.telemetry.report.svg import GREY, colour, render, thin

log = logging.getLogger(__name__)

MAX_HARMONICS = 8  # step-rate harmonics marked on the spectrum
MAX_DEVICE_ROWS = 16


def swing_svg(swing: RunSwing) -> str:
    """The job's power and its what-ifs over time (left), its spectrum with bands and step harmonics (right)."""
    job = swing.job

    def draw(fig: Figure) -> None:
        left, right = fig.subplots(1, 2, width_ratios=(1.3, 1))
        t = np.arange(job.samples) * job.grid.dt_s
        xs, ys, _ = thin(list(t), list(job.grid.watts))
        left.plot(xs, ys, color=colour(0), lw=1.3, label="as measured", zorder=3)
        for i, w in enumerate(swing.what_ifs, start=1):
            xs, ys, _ = thin(list(t), list(w.what_if.watts))
            left.plot(xs, ys, color=colour(i), lw=0.8, alpha=0.85, label=w.what_if.name)
        left.set_xlabel("seconds")
        left.set_ylabel("job power (W)")
        left.set_title(f"job power ({provenance(swing)})")
        left.legend(loc="lower left", bbox_to_anchor=(0, 1.06), ncol=2, fontsize=7)
        f, psd = job.spectrum.freqs_hz, job.spectrum.psd
        keep = f > 0
        right.semilogy(f[keep], np.maximum(psd[keep], 1e-12), color=colour(0), lw=1.0)
        for i, (low, high) in enumerate(BANDS):
            right.axvspan(low, high, color=colour(i + 1), alpha=0.08, lw=0)
        seen = job.resolvable
        top = max(float(f[-1]), BANDS[-1][1])
        if seen.high_hz < top * (1 - 1e-6):
            right.axvspan(seen.high_hz, top, facecolor="none", edgecolor=GREY, hatch="//", lw=0)
            right.text(seen.high_hz, 1.0, " not seen", transform=right.get_xaxis_transform(), va="top",
                       fontsize=8, color="#555555")
        if swing.step_rate_hz:
            for k in range(1, MAX_HARMONICS + 1):
                if k * swing.step_rate_hz > top:
                    break
                right.axvline(k * swing.step_rate_hz, color="#444444", lw=0.6, ls=":",
                              label="step rate and harmonics" if k == 1 else None)
            if right.get_legend_handles_labels()[0]:  # no line where the step rate is above the band shown
                right.legend(loc="lower left", fontsize=7)
        right.set_xscale("log")
        right.set_xlim(max(seen.low_hz, 0.05), top)
        right.set_xlabel("Hz (shaded: 0.1-1, 1-2.5, 2.5-7, 7-20 Hz)")
        right.set_ylabel("W²/Hz")
        right.set_title("spectrum of the oscillation (Welch)")

    return render(draw, (9.0, 3.4))


def power_swing_part(page: Page, data: RunData, sid: str, level: int) -> list[Html]:
    """The run's power swing (nothing where it has no power timeline; one line where it cannot be analysed)."""
    if not data.power:
        return []
    try:
        swing = swing_of_run(data)
    except ConfigError as exc:
        return [para(f"Power swing not analysed: {exc}", "absent")]
    job = swing.job
    kind = provenance(swing)
    label = {"simulated": badge("simulated", "sim"), "estimated": badge("estimated", "est")}.get(kind, Html(""))
    out = [page.heading(level, f"{sid}-swing", "Power swing", label)]
    out.append(figure(f"{sid}-swing-plot", swing_svg(swing),
                      f"Left: the job's summed power ({kind}) and what each what-if would leave of it. Right: its "
                      f"spectrum; the timeline resolves {job.resolvable.low_hz:.3g}-{job.resolvable.high_hz:.3g} Hz "
                      f"({job.resolvable.why}); hatched: not seen."))
    rows = [swing.devices[:MAX_DEVICE_ROWS], [job]]
    out.append(table(("timeline", "mean", "p5 / p95", "swing", *[f"ramp {lag:g} s" for lag in RAMP_LAGS_S],
                      "dominant", "against the steps"),
                     [(f.name, watts(f.mean_w), f"{watts(f.p5_w)} / {watts(f.p95_w)}",
                       f"{watts(f.swing_w)} ({100 * f.swing_share:.1f} %)",
                       *[ramp(f.ramps_w_per_s.get(lag)) for lag in RAMP_LAGS_S],
                       "none" if f.dominant_hz is None else f"{f.dominant_hz:.3g} Hz", f.harmonic)
                      for group in rows for f in group]))
    out.append(table(("band", "share of the job's oscillating energy", "seen"),
                     [(b.label, share(b.share) + (" of the part seen" if b.seen == "partly" else ""), b.seen)
                      for b in job.bands]))
    fleet = swing.fleet
    out.append(para(f"At {fleet.gpus:,} {swing.unit}s: swing {watts(fleet.swing_mw[1] * 1e6)} expected "
                    f"(independent {watts(fleet.swing_mw[0] * 1e6)}, in phase {watts(fleet.swing_mw[2] * 1e6)}), "
                    f"from " + (f"a mean cross-rank correlation of {fleet.correlation:.2f}"
                                if fleet.measured_correlation else f"one {swing.unit}, taken as in phase") + "."))
    out.append(table(("what-if", "settings", "swing", "ramp 1 s", "0.1-20 Hz share", "energy cost", "note"),
                     [("as measured", "", watts(job.swing_w), ramp(job.ramps_w_per_s.get(1.0)), critical_share(job),
                       "", "")]
                     + [(w.what_if.name, w.what_if.settings, watts(w.figures.swing_w),
                         ramp(w.figures.ramps_w_per_s.get(1.0)), critical_share(w.figures),
                         f"{100 * w.what_if.energy_cost_share:+.2f} %", w.what_if.note) for w in swing.what_ifs]))
    out.append(para("; ".join(dict.fromkeys(swing.notes)), "muted"))
    return out
