"""Horovod timelines for tests, written byte for byte as Horovod's C++ writer writes them.

Horovod cannot be installed here (no release since June 2023), so the fixtures come from a model of
``horovod/common/timeline.cc`` and of the coordinator that calls it (``IncrementTensorCount`` in
``horovod/common/controller.cc``):

* every tensor is a process: on its first event, ``process_name`` (``args.name``: the tensor) and
  ``process_sort_index`` metadata for a new pid (1, 2, ...);
* the coordinator takes requests once per cycle (``HOROVOD_CYCLE_TIME``): its own first, the other ranks' after
  a gather, in rank order. The first request of a tensor opens ``NEGOTIATE_ALLREDUCE`` (``"ph": "B"``), each
  request is a tick (``"ph": "X"``, ``"name"``: the rank, ``"dur": 0``), the last one ends it (``"ph": "E"``,
  no name);
* then the ``ALLREDUCE`` span with activities (``MEMCPY_IN_FUSION_BUFFER``, ``NCCL_ALLREDUCE``,
  ``MEMCPY_OUT_FUSION_BUFFER``), closed with ``dtype`` and ``shape`` args;
* with the response cache, a tensor seen before gets ``NEGOTIATE_ALLREDUCE`` begin and end but no ticks.

Two file layouts: ``"0.21"`` (``TimelineWriter``: pid 0 metadata with ``start_time_since_epoch_in_micros``,
each event closes the array with ``]``, the next one overwrites it with ``,``) and ``"0.16"`` (``[`` then every
event followed by ``,`` and a newline, never closed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

START_UNIX_US = 1_700_000_000_000_000


@dataclass
class Job:
    """A synthetic training job as Horovod's coordinator on rank 0 would see it.

    Attributes:
        ranks: World size.
        tensors: Gradient tensors, in the order backward produces them.
        steps: Iterations.
        late_ms: Per rank, how much later than the others it asks for every tensor (a straggler).
        compute_ms: Forward and backward up to the first gradient.
        gap_ms: Between two gradients of one backward.
        cycle_ms: ``HOROVOD_CYCLE_TIME``.
        allreduce_ms: Each tensor's allreduce.
        optimizer_ms: After the allreduces, before the next iteration's compute.
        cached_from_step: Steps from this one on are negotiated by the response cache (no ticks).
        mark_cycles: ``HOROVOD_TIMELINE_MARK_CYCLES=1``: a ``CYCLE_START`` marker at each cycle that took requests.
    """

    ranks: int = 4
    tensors: tuple[str, ...] = ("allreduce.fc2.bias", "allreduce.fc2.weight", "allreduce.fc1.bias",
                                "allreduce.fc1.weight")
    steps: int = 5
    late_ms: dict[int, float] = field(default_factory=dict)
    compute_ms: float = 20.0
    gap_ms: float = 1.5
    cycle_ms: float = 1.0
    allreduce_ms: float = 2.0
    optimizer_ms: float = 3.0
    cached_from_step: int | None = None
    mark_cycles: bool = False


def events(job: Job) -> list[tuple[float, str, str, str, str]]:
    """The coordinator's timeline calls in the order it makes them: (ts µs, tensor, phase, name, args)."""
    out: list[tuple[float, str, str, str, str]] = []
    base = 1000.0
    for step in range(job.steps):
        cached = job.cached_from_step is not None and step >= job.cached_from_step
        step_end = base
        for i, tensor in enumerate(job.tensors):
            asked = {r: base + (job.compute_ms + job.late_ms.get(r, 0.0) + i * job.gap_ms) * 1e3
                     for r in range(job.ranks)}
            cycle = job.cycle_ms * 1e3
            taken = {r: math.ceil(t / cycle) * cycle + (0.0 if r == 0 else 40.0 + 3.0 * r) for r, t in asked.items()}
            first, last = min(taken.values()), max(taken.values())
            if job.mark_cycles:
                cycles = sorted({math.floor(t / cycle) * cycle for t in taken.values()})
                out += [(t - 0.5, "", "i", "CYCLE_START", "") for t in cycles]
            out.append((first, tensor, "B", "NEGOTIATE_ALLREDUCE", ""))
            if not cached:
                for r in sorted(taken, key=lambda r: (taken[r], r)):
                    out.append((taken[r], tensor, "X", str(r), ""))
            out.append((last + 1.0, tensor, "E", "", ""))
            start = last + 100.0
            end = start + job.allreduce_ms * 1e3
            out.append((start, tensor, "B", "ALLREDUCE", ""))
            for name, a, b in (("MEMCPY_IN_FUSION_BUFFER", 0.0, 0.2), ("NCCL_ALLREDUCE", 0.2, 0.9),
                               ("MEMCPY_OUT_FUSION_BUFFER", 0.9, 1.0)):
                out.append((start + a * (end - start), tensor, "B", name, ""))
                out.append((start + b * (end - start) - 1.0, tensor, "E", "", ""))
            out.append((end, tensor, "E", "", '"dtype": "float32", "shape": "[16, 8]"'))
            step_end = max(step_end, end)
        base = step_end + job.optimizer_ms * 1e3
    out.sort(key=lambda e: e[0])  # one writer thread, in the order the events were enqueued
    return out


def _event(ts: float, pid: int, phase: str, name: str, args: str) -> str:
    if phase == "i":  # DoWriteMarker: no pid
        return f'{{"ph": "i", "name": "{name}", "ts": {int(ts)}, "s": "g"}}'
    text = '{"ph": "' + phase + '"'
    if phase != "E":
        text += ', "name": "' + name + '"'
    text += f', "ts": {int(ts)}, "pid": {pid}'
    if phase == "X":
        text += ', "dur": 0'
    if args:
        text += ", \"args\": {" + args + "}"
    return text + "}"


def _metadata(pid: int, tensor: str) -> str:
    return (f'{{"name": "process_name", "ph": "M", "pid": {pid}, "args": {{"name": "{tensor}"}}}},\n'
            f'{{"name": "process_sort_index", "ph": "M", "pid": {pid}, "args": {{"sort_index": {pid}}}}},\n')


def timeline_text(job: Job, layout: str = "0.21") -> str:
    """The file Horovod would have written for ``job`` (``layout``: ``"0.21"`` or ``"0.16"``)."""
    pids: dict[str, int] = {}
    if layout == "0.16":
        text = "[\n"
        for ts, tensor, phase, name, args in events(job):
            if tensor and tensor not in pids:
                pids[tensor] = len(pids) + 1
                text += _metadata(pids[tensor], tensor)
            text += _event(ts, pids.get(tensor, 0), phase, name, args) + ",\n"
        return text
    text = ""
    for ts, tensor, phase, name, args in events(job):
        if not text:
            text = ("[\n"
                    f'{{"name": "process_name", "ph": "M", "pid": 0, '
                    f'"args": {{"start_time_since_epoch_in_micros":{START_UNIX_US}}}}},\n'
                    '{"name": "process_sort_index", "ph": "M", "pid": 0, "args": {"sort_index": 0}},\n')
        else:
            text = text[:-1] + ","  # seekp(pos - 1): the closing ']' becomes ','
        if tensor and tensor not in pids:
            pids[tensor] = len(pids) + 1
            text += _metadata(pids[tensor], tensor)
        text += _event(ts, pids.get(tensor, 0), phase, name, args) + "]"
    return text
