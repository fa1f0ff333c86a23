"""A Horovod timeline read into dtpo's views: per step, which rank was ready last and how late each rank was.

Horovod (``HOROVOD_TIMELINE=file.json``, recorded on rank 0 only) writes Chrome trace events, one *process* per
tensor: a ``process_name`` metadata event (``"ph": "M"``) names pid *k* after the tensor (pid 0 carries
``start_time_since_epoch_in_micros`` from Horovod 0.21 on). A tensor's collective is

* a ``NEGOTIATE_<OP>`` span (``"ph": "B"`` ... ``"ph": "E"``, the end has no name) while the coordinator collects
  the ranks' requests, holding one zero-length event per rank (``"ph": "X"``, ``"name"`` the rank's number) at
  the moment the coordinator took that rank's request: when the rank was ready for the tensor;
* then a span named after the operation (``ALLREDUCE``, ``ALLGATHER``, ``BROADCAST``, ...) with its activities
  nested inside (``QUEUE``, ``MEMCPY_IN_FUSION_BUFFER``, ``NCCL_ALLREDUCE``, ``MEMCPY_OUT_FUSION_BUFFER``...),
  the closing event carrying ``dtype`` and ``shape``.

``ts`` are microseconds since the timeline started. ``CYCLE_START`` markers (``"ph": "i"``, no pid) are ignored.
Horovod writes the file as it goes: before 0.21 every event ends ``},`` and the array is never closed; later
versions close it after each event, but a killed job still leaves half an event behind. :func:`parse_events`
reads every whole event up to the first broken one.

**Steps.** Horovod does not mark iterations, so they are derived from the negotiations of one operation (by
default the one negotiated most often: the gradient reduction): in order of their start, a step is the longest
run of negotiations in which no tensor repeats; the next negotiation of a tensor already in the step begins the
next step (a tensor negotiated once, such as an unnamed ``hvd.allreduce`` of a metric, joins the step it falls
in). A rank's *ready* time in a step is its last tick there (it had asked for every reduction of the
step: its backward was done); its *lateness* is that minus the earliest rank's ready time. The step's *late
rank* is the one ready last, unless another rank was ready within ``tie_s`` of it (then the step has none: the
coordinator takes requests once per cycle, ``HOROVOD_CYCLE_TIME``, so closer readiness is not resolved; rank 0's
own requests are also stamped before the others' of the same cycle arrive). Statistics use *complete* steps
only: every negotiation ended and every rank ticked in each.

**Response cache.** With Horovod's response cache on (the default; ``HOROVOD_CACHE_CAPACITY`` sizes it), a tensor
negotiated before is coordinated by a bit vector: its ``NEGOTIATE_`` span is still written, but without per-rank
ticks. Such steps are counted as *cached* and drawn without per-rank readiness; set ``HOROVOD_CACHE_CAPACITY=0``
when recording a timeline for stragglers.

:func:`read_timeline` reads a file, :func:`analyse` finds the steps and stragglers, :func:`trace_document`
draws them in dtpo's trace format (pid = rank, one track of steps: ``compute`` up to the rank's readiness,
``negotiation wait`` until the last rank was ready, then the operation), and :func:`summary` gives plain values
(``--json``).
"""

from __future__ import annotations

import json
import logging
import os
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dtpo.core.errors import ConfigError

log = logging.getLogger(__name__)

NEGOTIATE = "NEGOTIATE_"
DEFAULT_TIE_S = 0.001  # one default HOROVOD_CYCLE_TIME (1 ms since Horovod 0.20; 5 ms before)
TRACE_SUFFIX = ".dtpo-trace.json"


@dataclass
class Negotiation:
    """One negotiation of one tensor, with the operation that followed it.

    Attributes:
        tensor: The tensor's name (its pid's ``process_name``).
        kind: The operation negotiated (``ALLREDUCE`` for ``NEGOTIATE_ALLREDUCE``).
        start_us: When the coordinator got the first request (µs since the timeline started).
        end_us: When every rank had asked (``None``: the file ends inside it).
        ready_us: Each rank's tick: when the coordinator took its request (empty: negotiated by the cache).
        op_start_us: Start of the operation's span that followed, if any.
        op_end_us: Its end (``None`` if it did not end in the file).
        activities: The operation's activities as (name, start µs, end µs).
    """

    tensor: str
    kind: str
    start_us: float
    end_us: float | None = None
    ready_us: dict[int, float] = field(default_factory=dict)
    op_start_us: float | None = None
    op_end_us: float | None = None
    activities: list[tuple[str, float, float]] = field(default_factory=list)


