"""Power-swing analysis: a square wave's frequency and band shares, what a slow or averaging source cannot see,
irregular sampling, ramps, and the cross-rank correlation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dtpo.telemetry.power_swing import (
    BANDS,
    PowerSeries,
    align,
    analyse,
    mean_correlation,
    to_uniform,
    welch,
)

LOW_W, HIGH_W = 200.0, 700.0


def square(freq_hz: float, fs_hz: float, seconds: float, duty: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """A power square wave between LOW_W and HIGH_W, high for ``duty`` of each period."""
    t = np.arange(int(round(seconds * fs_hz))) / fs_hz
    phase = (t * freq_hz) % 1.0
    return t, np.where(phase < duty, HIGH_W, LOW_W)


def square_shares(freq_hz: float, top_hz: float) -> dict[tuple[float, float], float]:
    """The continuous 50 % square wave's variance by band, up to ``top_hz``: odd harmonic k holds 8 / (pi k)^2."""
    shares = dict.fromkeys(BANDS, 0.0)
    k = 1
    while k * freq_hz <= top_hz:
        for low, high in BANDS:
            if low <= k * freq_hz < high:
                shares[(low, high)] += 8 / (math.pi * k) ** 2
        k += 2
    return shares


def test_a_square_wave_gives_its_frequency_swing_and_band_shares() -> None:
    t, w = square(0.4, 100.0, 120.0)
    figures = analyse(PowerSeries("gpu", t, w, source="nvml-counter"), step_rate_hz=0.4)
    assert figures.dominant_hz == pytest.approx(0.4, abs=0.01)
    assert figures.harmonic.startswith("at the step rate")
    assert figures.mean_w == pytest.approx((LOW_W + HIGH_W) / 2, rel=1e-3)
    assert figures.swing_w == pytest.approx(HIGH_W - LOW_W)
    assert figures.swing_share == pytest.approx((HIGH_W - LOW_W) / HIGH_W)
    assert not figures.grid.resampled
    expected = square_shares(0.4, 50.0)
    for band in figures.bands:
        assert band.seen == "seen"
        assert band.share == pytest.approx(expected[(band.low_hz, band.high_hz)], abs=0.01), band.label
    assert figures.bands[0].share > 0.75  # the fundamental holds most of it
    # the steps are instantaneous: the fastest ramp is the whole swing within one lag
    assert figures.ramps_w_per_s[0.1] == pytest.approx((HIGH_W - LOW_W) / 0.1)
    assert figures.ramps_w_per_s[1.0] == pytest.approx((HIGH_W - LOW_W) / 1.0)


def test_the_dominant_frequency_is_named_as_a_harmonic_of_the_step_rate() -> None:
    t, w = square(0.4, 50.0, 60.0)
    assert analyse(PowerSeries("gpu", t, w), step_rate_hz=0.2).harmonic.startswith("2 x the step rate")
    assert "not a harmonic" in analyse(PowerSeries("gpu", t, w), step_rate_hz=0.17).harmonic
    assert "unknown" in analyse(PowerSeries("gpu", t, w)).harmonic


def test_a_one_second_average_source_says_which_bands_it_cannot_see() -> None:
    t, w = square(0.2, 10.0, 100.0)
    figures = analyse(PowerSeries("gpu", t, w, source="nvml-polled", averaging_s=1.0), step_rate_hz=0.2)
    assert figures.resolvable.high_hz == pytest.approx(0.5)
    assert "averages" in figures.resolvable.why
    seen = {b.label: (b.seen, b.share) for b in figures.bands}
    assert seen["0.1-1 Hz"][0] == "partly" and seen["0.1-1 Hz"][1] > 0.9
    for label in ("1-2.5 Hz", "2.5-7 Hz", "7-20 Hz"):
        assert seen[label] == ("not seen", None)  # never reported as 0
    assert figures.ramps_w_per_s[0.1] is None and "averages" in figures.ramp_notes[0.1]
    assert figures.ramps_w_per_s[1.0] is not None


