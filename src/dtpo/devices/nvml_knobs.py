"""Power-limit and SM-clock knobs of NVIDIA GPUs through NVML.

Setting them needs root (or the admin's permission); without it NVML answers ``NoPermission``, which is
raised as a :class:`KnobError` with ``permission=True`` so callers fall back to observe mode. Change knobs
only through :class:`dtpo.devices.knobs.KnobController`, which journals the original settings first.

NVML can tell the power limit but not whether SM clocks are locked, so the journal records clocks as
unlocked and restoring resets any lock (``nvmlDeviceResetGpuLockedClocks``), which is the driver default.

Power smoothing (GB200 and later: a power floor and ramp limits, in preset profiles) is read through NVML's field
values (``NVML_FI_PWR_SMOOTHING_*``: on or off, the active profile, each profile's floor in % of the total module
power, ramp rates in mW/s and ramp-down hysteresis in ms) and set with ``nvmlDevicePowerSmoothingSetState``,
``nvmlDevicePowerSmoothingActivatePresetProfile`` and ``nvmlDevicePowerSmoothingUpdatePresetProfileParam``.
A GPU, driver or nvidia-ml-py without them (``NotSupported``, ``FunctionNotFound``, a missing symbol) has no power
smoothing: :meth:`NvmlKnobs.power_smoothing_limits` answers ``None`` and the journal records none.
"""

from __future__ import annotations

import ctypes
import logging
from typing import Any

from dtpo.devices.base import KnobError, KnobLimits, KnobState, SmoothingLimits, SmoothingProfile, SmoothingState

log = logging.getLogger(__name__)

# The profile parameters, in NVML's order (NVML_POWER_SMOOTHING_PROFILE_PARAM_*) and units, with the field that
# reads each (NVML_FI_PWR_SMOOTHING_PROFILE_*, scoped by profile) and the factor from NVML's unit to dtpo's.
SMOOTHING_PARAMETERS = (  # (SmoothingProfile field, parameter id, field id, NVML unit per dtpo unit)
    ("floor_pct", 0, 260, 1.0),  # % of TMP
    ("ramp_up_w_per_s", 1, 261, 1000.0),  # mW/s
    ("ramp_down_w_per_s", 2, 262, 1000.0),  # mW/s
    ("ramp_down_hysteresis_ms", 3, 263, 1.0),  # ms
)
FI_SMOOTHING_ENABLED = 251
FI_SMOOTHING_MAX_FLOOR = 256
FI_SMOOTHING_MIN_FLOOR = 257
FI_SMOOTHING_PROFILES = 259
FI_SMOOTHING_ACTIVE_PROFILE = 264
SMOOTHING_SETTERS = ("nvmlDevicePowerSmoothingSetState", "nvmlDevicePowerSmoothingActivatePresetProfile",
                     "nvmlDevicePowerSmoothingUpdatePresetProfileParam")
ABSENT = (3, 13)  # NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND: the feature is not there
_VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")  # by NVML_VALUE_TYPE_*


