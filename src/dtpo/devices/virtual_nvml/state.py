"""The shared state file of the virtual GPUs, mirrored from ``state.h`` with ctypes.

The stand-in for ``libnvidia-ml.so.1`` maps ``<dir>/state.bin`` and updates it under ``flock``; this module
writes it in the first place and injects faults afterwards under the same lock, so a
change made here and a change made through NVML never interleave.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

MAGIC = 0x55504756
VERSION = 4
MAX_GPUS = 16
MAX_CLOCKS = 512
LIMIT_POINTS = 64
TEXT = 96
NOTE = 256
SMOOTHING_PROFILES = 5
SMOOTHING_PARAMS = 4  # floor (% of TMP), ramp up (mW/s), ramp down (mW/s), hysteresis (ms)

HAS_ENERGY_COUNTER = 1
HAS_LOCKED_CLOCKS = 2
HAS_MIG = 4
HAS_POWER_SMOOTHING = 8

STATE_FILE = "state.bin"
CALL_LOG = "calls.log"


class GpuState(ctypes.Structure):
    """One virtual GPU (``vg_gpu`` in ``state.h``; the same fields, in the same order)."""

    _fields_ = [
        ("name", ctypes.c_char * TEXT),
        ("uuid", ctypes.c_char * TEXT),
        ("note", ctypes.c_char * NOTE),
        ("flags", ctypes.c_uint32),
        ("min_limit_mw", ctypes.c_uint32),
        ("max_limit_mw", ctypes.c_uint32),
        ("default_limit_mw", ctypes.c_uint32),
        ("limit_mw", ctypes.c_uint32),
        ("mem_clock_mhz", ctypes.c_uint32),
        ("locked_min_mhz", ctypes.c_uint32),
        ("locked_max_mhz", ctypes.c_uint32),
        ("lost", ctypes.c_uint32),
        ("lose_after_reads", ctypes.c_uint32),
        ("reads", ctypes.c_uint32),
        ("n_limits", ctypes.c_uint32),
        ("n_clocks", ctypes.c_uint32),
        ("idle_w", ctypes.c_float),
        ("utilization", ctypes.c_float),
        ("slow_factor", ctypes.c_float),
        ("limit_w", ctypes.c_float * LIMIT_POINTS),
        ("limit_busy_w", ctypes.c_float * LIMIT_POINTS),
        ("limit_clock_mhz", ctypes.c_float * LIMIT_POINTS),
        ("clocks_mhz", ctypes.c_uint32 * MAX_CLOCKS),
        ("clock_busy_w", ctypes.c_float * MAX_CLOCKS),
        ("limit_time_factor", ctypes.c_float * LIMIT_POINTS),
        ("clock_time_factor", ctypes.c_float * MAX_CLOCKS),
        ("energy_offset_mj", ctypes.c_uint64),
        ("energy_mj", ctypes.c_double),
        ("updated_ns", ctypes.c_int64),
        ("smoothing_enabled", ctypes.c_uint32),
        ("smoothing_profile", ctypes.c_uint32),
        ("smoothing_min_floor_pct", ctypes.c_float),
        ("smoothing_max_floor_pct", ctypes.c_float),
        ("smoothing_params", (ctypes.c_double * SMOOTHING_PARAMS) * SMOOTHING_PROFILES),
    ]


class State(ctypes.Structure):
    """The whole file (``vg_state``)."""

    _fields_ = [
        ("magic", ctypes.c_uint32),
        ("version", ctypes.c_uint32),
        ("count", ctypes.c_uint32),
        ("root", ctypes.c_uint32),
        ("log_calls", ctypes.c_uint32),
        ("slow_steps", ctypes.c_uint32),
        ("driver_version", ctypes.c_char * 80),
        ("gpus", GpuState * MAX_GPUS),
    ]


def write_new(path: Path, state: State) -> None:
    """Write a fresh state file (atomically: a process that maps it never sees half of one)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as out:
        out.write(bytes(state))
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


@contextmanager
def locked(path: Path) -> Iterator[State]:
    """A copy of the state, read and written back under the lock the stand-in takes (written back only when the
    block ends without an exception).

    Raises:
        FileNotFoundError: No state file at ``path``.
        ValueError: The file is not a state file of this version.
    """
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        if os.fstat(fd).st_size != ctypes.sizeof(State):
            raise ValueError(f"{path} is not a virtual-GPU state file of this dtpo (size differs)")
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            state = State.from_buffer_copy(os.pread(fd, ctypes.sizeof(State), 0))
            if state.magic != MAGIC or state.version != VERSION:
                raise ValueError(f"{path} is not a virtual-GPU state file of this dtpo")
            yield state
            os.pwrite(fd, bytes(state), 0)  # the page cache the stand-in maps: seen by every process at once
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
