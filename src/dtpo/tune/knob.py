"""The GPU knobs a tuner turns: their candidate settings, and applying a setting through the knob controller.

A :class:`Knob` names a knob, lists its candidates given the setting chosen so far (the first candidate is
that setting itself), says how a setting is applied, and whether it changes the numerics of training (GPU
power limits and clocks never do: they change speed and power, not results).

Candidates follow Zeus's grid for power limits (from the maximum down to the minimum in ``step_w`` steps,
the minimum included) and a spread of supported clocks for SM-clock locks (floating first, then from the
highest supported clock down, about ``clock_points`` of them). Between two candidates a knob can also name a
setting off its grid (:attr:`Knob.between`): any whole watt for a power limit, any supported clock for a lock.
A ``MaxSlowdown`` search uses it to move its choice up to the allowed slowdown (:mod:`dtpo.tune.boundary`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dtpo.core.config import TUNE_KNOBS
from dtpo.core.errors import ConfigError
from dtpo.devices.base import Device, KnobLimits
from dtpo.devices.knobs import KnobController
from dtpo.tune.setting import GpuSetting

DEFAULT_STEP_W = 25.0
DEFAULT_CLOCK_POINTS = 16

Between = Callable[[GpuSetting, GpuSetting, float], "GpuSetting | None"]


@dataclass(frozen=True)
class Knob:
    """One knob a tuner searches.

    Attributes:
        name: ``"power-limit"`` or ``"sm-clock"``.
        candidates: From the setting chosen so far to this knob's candidates (that setting first).
        changes_numerics: Whether turning it changes what training computes (never, for GPU knobs).
        between: Optional: given two settings ``a`` and ``b`` that differ in this knob only and a fraction
            ``f`` in (0, 1), a setting of this knob strictly between them near ``a + f (b - a)``, or ``None``
            where the knob has none (adjacent clocks, limits a watt apart). Knobs without it are searched on
            their candidates only.
    """

    name: str
    candidates: Callable[[GpuSetting], list[GpuSetting]]
    changes_numerics: bool = False
    between: Between | None = None


def power_limit_grid(limits: KnobLimits, step_w: float = DEFAULT_STEP_W) -> list[float]:
    """Power limits from the maximum down in ``step_w`` steps, the minimum included."""
    if step_w <= 0:
        raise ConfigError(f"power-limit step must be > 0 W, got {step_w:g}")
    values = []
    value = limits.max_power_limit_w
    while value >= limits.min_power_limit_w - 1e-9:
        values.append(round(value, 3))
        value -= step_w
    if values[-1] > limits.min_power_limit_w + 1e-9:
        values.append(limits.min_power_limit_w)
    return values


def clock_grid(limits: KnobLimits, points: int = DEFAULT_CLOCK_POINTS) -> list[int]:
    """About ``points`` supported SM clocks from the highest down, evenly spread over the supported list."""
    clocks = sorted(limits.sm_clocks_mhz, reverse=True)
    if not clocks:
        raise ConfigError("this GPU reports no lockable SM clocks; tune the power limit instead")
    if len(clocks) <= points:
        return clocks
    stride = (len(clocks) - 1) / (points - 1)
    return sorted({clocks[round(i * stride)] for i in range(points)}, reverse=True)


def power_limit_between(a: GpuSetting, b: GpuSetting, fraction: float) -> GpuSetting | None:
    """The whole-watt power limit nearest ``a + fraction (b - a)`` strictly between ``a`` and ``b`` (clock of
    ``a``), or ``None`` when no whole watt lies between them."""
    lo, hi = sorted((a.power_limit_w, b.power_limit_w))
    first, last = math.floor(lo) + 1, math.ceil(hi) - 1  # the whole watts strictly inside
    if first > last:
        return None
    target = a.power_limit_w + fraction * (b.power_limit_w - a.power_limit_w)
    return GpuSetting(float(min(max(round(target), first), last)), a.sm_clock_mhz)


def clock_between(clocks: Sequence[int]) -> Between:
    """A ``between`` for SM-clock locks: the supported clock nearest ``a + fraction (b - a)`` strictly between the
    two locks (a floating clock counts as the highest supported one)."""
    supported = sorted(clocks)

    def between(a: GpuSetting, b: GpuSetting, fraction: float) -> GpuSetting | None:
        top = supported[-1] if supported else 0
        ca = a.sm_clock_mhz if a.sm_clock_mhz is not None else top
        cb = b.sm_clock_mhz if b.sm_clock_mhz is not None else top
        lo, hi = sorted((ca, cb))
        inside = [c for c in supported if lo < c < hi]
        if not inside:
            return None
        target = ca + fraction * (cb - ca)
        return GpuSetting(a.power_limit_w, min(inside, key=lambda c: (abs(c - target), c)))

    return between


def make_knobs(which: str, limits: KnobLimits, step_w: float = DEFAULT_STEP_W,
               clock_points: int = DEFAULT_CLOCK_POINTS) -> list[Knob]:
    """The knobs to tune for ``--tune which``, in the order they are searched (for ``both``: the power limit
    with clocks floating, then an SM-clock lock under the chosen limit: a lock above the clock the limit
    settles at changes nothing, one below it can still save).

    Raises:
        ConfigError: Unknown knob name, or SM clocks asked of a GPU that cannot lock them.
    """
    if which not in TUNE_KNOBS:
        raise ConfigError(f"unknown knob {which!r} to tune; choose one of {', '.join(TUNE_KNOBS)}")
    limit_values = power_limit_grid(limits, step_w)

    def by_limit(base: GpuSetting) -> list[GpuSetting]:
        rest = [GpuSetting(v, base.sm_clock_mhz) for v in limit_values if v != base.power_limit_w]
        return [base, *rest]

    power = Knob("power-limit", by_limit, between=power_limit_between)
    if which == "power-limit":
        return [power]
    clock_values = clock_grid(limits)

    def by_clock(base: GpuSetting) -> list[GpuSetting]:
        rest = [GpuSetting(base.power_limit_w, c) for c in clock_values if c != base.sm_clock_mhz]
        return [base, *rest]

    clock = Knob("sm-clock", by_clock, between=clock_between(limits.sm_clocks_mhz))
    return [clock] if which == "sm-clock" else [power, clock]


def candidate_grid(dimensions: Sequence[Callable[[GpuSetting], list[GpuSetting]]], default: GpuSetting
                   ) -> list[GpuSetting]:
    """Every setting a full sweep visits: each knob's candidates (``Knob.candidates``) from every setting of the
    knobs before it, starting at ``default``, in order and without repeats."""
    settings = [default]
    for candidates in dimensions:
        settings = [s for base in settings for s in candidates(base)]
    return list(dict.fromkeys(settings))


def apply_setting(controller: KnobController, devices: Sequence[Device], setting: GpuSetting,
                  previous: GpuSetting | None) -> None:
    """Put ``setting`` on every device, changing only what differs from ``previous``."""
    for device in devices:
        if previous is None or previous.power_limit_w != setting.power_limit_w:
            controller.set_power_limit(device, setting.power_limit_w)
        if previous is None or previous.sm_clock_mhz != setting.sm_clock_mhz:
            if setting.sm_clock_mhz is None:
                if previous is not None:
                    controller.unlock_sm_clocks(device)
            else:
                controller.lock_sm_clock(device, setting.sm_clock_mhz)
