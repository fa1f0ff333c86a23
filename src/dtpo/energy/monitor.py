"""Energy windows over all devices of a rank, and a background power timeline.

Like Zeus's ``ZeusMonitor``, a window is opened and closed by name; unlike it, a device that fails is
reported as lost instead of silently reading 0 J, devices shared by a node are counted once, and every
figure says where it came from.

A window reads every device's cumulative energy counter at its start and at its end, so windows may nest
and overlap freely: each is only a difference of two readings of monotonic counters.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from dtpo.devices.base import Device, DeviceError
from dtpo.energy.sample_rate import check_sample_interval


@dataclass(slots=True)
class Snapshot:
    """Every device's cumulative energy at one moment (a value: read, never changed; not frozen, since a frozen
    dataclass sets each field through ``object.__setattr__``, several times slower to build at each window's end).

    Attributes:
        t: Monotonic time of the reading.
        energy_j: Cumulative joules per device name (devices that could not be read are absent).
    """

    t: float
    energy_j: dict[str, float]


@dataclass(slots=True)
class WindowMeasurement:
    """Time and energy of one window on one rank (or, after :func:`combine`, on all ranks); a value, not frozen
    for the same reason as :class:`Snapshot`.

    Attributes:
        name: The window's name.
        time_s: Wall time of the window.
        energy_j: Joules per device over the window.
        sources: Energy source per device (``nvml-counter``, ``nvml-polled``, ``rapl``, ``modelled``, ...).
        estimated: True if any device's energy is modelled.
        lost: Devices that could not be read at the start or end of the window (their energy is missing).
    """

    name: str
    time_s: float
    energy_j: dict[str, float]
    sources: dict[str, str]
    estimated: bool
    lost: tuple[str, ...] = ()

    @property
    def total_j(self) -> float:
        """Joules over all devices."""
        return sum(self.energy_j.values())

    @property
    def average_power_w(self) -> float:
        """Mean power over the window."""
        return self.total_j / self.time_s if self.time_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {"name": self.name, "time_s": self.time_s, "energy_j": self.energy_j, "total_j": self.total_j,
                "sources": self.sources, "estimated": self.estimated, "lost": list(self.lost)}


@dataclass
class PowerSample:
    """Mean power of each device since the previous sample.

    Attributes:
        t: Monotonic time at the end of the interval.
        power_w: Watts per device name.
    """

    t: float
    power_w: dict[str, float] = field(default_factory=dict)


class Monitor:
    """Measures windows of time and energy over a rank's devices.

    Args:
        devices: The devices this rank counts (a node's shared devices on one rank of the node only).
        sample_interval_s: Period of the background power timeline; ``None`` for no sampler.
        clock: Monotonic clock.
        on_lost: Called once with a one-line message when a device stops answering.

    Raises:
        ConfigError: The interval is shorter than a device's source can resolve
            (:mod:`dtpo.energy.sample_rate`).
    """

    def __init__(self, devices: list[Device], sample_interval_s: float | None = 0.1,
                 clock: Callable[[], float] = time.monotonic,
                 on_lost: Callable[[str], None] | None = None) -> None:
        if sample_interval_s is not None and sample_interval_s <= 0:
            raise ValueError(f"sample interval must be positive, got {sample_interval_s:g}")
        if sample_interval_s is not None:
            check_sample_interval(devices, sample_interval_s)
        self.devices = list(devices)
        # what a window reports of each device, read once: (name, source, estimated) in device order
        self._described = [(d.info.name, d.info.source, d.info.estimated) for d in self.devices]
        # the devices still read: (name, read, read between samples), bound once; a lost device's name leaves
        self._readers = [(d.info.name, d.energy_j, d.energy_j_between_samples) for d in self.devices]
        self._clock = clock
        self._on_lost = on_lost
        self._lock = threading.Lock()
        self._open: dict[str, Snapshot] = {}
        self.lost: dict[str, str] = {}
        self.timeline: list[PowerSample] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._interval = sample_interval_s
        self._last_sample = self.snapshot()
        if sample_interval_s is not None and self.devices:
            self._thread = threading.Thread(target=self._run_sampler, name="dtpo-power-sampler", daemon=True)
            self._thread.start()

    @property
    def estimated(self) -> bool:
        """True if any device's energy is modelled."""
        return any(d.info.estimated for d in self.devices)

    def unix_time(self, t: float) -> float:
        """The Unix time of a reading taken at ``t`` on this monitor's monotonic clock."""
        return t + (time.time() - self._clock())

    def snapshot(self, between_samples: bool = False) -> Snapshot:
        """Read every device now; a device that fails is marked lost and left out from then on.

        Args:
            between_samples: While the sampler runs, let a modelled device extend its last sample rather than be
                read again (:meth:`~dtpo.devices.base.Device.energy_j_between_samples`): what a window's end asks.
        """
        readings: dict[str, float] = {}
        failed: list[tuple[str, DeviceError]] | None = None
        extend = between_samples and self._thread is not None
        with self._lock:
            t = self._clock()
            for name, read, read_between_samples in self._readers:
                try:
                    readings[name] = read_between_samples() if extend else read()
                except DeviceError as exc:
                    failed = failed or []  # made only when a device fails
                    failed.append((name, exc))
            if failed is not None:
                self._lose(failed, readings)
        return Snapshot(t, readings)

    def _lose(self, failed: list[tuple[str, DeviceError]], readings: dict[str, float]) -> None:
        """Mark the devices that failed to read as lost (the lock held): left out of ``readings`` and of every
        snapshot from now on, each told once."""
        for name, exc in failed:
            readings.pop(name, None)
            if name in self.lost:  # a second device of the same name
                continue
            self.lost[name] = str(exc)
            if self._on_lost is not None:
                self._on_lost(f"energy of {name} is no longer measured: {exc}")
        self._readers = [reader for reader in self._readers if reader[0] not in self.lost]

    @property
    def last_snapshot(self) -> Snapshot:
        """The snapshot taken by the latest :meth:`sample` (or at construction)."""
        return self._last_sample

    def begin_window(self, name: str, at: Snapshot | None = None) -> None:
        """Open a window; names must be unique among open windows.

        Args:
            name: The window's name.
            at: A snapshot to start from (the one that ended the previous window, for adjacent windows).
        """
        if name in self._open:
            raise ValueError(f"energy window {name!r} is already open")
        self._open[name] = at or self.snapshot()

    def end_window(self, name: str, at: Snapshot | None = None) -> WindowMeasurement:
        """Close a window and return its measurement.

        Args:
            name: The window's name.
            at: A snapshot to end at (lets adjacent windows share one reading, so they add up exactly).
        """
        try:
            start = self._open.pop(name)
        except KeyError:
            raise ValueError(f"energy window {name!r} is not open") from None
        end = at or self.snapshot()
        return self.measure(name, start, end)

    def measure(self, name: str, start: Snapshot, end: Snapshot) -> WindowMeasurement:
        """The window between two snapshots (one pass over the devices: this runs at every window's end)."""
        first, last = start.energy_j, end.energy_j
        energy: dict[str, float] = {}
        sources: dict[str, str] = {}
        lost: list[str] = []
        estimated = False
        for n, source, modelled in self._described:
            if n in first and n in last:
                energy[n] = last[n] - first[n]
                sources[n] = source
                if modelled:
                    estimated = True
            else:
                lost.append(n)
        return WindowMeasurement(name, end.t - start.t, energy, sources, estimated,
                                 tuple(sorted(set(lost))) if lost else ())  # a name two devices share, once

    @contextlib.contextmanager
    def window(self, name: str) -> Iterator[dict[str, WindowMeasurement]]:
        """``with monitor.window("epoch") as out: ...``; afterwards ``out["measurement"]`` holds the result."""
        out: dict[str, WindowMeasurement] = {}
        self.begin_window(name)
        try:
            yield out
        finally:
            out["measurement"] = self.end_window(name)

    def sample(self) -> PowerSample:
        """Append one point to the power timeline: each device's mean power since the previous point."""
        snap = self.snapshot()
        prev, self._last_sample = self._last_sample, snap
        dt = snap.t - prev.t
        powers = {n: (snap.energy_j[n] - prev.energy_j[n]) / dt for n in snap.energy_j
                  if n in prev.energy_j and dt > 0}
        point = PowerSample(snap.t, powers)
        self.timeline.append(point)
        return point

    def close(self) -> None:
        """Stop the sampler and close the devices."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        for device in self.devices:
            with contextlib.suppress(Exception):
                device.close()

    def _run_sampler(self) -> None:
        """Sample on a fixed schedule (not ``interval`` after each sample, which drifts later by the sample's own
        time, most at high rates); a sampler that fell behind skips ahead rather than catching up in a burst."""
        interval = self._interval
        assert interval is not None
        due = time.monotonic() + interval
        while not self._stop.wait(max(0.0, due - time.monotonic())):
            self.sample()
            due += interval
            now = time.monotonic()
            if due < now:
                due = now + interval


def combine(windows: list[WindowMeasurement], name: str | None = None) -> WindowMeasurement:
    """Combine one window measured on several ranks: energy summed (devices prefixed by rank), time the max."""
    energy: dict[str, float] = {}
    sources: dict[str, str] = {}
    lost: list[str] = []
    for rank, w in enumerate(windows):
        for dev, joules in w.energy_j.items():
            energy[f"rank{rank}/{dev}"] = joules
            sources[f"rank{rank}/{dev}"] = w.sources[dev]
        lost += [f"rank{rank}/{dev}" for dev in w.lost]
    return WindowMeasurement(name or (windows[0].name if windows else ""), max((w.time_s for w in windows),
                             default=0.0), energy, sources, any(w.estimated for w in windows), tuple(lost))

