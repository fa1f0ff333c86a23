"""The power timeline's rate: --power-sample-hz in the config, and each source's limit checked when sampling starts."""

from __future__ import annotations

import pytest

from dtpo.core.config import EnergyConfig
from dtpo.core.errors import ConfigError
from dtpo.devices.modelled_cpu import ModelledCpu
from dtpo.energy.monitor import Monitor
from dtpo.energy.sample_rate import check_sample_interval, max_sample_hz


def _cpu() -> ModelledCpu:
    return ModelledCpu(n_cpus=2, read_times=lambda: (0, 0), clock=lambda: 0.0, model="Test CPU")


def test_hz_sets_the_interval_and_is_saved_with_it() -> None:
    config = EnergyConfig(sample_hz=50)
    assert config.sample_interval_s == pytest.approx(0.02)
    again = EnergyConfig(**config.to_dict())  # a config.json read back
    assert (again.sample_hz, again.sample_interval_s) == (50.0, pytest.approx(0.02))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"sample_hz": 5000}, r"energy.sample_hz must be <= 1000, got 5000 \(--power-sample-hz\)"),
    ({"sample_hz": 0}, r"must be positive.*--power-sample-hz"),
    ({"sample_hz": 50, "sample_interval_s": 0.5}, "--power-sample-interval 0.5 disagree; give one of them"),
])
def test_bad_rates_are_one_line(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as raised:
        EnergyConfig(**kwargs)
    assert "\n" not in str(raised.value)


def test_a_modelled_cpu_is_sampled_at_most_at_the_kernels_tick_rate() -> None:
    cpu = _cpu()
    hz, device, why = max_sample_hz([cpu])
    assert device is cpu and hz == 100 and "clock ticks" in why
    check_sample_interval([cpu], 1 / 100)  # at the limit: accepted
    with pytest.raises(ConfigError, match=r"200 Hz .* above what cpu \(modelled\) \(modelled\) supports: at most "
                                          r"100 Hz") as raised:
        check_sample_interval([cpu], 1 / 200)
    assert "\n" not in str(raised.value)


def test_the_monitor_refuses_a_rate_its_devices_cannot_resolve() -> None:
    with pytest.raises(ConfigError, match="above what cpu"):
        Monitor([_cpu()], sample_interval_s=0.002)
    monitor = Monitor([_cpu()], sample_interval_s=None)  # no sampler: no rate to check
    monitor.close()
