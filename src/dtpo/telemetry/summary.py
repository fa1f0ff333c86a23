"""The summary table printed at the end of a run."""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from dtpo.core.measurement import Measurement
from dtpo.core.record import RunRecord
from dtpo.core.record_sections import PowerTuning
from dtpo.core.totals import energy_of_all_attempts, measured_steps
from dtpo.telemetry.job_tuning import job_tuning_line, job_tuning_table
from dtpo.telemetry.rebalance import MAX_NAMED_RANKS, shares_over_run


def _pct(part: float | None, whole: float) -> str:
    return "n/a" if part is None or whole <= 0 else f"{100 * part / whole:.1f}%"


PIPE_WIDTH = 1000
"""Columns of a console that is not a terminal: wide enough that no table is cut (lines are as long as needed)."""


def make_console() -> Console:
    """A console for tables: the terminal's width on a terminal; in a pipe or a log, no cutting or wrapping."""
    if sys.stdout.isatty():
        return Console()
    return Console(width=PIPE_WIDTH, soft_wrap=True)


def format_value(m: Measurement | dict[str, Any] | None) -> str:
    """A measurement (or its dict) as text, with its unit and an *estimated* label where it is modelled."""
    if isinstance(m, Measurement):
        m = m.to_dict()
    if not m or m.get("value") is None:
        return "n/a"
    value, unit = m["value"], m["unit"]
    if unit == "fraction":
        text = f"{100 * value:.2f}%"
    elif unit == "s":
        text = f"{value * 1000:.2f} ms" if value < 1 else f"{value:.2f} s"
    elif unit == "FLOP/s":
        text = f"{value / 1e9:,.1f} GFLOP/s"
    elif isinstance(value, float):
        text = f"{value:,.4g} {unit}" if abs(value) < 1000 else f"{value:,.0f} {unit}"
    else:
        text = f"{value:,} {unit}"
    return text + (" (estimated)" if m.get("source") == "estimated" else "")


def _loss(m: Measurement) -> str:
    return "n/a" if m.value is None else f"{m.value:.4f}"


def breakdown_table(record: RunRecord) -> Table:
    """Per-rank breakdown of the measured steps."""
    table = Table(title=f"dtpo run {record.run_id} ({record.status})", title_justify="left")
    for name in ("rank", "node", "samples/s", "step", "data", "compute", "comm", "sync", "optim"):
        table.add_column(name, justify="left" if name == "node" else "right", no_wrap=True)
    for rank in record.ranks:
        steps = measured_steps(rank)
        wall = sum(s.step_s for s in steps)
        if not steps or wall <= 0:
            table.add_row(str(rank.rank), rank.node, *(["-"] * 7))
            continue

        def part(name: str, steps: list = steps, wall: float = wall) -> str:
            values = [getattr(s, name) for s in steps]
            return _pct(None if None in values else sum(values), wall)

        table.add_row(str(rank.rank), rank.node, f"{sum(s.samples for s in steps) / wall:,.1f}",
                      f"{1000 * wall / len(steps):.1f} ms", part("data_wait_s"), part("compute_s"),
                      part("comm_exposed_s"), part("sync_wait_s"), part("optimizer_s"))
    return table


def _step_time_row(t: dict[str, Any], framework: str | None) -> tuple[str, str]:
    """The median step time; for another framework's run, the mean: it dispatches asynchronously, so a step's own
    time is when the host queued it, and only whole windows (the device waited for at their ends) hold its pace."""
    wall, steps = t.get("wall_s"), t.get("measured_steps")
    if framework and wall is not None and steps is not None and wall.value and steps.value:
        return ("step time (mean)", f"{format_value(Measurement(wall.value / steps.value, 's'))} ({framework} "
                "dispatches asynchronously: per-step times are when the host queued each step)")
    return ("step time (median)", format_value(t.get("step_time_s")))


