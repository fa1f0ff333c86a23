"""The step timer: the five marks of an optimizer step and the per-step state between them.

Each optimizer step (k micro-steps with accumulation) is cut at five marks: batch requested, batch in hand,
last gradient ready (stamped by the gradient-communication hook), backward returned, optimizer done. The
cuts give data wait, compute, the post-backward tail (later split into exposed communication and sync wait,
see :mod:`dtpo.core.totals`) and optimizer time; they partition the step, so the parts add up to it.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from dtpo.core.record import StepRecord
from dtpo.session.loop.clock import CpuClock, CudaClock


class ReadyStamps(Protocol):
    """What the timer needs from the gradient-communication hook: when the last gradient became ready."""

    last_ready: Any
    ready_count: int

    def reset(self) -> None:
        """Forget the previous backward's stamps."""


class StepTimer:
    """Marks one rank's optimizer steps and turns them into :class:`StepRecord` s.

    Args:
        clock: The session's clock (host time on CPU, CUDA events on a GPU).
        stamps: The hook that stamps gradient readiness, or ``None`` without one (single process, FSDP).
        tail_measured: Whether the post-backward tail means anything (``False`` for FSDP2, whose collectives
            stay inside compute and have no per-bucket hook).
        distributed: Whether other ranks take part (with one process comm and sync wait are 0).
    """

    def __init__(self, clock: CpuClock | CudaClock, stamps: ReadyStamps | None, tail_measured: bool,
                 distributed: bool) -> None:
        self.clock = clock
        self.stamps = stamps
        self.tail_measured = tail_measured
        self.distributed = distributed
        self.reset()

    def reset(self) -> None:
        """Forget the current step's marks (after it closed)."""
        self.step_start: Any = None
        self.started_at: float | None = None
        self.batch_ready: Any = None
        self.backward_end: Any = None
        self.backward_done = False
        self.data_marks: list[tuple[Any, Any]] = []
        self.compute_marks: list[tuple[Any, Any]] = []
        self.tail_marks: tuple[Any, Any] | None = None
        self.samples = 0

    def batch_requested(self, first_micro: bool) -> Any:
        """Mark the request for a micro-batch; the first of a step also starts the step."""
        start = self.clock.mark()
        if first_micro:
            self.step_start = start
            self.started_at = time.time()
        self._requested = start
        return start

    def batch_arrived(self, samples: int) -> None:
        """Mark the micro-batch in hand."""
        self.batch_ready = ready = self.clock.mark()
        self.data_marks.append((self._requested, ready))
        self.samples += samples

    def backward_starting(self) -> None:
        """Forget the previous backward's gradient stamps."""
        if self.stamps is not None:
            self.stamps.reset()

    def backward_finished(self, last_micro: bool) -> None:
        """Mark backward's return; the compute part ends at the last gradient's stamp on the last micro-step."""
        end = self.clock.mark()
        stamps = self.stamps
        hooked = last_micro and stamps is not None and stamps.ready_count > 0
        compute_end = stamps.last_ready if hooked else end  # type: ignore[union-attr]
        self.compute_marks.append((self.batch_ready, compute_end))
        if last_micro:
            self.tail_marks = (compute_end, end)
        self.backward_end = end
        self.batch_ready = None
        self.backward_done = True

    def close(self, step: int, warmup: bool, end: Any, loss: float | None) -> StepRecord:
        """The step's breakdown (call after the clock settled), then reset for the next step."""
        data = compute = 0  # summed in mark order as sum() would, without a generator (this runs every step)
        tail_marks, distributed = self.tail_marks, self.distributed
        tail: float | None
        if type(self.clock) is CpuClock:  # host marks are seconds: their differences, without a call for each
            for requested, arrived in self.data_marks:
                data += arrived - requested
            for ready, computed in self.compute_marks:
                compute += computed - ready
            tail = tail_marks[1] - tail_marks[0] if tail_marks else 0.0
            step_s, optimizer_s = end - self.step_start, end - self.backward_end
        else:
            secs = self.clock.seconds
            for requested, arrived in self.data_marks:
                data += secs(requested, arrived)
            for ready, computed in self.compute_marks:
                compute += secs(ready, computed)
            tail = secs(*tail_marks) if tail_marks else 0.0
            step_s, optimizer_s = secs(self.step_start, end), secs(self.backward_end, end)
        if distributed and not self.tail_measured:
            tail = None
        alone = None if distributed else 0.0  # with one process comm and sync wait are 0
        record = StepRecord(
            step=step, warmup=warmup, samples=self.samples, step_s=step_s, data_wait_s=data, compute_s=compute,
            tail_s=tail, optimizer_s=optimizer_s, loss=loss, started_at=self.started_at, comm_exposed_s=alone,
            sync_wait_s=alone)
        # reset() written out (this runs every step)
        self.step_start = self.started_at = self.batch_ready = self.backward_end = self.tail_marks = None
        self.backward_done = False
        self.data_marks = []
        self.compute_marks = []
        self.samples = 0
        return record
