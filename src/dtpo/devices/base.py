"""One interface for every power source: GPUs through NVML, CPU packages and DRAM through RAPL, models.

A :class:`Device` reports cumulative energy since it was opened and, where it can, instantaneous power.
Devices with knobs (GPUs: power limit, locked SM clocks, and power smoothing where NVML has it) also implement
:meth:`Device.knob_limits` and the setters; callers change knobs only through ``dtpo.devices.journal`` so the
original settings are journaled first and always restored.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Literal

from dtpo.core.errors import DtpoError

EnergySource = Literal["nvml-counter", "nvml-polled", "rapl", "modelled", "simulated"]
DeviceKind = Literal["gpu", "cpu", "dram"]


class DeviceError(DtpoError):
    """A device could not be opened or read; the message is one line a user can act on."""


class KnobError(DeviceError):
    """A knob could not be set: unsupported, out of range, or no permission (see :attr:`permission`)."""

    def __init__(self, message: str, permission: bool = False) -> None:
        super().__init__(message)
        self.permission = permission


@dataclass(frozen=True)
class KnobLimits:
    """What a device's knobs allow.

    Attributes:
        min_power_limit_w: Lowest settable power limit.
        max_power_limit_w: Highest settable power limit.
        default_power_limit_w: The limit the device ships with.
        sm_clocks_mhz: Supported SM clocks in MHz, ascending (empty if clocks cannot be locked).
    """

    min_power_limit_w: float
    max_power_limit_w: float
    default_power_limit_w: float
    sm_clocks_mhz: tuple[int, ...] = ()


@dataclass(frozen=True)
class SmoothingProfile:
    """One preset profile of a GPU's power smoothing (NVML's units: GB200 and later).

    Attributes:
        floor_pct: Power floor, in per cent of the GPU's total module power (TMP).
        ramp_up_w_per_s: Fastest rise of power, W/s.
        ramp_down_w_per_s: Fastest fall of power, W/s.
        ramp_down_hysteresis_ms: How long power must stay low before it may fall, ms.
    """

    floor_pct: float
    ramp_up_w_per_s: float
    ramp_down_w_per_s: float
    ramp_down_hysteresis_ms: float


@dataclass(frozen=True)
class SmoothingState:
    """A GPU's power smoothing: on or off, the active preset profile, and every profile's parameters.

    Attributes:
        enabled: Whether power smoothing is on.
        active_profile: The preset profile in force (0-based).
        profiles: Every preset profile's parameters, by profile number.
    """

    enabled: bool
    active_profile: int
    profiles: tuple[SmoothingProfile, ...]


@dataclass(frozen=True)
class SmoothingLimits:
    """What a GPU's power smoothing allows.

    Attributes:
        profiles: How many preset profiles it has.
        min_floor_pct: Lowest settable floor, per cent of TMP.
        max_floor_pct: Highest settable floor, per cent of TMP.
    """

    profiles: int
    min_floor_pct: float
    max_floor_pct: float


@dataclass(frozen=True)
class KnobState:
    """A device's current knob settings (what the journal saves and restores).

    Attributes:
        power_limit_w: Current power limit.
        locked_sm_clocks_mhz: ``(min, max)`` if SM clocks are locked, ``None`` if they float.
        smoothing: The power smoothing settings, ``None`` on a device without power smoothing.
    """

    power_limit_w: float
    locked_sm_clocks_mhz: tuple[int, int] | None = None
    smoothing: SmoothingState | None = None


@dataclass(frozen=True)
class DeviceInfo:
    """What a device is.

    Attributes:
        name: Unique, readable name, e.g. ``"gpu0 (NVIDIA H100 80GB HBM3)"`` or ``"package-0"``.
        kind: ``"gpu"``, ``"cpu"`` or ``"dram"``.
        source: How its energy is obtained: ``"nvml-counter"`` (the GPU's total-energy counter),
            ``"nvml-polled"`` (power polled and integrated), ``"rapl"``, ``"modelled"`` or ``"simulated"``.
        estimated: True when the energy comes from a model rather than a hardware counter.
        node_shared: True for devices every process of a node shares (a CPU package, DRAM): counted once
            per node, not once per rank.
        detail: Free text, e.g. the UUID, the powercap path, the model's assumptions.
    """

    name: str
    kind: DeviceKind
    source: EnergySource
    estimated: bool
    node_shared: bool
    detail: str = ""


class Device(ABC):
    """A power source whose energy can be read."""

    info: DeviceInfo

    @abstractmethod
    def energy_j(self) -> float:
        """Joules consumed since the device was opened (monotonic, wraparound already handled)."""

    def energy_j_between_samples(self) -> float:
        """:meth:`energy_j` where a power sampler reads every device on its own schedule (a window's end between
        two samples): a device whose figure is a model and whose read is costly may extend its last reading at
        that reading's power instead (see :class:`~dtpo.devices.modelled_cpu.ModelledCpu`); by default it is read."""
        return self.energy_j()

    def power_w(self) -> float | None:
        """Instantaneous (or most recent average) power in watts, if the device can tell."""
        return None

    def close(self) -> None:  # noqa: B027 - most devices hold nothing to release
        """Release handles and background threads."""

    # -- knobs (GPUs); devices without knobs keep these defaults ---------------------------------------

    @property
    def knob_key(self) -> str | None:
        """A stable identity to reopen this device by after a crash (``"nvml:<uuid>"``, ``"sim:<path>"``);
        ``None`` for devices without knobs."""
        return None

    def knob_limits(self) -> KnobLimits | None:
        """The allowed power-limit range and SM clocks, or ``None`` if the device has no knobs."""
        return None

    def knob_state(self) -> KnobState:
        """Current knob settings."""
        raise KnobError(f"{self.info.name} has no knobs")

    def sm_clock_mhz(self) -> float | None:
        """The SM clock the device runs at right now, if it can tell (below a lock when a power limit binds)."""
        return None

    def set_power_limit(self, watts: float) -> None:
        """Set the power limit (watts, within :meth:`knob_limits`)."""
        raise KnobError(f"{self.info.name} has no power limit to set")

    def lock_sm_clocks(self, min_mhz: int, max_mhz: int) -> None:
        """Lock SM clocks to a range of supported clocks."""
        raise KnobError(f"{self.info.name} has no clocks to lock")

    def unlock_sm_clocks(self) -> None:
        """Let SM clocks float again."""
        raise KnobError(f"{self.info.name} has no clocks to unlock")

    def power_smoothing_limits(self) -> SmoothingLimits | None:
        """What the device's power smoothing allows, or ``None`` if it has none (most GPUs: it is GB200's)."""
        return None

    def set_power_smoothing(self, state: SmoothingState) -> None:
        """Put the device's power smoothing into ``state`` (profiles' parameters, active profile, on or off)."""
        raise KnobError(f"{self.info.name} has no power smoothing")