def totals_table(record: RunRecord) -> Table:
    """The run's headline figures."""
    t = record.totals
    table = Table(show_header=False, box=None, padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    devices = sorted({r.device for r in record.ranks})
    framework = (record.config.get("user") or {}).get("framework") if isinstance(record.config, dict) else None
    rows = [
        ("workers", f"{len(record.ranks)} on {', '.join(devices)}"),
        ("measured steps", format_value(t.get("measured_steps"))),
        ("throughput", format_value(t.get("throughput"))),
        _step_time_row(t, framework),
        ("MFU", format_value(t.get("mfu"))),
        ("communication overhead", format_value(t.get("comm_overhead"))),
        ("sync latency (mean)", format_value(t.get("sync_latency_s"))),
        ("data-loading share", format_value(t.get("data_wait_fraction"))),
    ]
    threads = record.environment.get("torch_threads")
    if threads is not None and not framework:
        rows.insert(1, ("threads per worker", str(threads)))
    if "loss_first" in t and "loss_last" in t:
        rows.append(("loss", f"{_loss(t['loss_first'])} -> {_loss(t['loss_last'])}"))
    evaluation = next((r.evaluation for r in record.ranks if r.evaluation), None)
    if evaluation:
        rows.append(("evaluation loss", f"{evaluation['loss']:.4f} on a fixed set of {evaluation['samples']:,} "
                                        "samples"))
    knobs = knob_summary(record)
    if knobs:
        rows.append(("GPU knobs", knobs))
    tuning = tuning_summary(record)
    if tuning:
        rows.append(("GPU tuning", tuning))
    job = job_tuning_line(record, estimated=_energy_estimated(record))
    if job:
        rows.append(("job tuning", job))
    stragglers = straggler_summary(record)
    if stragglers:
        rows.append(("stragglers", stragglers))
    grid = grid_summary(record)
    if grid:
        rows.append(("grid signal", grid))
    rebalance = rebalance_summary(record)
    if rebalance:
        rows.append(("rebalance", rebalance))
        rows += [("rebalance advice" if i == 0 else "", line) for i, line in enumerate(rebalance_advice(record))]
    switches = sorted({(s["step"], s["setting"], str(s["value"])) for r in record.ranks for s in r.switches})
    if switches:
        rows.append(("switched", "; ".join(f"step {step}: {name} = {value}" for step, name, value in switches)))
    throughput = t.get("throughput")
    if throughput is not None and throughput.value is None and throughput.note:
        rows.insert(rows.index(("throughput", "n/a")) + 1, ("", f"[dim]{throughput.note}[/dim]"))
    mfu = t.get("mfu")
    if mfu is not None and mfu.value is None and mfu.note:
        rows.insert(rows.index(("MFU", "n/a")) + 1, ("", f"[dim]MFU unknown: {mfu.note}[/dim]"))
    caveat = peak_caveat(record)
    if caveat:
        high = "; a peak measured under load is low, so the MFU may read high" if PEAK_CAVEATS[0] in caveat else ""
        rows.insert([name for name, _ in rows].index("MFU") + 1, ("", f"[dim]MFU peak: {escape(caveat)}{high}[/dim]"))
    rows += energy_rows(record) + restart_rows(record)
    for name, value in rows:
        table.add_row(name, value)
    return table


PEAK_CAVEATS = ("measured under load", "re-measured")
"""Words in a peak's note (:mod:`dtpo.session.loop.mfu` writes them) that the summary repeats under the MFU: the
peak was measured while other work kept the CPUs busy (so the MFU may read high), or a cached peak a quick check
beat was measured again."""


def peak_caveat(record: RunRecord) -> str | None:
    """The note of a rank's peak that was measured under load or re-measured, if any (the first such; the
    ranks of a node share one cache, so their notes mostly agree)."""
    notes = sorted({r.peak_flops.note for r in record.ranks
                    if r.peak_flops is not None and any(word in r.peak_flops.note for word in PEAK_CAVEATS)})
    if not notes:
        return None
    return notes[0] + (f" (and {len(notes) - 1} other rank note(s))" if len(notes) > 1 else "")


def knob_summary(record: RunRecord) -> str | None:
    """One line on the GPU knobs requested for the run and what each rank did with them."""
    per_rank = [r.knobs for r in record.ranks if r.knobs]
    if not per_rank:
        return None
    first = per_rank[0]
    asked = ", ".join(part for part in (
        f"power limit {first.power_limit_w:g} W" if first.power_limit_w is not None else "",
        f"SM clock {first.sm_clock_mhz} MHz" if first.sm_clock_mhz is not None else "") if part)
    notes = sorted({k.note for k in per_rank})
    return f"{asked}: {'; '.join(n for n in notes if n)}"


def tuning_summary(record: RunRecord) -> str | None:
    """One line on what the GPU-knob tuner chose, what profiling cost and what the choice saves (rank 0's
    report: every rank decides the same); a model figure is labelled as one."""
    tuning = next((r.tuning for r in record.ranks if r.tuning is not None), None)
    if not isinstance(tuning, PowerTuning):
        return None
    report = tuning.report or {}
    if report.get("choice") is None and not tuning.model:
        return escape(f"--tune {tuning.knob}: {tuning.note or 'no choice was made'}")
    metric = report.get("metric_description") or tuning.metric
    if tuning.source == "model":
        model = tuning.model or {}
        choice = model.get("choice")
        label = _setting_label(choice) if choice else "nothing"
        return escape(f"model figure, nothing changed ({tuning.mode} mode): would choose {label} for {metric}")
    parts = [f"{_setting_label(report['choice'])} for {metric}"]
    cost = report.get("profiling_cost")
    if cost:
        parts.append(f"{report.get('profiling_steps')} profiling steps ({cost['extra_time_s']:+.1f} s, "
                     f"{cost['extra_energy_j'] / 1e3:+.2f} kJ against the default)")
    saving = report.get("projected_saving")
    if saving:
        parts.append(f"saves {saving['cost_fraction'] * 100:.1f} % of the cost per sample over the remaining "
                     f"{saving['samples']:,} samples (estimate)")
    refined = report.get("refined")
    if refined:
        parts.append(f"near-tie with {_setting_label(refined['against'])} refined while training: "
                     f"{refined['outcome']}, {refined['steps_at_runner_up']:,} steps at the runner-up")
    if (tuning.profile or {}).get("loaded"):
        parts.append("from a saved profile")
    return escape("; ".join(parts))


def grid_summary(record: RunRecord) -> str | None:
    """One line on a run scheduled against a grid signal (rank 0's section: every rank decides the same): the
    limits held (or the pauses), the cost as measured, the estimate against a signal-blind run, and the deadline."""
    grid = next((r.grid for r in record.ranks if r.grid is not None), None)
    if grid is None:
        return None
    outcome = grid.outcome or {}
    unit = outcome.get("cost_unit", "")
    intervals = len({s["interval"] for s in grid.intervals})
    if grid.policy == "pause":
        if not outcome or not grid.settings:
            return escape(f"pause: {grid.note or 'nothing was scheduled'}")
        paused = outcome.get("pauses", 0)
        parts = [f"pause: {intervals} signal intervals, paused {paused} time{'' if paused == 1 else 's'} for "
                 f"{outcome.get('paused_h', 0.0):.3g} h",
                 f"{outcome['cost']:.4g} {unit} (energy x signal, pauses included; {outcome['energy_source']})"]
    else:
        held = sorted({s["power_limit_w"] for s in grid.intervals if s.get("phase") == "throttle"})
        if not held or not outcome:
            return escape(f"{grid.policy}: {grid.note or 'nothing was scheduled'}")
        limits = f"{held[0]:g} W" if len(held) == 1 else f"limits {held[0]:g}-{held[-1]:g} W"
        parts = [f"{grid.policy}: {intervals} signal intervals, {limits}",
                 f"{outcome['cost']:.4g} {unit} (GPU energy x signal, {grid.source})"]
    estimate = outcome.get("estimated")
    if estimate:
        parts.append(f"{estimate['saving'] * 100:+.1f} % saved against signal-blind (estimate)")
    met = "met" if outcome.get("deadline_met") else "MISSED"
    parts.append(f"finished in {outcome['finished_h']:.3g} h of the {grid.deadline_h:g} h deadline ({met})")
    if grid.note:
        parts.append(grid.note)
    return escape("; ".join(parts))


def straggler_summary(record: RunRecord) -> str | None:
    """One line on the ranks' online slack: who set the pace, how long the others waited, which clocks the
    per-rank slowdown locked (``--tune stragglers``)."""
    slacks = {r.rank: r.slack for r in record.ranks if r.slack}
    if not slacks:
        return None
    first = next(iter(slacks.values()))
    windows = max(first.windows, 1)
    pace = ", ".join(f"rank {rank} in {100 * n / windows:.0f} % of windows"
                     for rank, n in sorted(first.critical_ranks.items(), key=lambda kv: -kv[1])[:3])
    waits = [s.wait_share for s in slacks.values()]
    parts = [f"pace set by {pace}", f"ranks waited {100 * sum(waits) / len(waits):.1f} % of their step time"]
    locked = {rank: s.clock_changes[-1]["clock_mhz"] for rank, s in slacks.items() if s.clock_changes}
    if any(s.tuned for s in slacks.values()):
        final = sorted(c for c in locked.values() if c is not None)
        parts.append(f"{len(final)} rank(s) ended locked lower ({final[0]:g}-{final[-1]:g} MHz)" if final
                     else "no rank ended locked")
    return escape("; ".join(parts))


def rebalance_summary(record: RunRecord) -> str | None:
    """One line on ``--tune rebalance``: the ranks whose share of the global batch ended farthest from the even
    one (up to :data:`~dtpo.telemetry.rebalance.MAX_NAMED_RANKS`, then ``+N more``), from which step, and how many
    changes it made; ``None`` where rebalancing did not run."""
    run = shares_over_run(record)
    if run is None:
        return None
    count = len(run.changes)
    changes = f"{count} change{'' if count == 1 else 's'}"
    moved = run.moved()
    if not moved:
        if not count:
            return "shares stayed even (no rank persistently slower)"
        return escape(f"shares back to even from step {run.changes[-1]['step']} after {changes}")
    named = []
    for i, m in enumerate(moved[:MAX_NAMED_RANKS]):
        share = f"{m.share} of {run.global_batch} samples per step" if i == 0 else str(m.share)
        since = "" if m.since is None else f" from step {m.since}"
        named.append(f"rank {m.rank}: {share} ({m.ratio:.2f}x even){since}")
    if len(moved) > MAX_NAMED_RANKS:
        named.append(f"+{len(moved) - MAX_NAMED_RANKS} more")
    text = f"{', '.join(named)}; {changes}"
    gains = [100 * g for g in run.gains() if g > 0]
    if len(gains) == 1:
        text += f" (predicted {gains[0]:.1f} % shorter steps)"
    elif gains:
        text += f" (each predicted {min(gains):.1f}-{max(gains):.1f} % shorter steps)"
    return escape(text)


def rebalance_advice(record: RunRecord, limit: int = MAX_NAMED_RANKS) -> list[str]:
    """The rebalancer's recommendations to restart without a rank, one line each (up to ``limit``, then a line
    that counts the rest); empty where it made none."""
    run = shares_over_run(record)
    if run is None or not run.recommendations:
        return []
    lines = [escape(text) for text in run.recommendations[:limit]]
    if len(run.recommendations) > limit:
        lines.append(escape(f"+{len(run.recommendations) - limit} more (record.json: ranks[].slack.recommendations)"))
    return lines


def _setting_label(setting: dict[str, Any]) -> str:
    text = f"{setting['power_limit_w']:g} W"
    return text if setting.get("sm_clock_mhz") is None else f"{text}, SM {setting['sm_clock_mhz']} MHz"


def energy_rows(record: RunRecord) -> list[tuple[str, str]]:
    """Energy lines of the summary; a modelled figure is labelled *estimated*."""
    e = record.energy
    if e is None:
        return [("energy", "not measured")]
    whole = max(sum(e.by_source_j.values()), 1e-12)
    sources = ", ".join(f"{k} {100 * v / whole:.0f}%" for k, v in sorted(e.by_source_j.items()))
    per_sample = format_value(e.energy_per_sample_j)
    if e.energy_per_sample_j.value is None and e.energy_per_sample_j.note:
        per_sample += f" ({e.energy_per_sample_j.note})"
    rows = [
        ("energy", f"{format_value(e.energy_j)}  {escape(f'[{sources}]')}"),
        ("average power", format_value(e.average_power_w)),
        ("energy per sample", per_sample),
        ("emissions", f"{format_value(e.co2_g)} at {e.co2_g.note}"),
    ]
    if e.cost is not None:
        rows.append(("cost", format_value(e.cost)))
    if e.lost:
        rows.append(("energy lost", "; ".join(f"{k}: {v}" for k, v in e.lost.items())))
    return rows


def restart_rows(record: RunRecord) -> list[tuple[str, str]]:
    """Lines on a restarted or resumed run: the restarts with the steps they lost and what recovering cost, and
    the energy over every attempt."""
    rows = []
    if record.restarts:
        lost = sum(r.steps_lost or 0 for r in record.restarts)
        recovery_s = sum(r.recovery_s.value for r in record.restarts if r.recovery_s and r.recovery_s.value)
        recovery_j = [r.recovery_energy_j for r in record.restarts if r.recovery_energy_j is not None]
        text = f"{len(record.restarts)} ({lost} step(s) done again; recovery {recovery_s:.1f} s"
        if recovery_j:
            text += f", {format_value(Measurement(sum(m.value or 0.0 for m in recovery_j), 'J', 'estimated'))}"
        rows.append(("restarts", escape(text + ")")))
        total = energy_of_all_attempts(record)
        if total is not None:
            rows.append(("energy, all attempts", f"{format_value(total)} ({escape(total.note)})"))
    if record.resumed:
        rows.append(("resumed", escape(f"from step {record.resumed['step']} ({record.resumed['checkpoint']})")))
    return rows


def print_summary(record: RunRecord, console: Console | None = None, record_path: str | None = None) -> None:
    """Print the breakdown and the headline figures of a run."""
    console = console or make_console()
    console.print(breakdown_table(record))
    console.print("[dim]share of step time: data = waiting for batches, comm = collectives not hidden behind "
                  "backward, sync = waiting for the slowest rank[/dim]")
    console.print(totals_table(record))
    jobs = job_tuning_table(record, estimated=_energy_estimated(record))
    if jobs is not None:
        console.print(jobs)
    if record.error:
        console.print(f"[red]run {escape(record.status)}:[/red] {escape(record.error)}")
    if record_path:
        console.print(f"record: {record_path}")


def _energy_estimated(record: RunRecord) -> bool:
    """Whether the run's energy is (partly) modelled rather than read from counters."""
    return bool(record.energy is not None and record.energy.energy_j.source == "estimated")
