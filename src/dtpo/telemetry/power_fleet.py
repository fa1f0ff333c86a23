"""A measured power swing scaled up to a fleet of N GPUs, and judged against a utility's specification.

N GPUs that swing exactly in phase swing N times as far as one (the *coherent* bound); N independent ones only
sqrt(N) times (the *incoherent* bound). Between them, N series of equal spread whose pairs correlate by rho on
average sum to a spread of ``sqrt(N + N (N - 1) rho)`` times one GPU's: that is the *expected* figure, from the
cross-rank correlation the run measured (clamped to 0-1: anti-correlated ranks are not extrapolated below the
incoherent bound). Synchronous data-parallel training is close to coherent, and the figures say how close.

A specification file (TOML or JSON) holds the band the utility cares about, the largest share of the
oscillating energy allowed in it, and the largest ramp of the fleet's power::

    band_hz = [0.1, 20.0]
    max_band_share = 0.1          # of the oscillating (mean-removed) energy
    max_ramp_mw_per_s = 10.0      # the fleet's power, at ramp_lag_s
    ramp_lag_s = 1.0              # optional: 0.1 or 1 (default 1)
    gpus = 4096                   # optional: the fleet size to judge (a command-line count wins)

A check that the timeline cannot support (a band above what it resolves, a ramp it cannot see) is *not judged*,
never passed.
"""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dtpo.core.errors import ConfigError
from dtpo.telemetry.power_swing import RAMP_LAGS_S, SwingFigures, share_in

SPEC_KEYS = ("band_hz", "max_band_share", "max_ramp_mw_per_s", "ramp_lag_s", "gpus")
MAX_FLEET_GPUS = 10_000_000


def fleet_scale(gpus: int, correlation: float) -> float:
    """How many single-GPU swings the sum of ``gpus`` swings spans when their pairs correlate by
    ``correlation`` on average: ``sqrt(N + N (N - 1) rho)``, rho clamped to 0-1 (sqrt(N) at 0, N at 1)."""
    rho = min(1.0, max(0.0, correlation))
    return math.sqrt(gpus + gpus * (gpus - 1) * rho)


@dataclass(frozen=True)
class FleetFigures:
    """One GPU's measured swing scaled to a fleet.

    Attributes:
        gpus: The fleet's size.
        correlation: The mean cross-rank correlation used (measured, or 1 where it could not be).
        measured_correlation: Whether :attr:`correlation` was measured (False: one GPU only, assumed coherent).
        mean_mw: The fleet's mean power.
        swing_mw: Its swing (p95 - p5) as ``(incoherent, expected, coherent)``.
        ramps_mw_per_s: Its largest ramp per lag of :data:`RAMP_LAGS_S` as ``(incoherent, expected, coherent)``;
            ``None`` where one GPU's ramp is not seen.
        per_gpu: What one GPU stands for: the mean over the measured GPUs of mean power, swing and ramps.
        estimated: True where the measured power is modelled.
    """

    gpus: int
    correlation: float
    measured_correlation: bool
    mean_mw: float
    swing_mw: tuple[float, float, float]
    ramps_mw_per_s: dict[float, tuple[float, float, float] | None]
    per_gpu: dict[str, float | None]
    estimated: bool


def fleet_figures(per_gpu: Sequence[SwingFigures], correlation: float | None, gpus: int) -> FleetFigures:
    """Scale the mean of the measured GPUs' figures to ``gpus`` GPUs.

    Args:
        per_gpu: Each measured GPU's figures.
        correlation: The measured mean cross-rank correlation (``None``: one GPU; taken as coherent).
        gpus: The fleet's size.

    Raises:
        ConfigError: ``gpus`` is not a positive count.
    """
    if not 1 <= gpus <= MAX_FLEET_GPUS:
        raise ConfigError(f"the fleet size must be between 1 and {MAX_FLEET_GPUS:,} GPUs, got {gpus:,}")
    if not per_gpu:
        raise ValueError("no GPU figures to scale")
    rho = 1.0 if correlation is None else correlation
    scale = (math.sqrt(gpus), fleet_scale(gpus, rho), float(gpus))
    mean_w = float(np.mean([f.mean_w for f in per_gpu]))
    swing_w = float(np.mean([f.swing_w for f in per_gpu]))
    ramps: dict[float, tuple[float, float, float] | None] = {}
    one: dict[str, float | None] = {"mean_w": mean_w, "swing_w": swing_w}
    for lag in RAMP_LAGS_S:
        values = [f.ramps_w_per_s.get(lag) for f in per_gpu]
        known = [v for v in values if v is not None]
        ramp = float(np.mean(known)) if known and len(known) == len(values) else None
        one[f"ramp_{lag:g}s_w_per_s"] = ramp
        ramps[lag] = None if ramp is None else _bounds(ramp / 1e6, scale)
    return FleetFigures(gpus=gpus, correlation=rho, measured_correlation=correlation is not None,
                        mean_mw=mean_w * gpus / 1e6, swing_mw=_bounds(swing_w / 1e6, scale),
                        ramps_mw_per_s=ramps, per_gpu=one, estimated=any(f.estimated for f in per_gpu))


@dataclass(frozen=True)
class GridSpec:
    """What a utility allows a fleet's power to do.

    Attributes:
        band_hz: The critical band's edges.
        max_band_share: The largest share of the oscillating energy allowed in the band (0-1).
        max_ramp_mw_per_s: The largest ramp of the fleet's power.
        ramp_lag_s: The lag the ramp is measured over (one of :data:`RAMP_LAGS_S`).
        gpus: The fleet size the spec is for, if it names one.
        path: The file it came from.
    """

    band_hz: tuple[float, float]
    max_band_share: float
    max_ramp_mw_per_s: float
    ramp_lag_s: float = 1.0
    gpus: int | None = None
    path: str = ""


