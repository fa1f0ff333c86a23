"""The step timer's record: its parts from the marks, and the same on a host clock as through the clock's own
``seconds``."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch

from dtpo.session.loop import timer as timer_module
from dtpo.session.loop.clock import CpuClock
from dtpo.session.loop.timer import StepTimer


class Marks:
    """A host clock whose marks the test sets: each mark is the next value of a list."""

    def __init__(self, marks: list[float]) -> None:
        self._marks = iter(marks)

    def mark(self) -> float:
        return next(self._marks)

    def seconds(self, start: Any, end: Any) -> float:
        return end - start

    def settle(self) -> None:
        pass


def _one_step(timer: StepTimer) -> Any:
    timer.batch_requested(True)  # 0.0
    timer.batch_arrived(8)  # 0.5
    timer.backward_starting()
    timer.backward_finished(True)  # 2.0
    return timer.close(3, False, 2.75, 1.5)


def test_close_gives_the_steps_record() -> None:
    record = _one_step(StepTimer(Marks([0.0, 0.5, 2.0]), None, tail_measured=True, distributed=False))
    assert (record.step, record.warmup, record.samples, record.loss) == (3, False, 8, 1.5)
    assert record.step_s == pytest.approx(2.75) and record.data_wait_s == pytest.approx(0.5)
    assert record.compute_s == pytest.approx(1.5) and record.optimizer_s == pytest.approx(0.75)
    assert record.tail_s == 0.0 and record.comm_exposed_s == 0.0 and record.sync_wait_s == 0.0
    assert record.tokens is None and record.started_at is not None


def test_a_host_steps_wall_start_comes_from_its_mark() -> None:
    timer = StepTimer(CpuClock(), None, tail_measured=True, distributed=False)
    before = time.time()
    timer.batch_requested(True)
    after = time.time()
    assert timer.started_at is None  # no wall clock read as the step begins: it is derived as the record is built
    timer.batch_arrived(1)
    timer.backward_starting()
    timer.backward_finished(True)
    record = timer.close(0, False, time.perf_counter(), None)
    assert record.started_at is not None
    assert before - 0.01 <= record.started_at <= after + 0.01  # the two clocks' offset, taken a moment later


def test_host_clock_and_generic_clock_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    marks = [10.0, 10.25, 11.0]
    host = CpuClock()
    values = iter(marks)
    monkeypatch.setattr(host, "mark", lambda: next(values))
    on_host = _one_step(StepTimer(host, None, tail_measured=False, distributed=True))
    generic = _one_step(StepTimer(Marks(marks), None, tail_measured=False, distributed=True))
    assert {k: v for k, v in vars(on_host).items() if k != "started_at"} == \
        {k: v for k, v in vars(generic).items() if k != "started_at"}
    assert on_host.tail_s is None and on_host.comm_exposed_s is None  # several ranks, no bucket timing


def _two_micro_batches(timer: StepTimer) -> Any:
    timer.batch_requested(True)  # 0.0
    timer.batch_arrived(4)  # 0.5
    timer.backward_starting()
    timer.backward_finished(False)  # 1.0
    timer.batch_requested(False)  # 1.25
    timer.batch_arrived(4)  # 1.5
    timer.backward_starting()
    timer.backward_finished(True)  # 2.5
    return timer.close(0, False, 3.0, None)


def test_a_host_timer_sums_each_part_as_a_device_timer_reads_its_marks(monkeypatch: pytest.MonkeyPatch) -> None:
    host = CpuClock()
    values = iter([0.0, 0.5, 1.0, 1.25, 1.5, 2.5])
    monkeypatch.setattr(host, "mark", lambda: next(values))
    on_host = StepTimer(host, None, tail_measured=True, distributed=False)
    summed = _two_micro_batches(on_host)
    assert on_host.data_marks == [] and on_host.compute_marks == []  # no pair kept on the host
    paired = _two_micro_batches(StepTimer(Marks([0.0, 0.5, 1.0, 1.25, 1.5, 2.5]), None, tail_measured=True,
                                          distributed=False))
    for record in (summed, paired):
        assert (record.samples, record.step_s, record.data_wait_s) == (8, 3.0, 0.75)
        assert (record.compute_s, record.tail_s, record.optimizer_s) == (1.5, 0.0, 0.5)


def test_close_resets_for_the_next_step() -> None:
    timer = StepTimer(Marks([0.0, 0.5, 2.0, 3.0, 3.5, 4.0]), None, tail_measured=True, distributed=False)
    _one_step(timer)
    assert timer.step_start is None and timer.batch_ready is None and not timer.backward_done
    assert timer.data_marks == [] and timer.compute_marks == [] and timer.samples == 0
    second = timer_module.StepTimer.close  # the same timer serves the next step
    timer.batch_requested(True)
    timer.batch_arrived(4)
    timer.backward_starting()
    timer.backward_finished(True)
    record = second(timer, 4, False, 4.5, None)
    assert record.samples == 4 and record.step_s == pytest.approx(1.5)


def _marked(timer: StepTimer, samples: int) -> None:
    timer.batch_requested(True)
    timer.batch_arrived(samples)
    timer.backward_starting()
    timer.backward_finished(True)


def _clock(marks: list[float], on_host: bool) -> Any:
    """A clock giving ``marks``: the host's (whose timer sums each part as it ends) or a generic one (whose timer
    keeps the pairs of marks, as on a device)."""
    if not on_host:
        return Marks(marks)
    clock = CpuClock()
    values = iter(marks)
    clock.mark = lambda: next(values)  # type: ignore[method-assign]
    return clock


@pytest.mark.parametrize("on_host", [True, False])
def test_deferred_steps_give_the_records_close_would_have_given(on_host: bool) -> None:
    marks = [0.0, 0.5, 2.0, 3.0, 3.25, 4.0]
    now = StepTimer(_clock(marks, on_host), None, tail_measured=True, distributed=False)
    later = StepTimer(_clock(marks, on_host), None, tail_measured=True, distributed=False)
    _marked(now, 8)
    first = now.close(3, False, 2.75, 1.5)
    _marked(now, 4)
    second = now.close(4, False, 4.5, 0.25)
    _marked(later, 8)
    later.defer(3, 2.75, torch.tensor(3.0), 2)  # the sum of two micro-batches' losses
    _marked(later, 4)
    later.defer(4, 4.5, torch.tensor(0.25), 1)
    assert later.step_start is None and later.samples == 0 and len(later.deferred) == 2
    records, diverged = later.close_deferred()
    assert diverged is None
    strip = lambda r: {k: v for k, v in vars(r).items() if k != "started_at"}  # noqa: E731
    assert [strip(r) for r in records] == [strip(first), strip(second)]
    assert [r.loss for r in records] == [1.5, 0.25]
    assert later.deferred == [] and later.close_deferred() == ([], None)


def test_read_losses_reads_float32_as_it_is_and_other_dtypes_through_float32() -> None:
    values = timer_module.read_losses([torch.tensor(1.5), None, torch.tensor(0.1, dtype=torch.bfloat16),
                                       torch.tensor(2.0, dtype=torch.float64)])
    assert values == [1.5, None, float(torch.tensor(0.1, dtype=torch.bfloat16).float()), 2.0]
    assert timer_module.read_losses([None, None]) == [None, None]


def test_read_loss_gives_a_float_as_item_does_whatever_the_losss_shape() -> None:
    weight = torch.tensor([0.3, -1.7], requires_grad=True)
    loss = (weight * torch.tensor([1.1, 2.3])).sum()  # 0-dim, with a graph
    loss.backward()
    for tensor in (loss, loss.reshape(1), torch.tensor([[0.7]]), torch.tensor(1e-8)):
        value = timer_module.read_loss(tensor)
        assert type(value) is float and value == tensor.item()
    assert timer_module.read_loss(torch.tensor([0.1], dtype=torch.bfloat16)) == float(
        torch.tensor(0.1, dtype=torch.bfloat16).float())


def test_read_losses_keeps_values_read_already_in_their_places() -> None:
    """On the host a step's loss is read as backward returns; with accumulation it stays a tensor."""
    assert timer_module.read_losses([0.25, torch.tensor(1.5), None, 3.0]) == [0.25, 1.5, None, 3.0]
    assert timer_module.read_losses([0.25, None]) == [0.25, None]


