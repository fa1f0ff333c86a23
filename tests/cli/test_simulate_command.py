"""dtpo simulate: the curve with its optima marked; bad input is one line, exit 2, nothing changed."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import dtpo_cli, run_cli

from dtpo.cli.app import main


def run(args: list[str], state: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(dtpo_cli("simulate", *args), capture_output=True, text=True, timeout=120,
                          env={**os.environ, "DTPO_STATE_DIR": str(state), "COLUMNS": "200"})


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_bad_input_from_a_real_process(tmp_path: Path) -> None:
    result = run(["--noise", "nan", "--json", str(tmp_path)], tmp_path / "state")
    assert result.returncode == 2 and result.stderr == "dtpo: error: --noise must be a finite number, got nan\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.slow
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


@pytest.mark.slow
def test_json_is_written_into_an_existing_folder(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    result = run(["--steps", "10", "--gpus", "2", "--json", str(out)], tmp_path / "state")
    assert result.returncode == 0, result.stderr
    assert json.loads(out.read_text())["config"]["gpus"] == 2
    # no temporary left, no state folder (runs/: where the test session puts run directories, DTPO_RUN_ROOT)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result.json", "runs"]


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


def write_trace(folder: Path, rows: list[str] | None = None) -> Path:
    """A user's measured H100 power-limit sweep in the Zeus columns (plus samples_per_epoch)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "my_h100.csv"
    rows = rows if rows is not None else [f"llama,mydata,64,adamw,{w},{40 + 20000 / w:.2f},{0.8 * w:.1f},10000"
                                          for w in range(200, 701, 50)]
    path.write_text("network,dataset,batch_size,optimizer,power_limit,time_per_epoch,average_power,"
                    "samples_per_epoch\n" + "\n".join(rows) + "\n")
    return path


def test_a_users_trace_is_simulated_through_the_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "state"
    monkeypatch.setenv("DTPO_STATE_DIR", str(state))
    trace = write_trace(tmp_path / "in")
    out = tmp_path / "in" / "result.json"
    with pytest.raises(SystemExit) as ended:
        main(["simulate", "--trace", str(trace), "--gpu", "H100-SXM", "--gpus", "2", "--steps", "2000",
              "--sweep", "power-limit", "--json", str(out)])
    captured = capsys.readouterr()
    assert ended.value.code == 0, captured.err
    assert f"calibrated on your measured trace {trace}" in captured.out
    assert f"simulated from your measured trace {trace}" in captured.out
    assert "llama/mydata, batch 64/GPU" in captured.out and "energy-optimal" in captured.out
    assert captured.err == ""
    data = json.loads(out.read_text())
    assert data["gpu"] == "H100-SXM" and data["calibrated"] is True and data["config"]["trace_file"] == str(trace)
    assert [r["power_limit_w"] for r in data["results"]] == [float(w) for w in range(200, 701, 50)]
    assert not list(state.rglob("*"))  # no state file, no journal


