"""The CPU time the Session spends in its own code on each step: dtpo's bookkeeping, counted directly.

A :class:`BookkeepingCounter` sums the thread's CPU time (``time.thread_time_ns``) over each stretch of dtpo
code a step runs: the Session's entry points as the training loop calls them (the next micro-batch, ``backward``,
``step``), less the user's work they wrap (the loader's ``next``, autograd's backward, the optimizer's step), and
with them the step stream's dispatch to every callback. The user's loop body and the work dtpo hands to torch
are left out, and so are the warm-up steps (FLOP counting, ``on_train_start``): only measured steps are counted.

Left out as well: the gradient-ready stamp DDP runs inside autograd's backward (:mod:`dtpo.distributed.comm_timing`: a
timestamp and a count, on one parameter once it has learned which gradient comes last, on every parameter for a couple
of backwards before), since reading the clock around it would cost more than the stamp itself, and the forward wrapper
of :meth:`~dtpo.session.session.Session.wrap` (one check, and only once a mixed precision has been in force: until then
the model's forward is its own). Not dtpo's either: freeing the loss's autograd graph (about a microsecond per node when
caches are cold). The Session keeps only a detached copy of the loss, so the graph dies where the loop lets go of the
loss, as in a plain loop, rather than inside the Session's code when it would drop its reference at the step's end.

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
five calls became two), so the step's end is written out in :meth:`~dtpo.session.session.Session.step` (a step
whose record waits is handed to the timer there), the timer sums each part's seconds as it ends on the host rather
than keeping pairs of marks, the Session skips the step stream's ``step_begin`` when no callback listens to it, and
the common cases of the two reads from torch that are left, each about a fifth of the path, are written out where
they run: the batch's size (``count_samples``: the leading size of a tuple's first tensor) and the loss's value
(``read_loss``: a float32 loss's ``tolist``); ``len``, ``size(0)`` and ``item`` cost more than the ``shape`` and
``tolist`` used. A window's end builds its records in one loop that also tells whether any loss is not finite.

Reading the thread's CPU clock is a system call (about 0.3 us in a tight loop here, nearer 0.8 us between the steps'
own work, more with the kernel's caches cold), and a step has six stretches: reading it around all of them on every
step, with a call to the counter at each end, would cost about a third of what it measures, and that cost is dtpo's
too. So the counter reads it on one step in :data:`SAMPLE_ONE_IN` (and on another, to calibrate itself, below),
chosen by a multiplicative hash of the step's index, which meets every kind of step (window ends, flushes,
checkpoints, whatever their period) in proportion; :attr:`BookkeepingCounter.raw_seconds_per_step` is the mean over
those steps. One in 16 keeps the counter's own calls and reads to one step in eight on average (a few
microseconds a step under DDP, where one in four spent about four times that), and still counts 60 steps in a
thousand; ``benchmarks/overhead.py``, which wants a tight interval from a few thousand steps, counts one in four.

Each stretch still holds part of the counter's own two reads: what the first does after it sampled the clock (the
return from the kernel, the integer it builds) and what the second does before it samples it. With the caches cold
that is 1.2-3.7 us a stretch here, and none of it is the Session's. So, as a profiler calibrates its own cost
(:meth:`profile.Profile.calibrate`), the counter measures it in place: on another step in :data:`SAMPLE_ONE_IN`
(the next slice of the same hash, so never a counted one) :attr:`BookkeepingCounter.calibrating` is set, the Session
calls it at the same places as on a counted step, and where each stretch would start it reads the clock twice in a
row instead: an empty stretch, under the same conditions. The share differs by place: the first read after the
model's work, or after a step with no reads, returns from a colder kernel than one that follows a read by a few
microseconds (medians of 2.3-3.7 us against 1.2-1.6 us here), so each stretch's place (its index in the step) has
its own calibration. :attr:`BookkeepingCounter.seconds_per_step` is the raw mean less, for each stretch counted,
the median empty stretch at its place (over the latest :data:`CALIBRATION_SAMPLES` there), and
:attr:`BookkeepingCounter.bias_seconds_per_step` what was taken off; both figures go to the benchmark's table.
(Taking one place's median off every stretch, as this counter did first, took off 3 us a step too much for
Linear(8, 4) and 6 us for 32 x Linear(8, 8): its place, a step's start, is one of the cold ones.)
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

SAMPLE_ONE_IN = 16  # steps per counted step (and per calibrating step)
CALIBRATION_SAMPLES = 256  # the latest empty stretches at a place the counter's own cost there is the median of
PLACES = 16  # the places in a step calibrated apart (later stretches, with many micro-batches, share the last)
_GOLDEN = 0x9E3779B9  # 2**32 / the golden ratio: Fibonacci hashing spreads any arithmetic progression of steps


class BookkeepingCounter:
    """Sums the CPU time of the stretches of dtpo code on counted steps, and counts those steps.

    The Session calls :meth:`begin_step` as each step begins (which opens the step's first stretch when it is
    counted), then, while :attr:`counting`, :meth:`leave` and :meth:`enter` around the user's work and
    :meth:`step_done` as the step ends (it checks :attr:`counting` itself, so a step not counted costs no call). On a
    calibrating step :attr:`counting` is set as well, and the same calls time an empty stretch where each stretch
    would start (:attr:`calibrating`).

    Args:
        clock: Nanoseconds of this thread's CPU time (``time.thread_time_ns``; tests pass their own).
        sample_one_in: Count one step in this many (1 counts every step, and leaves no step to calibrate on: the
            counter's own cost is then not taken off).

    Attributes:
        counting: The Session calls :meth:`enter`, :meth:`leave` and :meth:`step_done` on this step (it is counted,
            or calibrating).
        calibrating: This step times the counter's own reads where each stretch would start, and counts nothing.
    """

    __slots__ = ("clock", "sample_one_in", "counting", "calibrating", "total_ns", "steps", "stretches", "_since",
                 "_place", "_counted_at", "_empty", "_calibrations")

    def __init__(self, clock: Callable[[], int] = time.thread_time_ns, sample_one_in: int = SAMPLE_ONE_IN) -> None:
        if sample_one_in < 1:
            raise ValueError(f"sample_one_in must be >= 1, got {sample_one_in}")
        self.clock = clock
        self.sample_one_in = sample_one_in
        self.counting = False
        self.calibrating = False
        self.total_ns = 0  # dtpo's CPU time on the counted steps, the counter's own share included
        self.steps = 0  # counted steps closed
        self.stretches = 0  # stretches closed on counted steps
        self._since = 0  # where the open stretch started
        self._place = 0  # the open (or next) stretch's index in the step
        self._counted_at = [0] * PLACES  # stretches counted at each place
        self._empty = [[0] * CALIBRATION_SAMPLES for _ in range(PLACES)]  # the latest empty stretches at each place
        self._calibrations = [0] * PLACES  # empty stretches timed at each place

    def begin_step(self, step: int, warmup: bool = False) -> None:
        """Step ``step`` begins, and with it a stretch of dtpo code when the step is counted (:meth:`enter`).

        Args:
            step: The step's index.
            warmup: It is a warm-up step (never counted: its one-off work is not the per-step cost).
        """
        # the step's place among 2**32 by a multiplicative hash: counted in the lowest 1/sample_one_in of them, and
        # calibrating on the next 1/sample_one_in
        slot = ((step * _GOLDEN) & 0xFFFFFFFF) * self.sample_one_in >> 32
        counted = slot == 0 and not warmup
        self.calibrating = calibrating = slot == 1 and not warmup
        self.counting = counted or calibrating
        self._place = 0
        if counted:
            self._since = self.clock()
        elif calibrating:
            self._calibrate()

    def enter(self) -> None:
        """A stretch of dtpo code starts (on a calibrating step: an empty stretch is timed here)."""
        if self.calibrating:
            self._calibrate()
        else:
            self._since = self.clock()

    def leave(self) -> None:
        """The open stretch of dtpo code ends: add its CPU time."""
        if self.calibrating:
            self._place += 1
            return
        self.total_ns += self.clock() - self._since
        self.stretches += 1
        place = self._place
        self._counted_at[place if place < PLACES else PLACES - 1] += 1
        self._place = place + 1

    def step_done(self) -> None:
        """A counted step ended."""
        if not self.calibrating:
            self.steps += 1

    def _calibrate(self) -> None:
        """Time an empty stretch (two reads in a row) at the current place."""
        clock = self.clock
        first = clock()
        empty = clock() - first
        place = min(self._place, PLACES - 1)
        self._empty[place][self._calibrations[place] % CALIBRATION_SAMPLES] = empty
        self._calibrations[place] += 1

    def empty_stretch_at(self, place: int) -> float:
        """The counter's own share of a stretch at ``place`` (its index in the step): the median empty stretch timed
        there (0 before any was)."""
        place = min(place, PLACES - 1)
        n = min(self._calibrations[place], CALIBRATION_SAMPLES)
        return statistics.median(self._empty[place][:n]) if n else 0.0

    @property
    def bias_ns(self) -> float:
        """The counter's own share of :attr:`total_ns`: for each stretch counted, the median empty stretch at its
        place."""
        return sum(count * self.empty_stretch_at(place) for place, count in enumerate(self._counted_at) if count)

    @property
    def empty_stretch_ns(self) -> float:
        """The counter's own share of a counted stretch, on average over the stretches counted (0 before any)."""
        return self.bias_ns / self.stretches if self.stretches else 0.0

    @property
    def raw_seconds_per_step(self) -> float | None:
        """The mean CPU seconds per counted step in the stretches, the counter's own share included; ``None`` before
        the first."""
        return self.total_ns / self.steps / 1e9 if self.steps else None

    @property
    def bias_seconds_per_step(self) -> float | None:
        """The counter's own share of :attr:`raw_seconds_per_step`."""
        return self.bias_ns / self.steps / 1e9 if self.steps else None

    @property
    def seconds_per_step(self) -> float | None:
        """dtpo's mean CPU seconds per counted step, the counter's own share taken off; ``None`` before the first."""
        if not self.steps:
            return None
        return max(self.total_ns - self.bias_ns, 0.0) / self.steps / 1e9
