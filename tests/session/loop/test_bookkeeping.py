"""The bookkeeping counter: it sums the stretches it is told about on the steps it counts, counts those steps in
proportion whatever their period, and takes its own reads' share off (a fake clock: no timing)."""

from __future__ import annotations

import pytest

from dtpo.session.loop.bookkeeping import SAMPLE_ONE_IN, BookkeepingCounter


class FakeClock:
    """Nanoseconds that move only when told to."""

    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def two_stretch_steps(counter: BookkeepingCounter, clock: FakeClock, steps: int, first_ns: int,
                      second_ns: int) -> None:
    """Steps of two stretches of dtpo code around the user's work (1000 ns), with as much again between steps."""
    for step in range(steps):
        counter.begin_step(step)  # opens the step's first stretch when it is counted
        if counter.counting:
            clock.now += first_ns
            counter.leave()
            clock.now += 1000  # the user's work
            counter.enter()
            clock.now += second_ns
            counter.leave()
            counter.step_done()
        clock.now += 1000


def test_it_sums_the_stretches_of_counted_steps_and_nothing_between_them() -> None:
    clock = FakeClock()
    counter = BookkeepingCounter(clock, sample_one_in=1)
    assert counter.seconds_per_step is None
    two_stretch_steps(counter, clock, 3, first_ns=5, second_ns=7)
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


@pytest.mark.parametrize("sample_one_in", [SAMPLE_ONE_IN, 4])
@pytest.mark.parametrize("period", [2, 3, 4, 10, 16, 50])
def test_one_step_in_n_is_counted_whatever_the_period_of_a_kind_of_step(period: int, sample_one_in: int) -> None:
    counter = BookkeepingCounter(FakeClock(), sample_one_in=sample_one_in)
    share = 1 / sample_one_in
    for phase in range(period):  # e.g. the window ends: every 10th step from some first one
        steps = range(phase, phase + period * 4000, period)
        counted = 0
        calibrating = 0
        for step in steps:
            counter.begin_step(step)
            counted += counter.counting and not counter.calibrating
            calibrating += counter.calibrating
        assert counted / len(steps) == pytest.approx(share, abs=0.1 * share)
        assert calibrating / len(steps) == pytest.approx(share, abs=0.1 * share)  # never a counted one


def test_by_default_one_step_in_sixteen_is_counted() -> None:
    assert BookkeepingCounter(FakeClock()).sample_one_in == SAMPLE_ONE_IN == 16


def test_a_step_neither_counted_nor_calibrating_reads_no_clock() -> None:
    reads = 0

    def clock() -> int:
        nonlocal reads
        reads += 1
        return 0

    counter = BookkeepingCounter(clock)
    counted = calibrating = 0
    for step in range(400):
        before = reads
        counter.begin_step(step)
        counted += counter.counting and not counter.calibrating
        calibrating += counter.calibrating
        assert reads - before == (2 if counter.calibrating else 1 if counter.counting else 0)
    # begin_step opens a stretch on counted steps, times an empty one on calibrating steps, and reads nothing else
    assert 0 < counted < 400 and calibrating == pytest.approx(400 / SAMPLE_ONE_IN, rel=0.1)
    assert reads == counted + 2 * calibrating


class TickingClock(FakeClock):
    """Each read takes ``cost`` nanoseconds, half before the clock is sampled and half after (a system call)."""

    def __init__(self, cost: int) -> None:
        super().__init__()
        self.cost = cost

    def __call__(self) -> int:
        self.now += self.cost // 2
        sampled = self.now
        self.now += self.cost // 2
        return sampled


def test_the_counters_own_reads_are_timed_in_place_and_taken_off_each_stretch() -> None:
    clock = TickingClock(cost=40)
    counter = BookkeepingCounter(clock)
    two_stretch_steps(counter, clock, 4000, first_ns=100, second_ns=200)  # the Session's code: 300 ns a step
    assert counter.empty_stretch_ns == 40  # half of each of the two reads falls inside a stretch
    assert counter.raw_seconds_per_step == pytest.approx((300 + 2 * 40) / 1e9)
    assert counter.bias_seconds_per_step == pytest.approx(2 * 40 / 1e9)
    assert counter.seconds_per_step == pytest.approx(300 / 1e9)  # the Session's code alone


def test_counting_every_step_leaves_none_to_calibrate_on_and_takes_nothing_off() -> None:
    clock = TickingClock(cost=40)
    counter = BookkeepingCounter(clock, sample_one_in=1)
    for step in range(10):
        counter.begin_step(step)
        clock.now += 100
        counter.leave()
        counter.step_done()
    assert counter.empty_stretch_ns == 0 and counter.bias_seconds_per_step == 0
    assert counter.seconds_per_step == counter.raw_seconds_per_step == pytest.approx(140e-9)


def test_a_sample_rate_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="sample_one_in"):
        BookkeepingCounter(FakeClock(), sample_one_in=0)


class ColdAfterIdleClock(FakeClock):
    """A read costs more the longer since the last one (a colder kernel), half before the clock is sampled and half
    after."""

    def __init__(self) -> None:
        super().__init__()
        self.last = 0

    def __call__(self) -> int:
        idle = self.now - self.last
        cost = 120 if idle >= 2000 else 80 if idle >= 500 else 40
        self.now += cost // 2
        sampled = self.now
        self.now += cost // 2
        self.last = self.now
        return sampled


def test_each_place_in_a_step_takes_off_its_own_calibration() -> None:
    clock = ColdAfterIdleClock()
    counter = BookkeepingCounter(clock)
    for step in range(4000):  # a stretch after 3000 ns between steps, the user's work (1000 ns), another stretch
        counter.begin_step(step)
        if counter.counting:
            clock.now += 100
            counter.leave()
            clock.now += 1000
            counter.enter()
            clock.now += 200
            counter.leave()
            counter.step_done()
        clock.now += 3000
    # the first read of each stretch returns from a cold kernel (after 3000 ns between steps: 60 of its 120 inside;
    # after the user's 1000 ns: 40 of 80), the second from a warm one (20 of 40)
    assert counter.empty_stretch_at(0) == 60 + 20 and counter.empty_stretch_at(1) == 40 + 20
    # (step 0, counted, had no read before it: warm)
    assert counter.raw_seconds_per_step == pytest.approx((300 + 80 + 60) / 1e9, rel=1e-3)
    assert counter.seconds_per_step == pytest.approx(300 / 1e9, rel=1e-3)  # one figure for both would be 20 ns off
    assert counter.empty_stretch_ns == 70