@dataclass(frozen=True)
class Timeline:
    """What a timeline file holds for dtpo.

    Attributes:
        negotiations: Every negotiation, in the order they began.
        truncated: Whether the file ended inside the event array (unclosed, or cut inside an event).
        start_unix_us: Unix time of the timeline's zero, where Horovod wrote it (0.21 on).
        tensors: How many tensors (pids) it names.
    """

    negotiations: list[Negotiation]
    truncated: bool
    start_unix_us: float | None
    tensors: int


@dataclass(frozen=True)
class Step:
    """One derived step.

    Attributes:
        index: 0, 1, ... in time order.
        negotiations: Its negotiations.
        start_us: Its start: the previous step's end (the first step: its first negotiation's start).
        negotiated_us: When the last rank was ready (the last negotiation's end).
        end_us: When its last operation ended (or the latest thing seen of it).
        ready_us: Each rank's ready time (its last tick); empty for a step negotiated by the cache.
        complete: Every negotiation ended and every rank ticked in each (only these enter the statistics).
        late_rank: The rank ready last, ``None`` on a tie (within ``tie_s``), a cached or an incomplete step.
        lead_s: How much later the late rank was than the next-latest rank (0 without a late rank).
    """

    index: int
    negotiations: list[Negotiation]
    start_us: float
    negotiated_us: float
    end_us: float
    ready_us: dict[int, float]
    complete: bool
    late_rank: int | None
    lead_s: float

    @property
    def cached(self) -> bool:
        """Negotiated by the response cache: no per-rank ticks."""
        return not self.ready_us

    def lateness_s(self) -> dict[int, float]:
        """Each rank's ready time minus the earliest rank's, in seconds."""
        if not self.ready_us:
            return {}
        first = min(self.ready_us.values())
        return {rank: (at - first) / 1e6 for rank, at in sorted(self.ready_us.items())}


@dataclass(frozen=True)
class RankStragglers:
    """One rank over the complete steps.

    Attributes:
        rank: The rank.
        steps: Complete steps it took part in.
        last: Steps where it was the late rank.
        mean_lateness_s: Mean of its lateness.
        median_lateness_s: Median of its lateness.
        max_lateness_s: Largest lateness.
        mean_wait_s: Mean time it waited for the last rank (negotiation wait).
    """

    rank: int
    steps: int
    last: int
    mean_lateness_s: float
    median_lateness_s: float
    max_lateness_s: float
    mean_wait_s: float

    @property
    def last_share(self) -> float:
        """Share of its steps in which it was the late rank."""
        return self.last / self.steps if self.steps else 0.0


@dataclass(frozen=True)
class StragglerReport:
    """Steps and stragglers of one timeline.

    Attributes:
        timeline: What was read.
        kind: The operation whose negotiations make the steps.
        steps: Every derived step.
        ranks: Per rank, over the complete steps.
        tie_s: Readiness closer than this names no late rank.
    """

    timeline: Timeline
    kind: str
    steps: list[Step]
    ranks: list[RankStragglers]
    tie_s: float

    @property
    def measured(self) -> list[Step]:
        """The steps that enter the statistics: complete, with per-rank ticks."""
        return [s for s in self.steps if s.complete and not s.cached]

    @property
    def cached(self) -> int:
        """Steps negotiated by the response cache (no per-rank ticks)."""
        return sum(1 for s in self.steps if s.cached)

    @property
    def incomplete(self) -> int:
        """Steps with ticks that are not complete (the file ends inside them; a rank missing)."""
        return sum(1 for s in self.steps if not s.cached and not s.complete)


# -- reading ------------------------------------------------------------------------------------------------


def parse_events(text: str) -> tuple[list[Any], bool]:
    """The events of a trace-event JSON array, tolerating a file Horovod did not finish.

    Returns:
        The whole events (a ``{"traceEvents": [...]}`` object is accepted too) and whether the array was
        unclosed or cut inside an event.

    Raises:
        ValueError: Not JSON, or JSON that is not an array of events.
    """
    body = text.strip()
    try:
        data = json.loads(body)
    except json.JSONDecodeError:
        if not body.startswith("["):
            raise ValueError("not JSON") from None
    else:
        if isinstance(data, dict) and isinstance(data.get("traceEvents"), list):
            return data["traceEvents"], False
        if not isinstance(data, list):
            raise ValueError("JSON, but not an array of trace events")
        return data, False
    decoder = json.JSONDecoder()
    events: list[Any] = []
    at, size = 1, len(body)
    while True:
        while at < size and body[at] in " \t\r\n,":
            at += 1
        if at >= size or body[at] == "]":
            break
        try:
            event, at = decoder.raw_decode(body, at)
        except json.JSONDecodeError:
            break  # cut inside an event: keep what came before
        events.append(event)
    if not events:
        raise ValueError("not JSON (an unclosed array with no whole event)")
    return events, True


