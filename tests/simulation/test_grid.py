"""A simulated job scheduled against a grid signal: the measured settings, every policy by the deadline, and the
refusals."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from dtpo.core.errors import ConfigError
from dtpo.energy.grid_signal import synthetic_diurnal
from dtpo.simulation.grid import default_setting, measure_settings, run_grid_job
from dtpo.simulation.job import JobConfig


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list:
    monkeypatch.setenv("DTPO_STATE_DIR", str(tmp_path / "state"))
    return measure_settings(JobConfig(gpu="A40", workload="resnet50", gpus=2, steps=100))


def test_the_sweep_gives_a_setting_per_limit_the_default_fastest(settings: list) -> None:
    assert len(settings) >= 5
    default = settings[default_setting(settings)]
    assert default.time_per_sample_s == min(s.time_per_sample_s for s in settings)
    assert min(s.energy_per_sample_j for s in settings) < default.energy_per_sample_j


def test_every_policy_meets_the_deadline_and_throttle_saves(settings: list) -> None:
    signal = synthetic_diurnal(datetime(2024, 1, 1, tzinfo=UTC), 3, seed=0)
    run = run_grid_job(settings, signal, job_hours=12, deadline_hours=18, start=signal.start + timedelta(hours=6))
    assert set(run.outcomes) == {"blind", "throttle", "pause", "oracle-throttle", "oracle-pause", "oracle"}
    assert all(outcome.finished for outcome in run.outcomes.values())
    assert run.saving("throttle") > 0.05 and run.saving("oracle") >= run.saving("throttle") - 0.01


def test_bad_jobs_are_refused_in_one_line(settings: list) -> None:
    signal = synthetic_diurnal(datetime(2024, 1, 1, tzinfo=UTC), 1)
    with pytest.raises(ConfigError, match="already impossible"):
        run_grid_job(settings, signal, job_hours=10, deadline_hours=8)
    with pytest.raises(ConfigError, match="covers"):
        run_grid_job(settings, signal, job_hours=10, deadline_hours=20, start=signal.start + timedelta(hours=6))
    with pytest.raises(ConfigError, match="--grid-policy"):
        run_grid_job(settings, signal, job_hours=1, deadline_hours=2, policies=["greedy"])
