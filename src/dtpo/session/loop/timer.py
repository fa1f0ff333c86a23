"""The step timer: the five marks of an optimizer step and the per-step state between them.

Each optimizer step (k micro-steps with accumulation) is cut at five marks: batch requested, batch in hand,
last gradient ready (stamped by the gradient-communication hook), backward returned, optimizer done. The
cuts give data wait, compute, the post-backward tail (later split into exposed communication and sync wait,
see :mod:`dtpo.core.totals`) and optimizer time; they partition the step, so the parts add up to it.

On the host a mark is a ``perf_counter`` reading, so a span's length is known as it ends: the timer sums each part's
seconds at once (``data_s``, ``compute_s``, ``tail_s``), with no pair of marks kept per micro-batch. On a device a mark
is a CUDA event whose time is known only once the device is done, so the pairs are kept (``data_marks``,
``compute_marks``, ``tail_marks``) and read as the record is built.

A step's record is built as it ends (:meth:`StepTimer.close`), or later: :meth:`StepTimer.defer` keeps the marks
and the loss (a tensor on a device; on the host its value, read as backward returned, one operation where keeping a
tensor to read later is two), and :meth:`StepTimer.close_deferred` builds a window's records together, reading the
device's losses in one go, where the code is warm, rather than once per step with the caches cold from the model's
work.
"""

from __future__ import annotations

import math
import time
from typing import Any, Protocol

import torch

from dtpo.core.record import StepRecord
from dtpo.session.loop.clock import CpuClock, CudaClock
from dtpo.session.loop.divergence import first_diverged


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

    # slots: the marks are written several times a step, right after the model's work, when the caches are cold; a
    # slot is read and written in the object itself, where an attribute in a __dict__ is one more place to fetch
    __slots__ = ("clock", "stamps", "tail_measured", "distributed", "deferred", "step_start", "started_at",
                 "batch_ready", "backward_end", "backward_done", "data_s", "compute_s", "tail_s", "data_marks",
                 "compute_marks", "tail_marks", "samples", "_requested", "_host", "_mark")

    def __init__(self, clock: CpuClock | CudaClock, stamps: ReadyStamps | None, tail_measured: bool,
                 distributed: bool) -> None:
        self.clock = clock
        self._mark = clock.mark  # bound once: three marks a step, each without a lookup through the clock's class
        self.stamps = stamps
        self.tail_measured = tail_measured
        self.distributed = distributed
        self.deferred: list[tuple[Any, ...]] = []  # measured steps ended whose records wait (see defer())
        self._requested: Any = None
        self._host = type(clock) is CpuClock  # marks are perf_counter seconds, which give a step's start in wall time
        self.reset()

    def reset(self) -> None:
        """Forget the current step's marks (after it closed)."""
        self.step_start: Any = None
        self.started_at: float | None = None
        self.batch_ready: Any = None
        self.backward_end: Any = None
        self.backward_done = False
        self.data_s = self.compute_s = self.tail_s = 0.0  # on the host: each part's seconds so far
        self.data_marks: list[tuple[Any, Any]] = []  # on a device: each part's pairs of events
        self.compute_marks: list[tuple[Any, Any]] = []
        self.tail_marks: tuple[Any, Any] | None = None
        self.samples = 0

    @property
    def marked(self) -> bool:
        """Whether the open step has a micro-batch in hand or a backward done (a part of it marked)."""
        return self.batch_ready is not None or self.backward_end is not None

    def batch_requested(self, first_micro: bool) -> Any:
        """Mark the request for a micro-batch; the first of a step also starts the step."""
        start = self._mark()
        if first_micro:
            self.step_start = start
            # on the host the start's wall time comes from its mark as the record is built (one clock read less)
            self.started_at = None if self._host else time.time()
        self._requested = start
        return start

    def batch_arrived(self, samples: int) -> None:
        """Mark the micro-batch in hand."""
        self.batch_ready = ready = self._mark()
        if self._host:
            self.data_s += ready - self._requested
        else:
            self.data_marks.append((self._requested, ready))
        self.samples += samples

    def backward_starting(self) -> None:
        """Forget the previous backward's gradient stamps."""
        if self.stamps is not None:
            self.stamps.reset()

    def backward_finished(self, last_micro: bool) -> None:
        """Mark backward's return; the compute part ends at the last gradient's stamp on the last micro-step."""
        end = self._mark()
        stamps = self.stamps
        hooked = last_micro and stamps is not None and stamps.ready_count > 0
        compute_end = stamps.last_ready if hooked else end  # type: ignore[union-attr]
        if self._host:
            self.compute_s += compute_end - self.batch_ready
            if last_micro:
                self.tail_s = end - compute_end
        else:
            self.compute_marks.append((self.batch_ready, compute_end))
            if last_micro:
                self.tail_marks = (compute_end, end)
        self.backward_end = end
        self.batch_ready = None
        self.backward_done = True

    def add_compute(self, start: Any, end: Any) -> None:
        """Count the span between two marks as compute (a step whose backward the timer did not see)."""
        if self._host:
            self.compute_s += end - start
        else:
            self.compute_marks.append((start, end))

    def close(self, step: int, warmup: bool, end: Any, loss: float | None) -> StepRecord:
        """The step's breakdown (call after the clock settled), then reset for the next step."""
        self.defer(step, end, loss, 1)
        return self._records([self.deferred.pop()], warmup)[0][0]

    def defer(self, step: int, end: Any, loss: Any, divisor: int) -> None:
        """Keep what the step's record is built from, with its loss (a tensor, read later, or its value), for
        :meth:`close_deferred`, then reset for the next step: what a measured step must do as it ends, without building
        its record.

        What is kept: ``(step, end, loss, divisor, step_start, started_at, data, compute, tail, backward_end,
        samples)``, where data, compute and tail are seconds on the host and the pairs of marks on a device.
        """
        # written out, reset() included: this runs at every step, where each call costs with the caches cold
        if self._host:
            self.deferred.append((step, end, loss, divisor, self.step_start, self.started_at, self.data_s,
                                  self.compute_s, self.tail_s, self.backward_end, self.samples))
            self.data_s = self.compute_s = self.tail_s = 0.0
        else:
            self.deferred.append((step, end, loss, divisor, self.step_start, self.started_at, self.data_marks,
                                  self.compute_marks, self.tail_marks, self.backward_end, self.samples))
            self.data_marks = []
            self.compute_marks = []
            self.tail_marks = None
        self.step_start = self.started_at = self.batch_ready = self.backward_end = None
        self.backward_done = False
        self.samples = 0

    def close_deferred(self) -> tuple[list[StepRecord], int | None]:
        """The records of the deferred steps, in order, their losses read in one go (measured steps: no warm-up), and
        the index of the first whose loss is NaN or infinite (``None`` when none)."""
        deferred, self.deferred = self.deferred, []
        return self._records(deferred, False) if deferred else ([], None)

    def _records(self, kept: list[tuple[Any, ...]], warmup: bool) -> tuple[list[StepRecord], int | None]:
        """The records of steps as :meth:`defer` keeps them, in order, each loss read (a tensor's value, divided by
        the step's micro-batches), and the index of the first whose loss is NaN or infinite (``None`` when none).

        On the host one loop builds them all (the parts are seconds already; a step's own span, its optimizer's and
        its start in wall time come from its marks and the wall clock's offset, :func:`_wall_offset`), and the
        losses' sum says whether any is not finite: this runs as a window closes, ten records at once, where a call
        per record, or a second pass over them, would cost more than the record.
        """
        distributed = self.distributed
        alone = None if distributed else 0.0  # with one process comm and sync wait are 0
        untimed_tail = distributed and not self.tail_measured
        records = []
        if self._host:
            offset = _wall_offset()
            total = 0.0  # finite only when every loss is (or, rarely, not when finite ones overflow: looked at then)
            for step, end, loss, divisor, step_start, started_at, data, compute, tail, backward_end, samples in kept:
                if loss is not None:
                    loss = (loss if type(loss) is float else read_loss(loss)) / divisor
                    total += loss
                records.append(StepRecord(step, warmup, samples, end - step_start, data, compute,
                                          None if untimed_tail else tail, end - backward_end, alone, alone, loss,
                                          step_start + offset if started_at is None else started_at))
            return records, None if math.isfinite(total) else first_diverged(records)
        secs = self.clock.seconds
        losses = read_losses([marks[2] for marks in kept])  # one copy where they share a device
        for marks, loss in zip(kept, losses, strict=True):
            step, end, _, divisor, step_start, started_at, data_marks, compute_marks, tail_marks, backward_end, \
                samples = marks
            data = compute = 0.0  # summed in mark order
            for requested, arrived in data_marks:
                data += secs(requested, arrived)
            for ready, computed in compute_marks:
                compute += secs(ready, computed)
            tail = None if untimed_tail else secs(*tail_marks) if tail_marks else 0.0
            records.append(StepRecord(step, warmup, samples, secs(step_start, end), data, compute, tail,
                                      secs(backward_end, end), alone, alone, None if loss is None else loss / divisor,
                                      started_at))
        return records, first_diverged(records)


