"""Placing a setting between two candidates towards a ``MaxSlowdown`` bound: the margin its verdict needs and
where the interpolated time reaches the bound less that margin."""

from __future__ import annotations

import math

import pytest

from dtpo.tune.boundary import boundary_fraction, verdict_margin


def test_the_margin_is_z_standard_errors_of_the_time_difference() -> None:
    # own: 1 % of 1.1 s over sqrt(16) steps = 2.75 ms; the default's: 1.1 x 5 ms = 5.5 ms
    expected = 2.0 * math.hypot(0.01 * 1.1 / 4.0, 1.1 * 0.005)
    assert verdict_margin(2.0, 0.01, 1.1, 16, 1.1, 0.005) == pytest.approx(expected)
    assert verdict_margin(2.0, 0.01, 1.1, 64, 1.1, 0.005) < expected  # more planned steps, a narrower margin


def test_the_fraction_is_where_the_chord_reaches_the_bound_less_the_margin() -> None:
    # from 1.0 s to 1.2 s, the target 1.1 - 0.02 = 1.08 s lies 40 % of the way
    assert boundary_fraction(1.1, 1.0, 1.2, 0.02, 0.1) == pytest.approx(0.4)


@pytest.mark.parametrize(("allowed", "fast", "slow", "margin", "why"), [
    (1.3, 1.0, 1.2, 0.02, "the slower setting itself may be allowed"),
    (1.1, 1.0, 1.2, 0.1, "the margin takes everything up to the faster one"),
    (1.1, 1.0, 1.2, 0.09, "5 % of the way is below the least worth a visit"),
    (1.1, 1.2, 1.0, 0.02, "the lower setting measured faster: nothing to interpolate"),
])
def test_no_fraction_where_a_visit_between_is_pointless(allowed: float, fast: float, slow: float, margin: float,
                                                       why: str) -> None:
    assert boundary_fraction(allowed, fast, slow, margin, 0.1) is None, why
