"""Power sources: one :class:`Device` interface, backends for NVML, RAPL and a modelled CPU."""

from dtpo.devices.base import Device, DeviceError, DeviceInfo, KnobError, KnobLimits, KnobState

__all__ = ["Device", "DeviceError", "DeviceInfo", "KnobError", "KnobLimits", "KnobState"]
