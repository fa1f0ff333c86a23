"""A data-parallel job on simulated GPUs: synchronous steps, straggler waits, knobs through the journal."""

from __future__ import annotations

from pathlib import Path

import pytest

from dtpo.core.errors import ConfigError
from dtpo.devices.journal import KnobJournal
from dtpo.plan.simulated_job import JobConfig, SimulatedJob, optimal, sweep_values
from dtpo.plan.traces import find_trace


@pytest.fixture(autouse=True)
def _state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DTPO_STATE_DIR", str(tmp_path / "state"))


def quiet(**kwargs: object) -> JobConfig:
    base = {"gpu": "A40", "workload": "resnet50", "gpus": 4, "steps": 200, "time_noise": 0.0,
            "power_noise": 0.0, "counter_period_s": 0.0}
    return JobConfig(**{**base, **kwargs})  # type: ignore[arg-type]


def test_without_noise_the_job_is_the_model_times_steps() -> None:
    with SimulatedJob(quiet()) as job:
        result = job.run(200)
        point = job.devices[0].operating_point()
    step_s = point.time_per_sample_s * job.model.batch_size
    assert result.time_s == pytest.approx(200 * step_s)
    assert result.energy_j == pytest.approx(4 * 200 * step_s * point.power_w)
    assert result.samples == 4 * 200 * job.model.batch_size
    assert result.sync_wait_share == pytest.approx(0.0, abs=1e-12)


def test_a_straggler_sets_the_pace_and_the_others_wait() -> None:
    with SimulatedJob(quiet()) as job:
        even = job.run()
    with SimulatedJob(quiet(straggler=(2, 1.25))) as job:
        slow = job.run()
    assert slow.time_s == pytest.approx(1.25 * even.time_s)
    assert slow.sync_wait_share == pytest.approx(3 * 0.25 / (3 * 1.25 + 1.25), rel=1e-6)
    assert slow.energy_j > even.energy_j


def test_knobs_go_through_the_journal_and_are_restored_at_the_end(tmp_path: Path) -> None:
    journal = KnobJournal()
    with SimulatedJob(quiet()) as job:
        job.run(150)
        assert set(journal.entries()) == {d.knob_key for d in job.devices}
        state_files = [d.state_path for d in job.devices]
    assert not journal.path.exists()
    assert not any(path.exists() for path in state_files)


def test_the_power_limit_sweep_finds_the_measured_energy_optimum() -> None:
    trace = find_trace("A40", "resnet50")
    limits = [p.power_limit_w for p in trace.points]
    with SimulatedJob(quiet(calibrated=True)) as job:
        results = job.sweep("power-limit", limits)
    best_energy, best_time = optimal(results)
    assert best_energy.power_limit_w == trace.optimal_power_limit_w
    assert best_time.power_limit_w >= best_energy.power_limit_w


def test_default_sweeps_cover_the_range() -> None:
    with SimulatedJob(quiet(gpus=1)) as job:
        limits = sweep_values(job.devices[0], "power-limit")
        clocks = sweep_values(job.devices[0], "sm-clock")
        spec = job.model.spec
        with pytest.raises(ConfigError, match="unknown sweep"):
            sweep_values(job.devices[0], "voltage")
    assert limits[0] == spec.min_power_w and limits[-1] == spec.max_power_w
    assert clocks[0] == spec.sm_clocks_mhz[0] and clocks[-1] == spec.sm_clocks_mhz[-1]


@pytest.mark.parametrize(("kwargs", "message"), [({"gpus": 0}, "--gpus"), ({"steps": 0}, "--steps"),
                                                 ({"straggler": (9, 1.2)}, "straggler rank"),
                                                 ({"straggler": (0, -1.0)}, "straggler factor")])
def test_bad_jobs_are_one_line_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SimulatedJob(quiet(**kwargs))