def _wall_offset() -> float:
    """Unix time less the host clock's (``time.perf_counter``) reading now."""
    return time.time() - time.perf_counter()


def read_losses(losses: list[Any]) -> list[float | None]:
    """The values of steps' losses (tensors; values read already, on the host; or ``None`` where a step had none),
    as float32 reads them: tensors one by one on the host (after the first, each read is warm: a fraction of a
    microsecond), with one stacked copy where they share a GPU (one transfer, not one per step)."""
    # values read already are told by their exact type: isinstance(value, torch.Tensor) goes through torch's
    # metaclass, several times slower for a float
    tensors = [loss for loss in losses if loss is not None and type(loss) is not float]
    if not tensors:
        return list(losses)
    first = tensors[0]
    if first.device.type != "cpu" and all(t.device == first.device and t.dim() == 0 for t in tensors):
        stacked = torch.stack([t if t.dtype == torch.float32 else t.float() for t in tensors])
        values = iter(stacked.tolist())
    else:
        values = iter([read_loss(t) for t in tensors])
    return [loss if loss is None or type(loss) is float else next(values) for loss in losses]


def read_loss(loss: torch.Tensor) -> float:
    """A loss's value: a float32 loss as it is, another dtype through float32.

    A 0-dim float32 loss is read with ``tolist``, which copies the value out without a trip through the operator
    dispatcher that ``item`` takes: with the caches cold from the model's work (read right after backward), that
    read cost 17 us against 25 us under DDP on a small CPU machine (``benchmarks/overhead.py``'s model); both give
    the same float."""
    if loss.dtype == torch.float32:
        value = loss.tolist()
        return value if type(value) is float else loss.item()  # a loss of one element in a dimension: a list
    return float(loss.float().item())