class SmoothingUnavailable(Exception):
    """NVML answers that this GPU (or driver, or nvidia-ml-py) has no power smoothing."""


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
        """The current power limit and power smoothing; clocks are reported unlocked (NVML cannot query a lock)."""
        try:
            limit_w = self._nvml.nvmlDeviceGetPowerManagementLimit(self._handle) / 1000.0
        except self._nvml.NVMLError as exc:
            raise KnobError(f"{self.info.name}: power limit unreadable: {exc}") from None
        limits = self.power_smoothing_limits()
        return KnobState(limit_w, None, None if limits is None else self._smoothing_state(limits))

    def power_smoothing_limits(self) -> SmoothingLimits | None:
        """How many preset profiles and which floors the GPU's power smoothing takes; ``None`` without it.

        Raises:
            KnobError: NVML failed for another reason than the feature's absence.
        """
        if not all(hasattr(self._nvml, name) for name in ("nvmlDeviceGetFieldValues", *SMOOTHING_SETTERS)):
            log.debug("%s: this nvidia-ml-py has no power smoothing API", self.info.name)
            return None
        try:
            profiles, low, high = self._fields([FI_SMOOTHING_PROFILES, FI_SMOOTHING_MIN_FLOOR, FI_SMOOTHING_MAX_FLOOR])
        except SmoothingUnavailable as exc:
            log.debug("%s: no power smoothing (%s)", self.info.name, exc)
            return None
        return SmoothingLimits(int(profiles), float(low), float(high))

    def set_power_smoothing(self, state: SmoothingState) -> None:
        """Bring the GPU's power smoothing to ``state``, changing only what differs: each profile's parameters
        first, then the active profile, then on or off."""
        limits = self.power_smoothing_limits()
        if limits is None:
            raise KnobError(f"{self.info.name} has no power smoothing")
        nvml = self._nvml
        now = self._smoothing_state(limits)
        for number, (old, new) in enumerate(zip(now.profiles, state.profiles, strict=False)):
            for name, param, _, scale in SMOOTHING_PARAMETERS:
                if getattr(old, name) != getattr(new, name):
                    profile = nvml.c_nvmlPowerSmoothingProfile_v1_t()
                    profile.profileId, profile.paramId, profile.value = number, param, getattr(new, name) * scale
                    self._call(f"set power smoothing profile {number}'s {name}",
                               nvml.nvmlDevicePowerSmoothingUpdatePresetProfileParam, self._handle,
                               ctypes.byref(profile))
        if now.active_profile != state.active_profile:
            profile = nvml.c_nvmlPowerSmoothingProfile_v1_t()
            profile.profileId = state.active_profile
            self._call(f"activate power smoothing profile {state.active_profile}",
                       nvml.nvmlDevicePowerSmoothingActivatePresetProfile, self._handle, ctypes.byref(profile))
        if now.enabled != state.enabled:
            switch = nvml.c_nvmlPowerSmoothingState_v1_t()
            switch.state = nvml.NVML_FEATURE_ENABLED if state.enabled else nvml.NVML_FEATURE_DISABLED
            self._call(f"turn power smoothing {'on' if state.enabled else 'off'}",
                       nvml.nvmlDevicePowerSmoothingSetState, self._handle, ctypes.byref(switch))

    def _smoothing_state(self, limits: SmoothingLimits) -> SmoothingState:
        """On or off, the active profile and every profile's parameters, in one NVML call."""
        ids: list[int | tuple[int, int]] = [FI_SMOOTHING_ENABLED, FI_SMOOTHING_ACTIVE_PROFILE]
        ids += [(field, number) for number in range(limits.profiles) for _, _, field, _ in SMOOTHING_PARAMETERS]
        try:
            values = self._fields(ids)
        except SmoothingUnavailable as exc:
            raise KnobError(f"{self.info.name}: power smoothing settings unreadable: {exc}") from None
        per = len(SMOOTHING_PARAMETERS)
        profiles = tuple(SmoothingProfile(*(values[2 + per * n + i] / scale
                                            for i, (_, _, _, scale) in enumerate(SMOOTHING_PARAMETERS)))
                         for n in range(limits.profiles))
        return SmoothingState(bool(values[0]), int(values[1]), profiles)

    def _fields(self, ids: list[Any]) -> list[float]:
        """NVML field values (``id`` or ``(id, scope)``), as numbers.

        Raises:
            SmoothingUnavailable: NVML answers NotSupported or FunctionNotFound, for the call or for a field.
            KnobError: Any other failure.
        """
        nvml = self._nvml
        try:
            values = nvml.nvmlDeviceGetFieldValues(self._handle, ids)
        except nvml.NVMLError as exc:
            if getattr(exc, "value", None) in ABSENT:
                raise SmoothingUnavailable(str(exc)) from None
            raise KnobError(f"{self.info.name}: power smoothing unreadable: {exc}") from None
        out = []
        for value in values:
            if value.nvmlReturn != 0:
                error = nvml.NVMLError(value.nvmlReturn)
                if value.nvmlReturn in ABSENT:
                    raise SmoothingUnavailable(f"field {value.fieldId}: {error}")
                raise KnobError(f"{self.info.name}: power smoothing field {value.fieldId} unreadable: {error}")
            member = _VALUE_MEMBERS[value.valueType] if value.valueType < len(_VALUE_MEMBERS) else "dVal"
            out.append(float(getattr(value.value, member)))
        return out

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