def timeline_from_events(events: list[Any], truncated: bool = False) -> Timeline:
    """The negotiations (and the operations after them) in a list of Horovod timeline events.

    Events of each pid are nested ``B``/``E`` pairs in file order: a ``NEGOTIATE_*`` span holds rank ticks;
    a span opened outside any other is the operation, the spans inside it its activities.
    """
    names: dict[int, str] = {}
    start_unix: float | None = None
    stacks: dict[int, list[tuple[str, float, Negotiation | None]]] = {}
    pending: dict[int, Negotiation] = {}  # the pid's last negotiation still waiting for its operation
    negotiations: list[Negotiation] = []
    for event in events:
        if not isinstance(event, dict):
            continue
        phase, pid, ts = event.get("ph"), event.get("pid"), event.get("ts")
        if phase == "M":
            args = event.get("args") or {}
            if event.get("name") == "process_name" and isinstance(pid, int):
                if "name" in args:
                    names[pid] = str(args["name"])
                if isinstance(args.get("start_time_since_epoch_in_micros"), (int, float)):
                    start_unix = float(args["start_time_since_epoch_in_micros"])
            continue
        if not isinstance(pid, int) or not isinstance(ts, (int, float)) or isinstance(ts, bool):
            continue
        stack = stacks.setdefault(pid, [])
        name = str(event.get("name", ""))
        if phase == "B":
            if name.startswith(NEGOTIATE) and not stack:
                negotiation = Negotiation(names.get(pid, f"pid {pid}"), name[len(NEGOTIATE):], float(ts))
                negotiations.append(negotiation)
                pending[pid] = negotiation
                stack.append((name, float(ts), negotiation))
            elif not stack:  # the operation
                owner = pending.pop(pid, None)
                if owner is not None:
                    owner.op_start_us = float(ts)
                stack.append((name, float(ts), owner))
            else:  # an activity of the operation
                stack.append((name, float(ts), stack[0][2]))
        elif phase == "X" and stack and stack[-1][0].startswith(NEGOTIATE) and name.isdigit():
            owner = stack[-1][2]
            if owner is not None:
                owner.ready_us.setdefault(int(name), float(ts))
        elif phase == "E" and stack:
            opened, began, owner = stack.pop()
            if owner is None:
                continue
            if opened.startswith(NEGOTIATE):
                owner.end_us = float(ts)
            elif not stack:
                owner.op_end_us = float(ts)
            else:
                owner.activities.append((opened, began, float(ts)))
    negotiations.sort(key=lambda n: n.start_us)
    return Timeline(negotiations, truncated, start_unix, len(names))


def read_timeline(path: str | os.PathLike[str]) -> Timeline:
    """Read a Horovod timeline file.

    Raises:
        ConfigError: The file is missing or unreadable, not JSON, not a Horovod timeline, or holds no
            negotiation (one line, naming the file).
    """
    file = Path(path)
    if not file.is_file():
        what = "is a directory" if file.is_dir() else "does not exist"
        raise ConfigError(f"{file} {what}; name a Horovod timeline (the file HOROVOD_TIMELINE=... wrote)")
    try:
        text = file.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise ConfigError(f"cannot read {file} ({exc.strerror or exc})") from None
    if not text.strip():
        raise ConfigError(f"{file} is empty: Horovod had not written any event yet")
    try:
        events, truncated = parse_events(text)
    except ValueError as exc:
        raise ConfigError(f"{file} is {exc}; a Horovod timeline is a JSON array of Chrome trace events") from None
    timeline = timeline_from_events(events, truncated)
    if not timeline.negotiations:
        traced = any(isinstance(e, dict) and "ph" in e for e in events)
        what = "has no NEGOTIATE_* events" if traced else "holds no trace events"
        raise ConfigError(f"{file} {what}: not a Horovod timeline, or one stopped before the first collective")
    if truncated:
        log.debug("horovod timeline %s ends inside its event array (Horovod was still writing, or was stopped); "
                 "read its %d whole events", file, len(events))
    return timeline


# -- steps and stragglers -----------------------------------------------------------------------------------


