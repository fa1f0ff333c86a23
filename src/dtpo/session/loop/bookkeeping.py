"""The CPU time the Session spends in its own code on each step: dtpo's bookkeeping, counted directly.

A :class:`BookkeepingCounter` sums the thread's CPU time (``time.thread_time_ns``) over each stretch of dtpo
code a step runs: the Session's entry points as the training loop calls them (the next micro-batch, ``backward``,
``step``), less the user's work they wrap (the loader's ``next``, autograd's backward, the optimizer's step), and
with them the step stream's dispatch to every callback. The user's loop body and the work dtpo hands to torch
are left out, and so are the warm-up steps (FLOP counting, ``on_train_start``): only measured steps are counted.

Left out as well: the gradient-ready stamp DDP runs inside autograd's backward
(:mod:`dtpo.distributed.comm_timing`: a timestamp and a count, on one parameter once it has learned which
gradient comes last, on every parameter for a couple of backwards before), since reading the clock around it
would cost more than the stamp itself, and the forward wrapper of :meth:`~dtpo.session.session.Session.wrap`
(one check). Not dtpo's either: freeing the loss's autograd graph (about a microsecond per node when caches are
cold). The Session keeps only a detached copy of the loss, so the graph dies where the loop lets go of the loss,
as in a plain loop, rather than inside the Session's code when it would drop its reference at the step's end.

What is counted runs right after the model's work, with the caches cold: the same code costs two to five times
what it costs in a tight loop (``benchmarks/overhead.py`` shows it with a diagnostic model), so the Session's
per-step path is kept short: no per-step dicts or keyword calls, window-end work only at window ends, and the
modelled CPU's load read from ``/proc/stat`` at most once per clock tick (:mod:`dtpo.devices.modelled_cpu`). With
the caches cold, each object the path reaches costs about a microsecond on a small shared machine (measured after a
matrix product: 12 objects' attributes 12 us, 12 slots of one object 2 us), so the objects read at every step keep
their attributes in slots (the step timer, the gradient stamps), a callback done with a per-step hook says so and is
called no more (:class:`~dtpo.core.callbacks.Callback`), and settings that cannot change are copied where the step
already reads.
Where no callback wants each step's record as the step ends, a measured step only keeps its marks and its loss
tensor, and the window's records are built, their losses read and the callbacks told together as it closes
(:meth:`~dtpo.session.session.Session.settle_steps`): under DDP that halved what the step's end costs.
A Python call or a property costs as much as a few objects there (counted with ``benchmarks/overhead_instructions.py``,
which runs this path under a cache simulator: a step's end went from 19 to 13 thousand estimated cycles when its
five calls became two), so the step's end is written out in :meth:`~dtpo.session.session.Session.step`, the timer sums
each part's seconds as it ends on the host rather than keeping pairs of marks, and the Session skips the step
stream's ``step_begin`` when no callback listens to it. What is left is mostly two reads from torch, each about a
fifth of the path: the batch's size (``count_samples``) and the loss's value (``read_loss``); ``len``,
``size(0)`` and ``item`` cost more than the ``shape`` and ``tolist`` used.

Reading the thread's CPU clock is a system call (about 0.3 us in a tight loop here, nearer 0.8 us between
the steps' own work), and a step has six stretches: reading it around all of them on every step would cost about
a third of what it measures. So the counter reads it on one step in :data:`SAMPLE_ONE_IN`, chosen by a
multiplicative hash of the step's index, which meets every kind of step (window ends, flushes, checkpoints,
whatever their period) in proportion; :attr:`BookkeepingCounter.raw_seconds_per_step` is the mean over those steps.

Each stretch still holds part of the counter's own two reads: what the first does after it sampled the clock (the
return from the kernel, the integer it builds) and what the second does before it samples it. With the caches cold
that is 1.4-2.7 us a stretch here (8-16 us of a counted step's six stretches, more after a DDP step), and none of
it is the Session's. So, as a profiler calibrates its own cost (:meth:`profile.Profile.calibrate`), the counter
measures it in place: on another step in :data:`SAMPLE_ONE_IN` (the next slice of the same hash, so never a
counted one), where a counted step's first stretch would start, it reads the clock twice in a row: an empty
stretch, under the same conditions. :attr:`BookkeepingCounter.seconds_per_step` is the raw mean less the median
empty stretch (over the latest :data:`CALIBRATION_SAMPLES`) for each stretch counted, and
:attr:`BookkeepingCounter.bias_seconds_per_step` what was taken off; both figures go to the benchmark's table.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

SAMPLE_ONE_IN = 4  # steps per counted step
CALIBRATION_SAMPLES = 256  # the latest empty stretches the counter's own cost is the median of
_GOLDEN = 0x9E3779B9  # 2**32 / the golden ratio: Fibonacci hashing spreads any arithmetic progression of steps


class BookkeepingCounter:
    """Sums the CPU time of the stretches of dtpo code on counted steps, and counts those steps.

    The Session calls :meth:`begin_step` as each step begins (which opens the step's first stretch when it is
    counted, or times an empty stretch on a calibrating step), then, while :attr:`counting`, :meth:`leave` and
    :meth:`enter` around the user's work and :meth:`step_done` as the step ends (it checks :attr:`counting` itself,
    so a step not counted costs no call).

    Args:
        clock: Nanoseconds of this thread's CPU time (``time.thread_time_ns``; tests pass their own).
        sample_one_in: Count one step in this many (1 counts every step, and leaves no step to calibrate on: the
            counter's own cost is then not taken off).
    """

    __slots__ = ("clock", "sample_one_in", "counting", "total_ns", "steps", "stretches", "_since", "_empty",
                 "_calibrations")

    def __init__(self, clock: Callable[[], int] = time.thread_time_ns, sample_one_in: int = SAMPLE_ONE_IN) -> None:
        if sample_one_in < 1:
            raise ValueError(f"sample_one_in must be >= 1, got {sample_one_in}")
        self.clock = clock
        self.sample_one_in = sample_one_in
        self.counting = False  # whether the current step is counted
        self.total_ns = 0  # dtpo's CPU time on the counted steps, the counter's own share included
        self.steps = 0  # counted steps closed
        self.stretches = 0  # stretches closed on counted steps
        self._since = 0  # where the open stretch started
        self._empty = [0] * CALIBRATION_SAMPLES  # the latest empty stretches, a ring
        self._calibrations = 0  # empty stretches timed

    def begin_step(self, step: int, warmup: bool = False) -> None:
        """Step ``step`` begins, and with it a stretch of dtpo code when the step is counted (:meth:`enter`).

        Args:
            step: The step's index.
            warmup: It is a warm-up step (never counted: its one-off work is not the per-step cost).
        """
        # the step's place among 2**32 by a multiplicative hash: counted in the lowest 1/sample_one_in of them, and
        # calibrating on the next 1/sample_one_in
        quarter = ((step * _GOLDEN) & 0xFFFFFFFF) * self.sample_one_in >> 32
        self.counting = counting = quarter == 0 and not warmup
        if counting:
            self._since = self.clock()
        elif quarter == 1 and not warmup:
            clock = self.clock
            first = clock()
            self._empty[self._calibrations % CALIBRATION_SAMPLES] = clock() - first
            self._calibrations += 1

    def enter(self) -> None:
        """A stretch of dtpo code starts."""
        self._since = self.clock()

    def leave(self) -> None:
        """The open stretch of dtpo code ends: add its CPU time."""
        self.total_ns += self.clock() - self._since
        self.stretches += 1

    def step_done(self) -> None:
        """A counted step ended."""
        self.steps += 1

    @property
    def empty_stretch_ns(self) -> float:
        """The counter's own share of a stretch: the median empty stretch (0 before any was timed)."""
        n = min(self._calibrations, CALIBRATION_SAMPLES)
        return statistics.median(self._empty[:n]) if n else 0.0

    @property
    def raw_seconds_per_step(self) -> float | None:
        """The mean CPU seconds per counted step in the stretches, the counter's own share included; ``None`` before
        the first."""
        return self.total_ns / self.steps / 1e9 if self.steps else None

    @property
    def bias_seconds_per_step(self) -> float | None:
        """The counter's own share of :attr:`raw_seconds_per_step`: the median empty stretch for each stretch."""
        return self.stretches * self.empty_stretch_ns / self.steps / 1e9 if self.steps else None

    @property
    def seconds_per_step(self) -> float | None:
        """dtpo's mean CPU seconds per counted step, the counter's own share taken off; ``None`` before the first."""
        if not self.steps:
            return None
        return max(self.total_ns - self.stretches * self.empty_stretch_ns, 0.0) / self.steps / 1e9
