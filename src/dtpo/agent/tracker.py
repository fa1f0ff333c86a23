"""From torch's events to the step stream: :class:`StepTracker` marks each training iteration of an unmodified
script and hands its :class:`~dtpo.core.record.StepRecord` to the agent's run.

A step is cut at the same marks as a :class:`~dtpo.session.session.Session` step
(:class:`~dtpo.session.loop.timer.StepTimer`): it opens when the training loader is first asked for a batch
after the previous iteration (without a torch ``DataLoader``: at the previous iteration's end), the batches in
hand end the data wait, the last gradient ready (DDP: the Session's own
:class:`~dtpo.distributed.comm_timing.GradientComm` stamps) ends compute, backward's return ends the
post-backward tail, and the outermost optimizer step's return ends the step. Evaluation and checkpoints between
iterations fall outside every step. Samples are the leading dimension of the training batches (tokens where
they hold token ids), or ``DTPO_SAMPLES_PER_STEP``.

A listener call never raises into the script: a failure of the agent's own turns it off with one warning, and
the script trains on unmeasured.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import torch

from dtpo.agent.step_counter import LoaderChoice, StepCounter
from dtpo.core.record import StepRecord
from dtpo.distributed.comm_timing import GradientComm
from dtpo.session.loop.batch_size import count_samples, count_tokens
from dtpo.session.loop.clock import CpuClock, CudaClock
from dtpo.session.loop.timer import StepTimer
from dtpo.session.stream_run import StreamRun

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])


class StepSink(Protocol):
    """Where the tracker's steps go (:class:`~dtpo.agent.run.AgentRun`)."""

    def step_opened(self, step: int) -> None:
        """Step ``step`` began."""

    def step_closed(self, record: StepRecord) -> None:
        """It ended."""

    def finish_together(self) -> None:
        """The ranks end together, while their process group still stands."""


