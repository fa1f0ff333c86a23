"""The scaling table of ``dtpo bench``: throughput and efficiency per worker count, as rows and as a table."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from dtpo.core.measurement import Measurement
from dtpo.core.record import RunRecord
from dtpo.telemetry.job_tuning import job_report, setting_label

BENCH_SCHEMA = "dtpo.bench/1"


def scaling_rows(records: dict[int, RunRecord]) -> list[dict[str, Any]]:
    """Per worker count: throughput and scaling efficiency against the smallest count, per worker.

    Every figure is a JSON-ready :class:`~dtpo.core.measurement.Measurement` dict (``None`` where the run
    has no such figure); the scaling efficiency is ``None`` with a note when a throughput is unknown.
    """
    base_count = min(records)
    base = _value(records[base_count].totals.get("throughput"))
    rows = []
    for count, record in sorted(records.items()):
        t = record.totals
        throughput = _value(t.get("throughput"))
        if base and throughput is not None:
            efficiency = Measurement(throughput / (base * count / base_count), "fraction", "derived",
                                     f"against {base_count} worker(s)")
        else:
            efficiency = Measurement(None, "fraction", "derived", "throughput unknown")
        energy = record.energy
        rows.append({
            "workers": count,
            "run_id": record.run_id,
            "throughput": _dict(t.get("throughput")),
            "scaling_efficiency": efficiency.to_dict(),
            "step_time_s": _dict(t.get("step_time_s")),
            "comm_overhead": _dict(t.get("comm_overhead")),
            "sync_latency_s": _dict(t.get("sync_latency_s")),
            "data_wait_fraction": _dict(t.get("data_wait_fraction")),
            "mfu": _dict(t.get("mfu")),
            "energy_per_sample_j": _dict(energy.energy_per_sample_j) if energy is not None else None,
            "tuned": tuned_choice(record),
        })
    return rows


def tuned_choice(record: RunRecord) -> str | None:
    """The job-knob setting a tuned run settled on, ``"untuned"`` when it tuned nothing, or ``None`` when
    tuning was not asked for."""
    report = job_report(record)
    if report is None:
        return "untuned" if record.config.get("tune", {}).get("knob") is None else None
    choice = report.get("choice")
    return setting_label(choice) if choice else "still profiling at the end"


def _value(m: Measurement | dict[str, Any] | None) -> float | None:
    if m is None:
        return None
    return m.value if isinstance(m, Measurement) else m.get("value")


def _dict(m: Measurement | dict[str, Any] | None) -> dict[str, Any] | None:
    if m is None:
        return None
    return m.to_dict() if isinstance(m, Measurement) else dict(m)


def _number(m: dict[str, Any] | None, scale: float = 1.0, digits: int = 1) -> str:
    """A measurement dict's value scaled and rounded, ``*`` appended when it is estimated, ``n/a`` if unknown."""
    if not m or m.get("value") is None:
        return "n/a"
    text = f"{m['value'] * scale:,.{digits}f}"
    return text + ("*" if m.get("source") == "estimated" else "")


def bench_table(rows: list[dict[str, Any]], title: str) -> Table:
    """The scaling table (units in the headers; * marks an estimated figure)."""
    table = Table(title=title, title_justify="left", caption="* estimated (no hardware energy counter)")
    tuned = any(row.get("tuned") not in (None, "untuned") for row in rows)
    for name in ("workers", "threads", "samples/s", "scaling eff. %", "step ms", "comm %", "sync wait ms",
                 "data wait %", "MFU %", "mJ/sample"):
        table.add_column(name, justify="right", no_wrap=True)
    if tuned:
        table.add_column("tuned setting", justify="left")
    for row in rows:
        threads = row.get("threads_per_worker")
        cells = [str(row["workers"]), "?" if threads is None else str(threads), _number(row["throughput"]),
                 _number(row["scaling_efficiency"], 100),
                 _number(row["step_time_s"], 1e3, 2), _number(row["comm_overhead"], 100),
                 _number(row["sync_latency_s"], 1e3, 2), _number(row["data_wait_fraction"], 100),
                 _number(row["mfu"], 100), _number(row["energy_per_sample_j"], 1e3, 3)]
        table.add_row(*cells, *([row.get("tuned") or "-"] if tuned else []))
    return table
