"""The knob journal: a device's original settings, written before dtpo first changes it.

The journal is a JSON file per machine (``$DTPO_STATE_DIR/knobs-journal.json``, default
``/var/tmp/dtpo``, which survives reboots). An entry exists exactly while a device may be left changed: it
is written (and fsynced) before the first change and removed once the original settings are back. A
process killed with SIGKILL, or a power cut, leaves its entries behind, and the next dtpo start on that
machine restores them (:func:`restore_pending`, also ``dtpo restore``).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import getpass
import json
import math
import os
import socket
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from dtpo.core.errors import DtpoError
from dtpo.core.files import untrusted_reason
from dtpo.core.record import write_json_atomic
from dtpo.devices.base import Device, DeviceError, KnobState, SmoothingProfile, SmoothingState

JOURNAL_SCHEMA = "dtpo.knobs-journal/1"

# Reopen a device from its knob key, by the key's prefix ("nvml", "sim").
Opener = Callable[[str], Device]


def state_dir() -> Path:
    """Where machine-wide dtpo state lives: ``$DTPO_STATE_DIR``, else ``/var/tmp/dtpo``."""
    return Path(os.environ.get("DTPO_STATE_DIR") or "/var/tmp/dtpo")


class JournalError(DtpoError):
    """The journal cannot be read or written; the message says what to do."""


class KnobJournal:
    """Original knob settings of the devices dtpo has changed on this machine.

    Args:
        path: The journal file (default: ``state_dir() / "knobs-journal.json"``).
    """

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or state_dir() / "knobs-journal.json"

    def entries(self) -> dict[str, dict[str, Any]]:
        """Entries by knob key; empty when there is no journal.

        Raises:
            JournalError: The journal cannot be read, is not JSON, or is not a dtpo journal; the one-line
                message says how to inspect and clear it.
        """
        if not self.path.exists():
            return {}
        self.check_trusted(self.path)
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise self.unusable(f"is unreadable or corrupt ({exc.strerror or exc})") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise self.unusable(f"is unreadable or corrupt ({exc})") from None
        if not isinstance(data, dict) or data.get("schema") != JOURNAL_SCHEMA or not isinstance(
                data.get("entries"), dict):
            raise self.unusable(f"is not a dtpo journal ({JOURNAL_SCHEMA})")
        for key, entry in data["entries"].items():
            if not _valid_entry(entry):
                raise self.unusable(f"is unreadable or corrupt (its entry {key!r} has no usable original settings)")
        return data["entries"]

    def check_trusted(self, path: Path) -> None:
        """Refuse a journal (or its folder) that another user owns or could change: dtpo, run as root, would
        otherwise put planted "original" power limits and clocks on every GPU the journal names.

        Raises:
            JournalError: One line saying why and how to fix it (as OpenSSH does with its files).
        """
        why = untrusted_reason(path)
        if why is not None:
            folder = self.path.parent
            raise JournalError(f"refusing the knob journal {self.path}: {why}, so another user could make dtpo set "
                               f"any power limit or clock; fix: chown {getpass.getuser()} {folder} && chmod 700 "
                               f"{folder} (check what the journal holds first), or set DTPO_STATE_DIR to a folder "
                               "of your own")

    def unusable(self, why: str) -> JournalError:
        """The one-line error for a journal that cannot be used: what is wrong, how to inspect and clear it."""
        return JournalError(f"the knob journal {self.path} {why}; inspect it (cat {self.path}), put the GPUs it "
                            f"names back by hand (nvidia-smi -rgc; nvidia-smi -pl <default W>), then remove it "
                            f"(rm {self.path})")

    def remember(self, device: Device) -> bool:
        """Save a device's current settings as its original ones, unless already saved.

        Returns:
            True if a new entry was written.
        """
        key = device.knob_key
        if key is None:
            raise DeviceError(f"{device.info.name} has no knobs to journal")
        with self._exclusive():
            entries = self.entries()
            if key in entries:
                return False  # the first original wins: it is the state before anyone changed it
            entries[key] = {"device": device.info.name, "original": asdict(device.knob_state()),
                            "pid": os.getpid(), "host": socket.gethostname(),
                            "since": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")}
            self._write(entries)
        return True

    def forget(self, key: str) -> None:
        """Remove an entry once its device is back to its original settings."""
        with self._exclusive():
            entries = self.entries()
            if entries.pop(key, None) is not None:
                self._write(entries)

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        """Hold a lock on the journal's folder while reading and rewriting the journal: the ranks of a node share
        one journal, and two unlocked read-modify-writes lose an entry (the later writer's copy lacks the other's
        device, which then journals an already changed setting as its original). The folder is locked, not a
        lock file, so nothing is left behind."""
        folder = self.path.parent
        try:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)  # private: only this user changes knobs' state
            fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise JournalError(f"cannot lock the knob journal {self.path}: {exc.strerror or exc} "
                               "(set DTPO_STATE_DIR to a writable folder)") from None
        try:
            self.check_trusted(folder)
        except JournalError:
            os.close(fd)
            raise
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def original(self, key: str) -> KnobState | None:
        """The saved original settings of a device, if journaled."""
        entry = self.entries().get(key)
        if entry is None:
            return None
        locked = entry["original"].get("locked_sm_clocks_mhz")
        smoothing = entry["original"].get("smoothing")
        return KnobState(entry["original"]["power_limit_w"], tuple(locked) if locked else None,
                         None if smoothing is None else _smoothing_from(smoothing))

    def _write(self, entries: dict[str, Any]) -> None:
        try:
            if entries:
                write_json_atomic(self.path, {"schema": JOURNAL_SCHEMA, "entries": entries})
            else:
                self.path.unlink(missing_ok=True)
        except OSError as exc:
            raise JournalError(f"cannot write the knob journal {self.path}: {exc.strerror or exc} "
                               "(set DTPO_STATE_DIR to a writable folder)") from None


def _valid_entry(entry: Any) -> bool:
    """Whether a journal entry holds original settings that :meth:`KnobJournal.original` can read."""
    if not isinstance(entry, dict) or not isinstance(entry.get("original"), dict):
        return False
    original = entry["original"]
    limit = original.get("power_limit_w")
    locked = original.get("locked_sm_clocks_mhz")
    if isinstance(limit, bool) or not isinstance(limit, int | float) or not math.isfinite(limit):
        return False
    if not (locked is None or (isinstance(locked, list | tuple) and len(locked) == 2
                               and all(_is_number(c) for c in locked))):
        return False
    smoothing = original.get("smoothing")
    if smoothing is None:
        return True
    try:
        _smoothing_from(smoothing)
    except (TypeError, ValueError, KeyError):
        return False
    return True


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _smoothing_from(data: Any) -> SmoothingState:
    """Power smoothing settings as the journal holds them (``asdict`` of :class:`SmoothingState`).

    Raises:
        TypeError, ValueError, KeyError: They are not such settings.
    """
    if not isinstance(data, dict) or not isinstance(data["enabled"], bool) or not isinstance(data["profiles"], list):
        raise TypeError("not power smoothing settings")
    active = data["active_profile"]
    if not isinstance(active, int) or isinstance(active, bool) or not 0 <= active < max(1, len(data["profiles"])):
        raise ValueError(f"active profile {active!r}")
    profiles = []
    for profile in data["profiles"]:
        values = {name: profile[name] for name in SmoothingProfile.__dataclass_fields__}
        if not all(_is_number(v) for v in values.values()):
            raise ValueError(f"profile {profile!r}")
        profiles.append(SmoothingProfile(**values))
    return SmoothingState(data["enabled"], active, tuple(profiles))


def apply_state(device: Device, state: KnobState) -> None:
    """Put a device's knobs into ``state`` (power smoothing too, where it was recorded)."""
    device.set_power_limit(state.power_limit_w)
    if state.locked_sm_clocks_mhz is None:
        device.unlock_sm_clocks()
    else:
        device.lock_sm_clocks(*state.locked_sm_clocks_mhz)
    if state.smoothing is not None:
        device.set_power_smoothing(state.smoothing)