def test_list_with_a_trace_lists_its_traces(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DTPO_STATE_DIR", str(tmp_path / "state"))
    trace = write_trace(tmp_path, [f"llama,mydata,{b},adamw,{w},{40 + w / 100},{w / 2},10000"
                                   for b in (32, 64) for w in (200, 700)])
    with pytest.raises(SystemExit) as ended:
        main(["simulate", "--list", "--trace", str(trace), "--gpu", "h100"])
    captured = capsys.readouterr()
    assert ended.value.code == 0, captured.err
    assert f"traces in {trace} (measured on H100-SXM" in captured.out
    assert "llama/mydata batch 32 adamw: 2 limits 200-700 W" in captured.out
    assert "llama/mydata batch 64 adamw" in captured.out


def row(limit: str, time: str, power: str) -> str:
    return f"llama,mydata,64,adamw,{limit},{time},{power},10000"


GOOD_ROWS = [row("200", "100", "150"), row("300", "80", "250")]


@pytest.mark.parametrize(("rows", "args", "message"), [
    ([row("200", "100", "150"), row("300", "abc", "250")], [],
     "my_h100.csv row 3, column time_per_epoch: 'abc' is not a number"),
    ([row("200", "100", "150"), row("900", "80", "250")], [],
     "row 3, column power_limit: 900 W is outside the H100-SXM's"),
    ([row("200", "100", "150"), row("200", "80", "250")], [], "row 3, column power_limit: 200 W appears twice"),
    (GOOD_ROWS, ["--model", "parametric"], "--model parametric cannot use --trace"),
    (GOOD_ROWS, ["--workload", "bert"], "no trace of workload 'bert'"),
    (GOOD_ROWS, ["--batch-size", "8"], "measured batch sizes: 64"),
])
def test_a_bad_trace_file_is_one_line_and_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str], rows: list[str],
                                                 args: list[str], message: str) -> None:
    state = tmp_path / "state"
    monkeypatch.setenv("DTPO_STATE_DIR", str(state))
    trace = write_trace(tmp_path / "in", rows)
    with pytest.raises(SystemExit) as ended:
        main(["simulate", "--steps", "10", "--gpu", "H100-SXM", "--trace", str(trace), *args])
    captured = capsys.readouterr()
    assert ended.value.code == 2, captured.out + captured.err
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and lines[0].startswith("dtpo: error:"), captured.err
    assert "Traceback" not in captured.err + captured.out
    assert not list(state.rglob("*.json"))


@pytest.mark.slow
def test_a_missing_trace_file_from_a_real_process(tmp_path: Path) -> None:
    result = run(["--trace", str(tmp_path / "nope.csv")], tmp_path / "state")
    assert result.returncode == 2
    assert result.stderr == f"dtpo: error: cannot read trace file {tmp_path / 'nope.csv'}: No such file or directory\n"


# -- one subcommand per mode, and the earlier spelling -------------------------------------------------------------

