"""Per-rank traces of a run in the Chrome trace-event format (open in Perfetto or chrome://tracing).

Each rank is a process (``pid`` = rank) with one track of steps: a ``step N`` span holding its parts in the
order they happen (data wait, compute, sync wait, exposed communication, optimizer), settings switches as
instant events, and the rank's power timeline as counter tracks (one per device, in watts). The files are
built from the run record and the power timelines beside it, so a trace can be made again from any run
directory (:func:`write_traces`):

* ``RUN_DIR/trace/rankNNNNN.json``: one rank;
* ``RUN_DIR/trace/merged.json``: every rank on one time axis (ranks of one host share its clock; across
  hosts the trace is only as aligned as their clocks).

With gradient accumulation a step's parts are sums over its micro-batches; the trace draws each sum as one
span, end to end, so the spans show where the time went, not the interleaving of the micro-batches.
"""

from __future__ import annotations

import csv
import json
import logging
import os
from pathlib import Path
from typing import Any

from dtpo.core.record import RANK_DIR, RankRecord, RunRecord, StepRecord, write_json_atomic

log = logging.getLogger(__name__)

TRACE_DIR = "trace"
MERGED_TRACE = "merged.json"
TIMELINE_START = "timeline_started_at"  # key of a rank's energy section: Unix time of its first power sample

# The parts of a step as the trace draws them, in the order they happen within the step.
PARTS = (("data wait", "data_wait_s"), ("compute", "compute_s"), ("sync wait", "sync_wait_s"),
         ("comm exposed", "comm_exposed_s"), ("optimizer", "optimizer_s"))
_UNSPLIT_TAIL = "comm + sync wait"  # the tail before it is split between ranks (FSDP: not measured at all)


def step_events(rank: RankRecord, t0: float) -> list[dict[str, Any]]:
    """The spans of one rank's steps (``ph: X``, microseconds from ``t0``); steps without a start time (records
    from before dtpo stamped them) are skipped."""
    events: list[dict[str, Any]] = []
    for step in rank.steps:
        if step.started_at is None:
            continue
        start = (step.started_at - t0) * 1e6
        events.append(_span(f"step {step.step}", "step", rank.rank, start, step.step_s,
                            {"samples": step.samples, "warmup": step.warmup, "loss": step.loss}))
        at = start
        for name, seconds in step_parts(step):
            events.append(_span(name, "part", rank.rank, at, seconds, {"step": step.step}))
            at += seconds * 1e6
    return events


def step_parts(step: StepRecord) -> list[tuple[str, float]]:
    """A step's parts as (name, seconds), in order; the tail appears as one part while it is not split."""
    parts: list[tuple[str, float]] = []
    split = step.comm_exposed_s is not None and step.sync_wait_s is not None
    for name, attr in PARTS:
        if attr in ("sync_wait_s", "comm_exposed_s") and not split:
            if attr == "sync_wait_s" and step.tail_s:
                parts.append((_UNSPLIT_TAIL, step.tail_s))
            continue
        seconds = getattr(step, attr)
        if seconds:
            parts.append((name, seconds))
    return parts


def switch_events(rank: RankRecord, t0: float) -> list[dict[str, Any]]:
    """Instant events where a setting changed (precision, accumulation, compression), at the step it took effect."""
    starts = {s.step: s.started_at for s in rank.steps if s.started_at is not None}
    events = []
    for switch in rank.switches:
        at = starts.get(switch.get("step"))
        if at is not None:
            events.append({"name": f"{switch.get('setting')} = {switch.get('value')}", "ph": "i", "s": "p",
                           "cat": "switch", "pid": rank.rank, "tid": 0, "ts": round((at - t0) * 1e6, 1)})
    return events


def power_events(rank: RankRecord, rows: list[dict[str, float]], t0: float) -> list[dict[str, Any]]:
    """Counter events of one rank's power timeline (``ph: C``, one series per device)."""
    started = (rank.energy or {}).get(TIMELINE_START)
    if started is None or not rows:
        return []
    events = []
    for row in rows:
        ts = (started + row["t_s"] - t0) * 1e6
        for device, watts in row.items():
            if device != "t_s":
                events.append({"name": f"power {device}", "ph": "C", "cat": "power", "pid": rank.rank,
                               "ts": round(ts, 1), "args": {"W": watts}})
    return events