def _guarded(method: F) -> F:
    """A listener call that turns the agent off instead of raising into the script."""

    @functools.wraps(method)
    def call(self: StepTracker, *args: Any, **kwargs: Any) -> Any:
        if not self.active:
            return None
        try:
            return method(self, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - the script must never fail because of the agent
            self.active = False
            log.warning("agent: stopped measuring after an error of its own (%s: %s); the script goes on",
                        type(exc).__name__, exc)
            return None

    return call  # type: ignore[return-value]


class StepTracker:
    """Turns optimizer, data-loader, backward and DDP events into step records.

    Args:
        sink: Makes the run on the first iteration's end (``sink_for(tracker)``) and receives every step.
        samples_per_step: Samples per iteration on this rank, where the user said so (``DTPO_SAMPLES_PER_STEP``).
        warmup_steps: Steps left out of totals.

    Attributes:
        active: False once the agent stood aside (the script drives a producer of its own) or failed.
        step: Iterations closed so far.
        ddp: The first DDP model built, if any.
        comm: Its gradient-ready stamps.
    """

    def __init__(self, sink_for: Callable[[StepTracker], StepSink | None], samples_per_step: int | None = None,
                 warmup_steps: int = 2) -> None:
        self.sink_for = sink_for
        self.sink: StepSink | None = None
        self.samples_per_step = samples_per_step
        self.warmup_steps = warmup_steps
        self.active = True
        self.step = 0
        self.counter = StepCounter()
        self.loaders = LoaderChoice()
        self.ddp: Any = None
        self.comm: GradientComm | None = None
        self._clock: CpuClock | CudaClock | None = None
        self._timer: StepTimer | None = None
        self._previous_end: Any = None
        self._tokens: int | None = None
        self._requested_by: int | None = None
        self._announced = False

    # -- the clock and the timer ----------------------------------------------------------------------------

    @property
    def clock(self) -> CpuClock | CudaClock:
        """CUDA events on the current device once CUDA is in use, else the host clock (chosen at first use)."""
        if self._clock is None:
            cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
            self._clock = CudaClock(torch.device("cuda", torch.cuda.current_device())) if cuda else CpuClock()
        return self._clock

    def mark(self) -> Any:
        """A timestamp of the clock (what the gradient stamps take)."""
        return self.clock.mark()

    @property
    def timer(self) -> StepTimer:
        """The step timer."""
        if self._timer is None:
            self._timer = StepTimer(self.clock, self.comm, self.comm is not None, _distributed())
        return self._timer

    @property
    def step_open(self) -> bool:
        """Whether an iteration has begun and not ended."""
        return self.timer.step_start is not None

    def _open(self, start: Any = None) -> None:
        """Open the next step at ``start`` (a mark), or now."""
        timer = self.timer
        if start is None:
            timer.batch_requested(first_micro=True)
        else:
            timer.step_start, timer.started_at = start, time.time()
        self._tokens = None
        self._announced = False

    def _announce(self) -> None:
        """Tell the run the open step began, once it surely has (a batch in hand, a backward, its end)."""
        if not self._announced and self.sink is not None:
            self._announced = True
            self.sink.step_opened(self.step)

    # -- listener -------------------------------------------------------------------------------------------

    @_guarded
    def optimizer_entered(self, optimizer: Any) -> None:
        """An optimizer step begins."""
        self.counter.enter(optimizer)

    @_guarded
    def optimizer_left(self) -> None:
        """An optimizer step returned: the iteration ends when it was the clock optimizer's outermost step."""
        if self.counter.leave():
            self._close()

    @_guarded
    def batch_requested(self, loader: int) -> None:
        """A batch is asked for: the first training batch after an iteration opens the next one."""
        if not self.loaders.counts(loader):
            self._requested_by = None
            return
        self._requested_by = loader
        if self.step_open:
            self.timer.batch_requested(first_micro=False)
        else:
            self._open()

    @_guarded
    def batch_arrived(self, loader: int, batch: Any) -> None:
        """A batch is in hand: its samples (and tokens) count toward the open step."""
        self.loaders.yielded(loader)
        if self._requested_by != loader:
            return
        self._requested_by = None
        self._announce()
        self.timer.batch_arrived(count_samples(batch, default=0))
        tokens = count_tokens(batch)
        if tokens is not None:
            self._tokens = (self._tokens or 0) + tokens

    @_guarded
    def batch_cancelled(self, loader: int) -> None:
        """The loader ran out: a step it opened did not begin after all (the epoch ended)."""
        if self._requested_by != loader:
            return
        self._requested_by = None
        timer = self.timer
        if not timer.marked:
            timer.reset()

    @_guarded
    def backward_starting(self) -> None:
        """Backward begins: a step with no batch in hand opens at the previous iteration's end."""
        timer = self.timer
        if not self.step_open:
            self._open(self._previous_end if self._previous_end is not None else self.clock.mark())
        if timer.batch_ready is None:
            timer.batch_ready = timer.backward_end if timer.backward_end is not None else timer.step_start
        self._announce()
        timer.backward_starting()

    @_guarded
    def backward_finished(self) -> None:
        """Backward returned."""
        if self.step_open and self.timer.batch_ready is not None:
            self.timer.backward_finished(last_micro=True)

    @_guarded
    def ddp_built(self, model: Any) -> None:
        """Stamp the first DDP model's gradients (the script's comm hook, if any, stays as it is)."""
        if self.ddp is not None:
            log.debug("agent: a second DDP model is not stamped")
            return
        if self.sink is None and StreamRun.opened:  # dtpo.Session wraps its own model and stamps it itself
            self.active = False
            return
        comm = GradientComm(self.mark)
        comm.attach(model, "none")
        self.ddp, self.comm = model, comm
        if self._timer is not None:
            self._timer.stamps, self._timer.tail_measured = comm, True
        self.timer.distributed = _distributed()

    @_guarded
    def group_ending(self) -> None:
        """The script is about to destroy its process group: the ranks gather their records to rank 0 now, over
        the agent's own group (which goes down with the script's), and the agent stops listening."""
        if self.sink is not None:
            self.active = False
            self.sink.finish_together()

    # -- closing a step -------------------------------------------------------------------------------------

    def _close(self) -> None:
        timer = self.timer
        if not self.step_open:  # an iteration with neither batch nor backward: from the previous one's end
            self._open(self._previous_end if self._previous_end is not None else self.clock.mark())
        self._announce()
        end = self.clock.mark()
        self.clock.settle()
        if timer.backward_end is None:  # no backward seen (it ran elsewhere): the whole step counts as compute
            timer.add_compute(timer.batch_ready or timer.step_start, end)
            timer.backward_end = end
        timer.batch_ready = None
        tokens = self._tokens
        record = timer.close(self.step, self.step < self.warmup_steps, end, None)
        if self.samples_per_step is not None:
            record.samples = self.samples_per_step
        record.tokens = tokens
        self._previous_end = end
        self._requested_by = None
        self.loaders.step_ended()
        if self.sink is None:
            self.sink = self.sink_for(self)
            if self.sink is None:  # standing aside: no stamps left on the script's model
                self.active = False
                if self.comm is not None:
                    self.comm.detach()
                return
        self.step += 1
        self.sink.step_closed(record)


# Set for every rank by launchers whose ranks torch.distributed does not see (horovodrun, mpirun).
_OTHER_WORLD_SIZES = ("HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


def _distributed() -> bool:
    """Whether other ranks take part: a torch process group of several, or a launcher's world (Horovod's ranks
    are no torch group; their sync wait and exposed communication are then not measured, never a measured 0)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return True
    return any(os.environ.get(name, "1").strip().isdigit() and int(os.environ[name]) > 1
               for name in _OTHER_WORLD_SIZES if name in os.environ)