def _simulate(argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
              capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    monkeypatch.setenv("DTPO_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("DTPO_STORE", str(tmp_path / "store.sqlite"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as ended:
        main(["simulate", *argv])
    captured = capsys.readouterr()
    return int(ended.value.code or 0), captured.out, captured.err


def _printed(text: str) -> str:
    """The output without the line naming the run directory (each run has its own id)."""
    return "\n".join(line for line in text.splitlines() if "runs/simulate-" not in line and "run id" not in line)


@pytest.mark.parametrize("earlier, subcommand", [
    (["--sweep", "power-limit", "--gpus", "2", "--steps", "50"],
     ["sweep", "power-limit", "--gpus", "2", "--steps", "50"]),
    (["--power-limit", "200", "--steps", "50"], ["run", "--power-limit", "200", "--steps", "50"]),
    (["--tune", "both", "--gpus", "1", "--steps", "300"], ["tune", "both", "--gpus", "1", "--steps", "300"]),
    (["--tune", "stragglers", "--straggler", "1:1.2", "--gpus", "4", "--steps", "100"],
     ["stragglers", "--straggler", "1:1.2", "--gpus", "4", "--steps", "100"]),
    (["--list"], ["list"]),
])
def test_a_subcommand_prints_what_the_earlier_spelling_prints(earlier: list[str], subcommand: list[str],
                                                              tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    before = _simulate(earlier, tmp_path, monkeypatch, capsys)
    after = _simulate(subcommand, tmp_path, monkeypatch, capsys)
    assert before[0] == after[0] == 0, before[2] + after[2]
    assert _printed(after[1]) == _printed(before[1]) and _printed(before[1])


@pytest.mark.parametrize("argv, message", [
    (["--gpus", "2", "sweep", "power-limit"], "put the options after the subcommand: dtpo simulate sweep --gpus"),
    (["sweep", "voltage"], "--sweep must be one of power-limit, sm-clock, got 'voltage'"),
    (["tune", "voltage"], "--tune must be one of power-limit, sm-clock, both, got 'voltage'"),
    (["stragglers", "--cost", "energy"], "No such option: --cost"),  # a subcommand takes only its own flags
    (["run", "--sweep", "power-limit"], "No such option: --sweep"),
    (["stragglers", "--steps", "10"], "--tune stragglers needs at least one --straggler RANK:FACTOR"),
])
def test_subcommands_refuse_in_one_line(argv: list[str], message: str, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _simulate(argv, tmp_path, monkeypatch, capsys)
    assert code == 2 and err.startswith("dtpo: error:") and message in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "runs").exists()


def test_the_tree_and_the_simulated_job_agree_on_sweeps_and_help_placeholders() -> None:
    from dtpo.cli.simulate import HELP_VALUES
    from dtpo.core.config_section import tree_fields
    from dtpo.core.simulate_config import SIM_SWEEPS, SimulateConfig
    from dtpo.simulation.data_parallel import SWEEPS
    from dtpo.simulation.job import MAX_GPUS

    assert SIM_SWEEPS == SWEEPS
    helps = {f.path: f.help.format_map(HELP_VALUES) for f in tree_fields(SimulateConfig)}  # no placeholder unknown
    assert f"{MAX_GPUS:,}" in helps["job.gpus"] and "{" not in "".join(helps.values())


# -- every GPU of the catalogue, and a trace of a GPU outside it ----------------------------------------------------

@pytest.mark.parametrize(("gpu", "name"), [
    ("p100", "P100-PCIe"), ("p100-sxm2", "P100-SXM2"), ("t4", "T4"), ("rtx-6000", "RTX6000"), ("a6000", "A6000"),
    ("l4", "L4"), ("l40s", "L40S"), ("a100-pcie", "A100-PCIe"), ("h100-pcie", "H100-PCIe"), ("h200", "H200"),
    ("b200", "B200"), ("mi300x", "MI300X"),
])
def test_every_new_gpu_runs_a_short_tune(gpu: str, name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    from dtpo.devices.physics.power_specs import find_power_spec

    out = tmp_path / "tune.json"
    code, printed, err = _simulate(["tune", "power-limit", "--gpu", gpu, "--gpus", "1", "--steps", "200",
                                    "--json", str(out)], tmp_path, monkeypatch, capsys)
    assert code == 0, err
    assert f"1 x {name}" in printed
    data = json.loads(out.read_text())
    spec = find_power_spec(name)
    assert data["gpu"] == name and "gpu_note" not in data
    chosen = data["result"]["choice"]["power_limit_w"]
    assert spec.min_power_w <= chosen <= spec.max_power_w


def test_list_names_every_gpu_with_its_range(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    code, printed, err = _simulate(["list"], tmp_path, monkeypatch, capsys)
    assert code == 0, err
    for text in ("P100-PCIe (125-250 W)", "T4 (60-70 W)", "L4 (40-72 W)", "H200 (200-700 W)", "B200 (200-1000 W)",
                 "MI300X (300-750 W)", "A40 (100-300 W)"):
        assert text in printed


def write_p100(folder: Path, gpu: str | None = None) -> Path:
    """A P100-like sweep, 125-250 W (inside the A40's 100-300 W, which it must not borrow), optionally with a gpu
    column."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "p100_sweep.csv"
    lines = [("gpu," if gpu else "") + "power_limit,time_per_epoch,average_power,samples_per_epoch"]
    lines += [(f"{gpu}," if gpu else "") + f"{w},{30 + 3000 / w:.2f},{0.85 * w:.1f},50000" for w in range(125, 251, 25)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_trace_without_gpu_gets_its_own_range_and_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_p100(tmp_path / "in")
    out = tmp_path / "sweep.json"
    code, printed, err = _simulate(["sweep", "power-limit", "--trace", str(trace), "--gpus", "2", "--steps", "3000",
                                    "--json", str(out)], tmp_path, monkeypatch, capsys)
    assert code == 0, err
    [line] = err.splitlines()  # one line says where the range came from
    assert line.startswith("dtpo: GPU model not named") and "power-limit range 125-250 W taken from the trace" in line
    data = json.loads(out.read_text())
    assert data["gpu"] == data["config"]["gpu"] == "unlisted-125-250W" and data["gpu_note"] == line[len("dtpo: "):]
    limits = [r["power_limit_w"] for r in data["results"]]
    assert min(limits) == 125 and max(limits) == data["baseline"]["power_limit_w"] == 250  # not the A40's 100-300 W
    assert "2 x unlisted-125-250W" in printed


def test_a_trace_naming_its_gpu_in_a_column_gets_that_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_p100(tmp_path / "in", "Tesla P100-PCIE-16GB")
    code, printed, err = _simulate(["list", "--trace", str(trace)], tmp_path, monkeypatch, capsys)
    assert code == 0, err
    assert f"traces in {trace} (measured on P100-PCIe, power limits 125-250 W)" in printed
    assert err.splitlines() == [f"dtpo: GPU P100-PCIe, as the gpu column of {trace} names it ('Tesla P100-PCIE-16GB')"]


@pytest.mark.parametrize(("args", "message"), [
    (["--gpu", "Z9000"], "unknown GPU model 'Z9000'; choose one of A40, V100, H100-SXM, A100-SXM, MI250X, P100-PCIe, "),
    (["--gpu", "Z9000"], "MI300X (or leave --gpu out to take the power-limit range from the trace)"),
    (["--gpu", "T4"], "125 W is outside the T4's power-limit range 60-70 W (is T4 the GPU it was measured on?"),
    (["--sweep", "sm-clock"], "--sweep sm-clock: the SM clocks of unlisted-125-250W, a GPU outside the catalogue"),
    (["--tune", "both"], "--tune both: the SM clocks of unlisted-125-250W"),
])
def test_a_trace_with_a_wrong_gpu_or_clock_knob_is_one_line_and_exit_2(
        args: list[str], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_p100(tmp_path / "in")
    code, _, err = _simulate(["--steps", "10", "--trace", str(trace), *args], tmp_path, monkeypatch, capsys)
    assert code == 2 and message in err.splitlines()[-1], err
    assert err.splitlines()[-1].startswith("dtpo: error:") and "Traceback" not in err
    assert not (tmp_path / "runs").exists()


def test_an_unknown_gpu_without_a_trace_lists_the_catalogue(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _simulate(["run", "--gpu", "p200", "--steps", "10"], tmp_path, monkeypatch, capsys)
    assert code == 2 and err == ("dtpo: error: unknown GPU model 'p200'; choose one of A40, V100, H100-SXM, A100-SXM, "
                                 "MI250X, P100-PCIe, P100-SXM2, T4, RTX6000, A6000, L4, L40S, A100-PCIe, H100-PCIe, "
                                 "H200, B200, MI300X\n")


def test_phases_writes_a_run_the_power_swing_report_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("DTPO_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("COLUMNS", "200")
    run_dir = tmp_path / "phases"
    code, out, _ = run_cli(["simulate", "phases", "--gpu", "H100-SXM", "--gpus", "2", "--steps", "40",
                            "--batch-size", "2048", "--sample-hz", "50", "--power-floor", "40", "--run-dir",
                            str(run_dir)], capsys)
    assert code in (0, None), out
    assert "a power floor of 40 % of the limit" in out and "every figure simulated" in out
    assert f"dtpo report --power-swing {run_dir}" in out
    assert (run_dir / "record.json").is_file() and list((run_dir / "ranks").glob("power-rank*.csv"))
    code, out, _ = run_cli(["report", "--power-swing", str(run_dir)], capsys)
    assert code in (0, None), out
    assert "Power swing of phases (simulated)" in out and "rank 1 / sim1" in out
    assert "every figure is simulated" in out
    code, _, err = run_cli(["simulate", "phases", "--steps", "10", "--run-dir", str(run_dir)], capsys)
    assert code == 2 and "already holds a result" in err  # a run directory is never overwritten


@pytest.mark.parametrize(("args", "message"), [
    (["--comm-power", "1.5"], "communication power share must be between 0 and 1, got 1.5"),
    (["--power-floor", "150"], "power floor must be a share of the power limit between 0 and 1, got 1.5"),
    (["--steps", "200000"], "a phased simulation runs at most 100,000 steps"),
])
def test_phases_refuses_bad_input_in_one_line(args: list[str], message: str, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("DTPO_STATE_DIR", str(tmp_path / "state"))
    code, _, err = run_cli(["simulate", "phases", "--run-dir", str(tmp_path / "run"), *args], capsys)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()
