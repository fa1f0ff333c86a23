"""A data-parallel job on simulated GPUs: synchronous steps, straggler waits, knobs through the journal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import dtpo.simulation.data_parallel as data_parallel
from dtpo.core.errors import ConfigError
from dtpo.devices.base import KnobState
from dtpo.devices.journal import KnobJournal, restore_pending, state_dir
from dtpo.devices.physics.traces import find_trace
from dtpo.devices.simulated import reopen_simulated
from dtpo.simulation.data_parallel import MAX_GPU_STEPS, SimulatedJob, optimal, sweep_values
from dtpo.simulation.job import MAX_GPUS, MAX_STEPS, JobConfig


@pytest.fixture(autouse=True)
def _state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DTPO_STATE_DIR", str(tmp_path / "state"))


def quiet(**kwargs: object) -> JobConfig:
    base = {"gpu": "A40", "workload": "resnet50", "gpus": 4, "steps": 200, "noise": 0.0, "counter_period_s": 0.0}
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
    with SimulatedJob(quiet(stragglers=((2, 1.25),))) as job:
        slow = job.run()
    assert slow.time_s == pytest.approx(1.25 * even.time_s)
    assert slow.sync_wait_share == pytest.approx(3 * 0.25 / (3 * 1.25 + 1.25), rel=1e-6)
    assert slow.energy_j > even.energy_j


def test_knobs_go_through_the_journal_and_are_restored_at_the_end(tmp_path: Path) -> None:
    journal = KnobJournal()
    with SimulatedJob(quiet(gpus=64)) as job:
        assert not job.state_path.exists()  # at the defaults there is nothing to keep
        job.run(150)
        assert set(journal.entries()) == {job.gpus.knob_key} == {d.knob_key for d in job.devices}
        assert list((state_dir() / "sim").iterdir()) == [job.state_path]  # one file for all 64 GPUs
        assert reopen_simulated(job.state_path).knob_state() == KnobState(150.0, None)
    assert not journal.path.exists()
    assert not job.state_path.exists() and not (state_dir() / "sim").exists()


def test_a_dry_run_changes_and_leaves_nothing() -> None:
    from dtpo.devices.knobs import KnobController

    with SimulatedJob(quiet(), KnobController("dry-run", log=lambda _: None)) as job:
        result = job.run(150)
    assert result.power_limit_w == 150  # asked for, not applied: the GPUs ran at the default
    assert not KnobJournal().path.exists() and not job.state_path.exists()


def test_chunks_and_progress_cover_every_step(monkeypatch: pytest.MonkeyPatch) -> None:
    with SimulatedJob(quiet(steps=1000)) as job:
        whole = job.run(200)
    monkeypatch.setattr(data_parallel, "CHUNK_ELEMENTS", 4 * 64)  # 64 steps per chunk on 4 GPUs
    done: list[int] = []
    with SimulatedJob(quiet(steps=1000)) as job:
        chunked = job.run(200, progress=done.append)
    assert done == [64] * 15 + [40]
    assert chunked.time_s == pytest.approx(whole.time_s) and chunked.energy_j == pytest.approx(whole.energy_j)


KILLED_JOB = textwrap.dedent("""
    import time
    from dtpo.simulation.data_parallel import SimulatedJob
    from dtpo.simulation.job import JobConfig
    job = SimulatedJob(JobConfig("A40", "resnet50", gpus=16, steps=10)).__enter__()
    job.run(150, job.model.spec.sm_clocks_mhz[0])
    print(job.state_path, flush=True)
    time.sleep(120)
""")


@pytest.mark.slow
def test_a_killed_job_leaves_one_file_that_the_restore_removes() -> None:
    proc = subprocess.Popen([sys.executable, "-c", KILLED_JOB], stdout=subprocess.PIPE, text=True,
                            env=os.environ.copy())
    assert proc.stdout is not None
    state_file = Path(proc.stdout.readline().strip())
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert list((state_dir() / "sim").iterdir()) == [state_file]
    assert set(KnobJournal().entries()) == {f"sim:{state_file}"}
    lines = restore_pending()  # what `dtpo restore` and every dtpo start do
    assert len(lines) == 1 and lines[0].startswith("restored sim0-15 (16 x A40"), lines
    assert not state_file.exists() and not KnobJournal().path.exists()


def test_a_journal_entry_whose_file_is_gone_restores_to_nothing() -> None:
    with SimulatedJob(quiet()) as job:
        job.run(150)
        job.state_path.unlink()  # killed between the journal entry and the first write, or removed by hand
        journal = KnobJournal()
        assert restore_pending(journal)[0].startswith("restored")
        assert not journal.path.exists()


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


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"gpus": 0}, "--gpus"), ({"steps": 0}, "--steps"),
    ({"gpus": MAX_GPUS + 1}, f"--gpus must be between 1 and {MAX_GPUS:,}"),
    ({"steps": MAX_STEPS + 1}, f"--steps must be between 1 and {MAX_STEPS:,}"),
    ({"gpus": MAX_GPUS, "steps": MAX_GPU_STEPS // MAX_GPUS + 1}, f"at most {MAX_GPU_STEPS:,} GPU-steps"),
    ({"noise": float("nan")}, "--noise"), ({"noise": float("inf")}, "--noise"),
    ({"counter_period_s": float("nan")}, "--counter-period"), ({"seed": -1}, "--seed"),
    ({"batch_size": 0}, "--batch-size"),
    ({"stragglers": ((9, 1.2),)}, "straggler rank"),
    ({"stragglers": ((0, -1.0),)}, "straggler factor"), ({"stragglers": ((0, float("nan")),)}, "straggler factor"),
    ({"stragglers": ((0, 1.2),), "pattern": "drifting"}, "needs the straggler simulation")])
def test_bad_jobs_are_one_line_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SimulatedJob(quiet(**kwargs))
