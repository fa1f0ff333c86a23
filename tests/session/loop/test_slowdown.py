"""The labelled wait that stands for a virtual GPU's slowdown inside a CPU step's compute."""

from __future__ import annotations

import pytest

from dtpo.session.loop.slowdown import COMPUTE_PER_FORWARD, ComputeSlowdown


def test_it_waits_the_slowdown_of_the_steps_compute() -> None:
    slept: list[float] = []
    slowdown = ComputeSlowdown(lambda: 1.5, sleep=slept.append, clock=lambda: 10.02)
    assert slowdown.wait(10.0) == pytest.approx(0.5 * COMPUTE_PER_FORWARD * 0.02)
    assert slept == [pytest.approx(0.03)] and slowdown.added_s == pytest.approx(0.03)


@pytest.mark.parametrize("factor", [None, 1.0, 0.9])
def test_no_slowdown_no_wait(factor: float | None) -> None:
    slept: list[float] = []
    slowdown = ComputeSlowdown(lambda: factor, sleep=slept.append, clock=lambda: 10.02)
    assert slowdown.wait(10.0) == 0.0 and slept == [] and slowdown.added_s == 0.0