def main_kind(timeline: Timeline) -> str:
    """The operation negotiated most often (the gradient reduction in a training job); ties: the first seen."""
    return Counter(n.kind for n in timeline.negotiations).most_common(1)[0][0]


def group_steps(negotiations: list[Negotiation], world: set[int], tie_s: float = DEFAULT_TIE_S) -> list[Step]:
    """Cut negotiations (of one operation, in order of start) into steps: a step ends where a tensor repeats.

    Args:
        negotiations: The negotiations, sorted by start.
        world: Every rank that ticked anywhere in the timeline (a complete step has all of them).
        tie_s: Readiness closer than this to the last rank's names no late rank.
    """
    groups: list[list[Negotiation]] = []
    seen: set[str] = set()
    for negotiation in negotiations:
        if not groups or negotiation.tensor in seen:
            groups.append([])
            seen = set()
        groups[-1].append(negotiation)
        seen.add(negotiation.tensor)
    steps: list[Step] = []
    previous_end: float | None = None
    for index, group in enumerate(groups):
        ticked = [n for n in group if n.ready_us]
        ready: dict[int, float] = {}
        for negotiation in ticked:
            for rank, at in negotiation.ready_us.items():
                ready[rank] = max(ready.get(rank, at), at)
        complete = all(n.end_us is not None for n in group) and all(set(n.ready_us) == world for n in ticked)
        seen_at = [t for n in group for t in (n.start_us, n.end_us, n.op_start_us, n.op_end_us) if t is not None]
        seen_at += list(ready.values()) + [end for n in group for _, _, end in n.activities]
        negotiated = max([n.end_us for n in group if n.end_us is not None] + list(ready.values()),
                         default=group[-1].start_us)
        start = previous_end if previous_end is not None else group[0].start_us
        late, lead = _late_rank(ready, tie_s) if complete else (None, 0.0)
        end = max(seen_at)
        steps.append(Step(index, group, min(start, group[0].start_us), negotiated, end, ready, complete, late, lead))
        previous_end = end
    return steps


def _late_rank(ready: dict[int, float], tie_s: float) -> tuple[int | None, float]:
    if len(ready) < 2:
        return None, 0.0
    order = sorted(ready, key=lambda r: ready[r])
    lead = (ready[order[-1]] - ready[order[-2]]) / 1e6
    return (order[-1], lead) if lead > tie_s else (None, 0.0)


def analyse(timeline: Timeline, kind: str | None = None, tie_s: float = DEFAULT_TIE_S) -> StragglerReport:
    """Steps and per-rank straggler figures of a timeline.

    Args:
        timeline: What :func:`read_timeline` read.
        kind: The operation whose negotiations make the steps (``ALLREDUCE``...); default: :func:`main_kind`.
        tie_s: Readiness closer than this to the last rank's names no late rank.

    Raises:
        ConfigError: ``kind`` was never negotiated, or no negotiation has per-rank ticks (response cache on).
    """
    kinds = Counter(n.kind for n in timeline.negotiations)
    chosen = (kind or main_kind(timeline)).upper().removeprefix(NEGOTIATE)
    if chosen not in kinds:
        listed = ", ".join(f"{k} ({c})" for k, c in kinds.most_common())
        raise ConfigError(f"--op {chosen}: the timeline negotiates no {chosen}; it has {listed}")
    negotiations = [n for n in timeline.negotiations if n.kind == chosen]
    world = {rank for n in negotiations for rank in n.ready_us}
    if not world:
        raise ConfigError(f"no NEGOTIATE_{chosen} of the timeline has per-rank ticks: Horovod's response cache "
                          "negotiated every one of them; record with HOROVOD_CACHE_CAPACITY=0 to see each rank")
    steps = group_steps(negotiations, world, tie_s)
    measured = [s for s in steps if s.complete and not s.cached]
    ranks = []
    for rank in sorted(world):
        lateness = [s.lateness_s()[rank] for s in measured if rank in s.ready_us]
        waits = [(s.negotiated_us - s.ready_us[rank]) / 1e6 for s in measured if rank in s.ready_us]
        ranks.append(RankStragglers(
            rank=rank, steps=len(lateness), last=sum(1 for s in measured if s.late_rank == rank),
            mean_lateness_s=statistics.fmean(lateness) if lateness else 0.0,
            median_lateness_s=statistics.median(lateness) if lateness else 0.0,
            max_lateness_s=max(lateness, default=0.0),
            mean_wait_s=statistics.fmean(waits) if waits else 0.0))
    return StragglerReport(timeline, chosen, steps, ranks, tie_s)


