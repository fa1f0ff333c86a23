"""Changing GPU knobs safely: validated, journaled first, dry-run and observe modes, always restored.

Modes:

* ``apply``: validate, journal the original settings, then change the device.
* ``dry-run``: validate and log what would be set; touch nothing.
* ``observe``: touch nothing. A controller in ``apply`` mode that meets "no permission" says so in one
  line and continues in ``observe`` mode, so training goes on.

Power smoothing (NVML's power floor and ramp limits, GB200 and later) goes the same way where the GPU has it; on
any other GPU :meth:`KnobController.set_power_smoothing` says so in one line and changes nothing, in every mode.

The original settings come back on :meth:`KnobController.restore`, on leaving the ``with`` block (normal
exit or exception), on SIGINT and SIGTERM; after SIGKILL or a power cut, the journal lets the next dtpo
start restore them (:func:`dtpo.devices.journal.restore_pending`).
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Literal

from dtpo.core.config import KNOB_MODES
from dtpo.core.errors import ConfigError
from dtpo.core.power_smoothing import SmoothingRequest
from dtpo.devices.base import Device, KnobError, KnobLimits, SmoothingLimits, SmoothingProfile, SmoothingState
from dtpo.devices.journal import KnobJournal, apply_state, describe_state

KnobMode = Literal["apply", "dry-run", "observe"]

logger = logging.getLogger(__name__)


def log_knob_action(line: str) -> None:
    """The default log of knob actions: one ``knobs:`` line through dtpo's rank-aware log."""
    logger.info("knobs: %s", line)


