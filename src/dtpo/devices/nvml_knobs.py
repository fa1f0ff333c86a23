"""Power-limit and SM-clock knobs of NVIDIA GPUs through NVML.

Setting them needs root (or the admin's permission); without it NVML answers ``NoPermission``, which is
raised as a :class:`KnobError` with ``permission=True`` so callers fall back to observe mode. Change knobs
only through :class:`dtpo.devices.knobs.KnobController`, which journals the original settings first.

NVML can tell the power limit but not whether SM clocks are locked, so the journal records clocks as
unlocked and restoring resets any lock (``nvmlDeviceResetGpuLockedClocks``), which is the driver default.
"""

from __future__ import annotations

from typing import Any

from dtpo.devices.base import KnobError, KnobLimits, KnobState


class NvmlKnobs:
    """Knob methods for a device holding ``self._nvml`` (the pynvml module), ``self._handle`` and ``self.uuid``."""

    _nvml: Any
    _handle: Any
    uuid: str
    info: Any

    @property
    def knob_key(self) -> str | None:
        """``"nvml:<uuid>"``: stable across reboots and index changes."""
        return f"nvml:{self.uuid}"

    def knob_limits(self) -> KnobLimits | None:
        """Power-limit range, default limit and supported SM clocks (at the highest memory clock)."""
        nvml = self._nvml
        try:
            low_mw, high_mw = nvml.nvmlDeviceGetPowerManagementLimitConstraints(self._handle)
            default_mw = nvml.nvmlDeviceGetPowerManagementDefaultLimit(self._handle)
        except nvml.NVMLError as exc:
            raise KnobError(f"{self.info.name}: power limits unreadable: {exc}") from None
        clocks: tuple[int, ...] = ()
        try:
            memory = max(nvml.nvmlDeviceGetSupportedMemoryClocks(self._handle))
            clocks = tuple(sorted(set(nvml.nvmlDeviceGetSupportedGraphicsClocks(self._handle, memory))))
        except nvml.NVMLError:
            pass  # e.g. some consumer boards: no clock list, power limits still work
        return KnobLimits(low_mw / 1000.0, high_mw / 1000.0, default_mw / 1000.0, clocks)

    def knob_state(self) -> KnobState:
        """The current power limit; clocks are reported unlocked (NVML cannot query a lock)."""
        try:
            return KnobState(self._nvml.nvmlDeviceGetPowerManagementLimit(self._handle) / 1000.0, None)
        except self._nvml.NVMLError as exc:
            raise KnobError(f"{self.info.name}: power limit unreadable: {exc}") from None

    def sm_clock_mhz(self) -> float | None:
        """The current SM clock (``nvmlDeviceGetClockInfo``), or ``None`` where NVML cannot tell."""
        nvml = self._nvml
        try:
            return float(nvml.nvmlDeviceGetClockInfo(self._handle, getattr(nvml, "NVML_CLOCK_SM", 1)))
        except (AttributeError, nvml.NVMLError):
            return None

    def set_power_limit(self, watts: float) -> None:
        """Set the power limit (NVML takes milliwatts)."""
        self._call("set the power limit", self._nvml.nvmlDeviceSetPowerManagementLimit, self._handle,
                   int(round(watts * 1000)))

    def lock_sm_clocks(self, min_mhz: int, max_mhz: int) -> None:
        """Lock SM (graphics) clocks to ``[min_mhz, max_mhz]``."""
        self._call("lock SM clocks", self._nvml.nvmlDeviceSetGpuLockedClocks, self._handle, int(min_mhz),
                   int(max_mhz))

    def unlock_sm_clocks(self) -> None:
        """Return SM clocks to the driver's control."""
        self._call("unlock SM clocks", self._nvml.nvmlDeviceResetGpuLockedClocks, self._handle)

    def _call(self, what: str, fn: Any, *args: Any) -> None:
        nvml = self._nvml
        try:
            fn(*args)
        except nvml.NVMLError as exc:
            no_permission = isinstance(exc, getattr(nvml, "NVMLError_NoPermission", ()))
            hint = " (needs root, or `nvidia-smi -acp UNRESTRICTED` by an admin)" if no_permission else ""
            raise KnobError(f"{self.info.name}: cannot {what}: {exc}{hint}", permission=no_permission) from None
