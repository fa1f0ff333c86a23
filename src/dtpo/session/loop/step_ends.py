"""A step's end: its record, from the timer's marks and its loss, into this rank's record, the divergence check and
the step stream, as the step ends or together with its window.

Where no callback wants each step's record as the step ends (:attr:`~dtpo.core.callbacks.Callback.live_step_end`),
a measured step after the first only leaves its marks and its loss (a tensor, or on the host its value) with the
timer (:meth:`~dtpo.session.loop.timer.StepTimer.defer`, which :meth:`~dtpo.session.session.Session.step` calls
itself, then :meth:`StepEnds.settle` once the window is full: a call less where the caches are cold), and the
window's records are built, their losses read and checked, and the callbacks told together as the window closes.
Right after the model's work the caches are cold, and building a record there (reading the loss, the record itself,
its checks and dispatch) cost about as much as all the rest of the Session's step under DDP; built together, all
but the first run warm. The warm-up steps and the first measured one are always handed over as they end
(:meth:`StepEnds.close`).
"""

from __future__ import annotations

from typing import Any

import torch

from dtpo.session.loop.divergence import DivergedError, check_loss
from dtpo.session.loop.timer import StepTimer, read_loss
from dtpo.session.stream_run import StreamRun


class StepEnds:
    """Hands each ended optimizer step to the run: at once, or with its window.

    Args:
        timer: The step timer (its marks, and the steps that wait).
        run: The run whose rank record and step stream get the records.
        rank: This rank's index (for the divergence error).
    """

    def __init__(self, timer: StepTimer, run: StreamRun, rank: int) -> None:
        self.timer = timer
        self.run = run
        self.stream = run.stream  # read at every step's end: one object less to reach
        self.rank = rank

    def close(self, step: int, warmup: bool, end: Any, loss: torch.Tensor | float | None, divisor: int) -> None:
        """Step ``step`` ended at mark ``end``: hand its record over now (the steps that wait first).

        Args:
            step: The step's index.
            warmup: It is a warm-up step.
            end: The mark after its optimizer step (the clock settled).
            loss: The sum of its micro-batches' detached losses (or its loss's value, read on the host), ``None``
                without one.
            divisor: What divides ``loss`` into the step's mean (its micro-batches).

        Raises:
            DivergedError: This step's loss, or a waiting one's, is NaN or infinite.
        """
        timer = self.timer
        if timer.deferred:  # a callback that wants each step came in mid-window
            self.settle()
        value = None if loss is None else (loss if isinstance(loss, float) else read_loss(loss)) / divisor
        record = timer.close(step, warmup, end, value)
        self.run.lifecycle.rank.steps.append(record)
        check_loss(value, step, self.rank)
        self.stream.step_end(record)

    def settle(self) -> None:
        """Build the records of the steps that wait, read their losses, and hand them over in step order.

        Raises:
            DivergedError: A waiting step's loss is NaN or infinite (the steps after it are dropped, as if the run
                had stopped there).
        """
        records, bad = self.timer.close_deferred()
        if not records:
            return
        good = records if bad is None else records[:bad]
        steps = self.run.lifecycle.rank.steps
        steps.extend(good)
        self.stream.step_ends(good, True)  # measured steps only
        if bad is not None:  # in the record, not handed over, and the run stops there
            last = records[bad]
            steps.append(last)
            assert last.loss is not None  # found NaN or infinite
            raise DivergedError(last.step, last.loss, self.rank)
