"""Energy per window of training steps, and over the measured part of a run, on one rank: a callback.

The run window opens when the first measured (post-warm-up) step starts. The Session closes a window every
``window_steps`` measured steps; this callback, first in the list, fills each window's energy from one
snapshot of every device, which also opens the next window, so the windows add up exactly to the run window.
While the power sampler runs, a modelled device's share of that snapshot extends its last sample
(:meth:`~dtpo.energy.monitor.Monitor.snapshot`): a window's energy is then as fine as the sampler's period.
"""

from __future__ import annotations

import csv
import logging
import os
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from dtpo.core.callbacks import Callback
from dtpo.core.record import RankRecord, rank_record_path
from dtpo.core.steps import RunView, Window
from dtpo.devices.discovery import Discovery
from dtpo.energy.monitor import Monitor, Snapshot, WindowMeasurement
from dtpo.telemetry.trace import TIMELINE_START

log = logging.getLogger(__name__)

RUN_WINDOW = "run"
CURRENT_WINDOW = "current"


class EnergyCallback(Callback):
    """Measures energy over the Session's windows and over the run.

    Args:
        discovery: The devices this rank counts and how they were chosen.
        warmup_steps: Steps before the run window opens.
        sample_interval_s: Period of the power timeline (``None``: no sampler thread).
    """

    def __init__(self, discovery: Discovery, warmup_steps: int, sample_interval_s: float | None = 0.1) -> None:
        self.discovery = discovery
        self.warmup_steps = warmup_steps
        self.monitor = Monitor(discovery.devices, sample_interval_s=sample_interval_s,
                               on_lost=lambda msg: log.warning("%s", msg))
        self.windows: list[dict[str, Any]] = []
        self._open = False
        self._boundary: Snapshot | None = None  # the snapshot that closed the latest window
        self._run: WindowMeasurement | None = None
        self._closed = False
        self._gaps: list[WindowMeasurement] = []  # spans between windows kept out of the run (grid pauses)
        self._live_section = False  # this rank's record carries the live energy section

    def on_step_begin(self, session: RunView, step: int) -> bool:
        """Open the run window at the start of the first measured step; then (``True``) not be called again."""
        if not self._open and self._run is None and step == getattr(session, "start_step", 0) + self.warmup_steps:
            snap = self.monitor.snapshot()
            self.monitor.begin_window(RUN_WINDOW, at=snap)
            self._boundary = snap  # where the current window starts (measured from it, not opened in the monitor)
            self._open = True
        return self._open or self._run is not None

    def on_window_end(self, session: RunView, window: Window) -> None:
        """Fill the window's energy and open the next window at the same instant."""
        if not self._open:
            return
        start, snap = self._boundary, self.monitor.snapshot(between_samples=True)
        assert start is not None  # set when the run window opened
        measured = self.monitor.measure(CURRENT_WINDOW, start, snap)
        self._boundary = snap
        window.energy_j = dict(measured.energy_j)
        window.sources = dict(measured.sources)
        window.estimated = measured.estimated
        self.windows.append({"first_step": window.first_step, "last_step": window.last_step, **measured.to_dict()})
        if not self._live_section:  # partial records written from now on carry the windows
            rank = session.rank_record
            if rank.energy is None:
                rank.energy = self.section(live=True)
            self._live_section = True

    def skip_gap(self) -> WindowMeasurement | None:
        """Keep the time since the last window ended out of the run (a pause between windows, its checkpoint
        included): the next window starts now, and the run window's time and energy leave this span out.

        Returns:
            The span's own time and energy (``None`` when the run window is not open).
        """
        if not self._open or self._boundary is None:
            return None
        snap = self.monitor.snapshot()
        gap = self.monitor.measure("gap", self._boundary, snap)
        self._boundary = snap
        self._gaps.append(gap)
        return gap

    def on_rank_end(self, session: RunView, rank_record: RankRecord) -> None:
        """Close the run window where the last window ended, stop the sampler, keep this rank's energy section
        and write its power timeline."""
        self.close()
        rank_record.energy = self.section()
        rows = self.timeline_rows()
        if rows:
            rank_record.energy[TIMELINE_START] = self.monitor.unix_time(rows[0]["t"])
            path = rank_record_path(session.run_dir, rank_record.rank, session.record.attempt).with_name(
                f"power-rank{rank_record.rank:05d}.csv")
            try:
                write_power_timeline(path, rows)
            except OSError as exc:
                log.warning("cannot write the power timeline %s (%s)", path, exc.strerror or exc)

    def close(self) -> None:
        """End the run window at the last window boundary and release the devices (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._open:
            self._run = _less(self.monitor.end_window(RUN_WINDOW, at=self._boundary), self._gaps)
            self._open = False
        self.monitor.close()

    def section(self, live: bool = False) -> dict[str, Any]:
        """This rank's energy as recorded: devices, notes, windows, the run window, lost devices.

        Args:
            live: Share the window list and lost-device map instead of copying them, so the section grows
                with the run at no cost (what partial records carry while training goes on).
        """
        section = {
            "devices": [asdict(d.info) for d in self.discovery.devices],
            "notes": list(self.discovery.notes),
            "estimated": self.discovery.estimated,
            "windows": self.windows if live else list(self.windows),
            "run": self._run.to_dict() if self._run else None,
            "lost": self.monitor.lost if live else dict(self.monitor.lost),
        }
        if self._gaps:  # spans kept out of the run (grid pauses): their own time and energy
            section["gaps"] = [gap.to_dict() for gap in self._gaps]
        return section

    def timeline_rows(self) -> list[dict[str, float]]:
        """The power timeline as rows of ``t`` and one column per device (watts)."""
        return [{"t": p.t, **p.power_w} for p in self.monitor.timeline]


def _less(run: WindowMeasurement, gaps: list[WindowMeasurement]) -> WindowMeasurement:
    """``run`` without the time and energy of ``gaps`` (spans inside it)."""
    if not gaps:
        return run
    energy = {name: joules - sum(gap.energy_j.get(name, 0.0) for gap in gaps) for name, joules in run.energy_j.items()}
    return replace(run, time_s=run.time_s - sum(gap.time_s for gap in gaps), energy_j=energy)


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
