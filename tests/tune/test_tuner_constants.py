"""The power tuner's constants are gathered in ``TunerOptions``: its defaults are the values the tuner has always
used (a tuner given them explicitly decides exactly as one given none), and each constant is read (a tuner given
another value decides otherwise)."""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path

import pytest
from synthetic_tuning_job import SyntheticJob, make_tuner, run_until_hold, slowdown_tuner

from dtpo.devices.physics.gpu_model import CalibratedModel
from dtpo.devices.physics.traces import load_traces
from dtpo.devices.simulated import SimulatedGpu, SimulatedGpuConfig
from dtpo.simulation.tuning import tune_on_simulated
from dtpo.tune import boundary, settling, stats
from dtpo.tune.cost import CostMetric, Energy, MaxSlowdown, ZeusCost
from dtpo.tune.tuner import PowerTuner, TunerOptions

# Every constant of the tuner and its policies with the value it had before they were gathered into TunerOptions
# (the last nine were module constants or literals: stats, settling, boundary, race, bound_search).
TODAY = {
    "wait_steps": 2, "min_wait_s": 0.0, "first_visit_steps": 4, "quick_look_steps": 2, "revisit_steps": 8,
    "budget_steps_per_candidate": 16, "z": 2.0, "tolerance": 0.01, "min_gap": 0.005, "min_step_cost": 0.1,
    "reference_weight": 2.0, "steep_rise": 0.25, "min_warmup_steps": 1, "min_warmup_s": 0.0, "min_block_s": 0.0,
    "max_warmup_s": 5.0, "drift": 0.10, "drift_window_steps": 200, "ordered": True, "boundary_points": 1,
    "min_boundary_fraction": 0.1, "interpolate_choice": True, "grid_z_share": 0.25, "placed_z_share": 0.5,
    "refine_steps": 2000,
    "noise_prior_cv": 0.05, "noise_prior_steps": 8, "settling_z": 6.0, "settling_min_spread": 2e-3,
    "warmup_settling_factor": 1.2, "far_too_slow": 1.05, "race_stay_share": 0.5, "time_stay_share": 0.8,
    "max_race_visit": 2,
}
SIMULATED = "V100 bert_base_uncased/sentiment140 b64 adamw"


def test_the_defaults_are_the_values_the_tuner_always_had() -> None:
    assert asdict(TunerOptions()) == TODAY
    assert (settling.STANDARD_ERRORS, settling.MIN_SPREAD, settling.WARMUP_FACTOR) == (6.0, 2e-3, 1.2)
    assert boundary.FAR_TOO_SLOW == 1.05
    assert (stats.PRIOR_CV, stats.PRIOR_WEIGHT_STEPS) == (0.05, 8)


def synthetic(slowdown: bool, options: TunerOptions | None) -> tuple[object, ...]:
    """What a tuner decided on the made-up job (3 % noise, a settling overshoot after each change) until it held."""
    tuner: PowerTuner = slowdown_tuner(1.1, options) if slowdown else make_tuner(options=options)
    run_until_hold(tuner, SyntheticJob(overshoot=0.3, noise=0.03, seed=0))
    return tuple(tuner.history), tuple(tuner.segments), tuner.choice, tuple(tuner.settling_s)


def simulated(metric: CostMetric, options: TunerOptions | None, tmp_path: Path) -> tuple[object, ...]:
    """What a tuner decided over a 3,000-step job on a simulated GPU calibrated on a shipped trace (3 % noise, an
    energy counter that reads continuously, so ``tune_on_simulated``'s own options are the defaults)."""
    trace = next(t for t in load_traces() if t.label == SIMULATED)
    config = SimulatedGpuConfig(gpu=trace.gpu, workload=trace.workload, batch_size=trace.batch_size, seed=3,
                                time_noise=0.03, power_noise=0.03, counter_period_s=0.0)
    folder = tmp_path / f"run-{len(list(tmp_path.iterdir()))}"
    folder.mkdir()
    gpu = SimulatedGpu(config, state_path=folder / "gpu.json", model=CalibratedModel(trace))
    result = tune_on_simulated(gpu, metric, max_steps=3000, job_steps=3000, journal_dir=folder, options=options)
    return tuple(result.tuner.history), tuple(result.segments), result.choice


@pytest.mark.parametrize("slowdown", [False, True], ids=["energy", "slowdown"])
def test_a_tuner_given_the_defaults_explicitly_decides_as_one_given_none(slowdown: bool) -> None:
    assert synthetic(slowdown, TunerOptions(**TODAY)) == synthetic(slowdown, None)


@pytest.mark.parametrize("metric", [Energy(), ZeusCost(0.5), MaxSlowdown(1.1)], ids=str)
def test_on_a_simulated_gpu_the_explicit_defaults_decide_as_none(metric: CostMetric, tmp_path: Path) -> None:
    assert simulated(metric, TunerOptions(**TODAY), tmp_path) == simulated(metric, None, tmp_path)


@pytest.mark.parametrize(("name", "value", "slowdown"), [
    ("noise_prior_cv", 0.2, False),
    ("noise_prior_steps", 100, False),
    ("settling_z", 1.0, False),
    ("settling_min_spread", 0.05, False),
    ("warmup_settling_factor", 4.0, False),
    ("time_stay_share", 0.0, True),
    ("far_too_slow", 100.0, True),
    ("z", 3.0, False),
    ("budget_steps_per_candidate", 3, False),
])
def test_another_value_of_a_constant_changes_what_the_tuner_does(name: str, value: object, slowdown: bool) -> None:
    assert synthetic(slowdown, replace(TunerOptions(), **{name: value})) != synthetic(slowdown, TunerOptions())


@pytest.mark.parametrize(("name", "value", "metric"), [
    ("race_stay_share", 1.0, Energy()),
    ("max_race_visit", 1, Energy()),
    ("far_too_slow", 100.0, MaxSlowdown(1.1)),
    ("placed_z_share", 1.0, MaxSlowdown(1.1)),
])
def test_another_value_changes_what_the_tuner_does_on_a_simulated_gpu(name: str, value: object, metric: CostMetric,
                                                                      tmp_path: Path) -> None:
    changed = simulated(metric, replace(TunerOptions(), **{name: value}), tmp_path)
    assert changed != simulated(metric, TunerOptions(), tmp_path)
