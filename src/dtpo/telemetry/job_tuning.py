"""What ``--tune precision,grad-accum,compression`` did, for people: one summary line and a table of the
candidates (samples/s, J/sample, communication share, the guard's verdict, what became of each)."""

from __future__ import annotations

from typing import Any

from rich.markup import escape
from rich.table import Table

from dtpo.core.record import RunRecord
from dtpo.core.record_sections import JobTuning


def job_report(record: RunRecord) -> JobTuning | None:
    """Rank 0's job-knob tuning (every rank decides the same), or ``None``."""
    return next((r.tuning for r in record.ranks if isinstance(r.tuning, JobTuning)), None)


def setting_label(setting: dict[str, Any]) -> str:
    """``"bf16-mixed, accum 2, powersgd-2"``."""
    compression = setting.get("compression", "none")
    if compression == "powersgd":
        compression = f"powersgd-{setting.get('powersgd_rank', 1)}"
    return f"{setting.get('precision')}, accum {setting.get('grad_accum')}, {compression}"


def job_tuning_line(record: RunRecord, estimated: bool) -> str | None:
    """One line: the choice, toward what, after how many steps, and what it saves per sample."""
    job = job_report(record)
    if job is None:
        return None
    report = job.report or {}
    if report.get("choice") is None:
        if job.note:
            return escape(f"--tune {job.knob}: {job.note}")
        best = min(report.get("settings", []), key=lambda r: r["cost"], default=None)
        so_far = f"; the best so far was {setting_label(best)}" if best else ""
        return escape(f"still profiling when training ended ({report.get('steps')} steps tuned){so_far}: train "
                      "longer for a choice")
    rows = {setting_label(r): r for r in report.get("settings", [])}
    chosen = rows.get(setting_label(report["choice"]))
    default = rows.get(setting_label(report.get("default") or {}))
    parts = [f"{setting_label(report['choice'])} for {report.get('metric_description') or job.metric}",
             f"held from step {report.get('profiling_steps')}"]
    if chosen and default and default["energy_per_sample_j"] > 0 and chosen is not default:
        ratio = chosen["energy_per_sample_j"] / default["energy_per_sample_j"]
        speed = default["time_per_sample_s"] / chosen["time_per_sample_s"] if chosen["time_per_sample_s"] else 0
        parts.append(f"{ratio:.2f}x the J/sample{' (estimated)' if estimated else ''} and {speed:.2f}x the "
                     f"samples/s of the starting setting, as profiled")
    rejected = len(report.get("rejected", [])) + sum(1 for r in report.get("settings", [])
                                                     if r.get("status") == "rejected")
    if rejected:
        parts.append(f"{rejected} rejected by the convergence guard or screens")
    return escape("; ".join(parts))


def job_tuning_table(record: RunRecord, estimated: bool) -> Table | None:
    """The candidates the tuner profiled or the guard refused, best cost first."""
    job = job_report(record)
    report = job.report if job is not None else None
    if job is None or not report or not report.get("settings"):
        return None
    unit = " (est.)" if estimated else ""
    table = Table(title=f"job knobs tuned for {report.get('metric_description') or job.metric}")
    for name, justify in (("setting", "left"), ("steps", "right"), ("samples/s", "right"),
                          (f"J/sample{unit}", "right"), ("comm share", "right"), ("guard", "left"),
                          ("outcome", "left")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for row in sorted(report["settings"], key=lambda r: r["cost"]):
        table.add_row(escape(setting_label(row)), str(row["steps"]),
                      f"{row['samples_per_s']:,.1f}" if row.get("samples_per_s") else "n/a",
                      f"{row['energy_per_sample_j']:.4g}",
                      f"{row['comm_share'] * 100:.1f}%" if row.get("comm_share") is not None else "n/a",
                      escape(_guard_text(row.get("guard"))), escape(_outcome(row)))
    for rej in report.get("rejected", []):
        table.add_row(escape(rej.get("label") or setting_label(rej)), "0", "-", "-", "-",
                      escape(_guard_text(rej)), "rejected before training")
    for what, why in job.screened.items():
        table.add_row(escape(what), "0", "-", "-", "-", "-", escape(f"not searched: {why}"))
    return table


def _guard_text(guard: dict[str, Any] | None) -> str:
    if not guard:
        return "exact (no guard needed)"
    verdict = "accepted" if guard.get("accepted") else "rejected"
    return f"{verdict}: {guard.get('reason', '')}"


def _outcome(row: dict[str, Any]) -> str:
    status = row.get("status", "measured")
    reason = row.get("reason") or ""
    return f"{status}: {reason}" if reason else status
