"""A rank's heartbeat file: what it says about the rank's progress, written by a thread, read by the launcher."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dtpo.distributed.heartbeat import Beat, HeartbeatWriter, beat_path, read_beats


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_beat_carries_the_last_step_event_and_the_median_step_time(tmp_path: Path) -> None:
    clock = FakeClock()
    writer = HeartbeatWriter(tmp_path, rank=3, local_rank=1, attempt=2, clock=clock)
    writer.beat()
    [first] = read_beats(tmp_path)
    assert first.rank == 3 and first.local_rank == 1 and first.attempt == 2
    assert first.step is None and first.median_step_s is None and not first.finished

    for step, seconds in enumerate([0.1, 0.3, 0.2]):
        clock.now += 1
        writer.step_begun(step)
        writer.step_ended(step, seconds)
    clock.now += 1
    writer.step_begun(3)
    clock.now += 5
    writer.beat()
    [beat] = read_beats(tmp_path)
    assert beat.step == 3 and beat.in_step
    assert beat.progress_at == 104.0 and beat.beat_at == 109.0
    assert beat.median_step_s == 0.2


def test_the_median_is_taken_over_the_recent_steps_only(tmp_path: Path) -> None:
    writer = HeartbeatWriter(tmp_path, rank=0, local_rank=0, attempt=0)
    for step in range(32):
        writer.step_ended(step, 10.0)  # a slow start ...
    for step in range(32, 64):
        writer.step_ended(step, 0.5)  # ... forgotten once the ring went round
    assert writer.current().median_step_s == 0.5


def test_a_rank_that_stopped_training_says_so_in_its_last_beat(tmp_path: Path) -> None:
    writer = HeartbeatWriter(tmp_path, rank=0, local_rank=0, attempt=0, interval_s=0.01)
    writer.start()
    writer.step_begun(0)
    writer.stop()
    [beat] = read_beats(tmp_path)
    assert beat.finished and beat.step == 0
    assert not writer._beating.running


def test_position_orders_ranks_by_how_far_they_got() -> None:
    def at(step: int | None, in_step: bool) -> Beat:
        return Beat(rank=0, local_rank=0, node="n", pid=1, attempt=0, step=step, in_step=in_step,
                    progress_at=0.0, beat_at=0.0, median_step_s=None)

    assert at(None, False).position < at(0, True).position < at(0, False).position < at(1, True).position


def test_half_written_or_foreign_files_are_skipped(tmp_path: Path) -> None:
    HeartbeatWriter(tmp_path, rank=1, local_rank=1, attempt=0).beat()
    beat_path(tmp_path, 0).write_text('{"rank": 0, "local_')
    beat_path(tmp_path, 2).write_text(json.dumps({"rank": 2}))
    assert [beat.rank for beat in read_beats(tmp_path)] == [1]


def test_a_missing_directory_costs_the_beat_not_the_run(tmp_path: Path) -> None:
    HeartbeatWriter(tmp_path / "gone", rank=0, local_rank=0, attempt=0).beat()  # no exception
    assert read_beats(tmp_path / "gone") == []


def test_a_pause_is_in_the_beat_and_progress_counts_again_from_its_end(tmp_path: Path) -> None:
    now = [10.0]
    writer = HeartbeatWriter(tmp_path, rank=0, local_rank=0, attempt=0, clock=lambda: now[0])
    writer.step_ended(4, 0.1)
    writer.pause()
    [beat] = read_beats(tmp_path)
    assert beat.paused and beat.progress_at == 10.0
    now[0] = 500.0
    writer.resume()
    [beat] = read_beats(tmp_path)
    assert not beat.paused and beat.progress_at == 500.0 and beat.step == 4


def test_a_step_time_handed_over_late_counts_for_the_median_but_not_as_progress(tmp_path: Path) -> None:
    from dtpo.core.record import StepRecord
    from dtpo.session.callbacks.heartbeat import HeartbeatCallback

    clock = FakeClock()
    writer = HeartbeatWriter(tmp_path, rank=0, local_rank=0, attempt=0, clock=clock)
    callback = HeartbeatCallback(writer)
    callback.on_step_begin(None, 5)
    clock.now += 1
    callback.on_step_end(None, StepRecord(4, False, 8, 0.5, 0.0, 0.4, 0.0, 0.1))  # an earlier step's record
    assert (writer.step, writer.in_step, writer.progress_at) == (5, True, 100.0)
    callback.on_step_end(None, StepRecord(5, False, 8, 0.25, 0.0, 0.2, 0.0, 0.05))  # the step in hand
    assert (writer.step, writer.in_step, writer.progress_at) == (5, False, 101.0)
    writer.beat()
    [beat] = read_beats(tmp_path)
    assert beat.median_step_s == pytest.approx(0.375)
