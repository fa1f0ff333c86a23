"""``dtpo simulate --tune stragglers``: per-rank slowdown against no tuning, the clocks over the job, ``--json``;
bad requests are one line, exit 2, nothing left behind; the plain ``--straggler RANK:FACTOR`` still works."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import run_cli as run

from dtpo.cli.simulate_stragglers import run_stragglers
from dtpo.simulation.job import JobConfig

STATIC = ["simulate", "--gpus", "16", "--straggler", "3:1.2", "--tune", "stragglers", "--steps", "1000"]


def clock_rows(out: str) -> dict[str, list[str]]:
    """The clock table's rows by their rank label: ``{"3": ["1380*", ...], "other 60": [...]}``."""
    rows = {}
    for line in out.splitlines():
        match = re.match(r"\s*(\d+|other \d+)\s+((?:\d+\*?\s+)+)\d+\s+\d+%\s*$", line)
        if match:
            rows[match.group(1)] = match.group(2).split()
    return rows


def test_a_static_straggler_prints_the_clocks_and_a_saving(state: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(STATIC, capsys)
    assert code == 0, err
    assert "Traceback" not in out + err and err == ""  # no progress bar in a pipe
    # 1. the clocks over the job: the straggler sets the pace at full clock, the others run lower
    assert "each rank's SM clock (MHz) over the job" in out
    rows = clock_rows(out)
    assert set(rows) == {"3", "other 15"}  # the pace setter, and the 15 ranks that run alike as one row
    assert all(cell == "1380*" for cell in rows["3"])
    assert all(not cell.endswith("*") and int(cell) < 1380 for cell in rows["other 15"])
    assert "other 15: the mean of the ranks without a row" in out
    assert "Without tuning every rank runs free at 1,380 MHz throughout." in out
    # 2. the result table
    assert "no tuning" in out and "per-rank slowdown" in out
    for row in ("time", "energy", "average power", "energy per sample", "energy spent waiting", "slowdown",
                "bloat (noise-free)", "bloat recovered"):
        assert re.search(rf"^\s*{re.escape(row)}\s", out, re.MULTILINE), row
    saved = re.search(r"energy saved\s+([\d,.]+) kJ \(([\d.]+)%\)", out)
    assert saved is not None and float(saved.group(1).replace(",", "")) > 0 and float(saved.group(2)) > 0
    # 3. the caption
    assert "All figures are simulated, not measured (16 x A40, resnet50" in out
    assert "Straggler pattern: static (rank 3 computes 1.2x slower throughout)" in out
    assert not state.exists() or not list(state.rglob("*"))  # no journal or knob-state file left


def test_json_has_the_same_figures(state: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "out" / "stragglers.json"
    path.parent.mkdir()
    code, out, err = run([*STATIC, "--json", str(path)], capsys)
    assert code == 0, err
    assert f"results written to {path}" in out
    data = json.loads(path.read_text())
    assert data["schema"] == "dtpo.simulate/1" and data["knob"] == "stragglers" and data["simulated"] is True
    assert data["gpu"] == "A40" and data["workload"] == "resnet50/imagenet" and data["batch_size"] == 256
    config = data["config"]
    assert config["gpus"] == 16 and config["steps"] == 1000 and config["stragglers"] == [[3, 1.2]]
    assert config["pattern"] == "static" and config["period_steps"] == 500 and config["seed"] == 0
    base, tuned = data["no_tuning"], data["per_rank_slowdown"]
    for run_ in (base, tuned):
        assert set(run_) == {"time_s", "energy_j", "average_power_w", "joules_per_sample", "wait_energy_j",
                             "wait_energy_share"}
        assert run_["average_power_w"] == pytest.approx(run_["energy_j"] / run_["time_s"] / 16)
        assert run_["joules_per_sample"] == pytest.approx(run_["energy_j"] / (16 * 256 * 1000))
    assert data["energy_saved_j"] == pytest.approx(base["energy_j"] - tuned["energy_j"]) and data["energy_saved_j"] > 0
    assert data["energy_saved_share"] == pytest.approx(data["energy_saved_j"] / base["energy_j"])
    assert -0.01 < data["slowdown_share"] < 0.05
    assert tuned["wait_energy_share"] < base["wait_energy_share"]
    bloat = data["bloat"]
    assert bloat["bloat_j"] == pytest.approx(bloat["full_clock_j"] - bloat["just_in_time_j"]) and bloat["bloat_j"] > 0
    assert bloat["recovered_share"] == pytest.approx(data["energy_saved_j"] / bloat["bloat_j"])
    assert 0 < bloat["recovered_share"] < 1.5
    clocks = data["clocks"]
    assert len(clocks["per_window_mhz"]) == len(clocks["per_window_critical"]) == 1000 // 20
    assert all(len(row) == 16 for row in clocks["per_window_mhz"])
    assert 1 <= len(clocks["segments"]) <= 8 and all(s["critical"] == 3 for s in clocks["segments"])
    assert clocks["segments"][0]["first_step"] == 0 and clocks["segments"][-1]["last_step"] == 999
    assert sorted(p.name for p in path.parent.iterdir()) == ["stragglers.json"]  # no temporary left


@pytest.mark.parametrize(("args", "pattern"), [
    (["--straggler-pattern", "drifting", "--period", "250"],
     "drifting (rank 3 computes 1.2x slower at first; each slow rank hands its slowness on to the next rank every "
     "250 steps: 3 -> 4 -> 5 -> 6)"),
    (["--straggler-pattern", "intermittent", "--period", "250"],
     "intermittent (rank 3 computes 1.2x slower for 250 steps, then at full speed for as long, and so on)"),
    (["--straggler", "3:1.2,6:1.1"], "static (ranks 3, 6 compute 1.2x, 1.1x slower throughout)"),
])
def test_drifting_intermittent_and_several_stragglers_run(args: list[str], pattern: str, state: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["simulate", "--gpus", "8", "--straggler", "3:1.2", "--tune", "stragglers", "--steps",
                          "1000", *args], capsys)
    assert code == 0, err
    assert f"Straggler pattern: {pattern}." in out
    assert "energy saved" in out and "bloat recovered" in out
    rows = clock_rows(out)
    assert set(rows) == {str(r) for r in range(8)}  # 8 ranks: one row each
    if "drifting" in pattern:  # the pace setter moves on with the straggler
        paced = [next(r for r, cells in rows.items() if cells[i].endswith("*")) for i in range(len(rows["0"]))]
        assert paced[0] == "3" and paced[-1] == "6"


def test_a_large_job_groups_the_ranks_that_run_alike(state: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["simulate", "--gpus", "64", "--straggler", "5:1.3", "--tune", "stragglers", "--steps",
                          "300"], capsys)
    assert code == 0, err
    rows = clock_rows(out)
    assert "5" in rows and all(cell.endswith("*") for cell in rows["5"])
    others = [label for label in rows if label.startswith("other ")]
    assert len(others) == 1 and int(others[0].split()[1]) == 64 - (len(rows) - 1)
    assert len(rows) <= 9  # a few rows, not 64
    assert f"{others[0]}: the mean of the ranks without a row" in out


def test_both_runs_report_their_steps_to_the_progress_callback() -> None:
    job = JobConfig("A40", "resnet50", gpus=2, steps=50, stragglers=((1, 1.2),))
    done: list[int] = []
    run_ = run_stragglers(job, done.append)
    assert sum(done) == 2 * 50
    assert run_.tuned.energy_j < run_.baseline.energy_j


BAD = [
    (["--gpus", "16", "--straggler", "16:1.2"], "straggler rank 16 is not one of the 16 ranks (0-15)"),
    (["--straggler", "-1:1.2"], "straggler rank -1 is not one of the 8 ranks"),
    (["--straggler", "3:0"], "--straggler factor must be a finite number > 0, got '0'"),
    (["--straggler", "3:-1.5"], "--straggler factor must be a finite number > 0"),
    (["--straggler", "3:1.2,x"], "--straggler must be RANK:FACTOR[,RANK:FACTOR...]"),
    (["--straggler", "3:1.2,"], "--straggler must be RANK:FACTOR"),
    (["--straggler", "3:1.2,3:1.1"], "--straggler names rank 3 twice"),
    (["--straggler", "3:1.2", "--straggler-pattern", "zigzag"],
     "unknown straggler pattern 'zigzag'; choose one of static, drifting, intermittent"),
    ([], "--tune stragglers needs at least one --straggler RANK:FACTOR"),
    (["--straggler", "3:1.2", "--power-limit", "200"], "--tune stragglers chooses each rank's clock itself"),
    (["--straggler", "3:1.2", "--sm-clock", "1410"], "--tune stragglers chooses each rank's clock itself"),
    (["--straggler", "3:1.2", "--sweep", "power-limit"], "--tune stragglers chooses each rank's clock itself"),
    (["--straggler", "0:1.2", "--gpus", "1"], "--gpus must be between 2 and 1024 for stragglers, got 1"),
    (["--straggler", "3:1.2", "--period", "0"], "--period must be >= 1 step, got 0"),
    (["--straggler", "3:1.2", "--cost", "energy"], "--tune stragglers does not use --cost"),
    (["--straggler", "3:1.2", "--counter-period", "0.5"], "--tune stragglers does not use --counter-period"),
    (["--straggler", "3:1.2", "--model", "parametric"], "--tune stragglers picks the model itself"),
    (["--straggler", "3:1.2", "--seed", "-1"], "--seed must be >= 0"),
    (["--straggler", "3:1.2", "--noise", "-0.1"], "--noise must be a finite number >= 0"),
    (["--straggler", "3:1.2", "--gpus", "1024", "--steps", "10000"], "at most 5,000,000 GPU-steps"),
    (["--straggler", "3:1.2", "--gpu", "Z9000"], "Z9000"),
    (["--straggler", "3:1.2", "--json", "{tmp}/no/such/dir/x.json"], "does not exist"),
]
WITHOUT_TUNE = [
    (["--straggler", "3:1.2,5:1.1"], "--straggler 3:1.2,5:1.1 names 2 stragglers; only --tune stragglers"),
    (["--straggler", "3:1.2,5:1.1", "--tune", "power-limit"], "names 2 stragglers; only --tune stragglers"),
    (["--straggler", "3:1.2", "--straggler-pattern", "drifting"], "apply only to --tune stragglers"),
    (["--period", "100"], "--straggler-pattern and --period apply only to --tune stragglers"),
    (["--tune", "straggler"], "--tune must be one of power-limit, sm-clock, both, got 'straggler' (or stragglers"),
]


@pytest.mark.parametrize(("args", "message"), [*((["--tune", "stragglers", *a], m) for a, m in BAD), *WITHOUT_TUNE],
                         ids=[" ".join(a) for a, _ in [*BAD, *WITHOUT_TUNE]])
def test_bad_requests_are_one_line_and_exit_2(args: list[str], message: str, state: Path, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    monkeypatch.chdir(out_dir)
    code, out, err = run(["simulate", "--steps", "10", *(a.format(tmp=out_dir) for a in args)], capsys)
    assert code == 2, out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dtpo: error: ") and message in lines[0], err
    assert "Traceback" not in out + err
    assert not list(out_dir.rglob("*"))  # no results file
    assert not state.exists() or not list(state.rglob("*"))


def test_the_plain_single_straggler_still_works(state: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["simulate", "--straggler", "3:1.2", "--gpus", "4", "--steps", "50"], capsys)
    assert code == 0, err
    assert "Straggler: rank 3 x1.2." in out and "simulated, not measured" in out
    assert "per-rank slowdown" not in out
