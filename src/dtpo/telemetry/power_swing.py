"""Power swings of a training job: how far and how fast its power moves, and at which frequencies.

Synchronous training draws near the power limit while it computes and falls towards idle while it
communicates, on every GPU at once. A utility cares about the size of that swing, how fast power ramps, and
how much of the oscillation falls in a critical band around 0.1-20 Hz (NVIDIA, Microsoft and OpenAI, "Power
Stabilization for AI Training Datacenters", arXiv 2508.14318). This module computes those figures from a
sampled power timeline, with numpy only:

* level: mean, p5 and p95, the swing p95 - p5 in W and as a share of p95 (a peak-to-peak robust to single
  noisy samples; the extremes are kept beside it);
* ramps: the largest change of power over 0.1 s and over 1 s, in W/s;
* spectrum: Welch's method (mean-removed segments, Hann window, averaged periodograms) and the share of the
  oscillating (mean-removed) energy in 0.1-1, 1-2.5, 2.5-7 and 7-20 Hz;
* the dominant frequency against the step rate and its harmonics.

A timeline only shows what its sampling and its source let through. The highest frequency it resolves is the
lower of half its sampling rate (taken from the slower intervals when they are irregular) and, where the source
averages power itself, ``1 / (2 x averaging)`` (NVML's default power reading is a one-second average on recent
GPUs; dtpo's own timeline is made of energy-counter differences, so it averages over exactly its interval).
The lowest is one over a Welch segment. A band outside that range is reported *not seen*, never 0.

Irregular timelines (a sampler thread is late now and then) are put on a uniform grid by linear interpolation
first, and the figures say so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

BANDS: tuple[tuple[float, float], ...] = ((0.1, 1.0), (1.0, 2.5), (2.5, 7.0), (7.0, 20.0))
RAMP_LAGS_S: tuple[float, ...] = (0.1, 1.0)
NVML_AVERAGE_S = 1.0  # NVML's default power reading (nvmlDeviceGetPowerUsage): a 1 s average on recent GPUs
SOURCE_AVERAGING_S = {"nvml-polled": NVML_AVERAGE_S}  # sources that average beyond their sampler's interval
SEGMENT_S = 20.0  # Welch segment: 0.05 Hz resolution, so the 0.1-1 Hz band has bins of its own
REGULAR_TOLERANCE = 0.05  # intervals within 5 % of their median count as a uniform grid
MIN_SAMPLES = 8
HARMONIC_TOLERANCE = 0.05  # a peak within 5 % of k x the step rate (or one bin) is its k-th harmonic


@dataclass(frozen=True)
class PowerSeries:
    """One power timeline: a GPU's (or another device's), or a sum of them.

    Attributes:
        name: What was measured, e.g. ``rank 3 / gpu0 (H100)``.
        t_s: Sample times in seconds (any origin, increasing).
        watts: Mean power over the interval that ends at each sample.
        source: The energy source (``nvml-counter``, ``nvml-polled``, ``rapl``, ``modelled``, ``simulated``).
        estimated: True where the power comes from a model, not a counter.
        averaging_s: How long the source averages each reading beyond the sampler's own interval (0: the
            interval is all; see :data:`SOURCE_AVERAGING_S`).
        kind: Device kind (``gpu``, ``cpu``, ``dram``, ...).
    """

    name: str
    t_s: np.ndarray
    watts: np.ndarray
    source: str = ""
    estimated: bool = False
    averaging_s: float = 0.0
    kind: str = "gpu"


@dataclass(frozen=True)
class UniformGrid:
    """A timeline on evenly spaced samples.

    Attributes:
        dt_s: The grid's interval.
        watts: Power at each grid point.
        effective_dt_s: The interval the information really has (the slower intervals of an irregular timeline).
        resampled: True when the samples were interpolated onto the grid (irregular sampling).
        note: How the grid was made, in words.
    """

    dt_s: float
    watts: np.ndarray
    effective_dt_s: float
    resampled: bool
    note: str


@dataclass(frozen=True)
class BandShare:
    """The share of the oscillating energy in one frequency band.

    Attributes:
        low_hz: Lower edge.
        high_hz: Upper edge.
        share: Fraction of the oscillating (mean-removed) energy the timeline shows that falls in the band;
            ``None`` where the band is not seen at all.
        seen: ``"seen"``, ``"partly"`` (only up to or from the resolvable edge; the share covers that part)
            or ``"not seen"``.
    """

    low_hz: float
    high_hz: float
    share: float | None
    seen: str

    @property
    def label(self) -> str:
        """``0.1-1 Hz``."""
        return f"{self.low_hz:g}-{self.high_hz:g} Hz"


@dataclass(frozen=True)
class Spectrum:
    """Welch's power spectral density of a mean-removed timeline.

    Attributes:
        freqs_hz: Bin frequencies (0 first).
        psd: Power spectral density per bin in W^2/Hz (one-sided), averaged over segments; one row per series
            when several were given.
        segments: How many segments were averaged.
        segment_s: Length of a segment.
    """

    freqs_hz: np.ndarray
    psd: np.ndarray
    segments: int
    segment_s: float


@dataclass(frozen=True)
class Resolvable:
    """The frequencies a timeline can show.

    Attributes:
        low_hz: The lowest (one over a Welch segment).
        high_hz: The highest (half the effective sampling rate, or what the source's averaging lets through).
        why: What sets the upper edge, in words.
    """

    low_hz: float
    high_hz: float
    why: str


@dataclass(frozen=True)
class SwingFigures:
    """Every swing figure of one timeline.

    Attributes:
        name: The timeline's name.
        source: Its energy source.
        estimated: True where its power is modelled.
        duration_s: Time covered.
        samples: Samples analysed.
        grid: How it was put on a uniform grid.
        mean_w: Mean power.
        p5_w: 5th percentile.
        p95_w: 95th percentile.
        min_w: Lowest sample.
        max_w: Highest sample.
        ramps_w_per_s: Largest change of power over each lag of :data:`RAMP_LAGS_S`, per second; ``None`` where
            the sampling or the source's averaging is coarser than the lag.
        ramp_notes: Why a ramp is ``None``, by lag.
        bands: The share of the oscillating energy in each band of :data:`BANDS`.
        below_share: Share below the lowest band (slow drift), ``None`` if not seen.
        above_share: Share above the highest band and below the resolvable edge.
        dominant_hz: The frequency with the most oscillating energy (``None``: a flat timeline).
        step_rate_hz: Steps per second from the step marks, if known.
        harmonic: The dominant frequency against the step rate, in words.
        resolvable: The frequencies the timeline can show.
        spectrum: The spectrum itself (for plots).
    """

    name: str
    source: str
    estimated: bool
    duration_s: float
    samples: int
    grid: UniformGrid
    mean_w: float
    p5_w: float
    p95_w: float
    min_w: float
    max_w: float
    ramps_w_per_s: dict[float, float | None]
    ramp_notes: dict[float, str]
    bands: tuple[BandShare, ...]
    below_share: float | None
    above_share: float | None
    dominant_hz: float | None
    step_rate_hz: float | None
    harmonic: str
    resolvable: Resolvable
    spectrum: Spectrum = field(repr=False)

    @property
    def swing_w(self) -> float:
        """Peak-to-peak swing, p95 - p5."""
        return self.p95_w - self.p5_w

    @property
    def swing_share(self) -> float:
        """The swing as a share of the high level (p95); 0 for a timeline at 0 W."""
        return self.swing_w / self.p95_w if self.p95_w > 0 else 0.0

    def band(self, low_hz: float, high_hz: float) -> BandShare | None:
        """The band with these edges, if it is one of :attr:`bands`."""
        return next((b for b in self.bands if b.low_hz == low_hz and b.high_hz == high_hz), None)


def to_uniform(t_s: Sequence[float] | np.ndarray, watts: Sequence[float] | np.ndarray) -> UniformGrid:
    """Put a timeline on a uniform grid at its median interval (linear interpolation when it is irregular).

    Samples without a reading (NaN) are dropped first.

    Raises:
        ValueError: Fewer than :data:`MIN_SAMPLES` readings, or times that do not increase.
    """
    t = np.asarray(t_s, dtype=float)
    w = np.asarray(watts, dtype=float)
    keep = np.isfinite(t) & np.isfinite(w)
    t, w = t[keep], w[keep]
    if t.size < MIN_SAMPLES:
        raise ValueError(f"a power timeline needs at least {MIN_SAMPLES} readings, got {t.size}")
    steps = np.diff(t)
    if np.any(steps <= 0):
        raise ValueError("the power timeline's times do not increase")
    dt = float(np.median(steps))
    slow = float(np.percentile(steps, 90))
    if np.all(np.abs(steps - dt) <= REGULAR_TOLERANCE * dt):
        return UniformGrid(dt, w, dt, False, f"uniform sampling every {_seconds(dt)}")
    grid = t[0] + dt * np.arange(int(math.floor((t[-1] - t[0]) / dt + 1e-6)) + 1)
    note = (f"irregular sampling (intervals {_seconds(float(steps.min()))} to {_seconds(float(steps.max()))}, "
            f"median {_seconds(dt)}): resampled onto a uniform {_seconds(dt)} grid by linear interpolation; "
            f"frequencies judged from the 90th-percentile interval, {_seconds(slow)}")
    return UniformGrid(dt, np.interp(grid, t, w), max(dt, slow), True, note)


def welch(x: np.ndarray, fs_hz: float, segment: int | None = None, overlap: float = 0.5) -> Spectrum:
    """Welch's power spectral density: mean-removed segments, a Hann window, averaged one-sided periodograms.

    Args:
        x: Samples on a uniform grid; a 2-D array is one series per row (all analysed at once).
        fs_hz: Sampling rate.
        segment: Samples per segment (default: :data:`SEGMENT_S` seconds, or the whole series if shorter).
        overlap: Fraction by which consecutive segments overlap.

    The density is scaled so that its sum times the bin width is the variance of the windowed segments (the
    oscillating energy per unit time), as ``scipy.signal.welch(..., scaling="density")`` does.
    """
    x = np.atleast_1d(np.asarray(x, dtype=float))
    n = x.shape[-1]
    if segment is None:
        segment = min(n, max(MIN_SAMPLES, int(round(SEGMENT_S * fs_hz))))
    segment = max(2, min(segment, n))
    hop = max(1, segment - int(segment * overlap))
    starts = range(0, n - segment + 1, hop)
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(segment) / segment)  # periodic Hann
    scale = fs_hz * float(window @ window)
    total = np.zeros((*x.shape[:-1], segment // 2 + 1))
    for start in starts:
        part = x[..., start:start + segment]
        part = part - part.mean(axis=-1, keepdims=True)
        total += np.abs(np.fft.rfft(part * window, axis=-1)) ** 2
    psd = total / (len(starts) * scale)
    psd[..., 1:] *= 2.0
    if segment % 2 == 0:
        psd[..., -1] /= 2.0  # the Nyquist bin has no mirror image
    return Spectrum(np.fft.rfftfreq(segment, 1.0 / fs_hz), psd, len(starts), segment / fs_hz)


def resolvable(grid: UniformGrid, spectrum: Spectrum, averaging_s: float = 0.0) -> Resolvable:
    """The frequencies a timeline can show: one Welch bin up to the lower of the effective Nyquist frequency and
    what the source's own averaging lets through."""
    nyquist = 0.5 / grid.effective_dt_s
    effective = "effective " if grid.resampled else ""
    high, why = nyquist, f"half the {effective}sampling rate ({_hz(1 / grid.effective_dt_s)})"
    if averaging_s > 0 and 0.5 / averaging_s < high:
        high, why = 0.5 / averaging_s, f"the source averages each reading over {_seconds(averaging_s)}"
    return Resolvable(1.0 / spectrum.segment_s, high, why)


def share_in(spectrum: Spectrum, seen: Resolvable, low_hz: float, high_hz: float) -> BandShare:
    """The share of the visible oscillating energy between two frequencies.

    A band wholly outside what the timeline resolves is ``not seen`` (its share ``None``, never 0); one cut by an
    edge is ``partly`` seen and its share covers the visible part.
    """
    if low_hz >= seen.high_hz or high_hz <= seen.low_hz:
        return BandShare(low_hz, high_hz, None, "not seen")
    f, psd = spectrum.freqs_hz, spectrum.psd
    visible = _visible(f, seen)
    total = float(psd[visible].sum())
    part = float(psd[visible & (f >= low_hz) & (f < high_hz)].sum())
    status = "seen" if low_hz >= seen.low_hz and high_hz <= seen.high_hz else "partly"
    return BandShare(low_hz, high_hz, part / total if total > 0 else 0.0, status)


def band_shares(spectrum: Spectrum, seen: Resolvable, bands: Sequence[tuple[float, float]] = BANDS
                ) -> tuple[tuple[BandShare, ...], float | None, float | None]:
    """The share of the visible oscillating energy in each band (:func:`share_in`), and below and above them
    (``None`` where the timeline sees nothing there)."""
    out = tuple(share_in(spectrum, seen, low, high) for low, high in bands)
    lowest, highest = min(b[0] for b in bands), max(b[1] for b in bands)
    below = share_in(spectrum, seen, 0.0, lowest).share if seen.low_hz < lowest else None
    above = share_in(spectrum, seen, highest, math.inf).share if seen.high_hz > highest else None
    return out, below, above


def _visible(f: np.ndarray, seen: Resolvable) -> np.ndarray:
    """The bins a timeline resolves (DC excluded)."""
    return (f > 0) & (f >= seen.low_hz * (1 - 1e-9)) & (f <= seen.high_hz * (1 + 1e-9))


def ramp_rates(grid: UniformGrid, lags_s: Sequence[float] = RAMP_LAGS_S, averaging_s: float = 0.0
               ) -> tuple[dict[float, float | None], dict[float, str]]:
    """The largest change of power over each lag, per second, and why a lag has none.

    A lag shorter than the effective interval or than the source's averaging is not measured: the timeline
    would understate it.
    """
    rates: dict[float, float | None] = {}
    notes: dict[float, str] = {}
    for lag in lags_s:
        coarse = max(grid.effective_dt_s, averaging_s)
        if coarse > lag * (1 + REGULAR_TOLERANCE):
            rates[lag] = None
            notes[lag] = (f"not seen: the source averages over {_seconds(averaging_s)}" if averaging_s > lag
                          else f"not seen: samples every {_seconds(grid.effective_dt_s)}")
            continue
        k = max(1, int(round(lag / grid.dt_s)))
        w = grid.watts
        rates[lag] = float(np.abs(w[k:] - w[:-k]).max()) / (k * grid.dt_s) if w.size > k else None
        if rates[lag] is None:
            notes[lag] = "not seen: the timeline is shorter than the lag"
    return rates, notes


def harmonic_of(dominant_hz: float | None, step_rate_hz: float | None, seen: Resolvable, bin_hz: float) -> str:
    """The dominant frequency against the step rate, in words (``2 x the step rate (0.71 Hz)`` and so on)."""
    if dominant_hz is None:
        return "no oscillation (flat timeline)"
    if step_rate_hz is None or step_rate_hz <= 0:
        return "step rate unknown (no step marks)"
    rate = f"the step rate ({_hz(step_rate_hz)})"
    if step_rate_hz > seen.high_hz:
        return f"{rate} is above what the timeline resolves ({_hz(seen.high_hz)}): the steps' swing is averaged " \
               "away or aliased"
    k = int(round(dominant_hz / step_rate_hz))
    if k >= 1 and abs(dominant_hz - k * step_rate_hz) <= max(bin_hz, HARMONIC_TOLERANCE * k * step_rate_hz):
        return f"at {rate}" if k == 1 else f"{k} x {rate}"
    ratio = dominant_hz / step_rate_hz
    return f"{ratio:.2f} x {rate}: " + ("slower than the steps (a drift or a phase of the run)" if ratio < 1
                                        else "not a harmonic of the steps")


def analyse(series: PowerSeries, step_rate_hz: float | None = None, segment_s: float | None = None) -> SwingFigures:
    """Every swing figure of one timeline.

    Args:
        series: The timeline.
        step_rate_hz: Steps per second (from the step marks), to name the dominant frequency.
        segment_s: Welch segment length (default :data:`SEGMENT_S`, or the whole timeline if shorter).

    Raises:
        ValueError: Too few readings (see :func:`to_uniform`).
    """
    grid = to_uniform(series.t_s, series.watts)
    return analyse_grid(series, grid, step_rate_hz, segment_s)


def analyse_grid(series: PowerSeries, grid: UniformGrid, step_rate_hz: float | None = None,
                 segment_s: float | None = None) -> SwingFigures:
    """:func:`analyse` of a timeline already on a uniform grid (``series`` gives its name and source)."""
    w = grid.watts
    fs = 1.0 / grid.dt_s
    segment = None if segment_s is None else int(round(segment_s * fs))
    spectrum = welch(w, fs, segment)
    seen = resolvable(grid, spectrum, series.averaging_s)
    bands, below, above = band_shares(spectrum, seen)
    f = spectrum.freqs_hz
    visible = _visible(f, seen)
    dominant = None
    if visible.any() and float(spectrum.psd[visible].max()) > 0:
        dominant = float(f[visible][int(np.argmax(spectrum.psd[visible]))])
    ramps, notes = ramp_rates(grid, averaging_s=series.averaging_s)
    p5, p95 = (float(v) for v in np.percentile(w, [5, 95]))
    return SwingFigures(
        name=series.name, source=series.source, estimated=series.estimated, duration_s=grid.dt_s * (w.size - 1),
        samples=int(w.size), grid=grid, mean_w=float(w.mean()), p5_w=p5, p95_w=p95, min_w=float(w.min()),
        max_w=float(w.max()), ramps_w_per_s=ramps, ramp_notes=notes, bands=bands, below_share=below,
        above_share=above, dominant_hz=dominant, step_rate_hz=step_rate_hz,
        harmonic=harmonic_of(dominant, step_rate_hz, seen, float(f[1]) if f.size > 1 else 0.0),
        resolvable=seen, spectrum=spectrum)


@dataclass(frozen=True)
class AlignedSeries:
    """Several timelines on one common uniform grid, where all of them have readings.

    Attributes:
        t_s: The grid, in seconds on the series' shared clock.
        watts: One row per series.
        names: The series' names, in row order.
        note: How they were aligned, in words.
    """

    t_s: np.ndarray
    watts: np.ndarray
    names: tuple[str, ...]
    note: str


def align(series: Sequence[PowerSeries], offsets_s: Sequence[float] | None = None) -> AlignedSeries:
    """Put timelines on one grid (the coarsest median interval among them) over the time all of them cover.

    Args:
        series: The timelines.
        offsets_s: Added to each series' times to put them on one clock (e.g. the Unix time of each rank's first
            sample); default: they already share one.

    Raises:
        ValueError: No series, or no time that all of them cover.
    """
    if not series:
        raise ValueError("no power timelines to align")
    offsets = list(offsets_s) if offsets_s is not None else [0.0] * len(series)
    times = [np.asarray(s.t_s, dtype=float) + o for s, o in zip(series, offsets, strict=True)]
    dt = max(float(np.median(np.diff(t))) for t in times)
    start, end = max(float(t[0]) for t in times), min(float(t[-1]) for t in times)
    if end - start < dt * MIN_SAMPLES:
        raise ValueError("the power timelines do not overlap in time long enough to be added up")
    grid = start + dt * np.arange(int(math.floor((end - start) / dt + 1e-6)) + 1)
    rows = []
    for s, t in zip(series, times, strict=True):
        w = np.asarray(s.watts, dtype=float)
        keep = np.isfinite(w)
        rows.append(np.interp(grid, t[keep], w[keep]))
    same = len(series) == 1 or all(t.size == times[0].size and np.allclose(t, times[0]) for t in times)
    note = f"{len(series)} timeline(s) on one {_seconds(dt)} grid over the {_seconds(end - start)} all of them cover" \
        + ("" if same else " (interpolated: their samples fall at different times)")
    return AlignedSeries(grid, np.vstack(rows), tuple(s.name for s in series), note)


def mean_correlation(rows: np.ndarray) -> float | None:
    """The mean Pearson correlation over all pairs of rows (``None`` with fewer than two varying rows).

    Computed from the variance of the sum of standardised rows, ``N + sum of pairwise correlations``, so it
    costs one pass however many rows there are.
    """
    rows = np.asarray(rows, dtype=float)
    std = rows.std(axis=1)
    varying = rows[std > 0]
    n = varying.shape[0]
    if n < 2:
        return None
    z = (varying - varying.mean(axis=1, keepdims=True)) / std[std > 0][:, None]
    total = float(z.sum(axis=0).var())
    return (total - n) / (n * (n - 1))


def watts_text(value: float) -> str:
    """Watts with a unit that fits (W, kW, MW), three significant figures."""
    for unit, scale in (("MW", 1e6), ("kW", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:,.3g} {unit}"
    return f"{value:,.3g} W"


def joules_text(value: float) -> str:
    """Joules with a unit that fits (J, kJ, MJ, GJ), three significant figures."""
    for unit, scale in (("GJ", 1e9), ("MJ", 1e6), ("kJ", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.3g} J"


def _seconds(s: float) -> str:
    return f"{s * 1e3:.3g} ms" if s < 1 else f"{s:.3g} s"


def _hz(f: float) -> str:
    return f"{f:.3g} Hz"
