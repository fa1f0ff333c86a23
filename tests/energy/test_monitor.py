"""Energy windows: nesting and overlapping agree, lost devices are reported, ranks combine."""

from __future__ import annotations

import pytest

from dtpo.devices.base import Device, DeviceError, DeviceInfo
from dtpo.energy.monitor import Monitor, combine


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class ConstantPower(Device):
    """A device drawing constant power on the test's clock."""

    def __init__(self, name: str, watts: float, clock: Clock, estimated: bool = False) -> None:
        self.watts, self.clock, self.fail = watts, clock, False
        self.info = DeviceInfo(name, "gpu", "modelled" if estimated else "nvml-counter", estimated, False)

    def energy_j(self) -> float:
        if self.fail:
            raise DeviceError("counter vanished")
        return self.watts * self.clock.t


def make(clock: Clock, *devices: Device) -> Monitor:
    return Monitor(list(devices), sample_interval_s=None, clock=clock)


def test_adjacent_windows_add_up_to_one_window_over_both() -> None:
    clock = Clock()
    mon = make(clock, ConstantPower("gpu0", 300, clock), ConstantPower("gpu1", 100, clock))
    mon.begin_window("both")
    mon.begin_window("a")
    clock.t = 2.0
    boundary = mon.snapshot()
    a = mon.end_window("a", at=boundary)
    mon.begin_window("b", at=boundary)  # b starts exactly where a ended
    clock.t = 5.0
    b = mon.end_window("b")
    both = mon.end_window("both")
    assert a.total_j + b.total_j == pytest.approx(both.total_j)
    assert both.energy_j == {"gpu0": pytest.approx(1500), "gpu1": pytest.approx(500)}
    assert both.time_s == pytest.approx(5.0) and both.average_power_w == pytest.approx(400)


def test_overlapping_windows_are_independent() -> None:
    clock = Clock()
    mon = make(clock, ConstantPower("gpu0", 100, clock))
    mon.begin_window("x")
    clock.t = 1.0
    mon.begin_window("y")
    clock.t = 3.0
    x = mon.end_window("x")
    clock.t = 4.0
    y = mon.end_window("y")
    assert (x.total_j, y.total_j) == (pytest.approx(300), pytest.approx(300))


def test_window_misuse_is_an_error() -> None:
    mon = make(Clock(), ConstantPower("gpu0", 1, Clock()))
    with pytest.raises(ValueError, match="not open"):
        mon.end_window("nope")
    mon.begin_window("w")
    with pytest.raises(ValueError, match="already open"):
        mon.begin_window("w")


def test_a_failing_device_is_reported_lost_not_zero() -> None:
    clock = Clock()
    good, bad = ConstantPower("gpu0", 100, clock), ConstantPower("gpu1", 100, clock)
    messages: list[str] = []
    mon = Monitor([good, bad], sample_interval_s=None, clock=clock, on_lost=messages.append)
    with mon.window("w") as out:
        clock.t = 1.0
        bad.fail = True
    w = out["measurement"]
    assert w.energy_j == {"gpu0": pytest.approx(100)}
    assert w.lost == ("gpu1",)
    assert messages == ["energy of gpu1 is no longer measured: counter vanished"]


def test_estimated_flag_follows_the_devices() -> None:
    clock = Clock()
    mon = make(clock, ConstantPower("gpu0", 1, clock), ConstantPower("cpu", 1, clock, estimated=True))
    with mon.window("w") as out:
        clock.t = 1
    assert out["measurement"].estimated and out["measurement"].sources["cpu"] == "modelled"


def test_timeline_points_are_mean_power_between_samples() -> None:
    clock = Clock()
    mon = make(clock, ConstantPower("gpu0", 250, clock))
    clock.t = 0.5
    assert mon.sample().power_w == {"gpu0": pytest.approx(250)}
    assert len(mon.timeline) == 1


def test_combine_sums_energy_and_takes_the_longest_time() -> None:
    clock = Clock()
    windows = []
    for watts, seconds in ((100, 2.0), (200, 3.0)):
        clock.t = 0.0
        mon = make(clock, ConstantPower("gpu0", watts, clock))
        mon.begin_window("run")
        clock.t = seconds
        windows.append(mon.end_window("run"))
    both = combine(windows)
    assert both.total_j == pytest.approx(200 + 600) and both.time_s == 3.0
    assert set(both.energy_j) == {"rank0/gpu0", "rank1/gpu0"}


def test_background_sampler_runs_and_stops() -> None:
    import time

    mon = Monitor([ConstantPower("gpu0", 1, Clock())], sample_interval_s=0.01)
    deadline = time.monotonic() + 5
    while not mon.timeline and time.monotonic() < deadline:
        time.sleep(0.01)
    mon.close()
    assert mon.timeline
    count = len(mon.timeline)
    time.sleep(0.05)
    assert len(mon.timeline) == count


def test_a_lost_estimated_device_leaves_the_window_measured() -> None:
    clock = Clock()
    gpu, cpu = ConstantPower("gpu0", 100, clock), ConstantPower("cpu", 10, clock, estimated=True)
    mon = Monitor([gpu, cpu], sample_interval_s=None, clock=clock, on_lost=lambda msg: None)
    with mon.window("w") as out:
        clock.t = 2.0
        cpu.fail = True
    w = out["measurement"]
    assert (w.energy_j, w.sources, w.lost, w.estimated) == ({"gpu0": pytest.approx(200)},
                                                           {"gpu0": "nvml-counter"}, ("cpu",), False)


class Extending(ConstantPower):
    """Counts how it was read: in full, or between the sampler's samples."""

    def __init__(self, clock: Clock) -> None:
        super().__init__("cpu", 10, clock, estimated=True)
        self.full = self.between = 0

    def energy_j(self) -> float:
        self.full += 1
        return super().energy_j()

    def energy_j_between_samples(self) -> float:
        self.between += 1
        return super().energy_j()


def test_a_snapshot_between_samples_lets_devices_extend_only_while_the_sampler_runs() -> None:
    clock = Clock()
    device = Extending(clock)
    quiet = Monitor([device], sample_interval_s=None, clock=clock)  # no sampler: every snapshot reads in full
    quiet.snapshot(between_samples=True)
    assert (device.between, device.full) == (0, 2)
    sampled = Monitor([device], sample_interval_s=3600.0, clock=clock)  # a sampler that will not wake in the test
    try:
        full = device.full
        clock.t = 2.0
        snap = sampled.snapshot(between_samples=True)
        assert device.between == 1 and device.full == full and snap.energy_j == {"cpu": pytest.approx(20)}
        sampled.snapshot()  # what the sampler itself asks: a full read
        assert device.full == full + 1
    finally:
        sampled.close()
