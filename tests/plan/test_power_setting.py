"""Power limits for the planner: the GPU model's slowdown and power at each limit, against the calibration's."""

from __future__ import annotations

import pytest

from dtpo.core.errors import ConfigError
from dtpo.plan.power_setting import DEFAULT_PROXY_WORKLOAD, LIMIT_STEP_W, limit_model


def test_every_limit_of_the_gpu_slows_compute_and_cuts_power_as_its_model_says() -> None:
    model = limit_model("H100")
    assert model is not None and model.gpu == "H100-SXM" and model.workload == DEFAULT_PROXY_WORKLOAD
    limits = [e.power_limit_w for e in model.effects]
    assert limits[0] == 700.0 and limits[-1] >= 200.0 and limits[-1] - LIMIT_STEP_W < 200.0
    assert all(a - b == LIMIT_STEP_W for a, b in zip(limits, limits[1:], strict=False))
    first = model.effects[0]
    assert first.time_factor == pytest.approx(1.0) and first.power_factor == pytest.approx(1.0)
    times = [e.time_factor for e in model.effects]
    powers = [e.power_factor for e in model.effects]
    assert times == sorted(times) and powers == sorted(powers, reverse=True)  # lower limit: slower, less power
    assert times[-1] > 1.5 and powers[-1] < 0.5


def test_the_effects_are_relative_to_the_setting_the_calibration_measured() -> None:
    at_max = {e.power_limit_w: e for e in limit_model("H100").effects}  # type: ignore[union-attr]
    model = limit_model("H100", base_limit_w=500.0)
    assert model is not None
    at_500 = {e.power_limit_w: e for e in model.effects}
    assert at_500[500.0].time_factor == pytest.approx(1.0)
    assert at_500[400.0].time_factor == pytest.approx(at_max[400.0].time_factor / at_max[500.0].time_factor)


def test_a_gpu_without_a_power_model_has_no_limits_and_a_workload_must_be_traced() -> None:
    assert limit_model("A10") is None  # datasheet figures only
    assert limit_model("A40", "resnet50/imagenet") is not None
    with pytest.raises(ConfigError):
        limit_model("A40", "gpt3/pile")
