"""dtpo monitor: a bounded live reading of every power source, with a CSV."""

from __future__ import annotations

import csv
import subprocess
from pathlib import Path

from conftest import dtpo_cli


def test_monitor_reads_for_a_duration_and_writes_csv(tmp_path: Path) -> None:
    out = tmp_path / "power.csv"
    result = subprocess.run(dtpo_cli("monitor", "--interval", "0.2", "--duration", "1", "--csv", str(out),
                                     "--cpu-tdp", "30"), capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    rows = list(csv.DictReader(out.open()))
    cpu = [r for r in rows if r["device"] == "cpu (modelled)"]
    assert len(cpu) >= 3
    energies = [float(r["energy_j"]) for r in cpu]
    assert energies == sorted(energies) and energies[-1] > 0
    assert all(r["estimated"] == "True" for r in cpu)
    assert "(estimated)" in result.stdout
    assert "modelled, estimated" in result.stderr  # says what it picked and why


def test_monitor_rejects_a_negative_interval() -> None:
    result = subprocess.run(dtpo_cli("monitor", "--interval", "-1"), capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip() == "dtpo: error: --interval must be positive, got -1"
