"""``dtpo monitor``: a live table of every power source on this machine (like ``nvidia-smi dmon`` for all)."""

from __future__ import annotations

import csv
import logging
import math
import time
from pathlib import Path

import typer
from rich.live import Live
from rich.table import Table

from dtpo.core.errors import ConfigError
from dtpo.devices.discovery import discover
from dtpo.energy.monitor import Monitor, Snapshot
from dtpo.telemetry.summary import make_console

log = logging.getLogger(__name__)


def readings_table(monitor: Monitor, start: Snapshot, now: Snapshot, power: dict[str, float]) -> Table:
    """One row per device: its source, current power and energy since the monitor started."""
    table = Table(title=f"dtpo monitor: {now.t - start.t:.1f} s", title_justify="left")
    for name in ("device", "source", "power", "energy", ""):
        table.add_column(name, justify="left" if name in ("device", "source", "") else "right")
    for device in monitor.devices:
        name = device.info.name
        if name in monitor.lost:
            table.add_row(name, device.info.source, "-", "-", f"lost: {monitor.lost[name]}")
            continue
        energy = now.energy_j.get(name, 0.0) - start.energy_j.get(name, 0.0)
        watts = power.get(name)
        table.add_row(name, device.info.source, "-" if watts is None else f"{watts:.1f} W", f"{energy:,.1f} J",
                      "estimated" if device.info.estimated else "")
    return table


def check_options(interval: float, duration: float | None, cpu_tdp: float | None, csv_path: Path | None) -> None:
    """Reject values that make no sense (zero, negative, nan, inf) and a CSV path that cannot be a file.

    Raises:
        ConfigError: One line naming the flag.
    """
    if not (math.isfinite(interval) and interval > 0):
        raise ConfigError(f"--interval must be a positive number of seconds, got {interval:g}")
    if duration is not None and not (math.isfinite(duration) and duration > 0):
        raise ConfigError(f"--duration must be a positive number of seconds, got {duration:g}")
    if cpu_tdp is not None and not (math.isfinite(cpu_tdp) and cpu_tdp > 0):
        raise ConfigError(f"--cpu-tdp must be a positive number of watts, got {cpu_tdp:g}")
    if csv_path is not None:
        if not str(csv_path).strip() or csv_path.is_dir():
            raise ConfigError(f"--csv must name a file, got the directory {str(csv_path) or '.'!r}")
        parent = csv_path.absolute().parent
        if not parent.is_dir():
            raise ConfigError(f"--csv {csv_path}: the directory {parent} does not exist")


def monitor_command(
    interval: float = typer.Option(1.0, help="Seconds between readings."),
    duration: float = typer.Option(None, help="Stop after this many seconds (default: until Ctrl-C)."),
    csv_path: Path = typer.Option(None, "--csv", help="Also append every reading to this CSV file."),
    cpu_tdp: float = typer.Option(None, help="CPU TDP in watts for the modelled CPU (where no RAPL exists)."),
) -> None:
    """Show power and energy of every GPU, CPU package and DRAM on this machine, live."""
    check_options(interval, duration, cpu_tdp, csv_path)
    found = discover(local_rank=None, gpus=True, node_shared=True, cpu_tdp_w=cpu_tdp)
    for note in found.notes:
        log.info("monitor: %s", note)
    if not found.devices:
        raise ConfigError("no power source could be opened on this machine: " + "; ".join(found.notes))
    monitor = Monitor(found.devices, sample_interval_s=None,
                      on_lost=lambda msg: log.warning("monitor: %s", msg))
    console = make_console()
    start = monitor.snapshot()
    deadline = None if duration is None else time.monotonic() + duration
    writer, fh = None, None
    if csv_path is not None:
        new = not csv_path.exists()
        try:
            fh = csv_path.open("a", newline="")
        except OSError as exc:
            monitor.close()
            raise ConfigError(f"--csv {csv_path}: cannot write it ({exc.strerror or exc})") from None
        writer = csv.writer(fh)
        if new:
            writer.writerow(["t_s", "device", "source", "estimated", "power_w", "energy_j"])
    live = Live(console=console, auto_refresh=False) if console.is_terminal else None
    try:
        if live:
            live.start()
        while deadline is None or time.monotonic() < deadline:
            wait = interval if deadline is None else min(interval, max(deadline - time.monotonic(), 0))
            time.sleep(wait)
            point = monitor.sample()
            now = monitor.last_snapshot
            table = readings_table(monitor, start, now, point.power_w)
            if live:
                live.update(table, refresh=True)
            else:
                parts = [f"{d.info.name} {point.power_w.get(d.info.name, float('nan')):.1f} W"
                         f"{' (estimated)' if d.info.estimated else ''}" for d in monitor.devices]
                console.print(f"t={now.t - start.t:7.1f} s  " + "  |  ".join(parts), highlight=False)
            if writer is not None:
                for d in monitor.devices:
                    name = d.info.name
                    if name in now.energy_j:
                        writer.writerow([f"{now.t - start.t:.3f}", name, d.info.source, d.info.estimated,
                                         f"{point.power_w.get(name, float('nan')):.3f}",
                                         f"{now.energy_j[name] - start.energy_j.get(name, 0.0):.3f}"])
                fh.flush()  # type: ignore[union-attr]
    except KeyboardInterrupt:
        pass
    finally:
        if live:
            live.stop()
        if fh is not None:
            fh.close()
        final = monitor.snapshot()
        monitor.close()
    total = sum(final.energy_j.get(n, 0.0) - start.energy_j.get(n, 0.0) for n in start.energy_j)
    label = " (estimated)" if found.estimated else ""
    console.print(f"total {total:,.1f} J{label} over {final.t - start.t:.1f} s")