class KnobController:
    """The only way dtpo changes a device's knobs.

    Args:
        mode: ``"apply"``, ``"dry-run"`` or ``"observe"``.
        journal: Where original settings are saved (default: the machine's journal).
        log: Receives one line per action.
    """

    def __init__(self, mode: str = "apply", journal: KnobJournal | None = None,
                 log: Callable[[str], None] = log_knob_action) -> None:
        if mode not in KNOB_MODES:
            raise ConfigError(f"unknown knob mode {mode!r} (choose from: {', '.join(KNOB_MODES)})")
        self.mode: str = mode
        self.journal = journal or KnobJournal()
        self.log = log
        self._changed: dict[str, Device] = {}
        self._old_handlers: dict[int, Any] = {}

    def set_power_limit(self, device: Device, watts: float) -> bool:
        """Set a power limit within the device's range.

        Returns:
            True if the device was changed.

        Raises:
            ConfigError: The limit is outside the device's range (nothing is changed).
        """
        limits = self._limits(device)
        if not limits.min_power_limit_w <= watts <= limits.max_power_limit_w:
            raise ConfigError(f"power limit {watts:g} W is outside the range of {device.info.name}: "
                              f"{limits.min_power_limit_w:g}-{limits.max_power_limit_w:g} W")
        return self._change(device, f"power limit {watts:g} W", lambda: device.set_power_limit(watts))

    def lock_sm_clock(self, device: Device, mhz: int) -> bool:
        """Lock the SM clock to one supported frequency.

        Raises:
            ConfigError: The device does not support that clock (nothing is changed).
        """
        limits = self._limits(device)
        if mhz not in limits.sm_clocks_mhz:
            near = sorted(limits.sm_clocks_mhz, key=lambda c: abs(c - mhz))[:2]
            hint = f"; nearest supported: {', '.join(f'{c} MHz' for c in sorted(near))}" if near else \
                "; it has no lockable clocks"
            raise ConfigError(f"SM clock {mhz} MHz is not supported by {device.info.name}{hint}")
        return self._change(device, f"SM clock locked at {mhz} MHz", lambda: device.lock_sm_clocks(mhz, mhz))

    def unlock_sm_clocks(self, device: Device) -> bool:
        """Let a device's SM clocks float again (the driver's default)."""
        self._limits(device)
        return self._change(device, "SM clocks unlocked", device.unlock_sm_clocks)

    def set_power_smoothing(self, device: Device, request: SmoothingRequest) -> bool:
        """Turn a GPU's power smoothing off, or activate a preset profile with some of its parameters changed.

        A device without power smoothing (any GPU before GB200, an older driver or nvidia-ml-py) is left as it is,
        said in one line: it is not an error.

        Returns:
            True if the device was changed.

        Raises:
            ConfigError: A profile or floor the GPU does not take (nothing is changed).
        """
        limits = device.power_smoothing_limits()
        if limits is None:
            self.log(f"{device.info.name} has no power smoothing (NVML's power floor and ramp limits, GB200 and "
                     f"later): {request.describe()} not applied")
            return False
        current = device.knob_state().smoothing
        if current is None:
            raise KnobError(f"{device.info.name}: power smoothing settings unreadable")
        target = _smoothing_target(device.info.name, current, limits, request)
        if target == current:
            self.log(f"{device.info.name} {request.describe()}: already so, nothing to change")
            return False
        return self._change(device, request.describe(), lambda: device.set_power_smoothing(target))

    def restore(self) -> None:
        """Put every device this controller changed back to its journaled original settings."""
        for key, device in list(self._changed.items()):
            original = self.journal.original(key)
            if original is not None:
                apply_state(device, original)
                self.journal.forget(key)
                self.log(f"restored {device.info.name}: {describe_state(original)}")
            del self._changed[key]

    def __enter__(self) -> KnobController:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old_handlers[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.restore()
        finally:
            for sig, handler in self._old_handlers.items():
                signal.signal(sig, handler)
            self._old_handlers.clear()

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.restore()
        previous = self._old_handlers.get(signum)
        if callable(previous):
            previous(signum, frame)
        elif signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)

    def _limits(self, device: Device) -> KnobLimits:
        limits = device.knob_limits()
        if limits is None:
            raise ConfigError(f"{device.info.name} has no power or clock knobs")
        return limits

    def _change(self, device: Device, what: str, change: Callable[[], None]) -> bool:
        if self.mode == "observe":
            self.log(f"observe mode: {device.info.name} {what} not applied")
            return False
        if self.mode == "dry-run":
            self.log(f"dry run: would set {device.info.name} {what}")
            return False
        key = device.knob_key
        assert key is not None
        new_entry = self.journal.remember(device)  # before the first change, so a crash can be undone
        try:
            change()
        except KnobError as exc:
            if new_entry and key not in self._changed:
                self.journal.forget(key)  # nothing was changed
            if exc.permission:
                self.log(f"{exc}; continuing in observe mode")
                self.mode = "observe"
                return False
            raise
        self._changed[key] = device
        self.log(f"set {device.info.name} {what}")
        return True


def _smoothing_target(name: str, current: SmoothingState, limits: SmoothingLimits,
                      request: SmoothingRequest) -> SmoothingState:
    """The power smoothing settings ``request`` asks for, from the GPU's ``current`` ones.

    Raises:
        ConfigError: A profile the GPU does not have, or a floor outside its range.
    """
    if request.profile is None:
        return replace(current, enabled=False)
    if request.profile >= limits.profiles:
        raise ConfigError(f"power smoothing profile {request.profile} is not one of {name}'s: it has profiles "
                          f"0-{limits.profiles - 1}")
    if request.floor_pct is not None and not limits.min_floor_pct <= request.floor_pct <= limits.max_floor_pct:
        raise ConfigError(f"power smoothing floor {request.floor_pct:g} % is outside the range of {name}: "
                          f"{limits.min_floor_pct:g}-{limits.max_floor_pct:g} % of its total module power")
    changes = {field: getattr(request, field) for field in SmoothingProfile.__dataclass_fields__
               if getattr(request, field) is not None}
    profiles = list(current.profiles)
    profiles[request.profile] = replace(profiles[request.profile], **changes)
    return SmoothingState(True, request.profile, tuple(profiles))
