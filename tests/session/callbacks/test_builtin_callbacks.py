"""The partial-record flushes: as often as asked while the record is short, paced once it is long."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from dtpo.core.steps import Window
from dtpo.session.callbacks import builtin
from dtpo.session.callbacks.builtin import FlushCallback


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _host(clock: Clock, flush_cost_s: float, flushes: list[float]) -> Any:
    """A producer whose partial flush takes ``flush_cost_s`` of the clock."""
    steps: list[int] = []

    def flush(status: str = "running") -> None:
        flushes.append(clock.now)
        clock.now += flush_cost_s

    return SimpleNamespace(lifecycle=SimpleNamespace(flush=flush, rank=SimpleNamespace(steps=steps)), start_step=0)


def _windows(callback: FlushCallback, host: Any, clock: Clock, count: int, step_s: float) -> None:
    for index in range(count):
        host.lifecycle.rank.steps.append(index)
        clock.now += step_s
        callback.on_window_end(host, Window(index, index, index, step_s, 1, step_s))


def test_a_short_record_flushes_as_often_as_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(builtin.time, "monotonic", clock)
    flushes: list[float] = []
    host = _host(clock, 0.05, flushes)
    _windows(FlushCallback(every=1, warmup_steps=0, budget=0.01, paced_from=100), host, clock, 20, 0.01)
    assert len(flushes) == 20


def test_a_long_record_flushes_within_its_time_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(builtin.time, "monotonic", clock)
    flushes: list[float] = []
    host = _host(clock, 0.05, flushes)
    callback = FlushCallback(every=1, warmup_steps=0, budget=0.01, paced_from=5)
    _windows(callback, host, clock, 400, 0.1)
    assert len(flushes) < 400
    gaps = [b - a for a, b in zip(flushes[5:], flushes[6:], strict=False)]
    assert gaps and min(gaps) >= 0.05 / 0.01  # a 50 ms flush, then at least 5 s without one
    assert sum(0.05 for _ in flushes[5:]) <= 0.011 * (clock.now - flushes[5]) + 0.05
