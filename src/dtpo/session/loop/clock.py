"""Timestamps for the step breakdown: the CPU's monotonic clock, or CUDA events on a GPU.

On a GPU the host runs ahead of the device, so host timestamps would only say when work was queued.
CUDA events are recorded into the stream and read once per step, after one synchronisation at the end of
the step (which the loss's ``.item()`` in most loops does anyway).
"""

from __future__ import annotations

import time
from typing import Any

import torch


class CpuClock:
    """Host wall-clock timestamps (``time.perf_counter``): :meth:`mark` is ``time.perf_counter`` itself, called
    several times a step, with no Python frame of its own."""

    mark = staticmethod(time.perf_counter)  # a timestamp of now

    def seconds(self, start: Any, end: Any) -> float:
        """Seconds between two marks."""
        return end - start

    def settle(self) -> None:
        """Make the step's marks readable (nothing to wait for on the CPU)."""


class CudaClock:
    """CUDA event timestamps on the current stream of one device."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def mark(self) -> torch.cuda.Event:
        """An event recorded on the current stream."""
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, start: torch.cuda.Event, end: torch.cuda.Event) -> float:
        """Seconds between two recorded events (call :meth:`settle` first)."""
        return start.elapsed_time(end) / 1000.0

    def settle(self) -> None:
        """Wait for the device so the step's events have times."""
        torch.cuda.synchronize(self.device)


def clock_for(device: torch.device) -> CpuClock | CudaClock:
    """The right clock for a device."""
    return CudaClock(device) if device.type == "cuda" else CpuClock()
