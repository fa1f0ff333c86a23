"""``FrameworkSteps``: a step per call, and the device waited for only where a window of steps closes."""

from __future__ import annotations

from pathlib import Path

import pytest

from dtpo.core.config import RunConfig
from dtpo.core.record import RunRecord
from dtpo.frameworks.steps import FrameworkSteps


@pytest.fixture(autouse=True)
def _alone(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "DTPO_CONFIG", "DTPO_LAUNCHED"):
        monkeypatch.delenv(name, raising=False)


def _run(tmp_path: Path, steps: int, total: int | None, **options: object) -> tuple[list[int], FrameworkSteps]:
    waited: list[int] = []
    tracker = FrameworkSteps(lambda result: waited.append(result), "jax", total_steps=total, warmup_steps=2,
                             window_steps=5, run_dir=tmp_path / "run", progress=False, summary=False, energy=False,
                             **options)
    for step in range(steps):
        tracker.step(8, result=step)
    tracker.finish()
    return waited, tracker


def test_the_device_is_waited_for_at_the_end_of_warm_up_and_of_each_window(tmp_path: Path) -> None:
    waited, tracker = _run(tmp_path, 17, None)
    # steps 0-1 warm up (wait at 1), windows of 5 close at steps 6, 11, 16, each waiting for the step before (the
    # device goes on with the last one queued); finish waits for the last result
    assert waited == [0, 5, 10, 15, 16]
    record = RunRecord.load(tmp_path / "run")
    (rank,) = record.ranks
    assert len(rank.steps) == 17 and sum(s.samples for s in rank.steps) == 17 * 8
    assert record.config["user"] == {"framework": "jax"}
    assert tracker.step_count == 17 and tracker.finished


def test_the_last_step_of_a_known_total_is_waited_for_before_it_ends(tmp_path: Path) -> None:
    waited, _ = _run(tmp_path, 9, 9)
    assert waited == [0, 5, 8, 8]  # the last step of a known total waits for itself: the run's end is exact


def test_a_result_gone_before_its_wait_falls_back_to_the_last_one(tmp_path: Path) -> None:
    """A buffer the next step consumed (JAX's donated arguments) cannot be waited for: the last result is."""
    waited: list[int] = []

    def wait(result: int) -> None:
        if result % 2:
            raise RuntimeError("Array has been deleted")
        waited.append(result)

    tracker = FrameworkSteps(wait, "jax", warmup_steps=2, window_steps=5, run_dir=tmp_path / "run", progress=False,
                             summary=False, energy=False)
    for step in range(8):
        tracker.step(8, result=step)
    assert waited == [0, 6]  # step 1 ends the warm-up: 0 is waited for; step 6 closes a window: 5 is gone, so 6
    tracker.finish()


def test_a_launch_configuration_is_the_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = RunConfig().replace(session={"window_steps": 3, "warmup_steps": 1}, energy={"enabled": False})
    monkeypatch.setenv("DTPO_CONFIG", str(config.save(tmp_path / "config.json")))
    waited: list[int] = []
    tracker = FrameworkSteps(waited.append, "tensorflow", run_dir=tmp_path / "run", progress=False, summary=False)
    for step in range(7):
        tracker.step(4, result=step)
    tracker.finish()
    assert waited == [0, 2, 5, 6]


def test_nothing_to_wait_for_and_a_failed_run_does_not_wait(tmp_path: Path) -> None:
    waited: list[int] = []
    tracker = FrameworkSteps(waited.append, "jax", run_dir=tmp_path / "run", progress=False, summary=False,
                             energy=False)
    tracker.step(2)
    tracker.step(2, result=1)
    tracker.finish(RuntimeError("boom"))
    assert waited == [1]  # the first step had nothing to wait for; a failed run does not wait for its last one
    assert tracker.finish() is None


def test_without_lag_each_window_waits_for_the_last_step_queued(tmp_path: Path) -> None:
    """Where the next step consumes a step's result (Keras on JAX donates its state), the wait is for the step just
    queued, never for one already consumed."""
    waited: list[int] = []
    tracker = FrameworkSteps(waited.append, "keras/jax", warmup_steps=2, window_steps=5, run_dir=tmp_path / "run",
                             progress=False, summary=False, energy=False, lag=False)
    for step in range(12):
        tracker.step(8, result=step)
    tracker.finish()
    assert waited == [1, 6, 11, 11]
