"""The sections of the HTML report, one function per kind of input: train run, bench, plan, simulation.

A section says in one line what its input does not have (no energy, no tuning) instead of drawing an empty
figure. Ids are built from the section's id, so a figure is ``<figure id="run-1-breakdown">`` and so on.
"""

from __future__ import annotations

from typing import Any

from dtpo.core.errors import first_line
from dtpo.core.measurement import Measurement
from dtpo.core.record_sections import PowerTuning
from dtpo.telemetry.job_tuning import job_report, setting_label
from dtpo.telemetry.rebalance import SharesOverRun, last_step, shares_over_run
from dtpo.telemetry.report.curves import (
    bench_svg,
    job_tuning_svg,
    plan_svg,
    power_tuning_svg,
    shares_plan,
    shares_svg,
    straggler_clocks_svg,
    sweep_svg,
)
from dtpo.telemetry.report.data import BenchData, PlanData, RunData, SimulateData
from dtpo.telemetry.report.grid import grid_part
from dtpo.telemetry.report.markup import (
    Html,
    Page,
    badge,
    figure,
    flatten,
    join,
    measurement_cells,
    para,
    short_value,
    table,
    tag,
)
from dtpo.telemetry.report.plots import MAX_POWER_PANELS, breakdown_svg, energy_svg, power_svg, step_time_svg
from dtpo.telemetry.report.swing import power_swing_part
from dtpo.telemetry.summary import rebalance_advice, rebalance_summary, straggler_summary, tuning_summary

KEY_TOTALS = (("throughput", "throughput"), ("step time (median)", "step_time_s"), ("MFU", "mfu"),
              ("communication overhead", "comm_overhead"), ("sync latency (mean)", "sync_latency_s"),
              ("data-loading share", "data_wait_fraction"), ("measured steps", "measured_steps"))
KEY_ENERGY = (("energy", "energy_j"), ("average power", "average_power_w"),
              ("energy per sample", "energy_per_sample_j"), ("emissions", "co2_g"), ("cost", "cost"))
ESTIMATED_SOURCES = ("modelled", "simulated")


def key_figures(data: RunData) -> list[tuple[str, Measurement | None]]:
    """The run's headline figures, named, in the order the report shows them."""
    record = data.record
    rows: list[tuple[str, Measurement | None]] = [(name, record.totals.get(key)) for name, key in KEY_TOTALS]
    if record.energy is not None:
        rows += [(name, record.energy.get(key)) for name, key in KEY_ENERGY if record.energy.get(key) is not None]
    return [(name, m) for name, m in rows if m is not None]


def estimated_sources(data: RunData) -> set[str]:
    """Energy sources of the run that are models, not counters."""
    found = {s for s in (data.record.energy.by_source_j if data.record.energy else {}) if s in ESTIMATED_SOURCES}
    for rank in data.record.ranks:
        found |= {d.get("source", "") for d in (rank.energy or {}).get("devices") or [] if d.get("estimated")}
    return found


def run_section(page: Page, data: RunData, sid: str, title: str, level: int = 2) -> Html:
    """A train run: key figures, step breakdown, step time, power and energy, tuning, config and environment."""
    record = data.record
    status = badge(record.status, "ok" if record.status == "completed" else "bad")
    out = [page.heading(level, sid, title, status)]
    devices = ", ".join(sorted({r.device for r in record.ranks})) or "no ranks recorded"
    out.append(para(f"{data.path} · {len(record.ranks)} rank(s) on {devices} · started {record.started_at}"
                    f"{f', finished {record.finished_at}' if record.finished_at else ''}", "muted"))
    if record.error:
        out.append(para(f"run {record.status}: {first_line(record.error)}"))
        if record.error.strip() != first_line(record.error):
            out.append(tag("details", join([tag("summary", "the whole error"), tag("pre", record.error)])))
    figures = key_figures(data)
    if figures:
        out.append(table(("figure", "value", "source", "note"),
                         [(name, *measurement_cells(m)) for name, m in figures], "figures"))
    out += _steps_part(page, data, sid, level + 1)
    out += _energy_part(page, data, sid, level + 1)
    out += _tuning_part(page, data, sid, level + 1)
    out += grid_part(page, data, sid, level + 1)
    if record.restarts:
        out.append(page.heading(level + 1, f"{sid}-restarts", "Restarts"))
        out.append(table(("attempt", "status", "steps", "time", "energy", "resumed from", "steps lost", "recovery",
                          "recovery energy", "error"), [
            (r.attempt, r.status, "?" if r.steps is None else r.steps, short_value(r.time_s), short_value(r.energy_j),
             "" if r.resumed_from_step is None else f"step {r.resumed_from_step}",
             "" if r.steps_lost is None else r.steps_lost,
             short_value(r.recovery_s) if r.recovery_s is not None else "",
             short_value(r.recovery_energy_j) if r.recovery_energy_j is not None else "",
             r.error or "") for r in record.restarts]))
    out.append(page.heading(level + 1, f"{sid}-config", "Configuration and environment"))
    out.append(tag("div", join([
        tag("div", join([tag("h4", "configuration"), _kv(record.config)])),
        tag("div", join([tag("h4", "environment"), _kv(record.environment)]))]),
        class_="grid"))
    return join(out)