def read_spec(path: Path) -> GridSpec:
    """Read a specification file (``.toml`` or ``.json``; see the module's docstring).

    Raises:
        ConfigError: The file is missing, unreadable, not TOML/JSON, or a value is missing or out of range
            (one line naming the file and the key).
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read the grid spec {path} ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"the grid spec {path} is not text") from None
    try:
        data: Any = json.loads(text) if path.suffix.lower() == ".json" else tomllib.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"the grid spec {path} is not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"the grid spec {path} is not valid TOML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"the grid spec {path} must be a table of keys ({', '.join(SPEC_KEYS)})")
    unknown = sorted(set(data) - set(SPEC_KEYS))
    if unknown:
        raise ConfigError(f"the grid spec {path} has unknown key(s) {', '.join(unknown)}; "
                          f"known: {', '.join(SPEC_KEYS)}")
    where = f"the grid spec {path}"
    band = data.get("band_hz")
    if not (isinstance(band, list) and len(band) == 2 and all(_is_number(b) for b in band)
            and 0 < band[0] < band[1] and all(math.isfinite(b) for b in band)):
        raise ConfigError(f"{where}: band_hz must be two frequencies low < high in Hz, e.g. [0.1, 20.0]; got {band!r}")
    share = _number(data, "max_band_share", where)
    if not 0 <= share <= 1:
        raise ConfigError(f"{where}: max_band_share must be a share between 0 and 1, got {share:g}")
    ramp = _number(data, "max_ramp_mw_per_s", where)
    if ramp <= 0:
        raise ConfigError(f"{where}: max_ramp_mw_per_s must be > 0, got {ramp:g}")
    lag = _number(data, "ramp_lag_s", where, default=1.0)
    if lag not in RAMP_LAGS_S:
        raise ConfigError(f"{where}: ramp_lag_s must be one of {', '.join(f'{v:g}' for v in RAMP_LAGS_S)}, "
                          f"got {lag:g}")
    gpus = data.get("gpus")
    if gpus is not None and (not isinstance(gpus, int) or isinstance(gpus, bool) or not 1 <= gpus <= MAX_FLEET_GPUS):
        raise ConfigError(f"{where}: gpus must be a whole number between 1 and {MAX_FLEET_GPUS:,}, got {gpus!r}")
    return GridSpec((float(band[0]), float(band[1])), share, ramp, lag, gpus, str(path))


@dataclass(frozen=True)
class Verdict:
    """One check of a spec.

    Attributes:
        check: What was checked.
        measured: The figure, in words.
        limit: The spec's limit, in words.
        status: ``"pass"``, ``"fail"`` or ``"not judged"``.
        why: What the verdict rests on.
    """

    check: str
    measured: str
    limit: str
    status: str
    why: str


def judge(spec: GridSpec, job: SwingFigures, fleet: FleetFigures) -> list[Verdict]:
    """The spec's checks: the in-band share of the job's summed power (a share does not change with the fleet's
    size when its ranks swing in phase) and the fleet's expected ramp (its coherent bound named beside it)."""
    low, high = spec.band_hz
    found = share_in(job.spectrum, job.resolvable, low, high)
    share, seen = found.share, found.seen
    band = f"{low:g}-{high:g} Hz"
    limit = f"<= {100 * spec.max_band_share:.1f} %"
    if seen != "seen":
        measured = "not seen" if share is None else f"{100 * share:.1f} % of what is seen"
        verdicts = [Verdict(f"oscillation in {band}", measured, limit, "not judged",
                            f"the timeline resolves {job.resolvable.low_hz:.3g}-{job.resolvable.high_hz:.3g} Hz "
                            f"({job.resolvable.why}), not the whole band")]
    else:
        assert share is not None
        verdicts = [Verdict(f"oscillation in {band}", f"{100 * share:.1f} %", limit,
                            "pass" if share <= spec.max_band_share else "fail",
                            "share of the job's summed, mean-removed power")]
    ramps = fleet.ramps_mw_per_s.get(spec.ramp_lag_s)
    check = f"ramp over {spec.ramp_lag_s:g} s at {fleet.gpus:,} GPUs"
    limit = f"<= {spec.max_ramp_mw_per_s:g} MW/s"
    if ramps is None:
        verdicts.append(Verdict(check, "not seen", limit, "not judged",
                                job.ramp_notes.get(spec.ramp_lag_s, "the timeline does not show this ramp")))
    else:
        low_mw, expected, coherent = ramps
        basis = (f"correlation {fleet.correlation:.2f} across ranks" if fleet.measured_correlation
                 else "one GPU measured: taken as in phase")
        verdicts.append(Verdict(check, f"{expected:.3g} MW/s (in phase: {coherent:.3g})", limit,
                                "pass" if expected <= spec.max_ramp_mw_per_s else "fail", basis))
    return verdicts


def _bounds(one: float, scale: tuple[float, float, float]) -> tuple[float, float, float]:
    return one * scale[0], one * scale[1], one * scale[2]


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _number(data: dict[str, Any], key: str, where: str, default: float | None = None) -> float:
    value = data.get(key, default)
    if value is None:
        raise ConfigError(f"{where}: {key} is missing")
    if not _is_number(value) or not math.isfinite(value):
        raise ConfigError(f"{where}: {key} must be a number, got {value!r}")
    return float(value)
