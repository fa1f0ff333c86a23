"""GPU settings a tuner can choose, and the stretches of steps a tuning run spends at each."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class GpuSetting:
    """A power limit and an optional SM-clock lock, the same on every GPU of the job.

    Attributes:
        power_limit_w: The power limit in watts.
        sm_clock_mhz: The locked SM clock in MHz, or ``None`` when clocks float (the driver's default).
    """

    power_limit_w: float
    sm_clock_mhz: int | None = None

    @property
    def sort_key(self) -> tuple[float, float]:
        """Orders settings from the least to the most power they allow (floating clocks above any lock)."""
        return self.power_limit_w, float("inf") if self.sm_clock_mhz is None else float(self.sm_clock_mhz)

    @property
    def label(self) -> str:
        """``"200 W"`` or ``"300 W, SM 1410 MHz"``."""
        text = f"{self.power_limit_w:g} W"
        return text if self.sm_clock_mhz is None else f"{text}, SM {self.sm_clock_mhz} MHz"

    def as_dict(self) -> dict[str, Any]:
        """Plain values for JSON."""
        return {"power_limit_w": self.power_limit_w, "sm_clock_mhz": self.sm_clock_mhz}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GpuSetting:
        """The inverse of :meth:`as_dict`."""
        clock = data.get("sm_clock_mhz")
        return cls(float(data["power_limit_w"]), None if clock is None else int(clock))


@dataclass(frozen=True)
class Segment:
    """Consecutive steps a job ran at one setting, in one phase of tuning.

    Attributes:
        setting: The setting in force.
        phase: ``"wait"``, ``"warmup"``, ``"profile"`` or ``"hold"``.
        steps: Optimizer steps.
        samples: Samples trained (all GPUs).
        time_s: Wall time.
        energy_j: Energy of all GPUs as their counters read it.
    """

    setting: GpuSetting
    phase: str
    steps: int
    samples: int
    time_s: float
    energy_j: float

    def as_dict(self) -> dict[str, Any]:
        """Plain values for JSON."""
        return {**self.setting.as_dict(), "phase": self.phase, "steps": self.steps, "samples": self.samples,
                "time_s": self.time_s, "energy_j": self.energy_j}
