"""The periodic daemon thread the watches and heartbeats run on."""

from __future__ import annotations

import threading

import pytest

from dtpo.distributed.periodic import Periodic


def test_it_calls_at_once_until_stopped_and_a_failed_call_is_only_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[int] = []
    third = threading.Event()

    def work() -> None:
        calls.append(len(calls))
        if len(calls) == 1:
            raise OSError("cannot look")
        if len(calls) == 3:
            third.set()

    ticking = Periodic("test-periodic", 0.001, work)
    ticking.start()
    assert third.wait(5.0)
    ticking.stop(timeout_s=5.0)
    assert not ticking.running and len(calls) >= 3
    assert "test-periodic: cannot look" in caplog.text


def test_work_that_returns_false_ends_the_thread() -> None:
    calls: list[int] = []
    ticking = Periodic("test-periodic", 0.001, lambda: calls.append(1) or False)
    ticking.start()
    ticking._thread.join(5.0)  # type: ignore[union-attr]
    assert calls == [1] and not ticking.running


def test_waiting_first_and_stopped_at_once_calls_nothing() -> None:
    calls: list[int] = []
    ticking = Periodic("test-periodic", 60.0, lambda: calls.append(1), wait_first=True)
    ticking.start()
    ticking.stop(timeout_s=5.0)
    assert calls == [] and not ticking.running