def describe_state(state: KnobState) -> str:
    """The settings a restore put back, in words: ``power limit 300 W, locked clocks reset, power smoothing off``."""
    clocks = "locked clocks reset" if state.locked_sm_clocks_mhz is None else "clocks relocked"
    text = f"power limit {state.power_limit_w:g} W, {clocks}"
    smoothing = state.smoothing
    if smoothing is not None:
        text += (f", power smoothing profile {smoothing.active_profile} on" if smoothing.enabled
                 else ", power smoothing off") + " (its profiles as they were)"
    return text


def open_by_key(key: str) -> Device:
    """Reopen a device from its knob key (``nvml:<uuid>``, ``sim:<state file>``)."""
    prefix, _, rest = key.partition(":")
    if prefix == "nvml":
        from dtpo.devices.nvml import open_nvml_by_uuid

        return open_nvml_by_uuid(rest)
    if prefix == "sim":
        from dtpo.devices.simulated import reopen_simulated

        return reopen_simulated(rest)
    raise DeviceError(f"unknown device kind in journal key {key!r}")


def restore_pending(journal: KnobJournal | None = None, opener: Opener = open_by_key,
                    log: Callable[[str], None] | None = None) -> list[str]:
    """Restore every device a previous dtpo process left changed on this machine.

    Returns:
        One line per device: restored, or why it could not be (its entry is then kept).
    """
    journal = journal or KnobJournal()
    lines = []
    for key, entry in journal.entries().items():
        original = journal.original(key)
        assert original is not None
        try:
            device = opener(key)
            try:
                apply_state(device, original)
            finally:
                device.close()
        except DeviceError as exc:
            lines.append(f"could not restore {entry.get('device', key)}: {exc}; it stays in {journal.path}")
            continue
        journal.forget(key)
        lines.append(f"restored {entry.get('device', key)} (left by pid {entry.get('pid')}): "
                     f"{describe_state(original)}")
    if log is not None:
        for line in lines:
            log(line)
    return lines
