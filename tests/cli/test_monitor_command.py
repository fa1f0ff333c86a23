"""dtpo monitor: a bounded live reading of every power source, with a CSV."""

from __future__ import annotations

import csv
import subprocess
from pathlib import Path

import pytest
from conftest import dtpo_cli

from dtpo.cli.monitor import check_options
from dtpo.core.errors import ConfigError


@pytest.mark.slow
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


@pytest.mark.parametrize("options, message", [
    (dict(interval=-1.0), "--interval must be a positive number of seconds, got -1"),
    (dict(interval=float("nan")), "--interval must be a positive number of seconds, got nan"),
    (dict(interval=float("inf")), "--interval must be a positive number of seconds, got inf"),
    (dict(duration=float("nan")), "--duration must be a positive number of seconds, got nan"),
    (dict(duration=float("inf")), "--duration must be a positive number of seconds, got inf"),
    (dict(duration=0.0), "--duration must be a positive number of seconds, got 0"),
    (dict(cpu_tdp=float("nan")), "--cpu-tdp must be a positive number of watts, got nan"),
    (dict(cpu_tdp=float("-inf")), "--cpu-tdp must be a positive number of watts, got -inf"),
    (dict(csv_path="DIR"), "--csv must name a file, got the directory"),
    (dict(csv_path="DIR/missing/x.csv"), "--csv .*x.csv: the directory .*missing does not exist"),
])
def test_monitor_options_that_make_no_sense_are_refused(tmp_path: Path, options: dict, message: str) -> None:
    values = dict(interval=1.0, duration=None, cpu_tdp=None, csv_path=None) | options
    if values["csv_path"] is not None:
        values["csv_path"] = Path(str(values["csv_path"]).replace("DIR", str(tmp_path)))
    with pytest.raises(ConfigError, match=message):
        check_options(**values)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize("args, message", [
    (["--interval", "nan"], "dtpo: error: --interval must be a positive number of seconds, got nan"),
    (["--duration", "nan"], "dtpo: error: --duration must be a positive number of seconds, got nan"),
    (["--csv", "DIR"], "dtpo: error: --csv must name a file, got the directory 'DIR'"),
])
def test_monitor_refuses_in_one_line_with_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    args = [a.replace("DIR", str(tmp_path)) for a in args]
    result = subprocess.run(dtpo_cli("monitor", *args), capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == message.replace("DIR", str(tmp_path))
    assert list(tmp_path.iterdir()) == []
