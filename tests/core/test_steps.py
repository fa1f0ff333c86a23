"""Step events: what a producer that knows only a step's ends reports, and a window's figures."""

from __future__ import annotations

import pytest

from dtpo.core.steps import Window, plain_step


@pytest.mark.parametrize("distributed", [False, True])
def test_a_step_known_by_its_ends_counts_as_compute(distributed: bool) -> None:
    record = plain_step(5, False, 32, 1000.0, 0.25, distributed, tokens=4096)
    assert (record.step, record.samples, record.tokens, record.started_at) == (5, 32, 4096, 1000.0)
    assert record.compute_s == record.step_s == 0.25 and record.data_wait_s == record.optimizer_s == 0.0
    unknown = None if distributed else 0.0
    assert record.tail_s == record.comm_exposed_s == record.sync_wait_s == unknown


def test_a_window_says_its_throughput_and_energy_per_sample() -> None:
    window = Window(0, 4, 7, time_s=2.0, samples=64, step_time_s=0.5, energy_j={"gpu0": 100.0, "cpu": 28.0})
    assert window.steps == 4 and window.throughput == 32.0
    assert window.total_j == 128.0 and window.joules_per_sample == 2.0
    assert Window(0, 0, 0, 1.0, 8, 1.0).joules_per_sample is None  # energy not measured
