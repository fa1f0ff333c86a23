"""Energy from polled power: a background sampler that integrates watts over time with the trapezoid rule.

Used where a device reports power but has no energy counter (GPUs older than Volta through NVML) and reusable
by any backend that can read watts. Reading :meth:`PowerIntegrator.energy_j` takes a fresh sample first, so a
window that ends between two polls is not short by up to one interval.

A failed read never turns into missing or zero energy: it is counted (:attr:`PowerIntegrator.errors`) and the
next good sample bridges the gap with one trapezoid. Only when reads keep failing
(:attr:`PowerIntegrator.max_consecutive_errors` in a row) does :meth:`PowerIntegrator.energy_j` raise
:class:`~dtpo.devices.base.DeviceError`, so that the caller marks the device lost instead of reporting a flat line.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from dtpo.devices.base import DeviceError


class PowerIntegrator:
    """Integrates a power reading over time on a daemon thread.

    Args:
        read_power_w: Returns the current power in watts; may raise on a transient failure.
        interval_s: Polling period of the background thread.
        clock: Monotonic clock in seconds; injectable so tests drive time explicitly.
        name: What is measured, for error messages (e.g. ``"gpu0"``).
        max_consecutive_errors: Failed reads in a row after which :meth:`energy_j` raises.

    Attributes:
        errors: Failed reads since the start (transient failures included).
        consecutive_errors: Failed reads since the last good one.
        last_error: The most recent failure, or ``None``.
        samples: Good reads since the start.
    """

    def __init__(self, read_power_w: Callable[[], float], interval_s: float,
                 clock: Callable[[], float] = time.monotonic, name: str = "device",
                 max_consecutive_errors: int = 10) -> None:
        if not interval_s > 0:
            raise ValueError(f"polling interval must be positive, got {interval_s!r}")
        self._read = read_power_w
        self.interval_s = interval_s
        self._clock = clock
        self.name = name
        self.max_consecutive_errors = max_consecutive_errors
        self.errors = 0
        self.consecutive_errors = 0
        self.last_error: BaseException | None = None
        self.samples = 0
        self._energy = 0.0
        self._last: tuple[float, float] | None = None  # (time, watts) of the last good sample
        # One lock around read *and* integrate: two threads sampling at once must not integrate out of order.
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopped = False

    def sample_once(self) -> float | None:
        """Read power now and add the trapezoid since the previous good sample.

        Returns:
            The power read, or ``None`` if the read failed (the failure is counted, energy is kept).
        """
        with self._lock:
            if self._stopped:
                return None
            return self._sample_locked()

    def _sample_locked(self) -> float | None:
        try:
            watts = float(self._read())
            if not math.isfinite(watts) or watts < 0:
                raise ValueError(f"implausible power reading {watts!r} W")
        except Exception as exc:  # whatever the reader raises, it is one failed poll, not the end of the device
            self.errors += 1
            self.consecutive_errors += 1
            self.last_error = exc
            return None
        now = self._clock()
        if self._last is not None:
            t0, w0 = self._last
            if now > t0:
                self._energy += (w0 + watts) / 2 * (now - t0)
        self._last = (now, watts)
        self.samples += 1
        self.consecutive_errors = 0
        return watts

    def start(self) -> None:
        """Take the first sample and start polling in the background.

        Raises:
            DeviceError: The first reading failed, so there is nothing to integrate from.
        """
        if self._thread is not None:
            return
        if self.sample_once() is None:
            raise DeviceError(f"{self.name}: cannot read power: {_describe(self.last_error)}")
        self._thread = threading.Thread(target=self._run, name=f"dtpo-power-{self.name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample_once()

    def stop(self) -> None:
        """Take a last sample, stop the thread; :meth:`energy_j` then keeps returning the final total."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(5.0, 2 * self.interval_s))
            self._thread = None
        with self._lock:
            if not self._stopped:
                self._sample_locked()
                self._stopped = True

    def energy_j(self) -> float:
        """Joules integrated from the first sample up to now (a fresh sample is taken first).

        Raises:
            DeviceError: The last :attr:`max_consecutive_errors` reads all failed: the energy would be stale.
        """
        with self._lock:
            if not self._stopped:
                self._sample_locked()
            if self.consecutive_errors >= self.max_consecutive_errors:
                raise DeviceError(f"{self.name}: power unreadable for the last {self.consecutive_errors} polls: "
                                  f"{_describe(self.last_error)}")
            return self._energy

    def last_power_w(self) -> float | None:
        """The most recent good power reading, if any."""
        with self._lock:
            return None if self._last is None else self._last[1]


def _describe(exc: BaseException | None) -> str:
    """One line for an exception: its message, or its type when the message is empty."""
    if exc is None:
        return "no reading"
    text = " ".join(str(exc).split())
    return text or type(exc).__name__
