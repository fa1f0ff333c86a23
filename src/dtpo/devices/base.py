"""One interface for every power source: GPUs through NVML, CPU packages and DRAM through RAPL, models.

A :class:`Device` reports cumulative energy since it was opened and, where it can, instantaneous power.
Knobs (power limits, clocks) are added by later layers; here a device only measures.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Literal

EnergySource = Literal["nvml-counter", "nvml-polled", "rapl", "modelled", "simulated"]
DeviceKind = Literal["gpu", "cpu", "dram"]


class DeviceError(Exception):
    """A device could not be opened or read; the message is one line a user can act on."""


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

    def power_w(self) -> float | None:
        """Instantaneous (or most recent average) power in watts, if the device can tell."""
        return None

    def close(self) -> None:  # noqa: B027 - most devices hold nothing to release
        """Release handles and background threads."""
