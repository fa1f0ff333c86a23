"""What ``--power-smoothing`` asks of a GPU's power smoothing (NVML's power floor and ramp limits, GB200 and later).

The value is ``off``, or a preset profile with optional changes to its parameters::

    --power-smoothing 1                                   # activate preset profile 1 as the GPU has it
    --power-smoothing 1:floor=60,ramp_up=200,ramp_down=100,hysteresis=500

``floor`` is in per cent of the GPU's total module power (TMP), ``ramp_up`` and ``ramp_down`` in W/s,
``hysteresis`` (how long power must stay low before it may ramp down) in ms. Whether the GPU has power smoothing,
how many profiles it has and which floors it accepts are checked on the GPU itself
(:meth:`dtpo.devices.knobs.KnobController.set_power_smoothing`); here only what no GPU could take is refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dtpo.core.errors import ConfigError

OFF = "off"
MAX_PROFILES = 5  # NVML_POWER_SMOOTHING_MAX_NUM_PROFILES
MAX_RAMP_W_PER_S = 1e6
MAX_HYSTERESIS_MS = 3_600_000.0
PARAMETERS = {"floor": "floor_pct", "ramp_up": "ramp_up_w_per_s", "ramp_down": "ramp_down_w_per_s",
              "hysteresis": "ramp_down_hysteresis_ms"}


@dataclass(frozen=True)
class SmoothingRequest:
    """Power smoothing as asked for: off, or a preset profile and the parameters to change in it.

    Attributes:
        profile: The preset profile to activate (0-based); ``None``: turn power smoothing off.
        floor_pct: New power floor of the profile, per cent of TMP (``None``: keep the profile's).
        ramp_up_w_per_s: New ramp-up limit, W/s.
        ramp_down_w_per_s: New ramp-down limit, W/s.
        ramp_down_hysteresis_ms: New ramp-down hysteresis, ms.
    """

    profile: int | None
    floor_pct: float | None = None
    ramp_up_w_per_s: float | None = None
    ramp_down_w_per_s: float | None = None
    ramp_down_hysteresis_ms: float | None = None

    @property
    def off(self) -> bool:
        """Whether it asks to turn power smoothing off."""
        return self.profile is None

    def describe(self) -> str:
        """In words: ``off`` or ``profile 1 (floor 60 %, ramp up 200 W/s)``."""
        if self.profile is None:
            return "power smoothing off"
        parts = [f"floor {self.floor_pct:g} %" if self.floor_pct is not None else "",
                 f"ramp up {self.ramp_up_w_per_s:g} W/s" if self.ramp_up_w_per_s is not None else "",
                 f"ramp down {self.ramp_down_w_per_s:g} W/s" if self.ramp_down_w_per_s is not None else "",
                 f"hysteresis {self.ramp_down_hysteresis_ms:g} ms" if self.ramp_down_hysteresis_ms is not None
                 else ""]
        changed = ", ".join(p for p in parts if p)
        return f"power smoothing profile {self.profile}" + (f" ({changed})" if changed else "")


def parse_power_smoothing(text: str) -> SmoothingRequest:
    """Read ``off`` or ``PROFILE[:floor=PCT,ramp_up=W/S,ramp_down=W/S,hysteresis=MS]``.

    Raises:
        ConfigError: One line saying what is wrong and what is expected.
    """
    if not isinstance(text, str):
        raise ConfigError(f"must be off or PROFILE[:floor=PCT,ramp_up=W/S,ramp_down=W/S,hysteresis=MS], got {text!r}")
    head, _, tail = text.strip().partition(":")
    if head.lower() == OFF:
        if tail:
            raise ConfigError(f"off takes no parameters, got {text!r}")
        return SmoothingRequest(None)
    try:
        profile = int(head)
    except ValueError:
        raise ConfigError(f"must be off or a preset profile 0-{MAX_PROFILES - 1} with optional parameters "
                          f"(e.g. 1:floor=60,ramp_down=100), got {text!r}") from None
    if not 0 <= profile < MAX_PROFILES:
        raise ConfigError(f"preset profile must be 0-{MAX_PROFILES - 1}, got {profile}")
    values: dict[str, float] = {}
    for item in (part.strip() for part in tail.split(",")) if tail.strip() else ():
        name, equals, raw = item.partition("=")
        name = name.strip().lower().replace("-", "_")
        if name not in PARAMETERS or not equals:
            raise ConfigError(f"unknown parameter {item!r} (give {', '.join(f'{p}=...' for p in PARAMETERS)})")
        if PARAMETERS[name] in values:
            raise ConfigError(f"names {name} twice: {text!r}")
        values[PARAMETERS[name]] = _number(name, raw)
    return SmoothingRequest(profile, **values)


def _number(name: str, raw: str) -> float:
    """One parameter's value, checked against what no GPU could take."""
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number, got {raw.strip()!r}") from None
    if not math.isfinite(value):
        raise ConfigError(f"{name} must be a finite number, got {raw.strip()!r}")
    if name == "floor" and not 0 <= value <= 100:
        raise ConfigError(f"floor is a share of the GPU's total module power: 0-100 %, got {value:g}")
    if name in ("ramp_up", "ramp_down") and not 0 < value <= MAX_RAMP_W_PER_S:
        raise ConfigError(f"{name} must be a rate in W/s above 0 and at most {MAX_RAMP_W_PER_S:g}, got {value:g}")
    if name == "hysteresis" and not 0 <= value <= MAX_HYSTERESIS_MS:
        raise ConfigError(f"hysteresis must be 0-{MAX_HYSTERESIS_MS:g} ms, got {value:g}")
    return value
