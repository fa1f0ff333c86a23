"""The modelled CPU is monotonic, follows load, and is always marked estimated."""

from __future__ import annotations

import pytest

from dtpo.devices.base import DeviceError
from dtpo.devices.modelled_cpu import DEFAULT_W_PER_CPU, IDLE_SHARE, ModelledCpu, ModelledDram, watts_per_cpu


class FakeHost:
    """A /proc/stat and a clock that the test drives."""

    def __init__(self) -> None:
        self.busy, self.total, self.t = 0, 0, 0.0

    def run(self, seconds: float, utilisation: float, cpus: int = 4) -> None:
        jiffies = int(seconds * 100 * cpus)
        self.total += jiffies
        self.busy += int(jiffies * utilisation)
        self.t += seconds

    def times(self) -> tuple[int, int]:
        return self.busy, self.total


def make_cpu(host: FakeHost, **kwargs) -> ModelledCpu:
    return ModelledCpu(n_cpus=4, read_times=host.times, clock=lambda: host.t, model="Test CPU", **kwargs)


def test_energy_is_monotonic_and_follows_load() -> None:
    host = FakeHost()
    cpu = make_cpu(host, cpu_tdp_w=100.0)
    host.run(10, 0.0)
    idle = cpu.energy_j()
    host.run(10, 1.0)
    busy = cpu.energy_j() - idle
    assert idle == pytest.approx(100 * IDLE_SHARE * 10)
    assert busy == pytest.approx(100 * 10)
    readings = []
    for u in (0.2, 0.9, 0.0, 0.5):
        host.run(1, u)
        readings.append(cpu.energy_j())
    assert readings == sorted(readings)
    assert cpu.power_w() == pytest.approx(100 * (IDLE_SHARE + (1 - IDLE_SHARE) * 0.5))


def test_always_estimated_and_says_where_the_tdp_came_from() -> None:
    host = FakeHost()
    for kwargs in ({}, {"cpu_tdp_w": 50.0}):
        cpu = make_cpu(host, **kwargs)
        assert cpu.info.estimated and cpu.info.source == "modelled" and cpu.info.node_shared
    assert "not in table" in make_cpu(host).tdp_source
    assert make_cpu(host).w_per_cpu == DEFAULT_W_PER_CPU
    assert "--cpu-tdp 50 W" in make_cpu(host, cpu_tdp_w=50.0).tdp_source
    w, source = watts_per_cpu("AMD EPYC 7763 64-Core Processor")
    assert w == pytest.approx(280 / 128) and source.startswith("table")


def test_bad_tdp_is_a_clear_error() -> None:
    with pytest.raises(DeviceError, match="--cpu-tdp must be positive"):
        make_cpu(FakeHost(), cpu_tdp_w=-5)


def test_dram_is_constant_power_and_estimated() -> None:
    t = [0.0]
    dram = ModelledDram(mem_bytes=16 * 2**30, clock=lambda: t[0])
    t[0] = 10.0
    assert dram.energy_j() == pytest.approx(16 * 0.375 * 10)
    assert dram.info.estimated and dram.info.kind == "dram"


def reading_cpu(host: FakeHost, min_read_interval_s: float) -> tuple[ModelledCpu, list[float]]:
    """A 100 W modelled CPU on ``host``, and the times at which it read the CPU times."""
    reads: list[float] = []

    def times() -> tuple[int, int]:
        reads.append(host.t)
        return host.times()

    return ModelledCpu(n_cpus=4, read_times=times, clock=lambda: host.t, model="Test CPU", cpu_tdp_w=100.0,
                       min_read_interval_s=min_read_interval_s), reads


def test_reads_within_a_clock_tick_reuse_the_last_power_and_the_next_read_catches_up() -> None:
    host = FakeHost()
    cpu, reads = reading_cpu(host, min_read_interval_s=0.01)
    host.run(1, 0.0)
    idle = cpu.energy_j()  # a read: the power of an idle second
    assert idle == pytest.approx(100 * IDLE_SHARE)
    opened = len(reads)
    host.t += 0.004  # within one tick of that read: no read, the energy grows at the idle power
    within = cpu.energy_j()
    assert len(reads) == opened and within == pytest.approx(idle + 100 * IDLE_SHARE * 0.004)
    host.run(1, 1.0)  # a busy second: read again, its load applied to the time not yet counted
    busy = cpu.energy_j()
    assert len(reads) == opened + 1 and busy > within
    assert busy == pytest.approx(within + 100 * (IDLE_SHARE + (1 - IDLE_SHARE) * 1.0) * 1.0, rel=0.01)


def test_a_zero_interval_reads_every_time() -> None:
    host = FakeHost()
    calls = []
    cpu = ModelledCpu(n_cpus=4, read_times=lambda: calls.append(1) or host.times(), clock=lambda: host.t,
                      model="Test CPU", min_read_interval_s=0.0)
    for _ in range(3):
        host.t += 0.001
        cpu.energy_j()
    assert len(calls) == 4  # the reading at construction, then every call


def test_between_samples_a_read_extends_the_last_power_and_the_samplers_next_read_catches_up() -> None:
    host = FakeHost()
    cpu, reads = reading_cpu(host, min_read_interval_s=0.0)
    host.t += 0.05
    first = cpu.energy_j_between_samples()  # no power known yet: the CPU times are read
    assert len(reads) == 2
    host.run(1, 0.0)
    sampled = cpu.energy_j()  # the sampler's read: an idle second
    host.run(1, 1.0)  # a busy second, then a window's end between two samples: the idle power, no read
    between = cpu.energy_j_between_samples()
    assert len(reads) == 3
    assert between == pytest.approx(sampled + 100 * IDLE_SHARE * 1.0)
    host.run(1, 1.0)
    caught_up = cpu.energy_j()  # the next sample reads: two busy seconds, one of them left to count
    assert len(reads) == 4
    assert caught_up == pytest.approx(between + 100 * 1.0, rel=0.01)
    assert first <= sampled <= between <= caught_up
