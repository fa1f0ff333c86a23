"""The GPU knobs' candidates and the settings they name between two candidates."""

from __future__ import annotations

import pytest

from dtpo.devices.base import KnobLimits
from dtpo.tune.knob import candidate_grid, clock_between, make_knobs, power_limit_between, power_limit_grid
from dtpo.tune.setting import GpuSetting

LIMITS = KnobLimits(min_power_limit_w=100.0, max_power_limit_w=300.0, default_power_limit_w=300.0,
                    sm_clocks_mhz=(900, 1000, 1100, 1200, 1300, 1400))


def test_the_power_limit_grid_runs_from_the_maximum_down_with_the_minimum_included() -> None:
    assert power_limit_grid(LIMITS, 25.0)[:3] == [300.0, 275.0, 250.0]
    assert power_limit_grid(LIMITS, 30.0)[-2:] == [120.0, 100.0]


@pytest.mark.parametrize(("a", "b", "fraction", "expected"), [
    (200.0, 175.0, 0.4, 190.0),
    (200.0, 175.0, 0.01, 199.0),  # the nearest whole watt strictly inside
    (200.0, 175.0, 0.999, 176.0),
    (175.0, 200.0, 0.4, 185.0),  # from the lower limit upwards
    (200.5, 198.5, 0.5, 200.0),  # off-grid ends: whole watts between them
])
def test_a_power_limit_between_is_a_whole_watt_strictly_inside(a: float, b: float, fraction: float,
                                                                expected: float) -> None:
    assert power_limit_between(GpuSetting(a, 1200), GpuSetting(b, 1200), fraction) == GpuSetting(expected, 1200)


def test_no_power_limit_between_two_a_watt_apart() -> None:
    assert power_limit_between(GpuSetting(200.0), GpuSetting(199.0), 0.5) is None


def test_a_clock_between_is_a_supported_clock_strictly_inside() -> None:
    between = clock_between(LIMITS.sm_clocks_mhz)
    assert between(GpuSetting(250.0, 1400), GpuSetting(250.0, 1000), 0.3) == GpuSetting(250.0, 1300)
    assert between(GpuSetting(250.0, None), GpuSetting(250.0, 1100), 0.5) == GpuSetting(250.0, 1200)  # floating: top
    assert between(GpuSetting(250.0, 1200), GpuSetting(250.0, 1100), 0.5) is None  # adjacent supported clocks


def test_both_gpu_knobs_can_name_settings_between_their_candidates() -> None:
    power, clock = make_knobs("both", LIMITS)
    assert power.between is not None and clock.between is not None
    assert power.between(GpuSetting(300.0), GpuSetting(275.0), 0.5) == GpuSetting(288.0)


def test_the_candidate_grid_is_every_clock_at_every_limit_without_repeats() -> None:
    power, clock = make_knobs("both", LIMITS)
    grid = candidate_grid([power.candidates, clock.candidates], GpuSetting(300.0))
    assert grid[0] == GpuSetting(300.0) and len(grid) == len(set(grid))
    assert len(grid) == len(power_limit_grid(LIMITS)) * (1 + len(LIMITS.sm_clocks_mhz))