def read_power_timeline(path: Path) -> list[dict[str, float]]:
    """Rows of a ``power-rankNNNNN.csv`` timeline: ``t_s`` and watts per device (empty cells left out)."""
    rows: list[dict[str, float]] = []
    with path.open(newline="") as fh:
        for line in csv.DictReader(fh):
            row = {"t_s": float(line["t_s"])}
            for column, value in line.items():
                if column != "t_s" and value:
                    row[column.removesuffix(" [W]")] = float(value)
            rows.append(row)
    return rows


def power_timeline_path(run_dir: str | os.PathLike[str], rank: int, attempt: int = 0) -> Path:
    """Where a rank's power timeline lies in a run directory (beside its partial record)."""
    folder = Path(run_dir) / RANK_DIR
    if attempt:
        folder = folder / f"attempt-{attempt}"
    return folder / f"power-rank{rank:05d}.csv"


def trace_start(record: RunRecord) -> float | None:
    """The trace's time zero: the earliest step start or first power sample of any rank; ``None`` when no step
    has a start time (nothing to draw)."""
    starts = [s.started_at for r in record.ranks for s in r.steps if s.started_at is not None]
    if not starts:
        return None
    power = [r.energy[TIMELINE_START] for r in record.ranks if (r.energy or {}).get(TIMELINE_START) is not None]
    return min(starts + power)


def rank_trace(record: RunRecord, rank: RankRecord, t0: float, power: list[dict[str, float]]) -> list[dict[str, Any]]:
    """Every event of one rank, with the metadata that names its process and track."""
    device = rank.device if rank.device else "?"
    meta = [{"name": "process_name", "ph": "M", "pid": rank.rank, "args": {"name": f"rank {rank.rank} ({rank.node})"}},
            {"name": "process_sort_index", "ph": "M", "pid": rank.rank, "args": {"sort_index": rank.rank}},
            {"name": "thread_name", "ph": "M", "pid": rank.rank, "tid": 0, "args": {"name": f"steps on {device}"}}]
    return meta + step_events(rank, t0) + switch_events(rank, t0) + power_events(rank, power, t0)


def trace_document(record: RunRecord, events: list[dict[str, Any]], t0: float) -> dict[str, Any]:
    """The JSON object of a trace file: events plus what a reader needs to interpret them."""
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"run_id": record.run_id, "status": record.status, "time_zero_unix_s": t0,
                          "note": "with gradient accumulation a part is the sum over the step's micro-batches, "
                                  "drawn as one span"}}


def write_traces(record: RunRecord, run_dir: str | os.PathLike[str]) -> Path | None:
    """Write ``trace/rank*.json`` for every rank of ``record`` and ``trace/merged.json``.

    Power timelines are read from the run directory where they exist (a rank on another host whose run
    directory is not shared simply has no power track).

    Returns:
        The merged trace's path, or ``None`` when no step has a start time (nothing to draw).
    """
    t0 = trace_start(record)
    if t0 is None:
        return None
    folder = Path(run_dir) / TRACE_DIR
    merged: list[dict[str, Any]] = []
    for rank in record.ranks:
        path = power_timeline_path(run_dir, rank.rank, record.attempt)
        power: list[dict[str, float]] = []
        if path.is_file():
            try:
                power = read_power_timeline(path)
            except (OSError, ValueError, KeyError) as exc:
                log.warning("trace: power timeline %s is unreadable (%s); rank %d has no power track",
                            path, exc, rank.rank)
        events = rank_trace(record, rank, t0, power)
        write_json_atomic(folder / f"rank{rank.rank:05d}.json", trace_document(record, events, t0))
        merged.extend(events)
    merged_path = folder / MERGED_TRACE
    write_json_atomic(merged_path, trace_document(record, merged, t0))
    return merged_path


def load_trace(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a trace file back (what tests and tools use)."""
    return json.loads(Path(path).read_text())


def _span(name: str, category: str, pid: int, start_us: float, seconds: float, args: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "ph": "X", "cat": category, "pid": pid, "tid": 0, "ts": round(start_us, 1),
            "dur": round(seconds * 1e6, 1), "args": args}
