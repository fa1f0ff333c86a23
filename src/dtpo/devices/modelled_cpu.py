"""A modelled CPU (and DRAM): power from the processor's TDP and its measured load, always *estimated*.

Used where no hardware counter can be read (no RAPL: most VMs, macOS, unprivileged containers).

The model, and what it assumes:

* **CPU.** ``P = n_cpus * W_cpu * (IDLE_SHARE + (1 - IDLE_SHARE) * u)`` where ``n_cpus`` is the number of
  logical CPUs this node exposes, ``W_cpu`` the package TDP divided by the package's logical CPUs (so a
  2-vCPU VM on a 128-thread host is charged for 2 threads, not the whole package), and ``u`` the node's
  CPU utilisation from ``/proc/stat`` (busy time over total time, all processes). ``IDLE_SHARE = 0.3``:
  servers idle at about 25-35 % of their maximum power in published SPECpower results. TDP is a thermal
  design figure, not a measurement; real draw under load can differ by tens of percent either way.
* **DRAM.** ``P = 0.375 W per GiB`` of installed memory (the figure CodeCarbon uses: 3 W per 8 GiB), not
  load dependent.
* Because ``P`` is linear in ``u``, energy over any interval is exactly ``P(mean u) * dt``, and the mean
  utilisation over an interval is what ``/proc/stat`` deltas give. So no sampling thread is needed: each
  read integrates from the previous one.
* ``/proc/stat`` counts CPU time in clock ticks (``USER_HZ``, 100 per second on Linux), so a read less than one
  tick after the previous one could not see the load change: such a read extends the energy at the power of
  the last interval and leaves ``/proc/stat`` alone (reading it costs about 5 us, and ten times that after a
  training step has left the kernel's caches cold); the next read of the file integrates the utilisation over
  the whole span since the last one. The energy stays monotonic and every read's figure is final.

The TDP comes from ``--cpu-tdp`` (the user's figure), else from :data:`CPU_TDP` (a small table matched on
the model name), else a default of :data:`DEFAULT_W_PER_CPU` per logical CPU; :attr:`tdp_source` says which.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dtpo.devices.base import Device, DeviceError, DeviceInfo

IDLE_SHARE = 0.3
DRAM_W_PER_GIB = 0.375
DEFAULT_W_PER_CPU = 4.0


def clock_tick_s() -> float:
    """The unit ``/proc/stat`` counts CPU time in (``1 / USER_HZ``; 10 ms where the system does not say)."""
    try:
        return 1.0 / float(os.sysconf("SC_CLK_TCK"))
    except (ValueError, OSError, AttributeError):
        return 0.01


@dataclass(frozen=True)
class CpuTdp:
    """Datasheet TDP of a processor model.

    Attributes:
        match: Lower-case substring of ``/proc/cpuinfo``'s model name.
        tdp_w: Package TDP in watts.
        threads: Logical CPUs per package.
    """

    match: str
    tdp_w: float
    threads: int


# More specific entries first. Threads are per package (cores x SMT).
CPU_TDP: tuple[CpuTdp, ...] = (
    CpuTdp("epyc 9654", 360, 192),
    CpuTdp("epyc 9554", 360, 128),
    CpuTdp("epyc 7763", 280, 128),
    CpuTdp("epyc 7742", 225, 128),
    CpuTdp("epyc 7r13", 280, 96),
    CpuTdp("epyc 7543", 225, 64),
    CpuTdp("xeon platinum 8480", 350, 112),
    CpuTdp("xeon platinum 8380", 270, 80),
    CpuTdp("xeon platinum 8375c", 300, 64),
    CpuTdp("xeon platinum 8275cl", 240, 48),
    CpuTdp("xeon gold 6348", 235, 56),
    CpuTdp("xeon gold 6248", 150, 40),
    CpuTdp("core(tm) i9-13900k", 125, 32),
    CpuTdp("core(tm) i7-12700", 65, 20),
    CpuTdp("apple m2", 20, 8),
)


def read_cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The first ``model name`` in ``/proc/cpuinfo`` (empty if unreadable)."""
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def watts_per_cpu(model: str, cpu_tdp_w: float | None = None, n_cpus: int = 1) -> tuple[float, str]:
    """TDP share of one logical CPU, and where it came from.

    Args:
        model: Processor model name.
        cpu_tdp_w: The user's TDP for the CPUs this node exposes (``--cpu-tdp``), if given.
        n_cpus: Logical CPUs this node exposes.
    """
    if cpu_tdp_w is not None:
        if cpu_tdp_w <= 0:
            raise DeviceError(f"--cpu-tdp must be positive, got {cpu_tdp_w:g}")
        return cpu_tdp_w / n_cpus, f"--cpu-tdp {cpu_tdp_w:g} W for {n_cpus} logical CPUs"
    lowered = model.lower()
    for entry in CPU_TDP:
        if entry.match in lowered:
            return entry.tdp_w / entry.threads, f"table: {entry.match} {entry.tdp_w:g} W / {entry.threads} threads"
    return DEFAULT_W_PER_CPU, f"default {DEFAULT_W_PER_CPU:g} W per logical CPU ({model or 'unknown CPU'} not in table)"