def _steps_part(page: Page, data: RunData, sid: str, level: int) -> list[Html]:
    ranks = data.record.ranks
    if not any(r.steps for r in ranks):
        return [para("No steps were recorded in this run.", "absent")]
    out = [page.heading(level, f"{sid}-steps", "Where the step time went")]
    svg = breakdown_svg(ranks)
    if svg is not None:
        out.append(figure(f"{sid}-breakdown", svg, "Mean time per measured step of each part, per rank (warm-up "
                          "steps excluded). Sync wait: waiting for the slowest rank; exposed comm: collectives "
                          "not hidden behind backward. Measured on each rank's clock."))
    else:
        out.append(para("No measured steps (only warm-up): no breakdown.", "absent"))
    switches = [s for r in ranks[:1] for s in r.switches]
    svg = step_time_svg(ranks, switches)
    if svg is not None:
        out.append(figure(f"{sid}-step-time", svg, "Step time over the run, per rank; the shaded warm-up steps are "
                          "not counted in the totals" + ("; dotted lines: setting switches." if switches else ".")))
    return out


def _energy_part(page: Page, data: RunData, sid: str, level: int) -> list[Html]:
    record = data.record
    if record.energy is None and not data.power:
        return [para("Energy was not measured in this run.", "absent")]
    out = [page.heading(level, f"{sid}-energy", "Power and energy")]
    if data.power:
        starts = {r.rank: next((s.started_at for s in r.steps if not s.warmup and s.started_at is not None), None)
                  for r in record.ranks}
        timeline = {t.rank: t.started_at for t in data.power}
        measured_from = {rank: (start - timeline[rank]) if start is not None and timeline.get(rank) else None
                         for rank, start in starts.items() if rank in timeline}
        shown = ", ".join(str(t.rank) for t in data.power[:MAX_POWER_PANELS])
        more = f" ({len(data.power) - MAX_POWER_PANELS} more not drawn)" if len(data.power) > MAX_POWER_PANELS else ""
        estimated = any(t.estimated for t in data.power)
        out.append(figure(f"{sid}-power", power_svg(data.power, measured_from) or "",
                          f"Power per device as sampled by rank(s) {shown}{more}"
                          + ("; modelled devices are estimates, not readings" if estimated else "")
                          + ". Shaded: before the first measured step."))
    else:
        out.append(para("No power timeline was recorded.", "absent"))
    if record.energy is not None:
        by_device = {}
        for rank in record.ranks:
            run = (rank.energy or {}).get("run") or {}
            for device, joules in (run.get("energy_j") or {}).items():
                by_device[f"rank {rank.rank} / {device}"] = (joules, (run.get("sources") or {}).get(device, "?"))
        svg = energy_svg(record.energy.by_source_j, by_device, estimated_sources(data))
        if svg is not None:
            out.append(figure(f"{sid}-energy-sources", svg, "Energy over the measured steps, by source and by "
                              "device (node-shared devices are counted once per node)."))
        if record.energy.lost:
            out.append(para("Energy lost: " + "; ".join(f"{k}: {v}" for k, v in record.energy.lost.items())))
    out += power_swing_part(page, data, sid, level + 1)
    return out