def test_sampling_below_40_hz_does_not_see_the_top_band() -> None:
    t, w = square(0.4, 10.0, 60.0)
    figures = analyse(PowerSeries("gpu", t, w), step_rate_hz=0.4)
    assert figures.resolvable.high_hz == pytest.approx(5.0)
    seen = {b.label: b.seen for b in figures.bands}
    assert seen == {"0.1-1 Hz": "seen", "1-2.5 Hz": "seen", "2.5-7 Hz": "partly", "7-20 Hz": "not seen"}
    assert figures.above_share is None


def test_a_step_rate_beyond_the_sampling_is_said_to_be_averaged_away() -> None:
    t, w = square(0.4, 10.0, 60.0)
    assert "above what the timeline resolves" in analyse(PowerSeries("gpu", t, w), step_rate_hz=8.0).harmonic


def test_irregular_sampling_is_resampled_and_said_so() -> None:
    rng = np.random.default_rng(3)
    intervals = rng.uniform(0.015, 0.03, 4000)
    t = np.cumsum(intervals)
    w = np.where((t * 0.5) % 1.0 < 0.5, HIGH_W, LOW_W)
    figures = analyse(PowerSeries("gpu", t, w), step_rate_hz=0.5)
    assert figures.grid.resampled and "resampled" in figures.grid.note
    assert figures.grid.effective_dt_s > figures.grid.dt_s  # judged from the slower intervals
    assert figures.dominant_hz == pytest.approx(0.5, abs=0.03)
    assert figures.resolvable.high_hz == pytest.approx(0.5 / figures.grid.effective_dt_s)


def test_regular_samples_are_kept_as_they_are() -> None:
    grid = to_uniform(np.arange(20) * 0.1, np.arange(20.0))
    assert not grid.resampled and grid.dt_s == pytest.approx(0.1)
    assert list(grid.watts) == list(np.arange(20.0))


def test_too_few_readings_are_refused() -> None:
    with pytest.raises(ValueError, match="at least"):
        to_uniform([0.0, 0.1, 0.2], [1.0, 2.0, 3.0])


def test_welch_preserves_the_variance_of_a_sine() -> None:
    fs = 200.0
    t = np.arange(int(60 * fs)) / fs
    x = 50.0 * np.sin(2 * np.pi * 3.0 * t) + 400.0
    spectrum = welch(x, fs)
    df = spectrum.freqs_hz[1]
    assert float(spectrum.psd.sum() * df) == pytest.approx(50.0 ** 2 / 2, rel=0.02)
    assert spectrum.freqs_hz[int(np.argmax(spectrum.psd))] == pytest.approx(3.0)
    assert spectrum.segments > 1


def test_a_flat_timeline_has_no_dominant_frequency_and_zero_swing() -> None:
    figures = analyse(PowerSeries("gpu", np.arange(100) * 0.05, np.full(100, 300.0)))
    assert figures.dominant_hz is None and figures.swing_w == 0.0
    assert all(b.share == 0.0 for b in figures.bands if b.seen != "not seen")


def test_correlation_of_in_phase_and_independent_ranks() -> None:
    t, w = square(0.5, 50.0, 60.0)
    rng = np.random.default_rng(0)
    in_phase = np.vstack([w + rng.normal(0, 5, w.size) for _ in range(16)])
    assert mean_correlation(in_phase) == pytest.approx(1.0, abs=0.01)
    independent = rng.normal(0, 1, (16, w.size))
    assert mean_correlation(independent) == pytest.approx(0.0, abs=0.02)
    opposite = np.vstack([w, HIGH_W + LOW_W - w])
    assert mean_correlation(opposite) == pytest.approx(-1.0)
    assert mean_correlation(w[None, :]) is None


def test_align_puts_ranks_on_one_clock_over_the_time_they_share() -> None:
    t = np.arange(200) * 0.1
    a = PowerSeries("a", t, np.full(200, 100.0))
    b = PowerSeries("b", t, np.full(200, 50.0))
    aligned = align([a, b], offsets_s=[1000.0, 1005.0])  # b started 5 s later
    assert aligned.t_s[0] == pytest.approx(1005.0) and aligned.t_s[-1] == pytest.approx(1019.9)
    assert aligned.watts.sum(axis=0) == pytest.approx(np.full(aligned.t_s.size, 150.0))
    with pytest.raises(ValueError, match="overlap"):
        align([a, b], offsets_s=[0.0, 100.0])
