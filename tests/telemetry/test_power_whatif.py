"""What-ifs on a power timeline: a floor never lowers energy; the ramp limiter and the buffer conserve energy
(deferred work, losses and stored energy accounted for) and do smooth the swing; gaps are filled only in gaps."""

from __future__ import annotations

import numpy as np
import pytest

from dtpo.telemetry.power_whatif import (
    energy_buffer,
    fill_gaps,
    gap_mask,
    limit_ramps,
    power_floor,
    ramp_limiter,
    run_buffer,
)

DT = 0.02
LIMIT = 700.0


def phases(seconds: float = 60.0, period: float = 1.5, duty: float = 0.7,
           seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A GPU computing near its limit for ``duty`` of each step, communicating at low power otherwise."""
    t = np.arange(int(seconds / DT)) * DT
    rng = np.random.default_rng(seed)
    w = np.where((t / period) % 1.0 < duty, 650.0, 180.0) + rng.normal(0, 5, t.size)
    return t, w


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("share", [0.0, 0.3, 0.6, 1.2])
def test_a_floor_never_lowers_energy_or_power(seed: int, share: float) -> None:
    w = np.random.default_rng(seed).uniform(0, 800, 500)
    floored = power_floor(w, DT, LIMIT, share)
    assert np.all(floored.watts >= w)
    assert floored.energy_cost_j >= 0
    assert floored.energy_cost_j == pytest.approx(float((floored.watts - w).sum() * DT))
    assert floored.watts.min() >= min(share * LIMIT, w.min()) - 1e-9


def test_a_floor_at_the_compute_level_flattens_the_swing() -> None:
    _, w = phases()
    floored = power_floor(w, DT, LIMIT, 650 / LIMIT)
    assert np.percentile(floored.watts, 95) - np.percentile(floored.watts, 5) < 25
    assert floored.energy_cost_share > 0.2  # burning the whole gap is not free


def test_the_ramp_limiter_conserves_work_and_bounds_its_ramps() -> None:
    _, w = phases()
    up, down, floor = 0.5 * LIMIT, 0.5 * LIMIT, 0.3 * LIMIT
    trace = limit_ramps(w, DT, floor, up, down, hysteresis_s=0.1)
    # every joule of work is either served within the timeline or still owed at its end
    assert float(trace.served_w.sum() * DT) + float(trace.backlog_j[-1]) == pytest.approx(float(w.sum() * DT))
    assert np.all(trace.backlog_j >= -1e-9)
    assert np.all(trace.output_w >= trace.served_w - 1e-9)  # dummy work only adds
    assert np.all(trace.output_w >= floor - 1e-9)
    rises = np.diff(trace.output_w)
    assert rises.max() <= up * DT + 1e-9
    assert (-rises).max() <= down * DT + 1e-9


def test_the_ramp_limiter_smooths_and_reports_its_cost() -> None:
    _, w = phases()
    limited = ramp_limiter(w, DT, LIMIT)
    assert np.abs(np.diff(limited.watts)).max() < np.abs(np.diff(w)).max() / 5
    assert limited.watts.max() <= w.max() + 1e-9  # deferred work is caught up no faster than the work ever ran
    assert limited.energy_cost_j > 0
    # what is spent = measured + dummy work (deferred work is spent later, counted in the measured joules)
    assert float(limited.watts.sum() * DT) == pytest.approx(limited.measured_j + limited.energy_cost_j - limited.delay_s
                                                            * float(limited.watts[-1]), rel=1e-9)


@pytest.mark.parametrize("round_trip", [1.0, 0.9, 0.7])
def test_the_buffer_conserves_energy_minus_its_stated_loss(round_trip: float) -> None:
    _, w = phases()
    capacity = 2 * 470.0 * 1.5
    trace = run_buffer(w, DT, capacity, round_trip, tau_s=10.0)
    drawn = float(trace.grid_w.sum() * DT)
    assert drawn == pytest.approx(float(w.sum() * DT) + trace.loss_j + float(trace.stored_j[-1]) - capacity / 2,
                                  rel=1e-12)
    assert np.all((trace.stored_j >= -1e-6) & (trace.stored_j <= capacity + 1e-6))
    if round_trip == 1.0:
        assert trace.loss_j == pytest.approx(0.0, abs=1e-9)
    else:
        assert trace.loss_j > 0


def test_a_big_buffer_smooths_the_grid_and_an_empty_one_changes_nothing() -> None:
    _, w = phases()
    swing = np.percentile(w, 95) - np.percentile(w, 5)
    big = energy_buffer(w, DT, capacity_j=2 * 470.0 * 1.5)
    assert np.percentile(big.watts, 95) - np.percentile(big.watts, 5) < swing / 5
    assert big.energy_cost_share < 0.1
    empty = energy_buffer(w, DT, capacity_j=0.0)
    assert np.allclose(empty.watts, w) and empty.energy_cost_j == pytest.approx(0.0, abs=1e-6)


def test_gaps_are_filled_only_inside_the_gaps() -> None:
    t, w = phases()
    gaps = [(s + 1.05, s + 1.5) for s in np.arange(0, 60, 1.5)]
    filled = fill_gaps(w, t, DT, gaps, share=0.8)
    assert filled is not None
    inside = gap_mask(t, gaps)
    assert np.array_equal(filled.watts[~inside], w[~inside])
    assert np.all(filled.watts[inside] >= 0.8 * w[~inside].mean() - 1e-9)
    assert filled.energy_cost_j > 0
    assert fill_gaps(w, t, DT, []) is None


def test_gap_mask_marks_half_open_intervals() -> None:
    t = np.arange(10.0)
    assert list(gap_mask(t, [(2.0, 4.0), (7.0, 8.0)]).nonzero()[0]) == [2, 3, 7]