def _tuning_part(page: Page, data: RunData, sid: str, level: int) -> list[Html]:
    record = data.record
    gpu = next((r.tuning for r in record.ranks if isinstance(r.tuning, PowerTuning)), None)
    job = job_report(record)
    slack = straggler_summary(record)
    if gpu is None and job is None and slack is None:
        return [para("Nothing was tuned in this run.", "absent")]
    out = [page.heading(level, f"{sid}-tuning", "Tuning")]
    estimated = bool(record.energy is not None and record.energy.energy_j.estimated)
    if gpu is not None:
        out.append(para(f"GPU knobs: {_plain(tuning_summary(record)) or gpu.note or 'no choice was made'}"))
        svg = power_tuning_svg(gpu.to_dict())
        if svg is not None:
            out.append(figure(f"{sid}-power-tuning", svg, "The GPU-knob tuner's cost per setting (bars: interval "
                              "of each estimate; star: the choice) and the setting it held over the tuned steps."))
    if job is not None:
        report = job.report or {}
        choice = report.get("choice")
        out.append(para(f"Job knobs ({job.knob}): " + (f"chose {setting_label(choice)} for "
                        f"{report.get('metric_description') or job.metric}" if choice
                        else job.note or "no choice was made")))
        svg = job_tuning_svg(job.to_dict(), estimated)
        if svg is not None:
            out.append(figure(f"{sid}-job-tuning", svg, "The job-knob tuner's candidates against J/sample, as "
                              "profiled" + (" (energy estimated)" if estimated else "") + " (★ black edge: the "
                              "choice; red hatched: rejected by the convergence guard), and each measured block of "
                              "steps over the run, coloured by setting."))
        if job.screened:
            out.append(para("Not searched: " + "; ".join(f"{k} ({v})" for k, v in job.screened.items())))
    if slack is not None:
        out.append(para(f"Stragglers: {_plain(slack)}"))
        out.append(table(("rank", "wait per step", "share of step time", "clock changes"), [
            (r.rank, f"{1e3 * r.slack.wait_s_per_step:.2f} ms", f"{100 * r.slack.wait_share:.1f} %",
             len(r.slack.clock_changes or []))
            for r in record.ranks if r.slack is not None]))
    out += _rebalance_part(data, sid)
    return out


def _rebalance_part(data: RunData, sid: str) -> list[Html]:
    """``--tune rebalance``: the summary line, the shares over time and the recommendations (nothing where
    rebalancing did not run)."""
    run = shares_over_run(data.record)
    if run is None:
        return []
    out = [para(f"Rebalance: {_plain(rebalance_summary(data.record))}")]
    svg = shares_svg(run, last_step(data.record, run))
    if svg is not None:
        out.append(figure(f"{sid}-shares", svg, shares_caption(run)))
    advice = rebalance_advice(data.record)
    if advice:
        out.append(tag("ul", join(tag("li", _plain(line)) for line in advice), class_="plain"))
    return out


MAX_CHANGES_IN_WORDS = 6


def _changes_in_words(run: SharesOverRun) -> str:
    """``from step 32 (predicted 26.2 % shorter steps), from step 62 (13.8 %)...``, the first few changes."""
    words = []
    for i, change in enumerate(run.changes[:MAX_CHANGES_IN_WORDS]):
        gain = change.get("gain")
        known = isinstance(gain, int | float) and not isinstance(gain, bool)
        predicted = "" if not known else f" (predicted {100 * gain:.1f} % shorter steps)" if i == 0 \
            else f" ({100 * gain:.1f} %)"
        words.append(f"from step {change['step']}{predicted}")
    if len(run.changes) > MAX_CHANGES_IN_WORDS:
        words.append(f"and {len(run.changes) - MAX_CHANGES_IN_WORDS} more")
    return ", ".join(words)


def shares_caption(run: SharesOverRun) -> str:
    """The shares-over-time figure in words: where the shares started, when they changed and where they ended."""
    low, high = min(run.initial), max(run.initial)
    even = f"{low} each" if low == high else f"{low}-{high} each"
    text = (f"Samples per step of each rank over the run (a step line per rank), out of a global batch of "
            f"{run.global_batch} that stays the same at every step; dashed: the even share.")
    if not run.changes:
        text += f" The shares stayed at the even split ({even}): no rank was persistently slower than the rest."
    else:
        count = len(run.changes)
        text += (f" They start at the even split ({even}) and changed {count} time{'' if count == 1 else 's'} "
                 f"(dotted): {_changes_in_words(run)}.")
        moved = run.moved()
        if moved:
            ends = ", ".join(f"rank {m.rank} at {m.share} ({m.ratio:.2f}x even)" for m in moved[:3])
            more = f" and {len(moved) - 3} more" if len(moved) > 3 else ""
            text += f" At the end, farthest from even: {ends}{more}."
        else:
            text += " At the end every rank is back at its even share."
    drawn, others = shares_plan(run)
    if others:
        text += (f" Drawn one line each: the {len(drawn)} ranks whose share moved most; the other {len(others)} "
                 "as one line (their mean) over a grey band (their smallest to largest share).")
    return text


