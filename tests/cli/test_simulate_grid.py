"""dtpo simulate grid: every policy against signal-blind on the shipped UK trace, printed and written as JSON; bad
input is one line, exit 2, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_cli

UK_TRACE = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "uk_carbon_intensity_2023-03-14_19.csv"
SMALL_JOB = ["--gpus", "2", "--steps", "100"]


def _grid(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int | str | None, str, str]:
    return run_cli(["simulate", "grid", *SMALL_JOB, *args], capsys)


def test_every_policy_against_blind_on_the_uk_trace(state: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "grid.json"
    code, stdout, _ = _grid(["--grid-signal", str(UK_TRACE), "--deadline", "30", "--job-hours", "24",
                             "--json", str(out)], capsys)
    assert code in (0, None), stdout
    data = json.loads(out.read_text())
    assert data["schema"] == "dtpo.simulate.grid/1" and data["simulated"] is True
    assert data["signal"]["unit"] == "gCO2e/kWh" and data["signal"]["decided_on"] == "forecast"
    outcomes = data["outcomes"]
    assert set(outcomes) == {"blind", "throttle", "pause", "oracle-throttle", "oracle-pause", "oracle"}
    assert all(o["finished"] and o["time_s"] <= 30 * 3600 + 1e-6 for o in outcomes.values())
    blind = outcomes["blind"]
    assert blind["plan"] == ["300 W"] * 48 and blind["pauses"] == 0  # 24 h at the default, half-hour intervals
    assert outcomes["throttle"]["cost"] < blind["cost"]  # the evening peak is dearer than the night before it
    assert set(outcomes["pause"]["plan"]) <= {"300 W", "pause"}  # pause holds the default setting or pauses
    assert outcomes["oracle"]["cost"] <= min(o["cost"] for o in outcomes.values()) + 1e-6
    saving = 1 - outcomes["throttle"]["cost"] / blind["cost"]
    assert f"{saving:.1%}" in stdout and "Every figure is simulated" in stdout
    strips = {line.split()[0]: line for line in stdout.splitlines() if line.startswith(("signal ", "throttle "))}
    assert len(strips) == 2 and set(strips["throttle"].split(None, 1)[1]) <= set("▁▂▃▄▅▆▇█·")
    assert len(list((tmp_path / "runs").glob("simulate-*/simulate.json"))) == 1  # registered like every simulation


def test_one_policy_and_the_flags_only_spelling(state: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "grid.json"
    code, stdout, _ = run_cli(["simulate", *SMALL_JOB, "--grid-signal", str(UK_TRACE), "--grid-policy", "pause",
                               "--deadline", "12", "--start", "2023-03-15T12:00Z", "--resume-s", "0",
                               "--json", str(out)], capsys)
    assert code in (0, None), stdout
    data = json.loads(out.read_text())
    assert set(data["outcomes"]) == {"blind", "pause", "oracle-pause", "oracle"}
    assert data["job"]["start"] == "2023-03-15T12:00:00+00:00" and data["job"]["resume_s"] == 0
    assert data["job"]["deadline_s"] == 12 * 3600
    blind_hours = data["outcomes"]["blind"]["time_s"] / 3600
    assert blind_hours == pytest.approx(12 / 1.25)  # --job-hours left out: the deadline with 25 % slack


def _csv(tmp_path: Path, rows: list[str]) -> str:
    path = tmp_path / "signal.csv"
    path.write_text("time,value\n" + "\n".join(rows) + "\n")
    return str(path)


HOURLY = [f"2024-01-01T{h:02d}:00Z,{100 + 10 * h}" for h in range(24)]


@pytest.mark.parametrize(("args", "message"), [
    ([], "dtpo simulate grid needs --grid-signal FILE"),
    (["--deadline", "10"], "--deadline schedules a job against a grid signal; name the signal with --grid-signal"),
    (["--grid-signal", "{csv}"], "--grid-signal needs --deadline HOURS"),
    (["--grid-signal", "{csv}", "--deadline", "10", "--grid-policy", "sometimes"], "grid.policy must be one of"),
    (["--grid-signal", "{csv}", "--deadline", "nan"], "--deadline must be a finite number of hours > 0"),
    (["--grid-signal", "{csv}", "--deadline", "10", "--resume-s", "-1"], "--resume-s must be a finite number"),
    (["--grid-signal", "{csv}", "--deadline", "4", "--job-hours", "5"], "the deadline is already impossible"),
    (["--grid-signal", "{csv}", "--deadline", "30", "--job-hours", "5"], "but the job with its deadline runs"),
    (["--grid-signal", "{csv}", "--deadline", "5", "--start", "yesterday"], "--start must be an ISO time"),
    (["--grid-signal", "{csv}", "--deadline", "5", "--start", "2024-01-01T01:20Z"], "--start must be the start"),
    (["--grid-signal", "{tmp}/missing.csv", "--deadline", "5"], "cannot read it"),
    (["--grid-signal", "{unsorted}", "--deadline", "5"], "{unsorted}"),
])
def test_bad_input_is_one_line_and_writes_nothing(args: list[str], message: str, state: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    csv = _csv(tmp_path, HOURLY)
    unsorted = tmp_path / "unsorted.csv"
    unsorted.write_text("time,value\n" + "\n".join([HOURLY[1], HOURLY[0], *HOURLY[2:]]) + "\n")
    names = {"csv": csv, "tmp": tmp_path, "unsorted": unsorted}
    code, stdout, err = _grid([a.format(**names) for a in args], capsys)
    assert code == 2, stdout + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dtpo: error:") and message.format(**names) in lines[0], err
    assert not (tmp_path / "runs").exists()  # no run directory for a refused job


def test_grid_flags_without_a_signal_are_refused(state: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["simulate", "--steps", "10", "--deadline", "5"], capsys)
    assert code == 2 and err.strip() == ("dtpo: error: --deadline schedules a job against a grid signal; name the "
                                         "signal with --grid-signal FILE")
