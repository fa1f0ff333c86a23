"""A step's end: handed over at once where a callback wants each record, with its window otherwise."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from dtpo.core.callbacks import Callback
from dtpo.core.stream import StepStream
from dtpo.session.loop.clock import CpuClock
from dtpo.session.loop.divergence import DivergedError
from dtpo.session.loop.step_ends import StepEnds
from dtpo.session.loop.timer import StepTimer


class Seen(Callback):
    def __init__(self, live: bool) -> None:
        self.live_step_end = live
        self.steps: list[int] = []

    def on_step_end(self, session: Any, step_record: Any) -> None:
        self.steps.append(step_record.step)


def _ends(live: bool, window_steps: int = 3) -> tuple[StepEnds, Seen, list[Any]]:
    seen = Seen(live)
    stream = StepStream(SimpleNamespace(), [seen], window_steps=window_steps)
    steps: list[Any] = []
    run = SimpleNamespace(stream=stream, lifecycle=SimpleNamespace(rank=SimpleNamespace(steps=steps)))
    return StepEnds(StepTimer(CpuClock(), None, True, False), run, 0), seen, steps  # type: ignore[arg-type]


def _marked(ends: StepEnds, step: int) -> None:
    ends.run.stream.step_begin(step)
    timer = ends.timer
    timer.batch_requested(True)
    timer.batch_arrived(4)
    timer.backward_starting()
    timer.backward_finished(True)


def _now(ends: StepEnds, step: int, loss: float) -> None:
    """A step handed over as it ends."""
    _marked(ends, step)
    ends.close(step, False, CpuClock.mark(), torch.tensor(loss), 1)


def _waits(ends: StepEnds, step: int, loss: float) -> None:
    """A step whose record waits (what Session.step leaves with the timer)."""
    _marked(ends, step)
    ends.timer.defer(step, CpuClock.mark(), torch.tensor(loss), 1)


def test_waiting_steps_are_handed_over_in_order_and_fill_their_window() -> None:
    ends, seen, steps = _ends(live=False, window_steps=3)
    _now(ends, 0, 0.5)
    assert seen.steps == [0] and [s.step for s in steps] == [0]
    for step in (1, 2):
        _waits(ends, step, 0.25)
    assert seen.steps == [0] and len(steps) == 1  # nothing handed over yet
    ends.settle()
    assert seen.steps == [0, 1, 2] and [s.loss for s in steps] == [0.5, 0.25, 0.25]
    assert ends.run.stream.windows == 1 and ends.run.stream.open_steps == 0  # the window closed


def test_a_step_handed_over_at_once_brings_the_waiting_ones_first() -> None:
    ends, seen, steps = _ends(live=False, window_steps=10)
    _now(ends, 0, 1.0)
    _waits(ends, 1, 1.0)
    _now(ends, 2, 1.0)  # a callback that wants each step came in mid-window
    assert seen.steps == [0, 1, 2] and [s.step for s in steps] == [0, 1, 2]


def test_a_waiting_step_that_diverged_raises_at_settling_and_drops_the_steps_after_it() -> None:
    ends, _, steps = _ends(live=False, window_steps=100)
    _now(ends, 0, 1.0)
    for step, loss in enumerate([1.0, math.nan, 1.0], start=1):
        _waits(ends, step, loss)
    with pytest.raises(DivergedError, match="step 2"):
        ends.settle()
    assert [s.step for s in steps] == [0, 1, 2]
    ends.settle()  # nothing waits any more


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_waiting_step_that_diverged_mid_window_hands_over_the_steps_before_it(bad: float) -> None:
    ends, seen, steps = _ends(live=False, window_steps=4)
    _now(ends, 0, 1.0)
    for step, loss in ((1, 1.0), (2, 1.0), (3, bad)):
        _waits(ends, step, loss)
    with pytest.raises(DivergedError, match="step 3"):
        ends.settle()  # the window is full: its steps are settled
    assert seen.steps == [0, 1, 2]  # the steps before the bad one reached the callbacks; it did not
    assert [s.step for s in steps] == [0, 1, 2, 3]  # and it is in the record
    assert not math.isfinite(steps[-1].loss)
    assert ends.run.stream.open_steps == 3  # its window did not close