# -- outputs ------------------------------------------------------------------------------------------------


def trace_events(report: StragglerReport) -> list[dict[str, Any]]:
    """The report's steps as dtpo trace events (µs from the first step's start): pid = rank, tid 0."""
    if not report.steps:
        return []
    t0 = report.steps[0].start_us
    op = report.kind.lower()
    world = [r.rank for r in report.ranks]
    events: list[dict[str, Any]] = []
    for rank in world:
        events += [
            {"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"rank {rank}"}},
            {"name": "process_sort_index", "ph": "M", "pid": rank, "args": {"sort_index": rank}},
            {"name": "thread_name", "ph": "M", "pid": rank, "tid": 0, "args": {"name": "steps (Horovod timeline)"}}]
    for step in report.steps:
        lateness = step.lateness_s()
        ranks = sorted(step.ready_us) if step.ready_us else world
        for rank in ranks:
            args: dict[str, Any] = {"tensors": len(step.negotiations), "complete": step.complete,
                                    "late_rank": step.late_rank, "per_rank_ready": not step.cached}
            if rank in lateness:
                args["lateness_ms"] = round(lateness[rank] * 1e3, 3)
            events.append(_span(f"step {step.index}", "step", rank, step.start_us - t0, step.end_us - t0, args))
            ready = step.ready_us.get(rank)
            if ready is not None:
                ready = max(ready, step.start_us)
                events.append(_span("compute", "part", rank, step.start_us - t0, ready - t0,
                                    {"step": step.index, "note": "until the rank asked for its last reduction"}))
                events.append(_span("negotiation wait", "part", rank, ready - t0, step.negotiated_us - t0,
                                    {"step": step.index}))
            events.append(_span(op, "part", rank, step.negotiated_us - t0, step.end_us - t0, {"step": step.index}))
            if rank == step.late_rank:
                events.append({"name": f"last ready (+{step.lead_s * 1e3:.2f} ms)", "ph": "i", "s": "t",
                               "cat": "straggler", "pid": rank, "tid": 0, "ts": round(step.ready_us[rank] - t0, 1)})
    return events


def trace_document(report: StragglerReport, source: str | os.PathLike[str]) -> dict[str, Any]:
    """The JSON object of the trace file (open in Perfetto or chrome://tracing)."""
    start = report.timeline.start_unix_us
    zero = None if start is None or not report.steps else (start + report.steps[0].start_us) / 1e6
    return {"traceEvents": trace_events(report), "displayTimeUnit": "ms",
            "otherData": {"source": str(source), "horovod_op": report.kind, "time_zero_unix_s": zero,
                          "note": "steps derived from a Horovod timeline (rank 0's view): compute ends when the rank "
                                  "asked for its last reduction of the step, negotiation wait until the last rank "
                                  "asked, then the operation"}}


def default_trace_path(timeline: str | os.PathLike[str]) -> Path:
    """Where the trace goes without ``--out``: beside the timeline, ``<stem>.dtpo-trace.json``."""
    path = Path(timeline)
    return path.with_name(path.stem + TRACE_SUFFIX)


def summary(report: StragglerReport) -> dict[str, Any]:
    """Plain values of the report (what ``--json`` writes)."""
    return {
        "op": report.kind, "truncated": report.timeline.truncated, "tie_s": report.tie_s,
        "steps": len(report.steps), "measured_steps": len(report.measured), "cached_steps": report.cached,
        "incomplete_steps": report.incomplete,
        "ranks": [{"rank": r.rank, "steps": r.steps, "last": r.last, "last_share": r.last_share,
                   "mean_lateness_s": r.mean_lateness_s, "median_lateness_s": r.median_lateness_s,
                   "max_lateness_s": r.max_lateness_s, "mean_wait_s": r.mean_wait_s} for r in report.ranks],
        "per_step": [{"step": s.index, "complete": s.complete, "cached": s.cached, "tensors": len(s.negotiations),
                      "late_rank": s.late_rank, "lead_s": s.lead_s, "duration_s": (s.end_us - s.start_us) / 1e6,
                      "lateness_s": {str(r): v for r, v in s.lateness_s().items()}} for s in report.steps],
    }


def _span(name: str, category: str, pid: int, start_us: float, end_us: float, args: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "ph": "X", "cat": category, "pid": pid, "tid": 0, "ts": round(start_us, 1),
            "dur": round(max(end_us - start_us, 0.0), 1), "args": args}
