"""dtpo simulate: the curve with its optima marked; bad input is one line, exit 2, nothing changed."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import dtpo_cli


def run(args: list[str], state: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(dtpo_cli("simulate", *args), capture_output=True, text=True, timeout=120,
                          env={**os.environ, "DTPO_STATE_DIR": str(state), "COLUMNS": "200"})


def test_a_power_limit_sweep_marks_both_optima(tmp_path: Path) -> None:
    out = tmp_path / "sweep.json"
    result = run(["--gpu", "A40", "--workload", "resnet50", "--gpus", "4", "--steps", "100",
                  "--sweep", "power-limit", "--json", str(out)], tmp_path / "state")
    assert result.returncode == 0, result.stderr
    assert "energy-optimal" in result.stdout and "time-optimal" in result.stdout
    assert "simulated, not measured" in result.stdout
    data = json.loads(out.read_text())
    assert data["schema"] == "dtpo.simulate/1" and data["calibrated"] is True
    energies = [r["joules_per_sample"] for r in data["results"]]
    assert len(energies) >= 9 and min(energies) < energies[-1]  # capping saves energy on this trace
    assert not (tmp_path / "state" / "knobs-journal.json").exists()


def test_a_clock_sweep_on_an_untraced_gpu(tmp_path: Path) -> None:
    result = run(["--gpu", "H100-SXM", "--workload", "resnet50", "--gpus", "8", "--steps", "50",
                  "--sweep", "sm-clock"], tmp_path / "state")
    assert result.returncode == 0, result.stderr
    assert "parametric" in result.stdout and "energy-optimal" in result.stdout


@pytest.mark.parametrize(("args", "message"), [
    (["--gpu", "Z9000"], "Z9000"),
    (["--workload", "tetris"], "tetris"),
    (["--power-limit", "900"], "outside the range"),
    (["--sm-clock", "7"], "not supported"),
    (["--sweep", "voltage"], "--sweep"),
    (["--straggler", "two"], "RANK:FACTOR"),
])
def test_bad_input_is_one_line_and_changes_nothing(tmp_path: Path, args: list[str], message: str) -> None:
    state = tmp_path / "state"
    result = run(["--steps", "10", *args], state)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and lines[0].startswith("dtpo: error:")
    assert not (state / "knobs-journal.json").exists()
    assert not list(state.glob("sim/*/*.json"))