def bench_section(page: Page, data: BenchData, sid: str) -> Html:
    """A bench: its scaling table and curves, then each worker count's run."""
    rows = data.bench.get("rows") or []
    out = [page.heading(2, sid, f"Bench {data.label}"),
           para(f"{data.path} · workload {data.bench.get('workload', '?')} · weak scaling (per-worker batch fixed)",
                "muted"),
           table(("workers", "samples/s", "scaling efficiency", "step time", "comm overhead", "J/sample", "tuned"),
                 [(r.get("workers"), short_value(r.get("throughput")), short_value(r.get("scaling_efficiency")),
                   short_value(r.get("step_time_s")), short_value(r.get("comm_overhead")),
                   short_value(r.get("energy_per_sample_j")), r.get("tuned") or "-") for r in rows])]
    svg = bench_svg({data.label: rows})
    if svg is not None:
        out.append(figure(f"{sid}-scaling", svg, "Throughput, scaling efficiency (against the smallest count) and "
                          "energy per sample against worker count; dashed: linear scaling."))
    for workers, run in sorted(data.runs.items()):
        out.append(run_section(page, run, f"{sid}-w{workers}", f"{workers} worker(s): run {run.label}", level=3))
    return join(out)


def plan_section(page: Page, data: PlanData, sid: str) -> Html:
    """A plan: predictions per GPU count and link, the curves, the assumptions (all model figures)."""
    out = [page.heading(2, sid, f"Plan {data.label}", badge("model predictions, estimated", "est")),
           para(f"{data.path} · {data.plans[0].get('gpu', '?') if data.plans else '?'} · calibration: "
                f"{data.plans[0].get('calibration', '?') if data.plans else '?'}", "muted")]
    svg = plan_svg(data.plans, "dtpo plan (model predictions, estimated)")
    if svg is not None:
        out.append(figure(f"{sid}-curves", svg, "Predicted throughput, scaling efficiency and energy per sample "
                          "against GPU count, one line per inter-node link; hollow points lie beyond what the "
                          "calibration measured (extrapolated)."))
    for i, plan in enumerate(data.plans):
        out.append(tag("h4", f"{plan.get('intra_link', '?')} inside nodes, {plan.get('inter_link', '?')} between"))
        out.append(table(("GPUs", "nodes", "accum", "step ms", "samples/s", "scaling eff.", "J/sample", "limited by"),
                         [(f"{p['gpus']}{'*' if p.get('extrapolated') else ''}", p.get("nodes"), p.get("grad_accum"),
                           _ms(p["step_s"]), f"{p['throughput']:,.1f}",
                           f"{100 * p['scaling_efficiency']:.1f} %", f"{p['joules_per_sample']:.4g}",
                           p.get("limit", "")) for p in plan["predictions"]]))
        assumptions = plan.get("assumptions") or []
        if assumptions:
            out.append(tag("details", join([tag("summary", "assumptions"),
                                            tag("ul", join(tag("li", a) for a in assumptions), class_="plain")]),
                           open="" if i == 0 else None))
    out.append(para("* extrapolated beyond what the calibration measured.", "muted"))
    return join(out)


def simulate_section(page: Page, data: SimulateData, sid: str) -> Html:
    """A simulation: its figures as a table and whatever it has to plot, every figure labelled simulated."""
    sim = data.data
    out = [page.heading(2, sid, f"Simulation {data.label}", badge("simulated", "sim")),
           para(f"{data.path} · every figure here is simulated from a model, not measured", "muted")]
    scalars = {k: v for k, v in sim.items() if k not in ("assumptions", "results", "tuning", "clocks", "baseline")}
    out.append(table(("key", "value"), flatten(scalars), "kv"))
    results = sim.get("results") or []
    if results and isinstance(results[0], dict):
        keys = list(results[0])
        out.append(table(keys, [[_cell(r.get(k)) for k in keys] for r in results]))
    for name, svg, caption in (
            ("sweep", sweep_svg(sim), "Simulated energy per sample and throughput against the swept knob."),
            ("tuning", power_tuning_svg(sim["tuning"], " (simulated)") if isinstance(sim.get("tuning"), dict)
             else None, "The tuner's cost per setting and the setting it held, on simulated GPUs."),
            ("clocks", straggler_clocks_svg(sim), "The SM clock each rank held, window by window (simulated).")):
        if svg is not None:
            out.append(figure(f"{sid}-{name}", svg, caption))
    assumptions = sim.get("assumptions") or []
    if assumptions:
        out.append(tag("h4", "model assumptions"))
        out.append(tag("ul", join(tag("li", a) for a in assumptions), class_="plain"))
    return join(out)


def _kv(data: dict[str, Any]) -> Html:
    return table(("key", "value"), flatten(data), "kv") if data else para("none recorded", "absent")


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1e4 else f"{value:.4g}"
    return "-" if value is None else str(value)


def _ms(seconds: float) -> str:
    """Milliseconds: three significant figures below 100 ms, one decimal above (as ``dtpo plan`` prints them)."""
    ms = seconds * 1e3
    return f"{ms:,.1f}" if ms >= 100 else f"{ms:.3g}"



def _plain(text: str | None) -> str:
    """A summary line written for the terminal (rich markup escaped) as plain text."""
    return (text or "").replace("\\[", "[")
