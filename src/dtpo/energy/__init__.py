"""Energy windows over a rank's devices, a power timeline, and combining ranks."""

from dtpo.energy.monitor import Monitor, PowerSample, Snapshot, WindowMeasurement, combine

__all__ = ["Monitor", "PowerSample", "Snapshot", "WindowMeasurement", "combine"]
