"""Fitting alpha and bandwidth to ring all-reduce timings."""

from __future__ import annotations

import random

import numpy as np
import pytest

from dtpo.core.errors import ConfigError
from dtpo.plan.link_fit import fit_alpha_beta, fit_cpu_cost, fit_link_probe


def synthetic(alpha: float, bandwidth: float, noise: float, seed: int = 7) -> list[tuple[float, float, float]]:
    rng = np.random.default_rng(seed)
    samples = []
    for p in (2, 4, 8, 16):
        for n in np.logspace(3, 9, 13):
            t = 2 * (p - 1) * alpha + 2 * (p - 1) / p * n / bandwidth
            samples.append((float(n), p, t * (1 + noise * rng.standard_normal())))
    return samples


def test_the_fit_recovers_alpha_and_bandwidth_within_5_percent_of_1_percent_noise() -> None:
    fit = fit_alpha_beta(synthetic(alpha=5e-6, bandwidth=12e9, noise=0.01))
    assert fit.alpha_s == pytest.approx(5e-6, rel=0.05)
    assert fit.bandwidth_Bps == pytest.approx(12e9, rel=0.05)
    assert fit.points == 52 and fit.note == ""
    assert 0 < fit.residual_rms_rel < 0.02
    assert fit.residual_rms_s > 0
    assert fit.predict(1e9, 8) == pytest.approx(14 * fit.alpha_s + 1.75e9 / fit.bandwidth_Bps)
    assert fit.link_cost().bandwidth_Bps == fit.bandwidth_Bps


def test_noiseless_samples_are_fitted_exactly() -> None:
    fit = fit_alpha_beta([(1e3, 8, 14 * 2e-6 + 1.75e3 / 1e10), (1e8, 8, 14 * 2e-6 + 1.75e8 / 1e10)])
    assert fit.alpha_s == pytest.approx(2e-6, rel=1e-9)
    assert fit.bandwidth_Bps == pytest.approx(1e10, rel=1e-9)


def test_a_negative_alpha_is_replaced_by_a_bandwidth_only_fit() -> None:
    # t = -1 us * 2 + n / 1e10 on p = 2: the free fit gives alpha = -1 us
    fit = fit_alpha_beta([(1e8, 2, 0.009998), (2e8, 2, 0.019998)])
    assert fit.alpha_s == 0.0
    assert "alpha" in fit.note and "0" in fit.note
    assert fit.bandwidth_Bps == pytest.approx(1e10, rel=1e-3)


def test_samples_that_cannot_be_fitted_raise_config_error() -> None:
    with pytest.raises(ConfigError, match="2 distinct message sizes"):
        fit_alpha_beta([(1e6, 2, 1e-3), (1e6, 4, 2e-3)])
    with pytest.raises(ConfigError, match="non-positive"):
        fit_alpha_beta([(1e3, 2, 1e-3), (1e8, 2, 1e-4)])
    with pytest.raises(ConfigError, match="p >= 2"):
        fit_alpha_beta([(1e3, 1, 1e-3), (1e8, 2, 1e-2)])
    with pytest.raises(ConfigError, match="sample 1"):
        fit_alpha_beta([(1e3, 2, 1e-3), (1e8, 2, 0.0)])
    with pytest.raises(ConfigError, match="separate"):
        fit_alpha_beta([(4e6, 4, 1e-3), (8e6, 8, 2e-3)])
    with pytest.raises(ConfigError):
        fit_alpha_beta([])


def test_the_cpu_cost_per_byte_is_the_slope_of_cpu_time_against_bytes_moved() -> None:
    # 2 ranks move n bytes each; 0.8 ns per byte plus 30 us of fixed work per call, 2 % noise
    rng = random.Random(3)
    sizes = [4096, 65536, 1 << 20, 4 << 20, 16 << 20]
    samples = [(n, 2, (30e-6 + 0.8e-9 * n) * (1 + rng.gauss(0, 0.02))) for n in sizes for _ in range(3)]
    assert fit_cpu_cost(samples) == pytest.approx(0.8e-9, rel=0.05)
    four = [(n, 4, 2 * 3 / 4 * n * 0.8e-9) for n in sizes]  # 4 ranks move 2 x 3/4 x n bytes each
    assert fit_cpu_cost(four) == pytest.approx(0.8e-9, rel=1e-6)
    assert fit_cpu_cost([(n, 2, 1e-3) for n in sizes]) == pytest.approx(0.0, abs=1e-18)  # flat: no per-byte cost


@pytest.mark.parametrize("bad", [[(1e6, 2, -1.0), (2e6, 2, 1e-3)], [(1e6, 2, 1e-3)], [("x", 2, 1e-3)]])
def test_bad_cpu_samples_are_refused(bad: list[tuple[object, ...]]) -> None:
    with pytest.raises(ConfigError):
        fit_cpu_cost(bad)  # type: ignore[arg-type]


def test_a_probe_file_gives_the_link_and_its_cpu_cost_where_it_timed_the_cpu() -> None:
    timings = [[n, 2, 1e-4 + n / 1e9] for n in (1 << 20, 4 << 20, 16 << 20)]
    cpu = [[n, 2, 0.5e-9 * n] for n in (1 << 20, 4 << 20, 16 << 20)]
    fit = fit_link_probe({"samples": timings, "cpu_samples": cpu})
    assert fit.bandwidth_Bps == pytest.approx(1e9, rel=1e-6)
    assert fit.cpu_s_per_byte == pytest.approx(0.5e-9, rel=1e-6)
    assert fit.link_cost().cpu_s_per_byte == fit.cpu_s_per_byte
    assert fit_link_probe({"samples": timings}).cpu_s_per_byte == 0  # a probe written before CPU timings
    for bad in ({}, {"samples": "x"}, []):
        with pytest.raises(ConfigError):
            fit_link_probe(bad)  # type: ignore[arg-type]