@pytest.mark.parametrize("on_host", [True, False])
@pytest.mark.parametrize(("losses", "first_bad"), [
    ([1.0, float("nan"), float("inf")], 1),
    ([1.0, 2.0, float("-inf")], 2),
    ([1e308, 1e308, 1.0], None),  # finite losses whose sum overflows: none diverged
    ([1.0, None, 3.0], None),
])
def test_close_deferred_finds_the_first_loss_that_is_not_finite(on_host: bool, losses: list[float | None],
                                                                  first_bad: int | None) -> None:
    timer = StepTimer(_clock([0.0, 0.5, 2.0, 3.0] * len(losses), on_host), None, tail_measured=True,
                      distributed=False)
    for step, loss in enumerate(losses):
        _marked(timer, 4)
        timer.defer(step, 4.0, loss, 1)  # values read already (a tensor's would be float32's: 1e308 is inf there)
    records, diverged = timer.close_deferred()
    assert diverged == first_bad
    assert [r.step for r in records] == list(range(len(losses)))


def test_a_step_closed_at_once_leaves_the_deferred_steps_waiting() -> None:
    timer = StepTimer(_clock([0.0, 0.5, 2.0, 3.0] * 2, True), None, tail_measured=True, distributed=False)
    _marked(timer, 4)
    timer.defer(0, 4.0, 1.0, 1)
    _marked(timer, 4)
    record = timer.close(1, True, 4.0, 2.0)
    assert record.step == 1 and record.warmup and record.loss == 2.0
    records, _ = timer.close_deferred()
    assert [(r.step, r.warmup, r.loss) for r in records] == [(0, False, 1.0)]
