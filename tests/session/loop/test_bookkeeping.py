"""The bookkeeping counter: it sums the stretches it is told about on the steps it counts, and counts those steps
in proportion whatever their period (a fake clock: no timing)."""

from __future__ import annotations

import pytest

from dtpo.session.loop.bookkeeping import SAMPLE_ONE_IN, BookkeepingCounter


class FakeClock:
    """Nanoseconds that move only when told to."""

    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def test_it_sums_the_stretches_of_counted_steps_and_nothing_between_them() -> None:
    clock = FakeClock()
    counter = BookkeepingCounter(clock, sample_one_in=1)
    assert counter.seconds_per_step is None
    for step in range(3):
        counter.begin_step(step)  # opens the step's first stretch
        clock.now += 5
        counter.leave()
        clock.now += 1000  # the user's work
        counter.enter()
        clock.now += 7
        counter.leave()
        counter.step_done()
        clock.now += 1000
    assert (counter.total_ns, counter.steps) == (3 * 12, 3)
    assert counter.seconds_per_step == pytest.approx(12e-9)


def test_warm_up_steps_are_never_counted() -> None:
    clock = FakeClock()
    counter = BookkeepingCounter(clock, sample_one_in=1)
    counter.begin_step(0, warmup=True)
    assert not counter.counting  # the Session then reads no clock on this step
    counter.begin_step(1)
    clock.now += 3
    counter.leave()
    counter.step_done()
    assert (counter.total_ns, counter.steps) == (3, 1)


@pytest.mark.parametrize("period", [2, 3, 4, 10, 50])
def test_one_step_in_four_is_counted_whatever_the_period_of_a_kind_of_step(period: int) -> None:
    counter = BookkeepingCounter(FakeClock())
    assert counter.sample_one_in == SAMPLE_ONE_IN == 4
    for phase in range(period):  # e.g. the window ends: every 10th step from some first one
        steps = range(phase, phase + period * 4000, period)
        counted = 0
        for step in steps:
            counter.begin_step(step)
            counted += counter.counting
        assert counted / len(steps) == pytest.approx(0.25, abs=0.02)


def test_a_step_not_counted_reads_no_clock() -> None:
    reads = 0

    def clock() -> int:
        nonlocal reads
        reads += 1
        return 0

    counter = BookkeepingCounter(clock)
    counted = 0
    for step in range(400):
        counter.begin_step(step)
        counted += counter.counting
    assert 0 < counted < 400 and reads == counted  # begin_step opens a stretch on counted steps only


def test_a_sample_rate_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="sample_one_in"):
        BookkeepingCounter(FakeClock(), sample_one_in=0)
