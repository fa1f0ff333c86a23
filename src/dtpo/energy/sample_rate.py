"""How fast the power timeline may sample each kind of power source, and the check of a requested rate.

The timeline is made of differences of each device's energy counter, so the fastest useful rate is what the
counter resolves:

* NVML (``nvml-counter``, and the virtual GPUs' ``simulated`` stand-in): the total-energy counter counts whole
  millijoules, and NVML documents no refresh period for it; at 100 Hz a 100 W GPU adds 1,000 mJ per interval
  (0.1 % quantisation), at 1 kHz an idle one only tens of mJ. NVML's power readings are no faster:
  ``nvmlDeviceGetPowerUsage`` is a one-second average on Ampere (except GA100) and later, and the instantaneous
  field ``NVML_FI_DEV_POWER_INSTANT`` has no documented refresh rate either. 100 Hz.
* ``nvml-polled`` (GPUs without a counter): the timeline reads the integrator of power polled every 0.1 s, so
  more than 10 Hz re-reads the same polls.
* ``rapl``: the counters update about every millisecond (Intel's SDM): 1 kHz.
* ``modelled``: CPU time from ``/proc/stat`` counts in clock ticks (``USER_HZ``, 100 on Linux): 100 Hz.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from dtpo.core.errors import ConfigError
from dtpo.devices.base import Device

NVML_MAX_HZ = 100.0
POLLED_MAX_HZ = 10.0  # the integrator's polling: discovery's poll_interval_s of 0.1 s
RAPL_MAX_HZ = 1000.0


def _clock_ticks_hz() -> float:
    try:
        return float(os.sysconf("SC_CLK_TCK"))
    except (ValueError, OSError, AttributeError):
        return 100.0


MAX_HZ_BY_SOURCE: dict[str, tuple[float, str]] = {
    "nvml-counter": (NVML_MAX_HZ, "NVML's energy counter counts whole millijoules and documents no faster refresh"),
    "simulated": (NVML_MAX_HZ, "a virtual GPU stands in for NVML's energy counter"),
    "nvml-polled": (POLLED_MAX_HZ, "without an energy counter its power is polled every 0.1 s (a one-second average "
                                   "on recent GPUs)"),
    "rapl": (RAPL_MAX_HZ, "RAPL's counters update about every millisecond"),
    "modelled": (_clock_ticks_hz(), "the modelled CPU counts CPU time in the kernel's clock ticks"),
}
DEFAULT_MAX = (NVML_MAX_HZ, "no faster rate is known for this source")


def max_sample_hz(devices: Iterable[Device]) -> tuple[float, Device | None, str]:
    """The fastest rate every device supports, the device that sets it (``None`` without devices) and why."""
    best: tuple[float, Device | None, str] = (RAPL_MAX_HZ, None, "")
    for device in devices:
        hz, why = MAX_HZ_BY_SOURCE.get(device.info.source, DEFAULT_MAX)
        if hz < best[0]:
            best = (hz, device, why)
    return best


def check_sample_interval(devices: Iterable[Device], interval_s: float) -> None:
    """Refuse a timeline interval shorter than its slowest source can resolve.

    Raises:
        ConfigError: One line naming the rate, the device and its limit.
    """
    hz, device, why = max_sample_hz(devices)
    asked = 1.0 / interval_s
    if device is not None and asked > hz * (1 + 1e-9):
        raise ConfigError(f"a power sample rate of {asked:g} Hz (--power-sample-hz) is above what {device.info.name} "
                          f"({device.info.source}) supports: at most {hz:g} Hz, as {why}")
