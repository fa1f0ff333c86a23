"""The one job config of every simulation: its checks, each rank's GPU and noise, stragglers over time."""

from __future__ import annotations

import numpy as np
import pytest

from dtpo.core.errors import ConfigError
from dtpo.devices.physics.gpu_model import load_model
from dtpo.simulation.job import MAX_GPUS, MAX_STEPS, JobConfig


def test_each_rank_gets_its_own_index_and_the_job_s_noise_and_seed() -> None:
    job = JobConfig("A40", "resnet50", seed=7, noise=0.02, counter_period_s=0.5)
    config = job.gpu_config(3)
    assert (config.index, config.seed, config.time_noise, config.power_noise) == (3, 7, 0.02, 0.02)
    assert config.counter_period_s == 0.5 and config.slowdown == 1.0


def test_the_model_is_the_shipped_one_unless_a_trace_or_a_choice_says_otherwise() -> None:
    assert JobConfig("A40", "resnet50").model() is load_model("A40", "resnet50")
    parametric = JobConfig("A40", "resnet50", calibrated=False).model()
    assert not parametric.calibrated and JobConfig("A40", "resnet50").model().calibrated


def test_a_static_straggler_is_slow_throughout_and_a_factor_below_one_changes_nothing() -> None:
    job = JobConfig("A40", "resnet50", gpus=4, stragglers=((1, 1.5), (2, 0.5)))
    factors = job.factors(100, 10)
    assert factors.shape == (4, 10)
    assert np.all(factors[1] == 1.5) and np.all(factors[[0, 2, 3]] == 1.0)


def test_a_drifting_straggler_moves_on_and_an_intermittent_one_comes_and_goes() -> None:
    drifting = JobConfig("A40", "resnet50", gpus=4, stragglers=((3, 1.2),), pattern="drifting", period_steps=5)
    slow = drifting.factors(0, 20).argmax(axis=0)
    assert slow.tolist() == [3] * 5 + [0] * 5 + [1] * 5 + [2] * 5
    intermittent = JobConfig("A40", "resnet50", gpus=4, stragglers=((3, 1.2),), pattern="intermittent",
                             period_steps=5)
    assert intermittent.factors(3, 10)[3].tolist() == [1.2, 1.2] + [1.0] * 5 + [1.2] * 3


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"gpus": 0}, "--gpus must be between 1"), ({"gpus": MAX_GPUS + 1}, f"--gpus must be between 1 and {MAX_GPUS:,}"),
    ({"steps": 0}, "--steps"), ({"steps": MAX_STEPS + 1}, f"--steps must be between 1 and {MAX_STEPS:,}"),
    ({"noise": -0.1}, "--noise"), ({"noise": float("nan")}, "--noise"),
    ({"counter_period_s": float("inf")}, "--counter-period"), ({"seed": -1}, "--seed"),
    ({"batch_size": 0}, "--batch-size"), ({"trace_file": "x.csv", "calibrated": False}, "--model parametric"),
    ({"pattern": "zigzag"}, "unknown straggler pattern"), ({"stragglers": ((8, 1.2),)}, "not one of the 8 ranks"),
    ({"stragglers": ((0, float("inf")),)}, "straggler factor"), ({"period_steps": 0}, "--period"),
    ({"window_steps": 0}, "window")])
def test_a_job_that_cannot_be_is_one_line(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        JobConfig("A40", "resnet50", **kwargs).validate()
    assert "\n" not in str(err.value)