def _parse_cpu_line(line: str, stat: Path) -> tuple[int, int]:
    """(busy, total) jiffies from the aggregate ``cpu`` line of ``/proc/stat``."""
    fields = line.split()
    if not fields or fields[0] != "cpu":
        raise DeviceError(f"{stat} has no aggregate 'cpu' line")
    values = [int(v) for v in fields[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    total = sum(values[:8])  # guest time is already inside user/nice
    return total - idle, total


def read_cpu_times(stat: Path = Path("/proc/stat")) -> tuple[int, int]:
    """(busy, total) jiffies over all CPUs from the aggregate ``cpu`` line of ``/proc/stat``."""
    try:
        line = stat.read_text().split("\n", 1)[0]
    except OSError as exc:
        raise DeviceError(f"cannot read {stat} for the CPU load model: {exc.strerror or exc}") from None
    return _parse_cpu_line(line, stat)


class ProcStatReader:
    """:func:`read_cpu_times` through one file descriptor kept open and re-read from offset 0.

    The power sampler reads the CPU load at every tick (10 Hz by default); opening ``/proc/stat`` by path and
    decoding the whole file each time cost about as much again as the kernel's work to produce it, in a
    thread that wakes with cold caches. ``pread`` at offset 0 makes the kernel regenerate the file, so every
    read is fresh; only the first line is decoded.

    Args:
        stat: The file to read (tests pass a fake one).
    """

    def __init__(self, stat: Path = Path("/proc/stat")) -> None:
        self.stat = stat
        try:
            self._fd: int | None = os.open(stat, os.O_RDONLY)
        except OSError as exc:
            raise DeviceError(f"cannot read {stat} for the CPU load model: {exc.strerror or exc}") from None

    def __call__(self) -> tuple[int, int]:
        """(busy, total) jiffies now."""
        if self._fd is None:
            raise DeviceError(f"{self.stat} is closed")
        try:
            head = os.pread(self._fd, 4096, 0)  # the aggregate line comes first and is far shorter
        except OSError as exc:
            raise DeviceError(f"cannot read {self.stat} for the CPU load model: {exc.strerror or exc}") from None
        return _parse_cpu_line(head.split(b"\n", 1)[0].decode("ascii", "replace"), self.stat)

    def close(self) -> None:
        """Close the file descriptor. Idempotent."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


class ModelledCpu(Device):
    """The node's CPUs, modelled from TDP and measured load. Always ``estimated``.

    Args:
        cpu_tdp_w: The user's TDP figure for the CPUs this node exposes, if any.
        n_cpus: Logical CPUs of the node (default: ``os.cpu_count()``).
        read_times: Returns (busy, total) CPU time; injectable for tests (default: a :class:`ProcStatReader`
            on ``/proc/stat``, closed by :meth:`close`).
        clock: Monotonic clock; injectable for tests.
        model: The processor's model name (default: from ``/proc/cpuinfo``).
        min_read_interval_s: Reads closer than this to the last read of the CPU times extend the energy at the
            last power instead of reading them again (default: one clock tick, :func:`clock_tick_s`; 0 reads
            every time).
    """

    def __init__(self, cpu_tdp_w: float | None = None, n_cpus: int | None = None,
                 read_times: Callable[[], tuple[int, int]] | None = None,
                 clock: Callable[[], float] = time.monotonic, model: str | None = None,
                 min_read_interval_s: float | None = None) -> None:
        self.n_cpus = n_cpus or os.cpu_count() or 1
        self.min_read_interval_s = clock_tick_s() if min_read_interval_s is None else min_read_interval_s
        self.model = read_cpu_model() if model is None else model
        self.w_per_cpu, self.tdp_source = watts_per_cpu(self.model, cpu_tdp_w, self.n_cpus)
        self._reader = ProcStatReader() if read_times is None else None
        self._read_times: Callable[[], tuple[int, int]] = read_times or self._reader  # type: ignore[assignment]
        self._clock = clock
        self._lock = threading.Lock()
        self._closed = False
        try:
            self._last_times = self._read_times()
        except DeviceError:
            self.close()
            raise
        self._last_t = clock()  # where the energy was integrated up to
        self._last_read_t = self._last_t  # when the CPU times were last read
        self._energy = 0.0
        self._last_power: float | None = None
        self.info = DeviceInfo(
            name="cpu (modelled)", kind="cpu", source="modelled", estimated=True, node_shared=True,
            detail=f"{self.model or 'unknown CPU'}, {self.n_cpus} logical CPUs; TDP from {self.tdp_source}; "
            f"P = TDP share x ({IDLE_SHARE:g} + {1 - IDLE_SHARE:g} x utilisation)")

    def power_at(self, utilisation: float) -> float:
        """Modelled power at a utilisation in [0, 1]."""
        u = min(max(utilisation, 0.0), 1.0)
        return self.n_cpus * self.w_per_cpu * (IDLE_SHARE + (1 - IDLE_SHARE) * u)

    def energy_j(self) -> float:
        """Modelled joules since opening, integrated up to now (up to :meth:`close`, once closed).

        Within :attr:`min_read_interval_s` of the last read of the CPU times the energy grows at the last
        interval's power, without reading them (they count in clock ticks: they could not have seen the change).
        """
        with self._lock:
            if self._closed:
                return self._energy
            now = self._clock()
            if self._last_power is not None and now - self._last_read_t < self.min_read_interval_s:
                return self._extend(now)
            return self._read()

    def energy_j_between_samples(self) -> float:
        """Modelled joules up to now, extended at the last interval's power without reading the CPU times: a power
        sampler reads them on its own schedule (every 0.1 s by default), and a window's end between two samples
        takes its energy from the last one (reading ``/proc/stat`` there cost 100 us with the caches cold after a
        DDP step). Before the first interval's power is known the CPU times are read."""
        with self._lock:
            if self._closed:
                return self._energy
            return self._read() if self._last_power is None else self._extend(self._clock())

    def _extend(self, now: float) -> float:
        """The energy grown at the last interval's power up to ``now`` (the lock held)."""
        power = self._last_power
        assert power is not None
        dt = now - self._last_t
        if dt > 0:
            self._energy += power * dt
            self._last_t = now
        return self._energy

    def _read(self) -> float:
        """The energy after reading the CPU times: the span since the last read at its mean utilisation (the lock
        held)."""
        busy, total = self._read_times()
        now = self._clock()
        last_busy, last_total = self._last_times
        d_busy, d_total = busy - last_busy, total - last_total
        dt = now - self._last_t
        if dt > 0:
            # the utilisation over the span since the last read, over the time not yet integrated
            util = d_busy / d_total if d_total > 0 else 0.0
            self._last_power = self.power_at(util)
            self._energy += self._last_power * dt
        self._last_times, self._last_t, self._last_read_t = (busy, total), now, now
        return self._energy

    def power_w(self) -> float | None:
        """Modelled power over the interval between the last two reads."""
        return self._last_power

    def close(self) -> None:
        """Close ``/proc/stat``; :meth:`energy_j` then keeps returning the energy up to the last read."""
        with self._lock:
            self._closed = True
            if self._reader is not None:
                self._reader.close()
                self._reader = None


class ModelledDram(Device):
    """The node's DRAM at a constant modelled power per GiB. Always ``estimated``."""

    def __init__(self, mem_bytes: int | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        if mem_bytes is None:
            mem_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        self.watts = DRAM_W_PER_GIB * mem_bytes / 2**30
        self._clock = clock
        self._start = clock()
        self.info = DeviceInfo(name="dram (modelled)", kind="dram", source="modelled", estimated=True,
                               node_shared=True,
                               detail=f"{mem_bytes / 2**30:.1f} GiB x {DRAM_W_PER_GIB} W/GiB = {self.watts:.1f} W")

    def energy_j(self) -> float:
        """Constant power times time since opening."""
        return self.watts * (self._clock() - self._start)

    energy_j_between_samples = energy_j  # nothing costly to spare: read, without the base class's extra call

    def power_w(self) -> float | None:
        """The constant modelled power."""
        return self.watts
