"""dtpo simulate: the curve with its optima marked; bad input is one line, exit 2, nothing changed."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import dtpo_cli

from dtpo.cli.app import main


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
    (["--straggler", "1:nan"], "--straggler factor must be a finite number"),
    (["--straggler", "1:inf"], "--straggler factor must be a finite number"),
    (["--noise", "nan"], "--noise must be a finite number"),
    (["--noise", "inf"], "--noise must be a finite number"),
    (["--noise", "-0.1"], "--noise must be a finite number >= 0"),
    (["--counter-period", "nan"], "--counter-period must be a finite number"),
    (["--power-limit", "nan"], "--power-limit must be a finite number"),
    (["--power-limit", "-inf"], "--power-limit must be a finite number"),
    (["--gpus", "100000", "--steps", "100000"], "--gpus must be between 1 and 4,096, got 100,000"),
    (["--gpus", "99999999999999999999"], "--gpus must be between 1 and 4,096"),
    (["--steps", "100000000"], "--steps must be between 1 and 1,000,000"),
    (["--gpus", "4096", "--steps", "1000000"], "at most 500,000,000 GPU-steps"),
    (["--seed", "-1"], "--seed must be >= 0"),
    (["--json", "{tmp}"], "is a directory"),
    (["--json", ""], "is a directory"),
    (["--json", "{tmp}/no/such/dir/x.json"], "does not exist"),
])
def test_bad_input_is_one_line_and_changes_nothing(tmp_path: Path, args: list[str], message: str,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """In-process through the CLI's own entry point (a subprocess per case costs seconds of imports)."""
    state = tmp_path / "state"
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setenv("DTPO_STATE_DIR", str(state))
    monkeypatch.chdir(out)
    with pytest.raises(SystemExit) as ended:
        main(["simulate", "--steps", "10", *(a.format(tmp=out) for a in args)])
    captured = capsys.readouterr()
    assert ended.value.code == 2, captured.out + captured.err
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and lines[0].startswith("dtpo: error:"), captured.err
    assert "Traceback" not in captured.err + captured.out
    assert not (state / "knobs-journal.json").exists()
    assert not list(state.rglob("*.json"))
    assert not list(out.rglob("*"))  # no results file, no temporary file, no folder made


def test_bad_input_from_a_real_process(tmp_path: Path) -> None:
    result = run(["--noise", "nan", "--json", str(tmp_path)], tmp_path / "state")
    assert result.returncode == 2 and result.stderr == "dtpo: error: --noise must be a finite number, got nan\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_the_readme_example_and_clean_state(tmp_path: Path) -> None:
    """The README's example, with the workload named in full (``bert_base_uncased`` alone is ambiguous)."""
    state = tmp_path / "state"
    result = run(["--gpu", "H100-SXM", "--workload", "bert_base_uncased/squad", "--sweep", "sm-clock",
                  "--straggler", "3:1.2", "--steps", "50", "--gpus", "4"], state)
    assert result.returncode == 0, result.stderr
    assert "energy-optimal" in result.stdout and "bert_base_uncased/squad" in result.stdout
    assert result.stderr == ""  # no progress bar or notice in a pipe
    assert not list(state.rglob("*"))  # no state file, no journal, no empty sim folder


def test_a_network_with_two_datasets_names_both(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("DTPO_STATE_DIR", str(tmp_path))
    with pytest.raises(SystemExit) as ended:
        main(["simulate", "--workload", "bert_base_uncased", "--steps", "10"])
    assert ended.value.code == 2
    assert capsys.readouterr().err == ("dtpo: error: workload 'bert_base_uncased' is ambiguous; choose one of "
                                       "bert_base_uncased/sentiment140, bert_base_uncased/squad\n")


def test_json_is_written_into_an_existing_folder(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    result = run(["--steps", "10", "--gpus", "2", "--json", str(out)], tmp_path / "state")
    assert result.returncode == 0, result.stderr
    assert json.loads(out.read_text())["config"]["gpus"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result.json"]  # no temporary left, no state folder


def test_the_progress_bar_shows_only_for_long_jobs_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from dtpo.cli.simulate import PROGRESS_GPU_STEPS, progress_bar

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    with progress_bar(PROGRESS_GPU_STEPS, 1) as advance:
        assert advance is None  # pytest's stderr is no terminal
    monkeypatch.setattr("sys.stderr", Terminal())
    with progress_bar(PROGRESS_GPU_STEPS // 8 - 1, 8) as advance:
        assert advance is None  # a short job
    with progress_bar(PROGRESS_GPU_STEPS, 1) as advance:
        assert advance is not None
        advance(PROGRESS_GPU_STEPS)
