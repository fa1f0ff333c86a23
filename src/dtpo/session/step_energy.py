"""Energy per window of training steps, and over the measured part of a run, on one rank.

The run window opens when the first measured (post-warm-up) step starts. Windows of ``window_steps`` steps
follow each other without a gap: one snapshot ends a window and starts the next, so the windows add up
exactly to the run window.
"""

from __future__ import annotations

import csv
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from dtpo.devices.discovery import Discovery
from dtpo.energy.monitor import Monitor, WindowMeasurement

RUN_WINDOW = "run"


class StepEnergy:
    """Measures energy windows aligned with optimizer steps.

    Args:
        discovery: The devices this rank counts and how they were chosen.
        window_steps: Steps per energy window.
        warmup_steps: Steps before the run window opens.
        sample_interval_s: Period of the power timeline (``None``: no sampler thread).
        on_lost: Called with a one-line message when a device stops answering.
    """

    def __init__(self, discovery: Discovery, window_steps: int, warmup_steps: int,
                 sample_interval_s: float | None = 0.1, on_lost: Any = None) -> None:
        self.discovery = discovery
        self.window_steps = window_steps
        self.warmup_steps = warmup_steps
        self.monitor = Monitor(discovery.devices, sample_interval_s=sample_interval_s, on_lost=on_lost)
        self.windows: list[dict[str, Any]] = []
        self._window_first_step: int | None = None
        self._boundary: Any = None  # snapshot that closed the latest window
        self._run: WindowMeasurement | None = None

    def step_starting(self, step: int) -> None:
        """Open the run window at the start of the first measured step."""
        if step == self.warmup_steps and self._window_first_step is None and self._run is None:
            snap = self.monitor.snapshot()
            self.monitor.begin_window(RUN_WINDOW, at=snap)
            self.monitor.begin_window(self._window_name(step), at=snap)
            self._window_first_step = step

    def step_ended(self, step: int) -> None:
        """Close the current window after its last step and open the next one at the same instant."""
        first = self._window_first_step
        if first is None or step - first + 1 < self.window_steps:
            return
        snap = self.monitor.snapshot()
        self._close_window(first, step, snap)
        self.monitor.begin_window(self._window_name(step + 1), at=snap)
        self._window_first_step = step + 1
        self._boundary = snap

    def finish(self, last_step: int) -> dict[str, Any]:
        """Close open windows and stop the sampler; returns this rank's energy section of the record."""
        if self._window_first_step is not None:
            snap = self.monitor.snapshot()
            if last_step >= self._window_first_step:
                self._close_window(self._window_first_step, last_step, snap)
            else:
                # No step since the last boundary: the run ends there, where the last step ended.
                self.monitor.end_window(self._window_name(self._window_first_step), at=snap)
                snap = self._boundary
            self._run = self.monitor.end_window(RUN_WINDOW, at=snap)
            self._window_first_step = None
        self.monitor.close()
        return self.section()

    def section(self) -> dict[str, Any]:
        """This rank's energy as recorded: devices, notes, windows, the run window, lost devices."""
        return {
            "devices": [asdict(d.info) for d in self.discovery.devices],
            "notes": list(self.discovery.notes),
            "estimated": self.discovery.estimated,
            "windows": list(self.windows),
            "run": self._run.to_dict() if self._run else None,
            "lost": dict(self.monitor.lost),
        }

    def timeline_rows(self) -> list[dict[str, float]]:
        """The power timeline as rows of ``t`` and one column per device (watts)."""
        return [{"t": p.t, **p.power_w} for p in self.monitor.timeline]

    def _close_window(self, first: int, last: int, snap: Any) -> None:
        window = self.monitor.end_window(self._window_name(first), at=snap)
        self.windows.append({"first_step": first, "last_step": last, **window.to_dict()})

    @staticmethod
    def _window_name(first_step: int) -> str:
        return f"steps-from-{first_step}"


def write_power_timeline(path: Path, rows: list[dict[str, float]]) -> None:
    """Write a power timeline as CSV (``t`` in seconds from the first sample, then watts per device)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    columns = sorted({k for row in rows for k in row} - {"t"})
    t0 = rows[0]["t"]
    tmp = path.with_suffix(".csv.tmp")
    with tmp.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["t_s", *[f"{c} [W]" for c in columns]])
        for row in rows:
            writer.writerow([f"{row['t'] - t0:.3f}", *[f"{row[c]:.3f}" if c in row else "" for c in columns]])
    os.replace(tmp, path)
