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


def _end(ends: StepEnds, step: int, loss: float) -> None:
    ends.run.stream.step_begin(step)
    timer = ends.timer
    timer.batch_requested(True)
    timer.batch_arrived(4)
    timer.backward_starting()
    timer.backward_finished(True)
    ends.close(step, False, CpuClock.mark(), torch.tensor(loss), 1, may_wait=step > 0)


def test_records_wait_for_their_window_unless_a_callback_wants_each() -> None:
    ends, seen, steps = _ends(live=False)
    for step in range(3):
        _end(ends, step, 0.5)
        assert seen.steps == ([0] if step < 2 else [0, 1, 2])  # the first at once, the window's when it fills
    assert [s.loss for s in steps] == [0.5, 0.5, 0.5]
    live, seen_live, _ = _ends(live=True)
    for step in range(2):
        _end(live, step, 0.5)
    assert seen_live.steps == [0, 1]


def test_a_waiting_step_that_diverged_raises_at_settling_and_drops_the_steps_after_it() -> None:
    ends, _, steps = _ends(live=False, window_steps=100)
    for step, loss in enumerate([1.0, 1.0, math.nan, 1.0]):
        _end(ends, step, loss)
    with pytest.raises(DivergedError, match="step 2"):
        ends.settle()
    assert [s.step for s in steps] == [0, 1, 2]
    ends.settle()  # nothing waits any more


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_waiting_step_that_diverged_mid_window_hands_over_the_steps_before_it(bad: float) -> None:
    ends, seen, steps = _ends(live=False, window_steps=4)
    for step in range(3):  # step 0 is handed over at once; steps 1 and 2 wait for the window
        _end(ends, step, 1.0)
    with pytest.raises(DivergedError, match="step 3"):
        _end(ends, 3, bad)  # the window fills: its steps are settled
    assert seen.steps == [0, 1, 2]  # the steps before the bad one reached the callbacks; it did not
    assert [s.step for s in steps] == [0, 1, 2, 3]  # and it is in the record
    assert not math.isfinite(steps[-1].loss)
    assert ends.run.stream.open_steps == 3  # its window did not close
