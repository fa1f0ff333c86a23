"""Whole jobs with stragglers on simulated GPUs: per-rank slowdown against no tuning and against the bloat."""

from __future__ import annotations

from pathlib import Path

import pytest

from dtpo.core.errors import ConfigError
from dtpo.devices.journal import KnobJournal
from dtpo.simulation.job import JobConfig
from dtpo.simulation.stragglers import MAX_STRAGGLER_GPUS, check_job, ideal_energy, run_job


@pytest.mark.parametrize("pattern", ["static", "drifting", "intermittent"])
def test_slowing_waiting_ranks_saves_energy_without_slowing_the_job(tmp_path: Path, pattern: str) -> None:
    job = JobConfig("A40", "resnet50", gpus=8, steps=1000, stragglers=((3, 1.5),), pattern=pattern,
                    period_steps=250, noise=0.01, seed=1)
    base = run_job(job, tune=False, journal_dir=tmp_path)
    tuned = run_job(job, tune=True, journal_dir=tmp_path)
    full, jit = ideal_energy(job)
    assert jit < full
    recovered = (base.energy_j - tuned.energy_j) / (full - jit)
    assert recovered > 0.5, recovered
    assert tuned.time_s < base.time_s * (1.01 if pattern == "static" else 1.03)
    assert any(any(c < max(row) for c in row) for row in tuned.clocks)  # some rank ran slower
    assert all(len(set(row)) == 1 for row in base.clocks)  # without tuning nobody did
    assert KnobJournal(tmp_path / "knobs-journal.json").entries() == {}  # every GPU put back


def test_the_same_seed_draws_the_same_noise_and_the_energy_counter_does_not_matter(tmp_path: Path) -> None:
    job = JobConfig("A40", "resnet50", gpus=4, steps=200, stragglers=((1, 1.2),), seed=2)
    first = run_job(job, tune=True, journal_dir=tmp_path)
    again = run_job(JobConfig("A40", "resnet50", gpus=4, steps=200, stragglers=((1, 1.2),), seed=2,
                              counter_period_s=0.0), tune=True, journal_dir=tmp_path)
    other = run_job(JobConfig("A40", "resnet50", gpus=4, steps=200, stragglers=((1, 1.2),), seed=3),
                    tune=True, journal_dir=tmp_path)
    assert (first.time_s, first.energy_j, first.clocks) == (again.time_s, again.energy_j, again.clocks)
    assert other.energy_j != first.energy_j


@pytest.mark.parametrize(("job", "words"), [
    (JobConfig("A40", "resnet50", gpus=4, stragglers=((4, 1.2),)), "not one of the 4 ranks"),
    (JobConfig("A40", "resnet50", stragglers=((1, 0.0),)), "factor must be"),
    (JobConfig("A40", "resnet50", pattern="wobbly"), "unknown straggler pattern"),
    (JobConfig("A40", "resnet50", gpus=1), "--gpus must be between 2"),
    (JobConfig("A40", "resnet50", gpus=MAX_STRAGGLER_GPUS + 1), f"--gpus must be between 2 and {MAX_STRAGGLER_GPUS}"),
    (JobConfig("A40", "resnet50", window_steps=0), "window must be >= 1")])
def test_bad_straggler_jobs_are_refused_in_one_line(job: JobConfig, words: str) -> None:
    with pytest.raises(ConfigError, match=words) as err:
        check_job(job)
    assert "\n" not in str(err.value)
