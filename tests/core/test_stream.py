"""The step stream's driver: windows of measured steps, hooks in list order, whoever produces the steps."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest

from dtpo.core.callbacks import Callback
from dtpo.core.record import RankRecord
from dtpo.core.steps import Window, plain_step
from dtpo.core.stream import StepStream


class Log(Callback):
    def __init__(self, name: str, out: list[tuple[str, str, Any]]) -> None:
        self.name = name
        self.out = out

    def on_step_end(self, session: Any, step_record: Any) -> None:
        self.out.append((self.name, "step", step_record.step))

    def on_window_end(self, session: Any, window: Window) -> None:
        self.out.append((self.name, "window", (window.index, window.first_step, window.last_step, window.samples,
                                               window.time_s, window.step_time_s, dict(window.settings))))


class Broken(Callback):
    def on_rank_end(self, session: Any, rank_record: Any) -> None:
        raise RuntimeError("boom")


class Marks(Callback):
    def on_rank_end(self, session: Any, rank_record: Any) -> None:
        rank_record.error = f"seen by rank {session.rank}"


def steps(n: int, warmup: int) -> list[Any]:
    return [plain_step(i, i < warmup, 10 + i, 1000.0 + i, 0.1 * (i + 1), distributed=False) for i in range(n)]


def test_measured_steps_are_cut_into_windows_after_every_callback_saw_the_step() -> None:
    out: list[tuple[str, str, Any]] = []
    stream = StepStream(SimpleNamespace(rank=0), [Log("a", out), Log("b", out)], window_steps=3,
                        settings=lambda: {"precision": "bf16-mixed"})
    for record in steps(9, warmup=2):
        stream.step_end(record)
    assert stream.window_open  # steps 8 wait for the next window
    stream.close_window()
    stream.close_window()  # nothing open: no empty window
    windows = [args for name, kind, args in out if kind == "window" and name == "a"]
    assert [w[:4] for w in windows] == [(0, 2, 4, 12 + 13 + 14), (1, 5, 7, 15 + 16 + 17), (2, 8, 8, 18)]
    assert windows[0][4] == pytest.approx(0.3 + 0.4 + 0.5) and windows[0][5] == pytest.approx(0.4)  # median
    assert all(w[6] == {"precision": "bf16-mixed"} for w in windows)
    # step 4 ends at "a", then "b", then its window closes at "a", then "b"
    i = out.index(("a", "step", 4))
    assert [(name, kind) for name, kind, _ in out[i:i + 4]] == [("a", "step"), ("b", "step"), ("a", "window"),
                                                                ("b", "window")]


class Windows(Callback):
    """Keeps each window's steps, and may start wanting each step's record after a window."""

    def __init__(self, out: list[Any], listen_after: int | None = None) -> None:
        self.out = out
        self.listen_after = listen_after

    def on_window_end(self, session: Any, window: Window) -> None:
        self.out.append((window.index, window.first_step, window.last_step, window.samples))
        if self.listen_after == window.index:
            session.callbacks.append(Log("late", self.out))


def test_measured_steps_handed_over_together_make_the_windows_one_at_a_time_would() -> None:
    records = steps(12, warmup=0)
    windows: dict[str, list[Any]] = {}
    for how in ("one at a time", "together"):
        out: list[Any] = []
        stream = StepStream(SimpleNamespace(), [Windows(out)], window_steps=4)
        stream.step_end(records[0])  # a window already open when the rest come together
        if how == "together":
            stream.step_ends(records[1:7], True)
            stream.step_ends(records[7:], True)
        else:
            for record in records[1:]:
                stream.step_end(record)
        windows[how] = out
        assert stream.open_steps == 0 and not stream.window_open
    assert windows["together"] == windows["one at a time"] == [(0, 0, 3, 46), (1, 4, 7, 62), (2, 8, 11, 78)]


def test_a_callback_that_wants_each_step_from_a_window_on_gets_each_step_after_it() -> None:
    out: list[Any] = []
    host = SimpleNamespace()
    stream = StepStream(host, [Windows(out, listen_after=0)], window_steps=3)
    host.callbacks = stream.callbacks
    stream.step_ends(steps(7, warmup=0), True)
    assert out == [(0, 0, 2, 33), ("late", "step", 3), ("late", "step", 4), ("late", "step", 5), (1, 3, 5, 42),
                   ("late", "window", (1, 3, 5, 42, pytest.approx(0.4 + 0.5 + 0.6), pytest.approx(0.5), {})),
                   ("late", "step", 6)]


def test_callbacks_added_to_the_list_are_called_from_the_next_hook() -> None:
    out: list[tuple[str, str, Any]] = []
    callbacks: list[Callback] = [Log("a", out)]
    stream = StepStream(SimpleNamespace(), callbacks, window_steps=100)
    first, second = steps(2, warmup=0)
    stream.step_end(first)
    callbacks.append(Log("late", out))
    stream.step_end(second)
    assert [(name, arg) for name, _, arg in out] == [("a", 0), ("a", 1), ("late", 1)]


def test_a_broken_callback_at_the_rank_end_costs_a_warning_not_the_others(caplog: pytest.LogCaptureFixture) -> None:
    stream = StepStream(SimpleNamespace(rank=3), [Broken(), Marks()], window_steps=1)
    rank = RankRecord(3, 0, "node", "cpu")
    with caplog.at_level(logging.WARNING):
        stream.rank_end(rank)
    assert rank.error == "seen by rank 3"
    assert "Broken failed at the end of the run: boom" in caplog.text


class Reader(Log):
    live_step_end = False


def test_the_stream_says_whether_a_callback_wants_each_record_as_its_step_ends() -> None:
    out: list[tuple[str, str, Any]] = []
    callbacks: list[Callback] = [Reader("r", out), Broken()]  # Broken has no on_step_end: it never counts
    stream = StepStream(SimpleNamespace(), callbacks, window_steps=100)
    stream.step_begin(0)
    assert not stream.live_step_end
    callbacks.append(Log("live", out))
    stream.step_begin(1)  # the list changed: looked at again
    assert stream.live_step_end


def test_records_handed_over_in_chunks_call_the_same_hooks_in_the_same_order_as_one_by_one() -> None:
    def run(chunks: list[list[Any]]) -> list[tuple[str, str, Any]]:
        out: list[tuple[str, str, Any]] = []
        stream = StepStream(SimpleNamespace(), [Log("a", out), Log("b", out)], window_steps=3)
        for chunk in chunks:
            stream.step_ends(chunk)
        stream.close_window()
        return out

    records = steps(11, warmup=2)
    one_by_one = run([[record] for record in records])
    # windows close inside chunks and at their ends; one chunk is empty
    chunked = run([records[:1], records[1:6], [], records[6:8], records[8:]])
    assert chunked == one_by_one
    assert [args[:3] for name, kind, args in chunked if kind == "window" and name == "a"] == [
        (0, 2, 4), (1, 5, 7), (2, 8, 10)]


class Once(Callback):
    """Acts on step 1 only, and says so from then on (``True``: not to be called again)."""

    def __init__(self, out: list[tuple[str, int]]) -> None:
        self.out = out

    def on_step_begin(self, session: Any, step: int) -> bool:
        self.out.append(("begin", step))
        return step >= 1

    def on_step_end(self, session: Any, step_record: Any) -> bool:
        self.out.append(("end", step_record.step))
        return step_record.step >= 1


def test_a_per_step_hook_that_returns_true_is_not_called_again_until_the_callbacks_change() -> None:
    out: list[tuple[str, int]] = []
    others: list[tuple[str, str, Any]] = []
    callbacks: list[Callback] = [Once(out), Log("a", others)]
    stream = StepStream(SimpleNamespace(), callbacks, window_steps=100)
    records = steps(6, warmup=0)
    for record in records[:4]:
        stream.step_begin(record.step)
        stream.step_end(record)
    assert out == [("begin", 0), ("end", 0), ("begin", 1), ("end", 1)]
    assert [arg for _, _, arg in others] == [0, 1, 2, 3]  # the other callback still sees every step
    callbacks.append(Log("late", others))  # a changed list: every listener is asked again
    stream.step_begin(4)
    stream.step_ends(records[4:])
    assert out[4:] == [("begin", 4), ("end", 4)]
