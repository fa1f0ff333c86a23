"""``dtpo runs`` and the registration of train, simulate and plan runs: tables, one-line errors (exit 2), the
rebuild of a corrupt store, a SIGKILLed run's row."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import logging
import os
import signal
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import dtpo_cli, run_cli

from dtpo.cli import app as cli_app
from dtpo.cli.register import Registration
from dtpo.cli.runs import runs_app
from dtpo.core.measurement import Measurement
from dtpo.core.record import RunRecord
from dtpo.telemetry.store.database import KILLED_ERROR, RunStore, StoreError

REPO = Path(__file__).resolve().parents[2]
PLAN_EXAMPLE = REPO / "examples" / "plan" / "h100_ib_ndr_vs_roce.toml"


def _wired() -> bool:
    return any(group.name == "runs" for group in cli_app.app.registered_groups)


@pytest.fixture(autouse=True)
def runs_command(state: Path) -> Iterator[None]:
    """``dtpo runs`` in the app (until app.py registers it itself), and isolated state."""
    if _wired():
        yield
        return
    cli_app.app.add_typer(runs_app, name="runs")
    try:
        yield
    finally:
        groups = cli_app.app.registered_groups
        groups[:] = [g for g in groups if g.typer_instance is not runs_app]


def record(run_id: str, throughput: float, workers: int = 1, started: str = "2026-01-01T00:00:00+00:00") -> RunRecord:
    config = {"workload": {"name": "mlp", "steps": 6}, "launch": {"workers": workers}, "tune": {"knob": None}}
    return RunRecord(run_id, "completed", started, started, config=config,
                     totals={"throughput": Measurement(throughput, "samples/s", "derived")},
                     energy={"energy_j": {"value": 10.0, "unit": "J", "source": "estimated"},
                             "average_power_w": {"value": 2.0, "unit": "W", "source": "estimated"},
                             "energy_per_sample_j": {"value": 0.1, "unit": "J/sample", "source": "estimated"},
                             "kwh": {"value": 1e-6, "unit": "kWh", "source": "estimated"},
                             "co2_g": {"value": 1e-3, "unit": "g CO2e", "source": "estimated"}})


@pytest.fixture
def filled(tmp_path: Path) -> Path:
    """A store with two completed train runs, ``base`` (1 worker) and ``wide`` (2 workers), their records on disk."""
    path = tmp_path / "store.sqlite"
    store = RunStore.open(path)
    for run_id, throughput, workers, day in (("base", 100.0, 1, "01"), ("wide", 150.0, 2, "02")):
        rec = record(run_id, throughput, workers, f"2026-01-{day}T00:00:00+00:00")
        rec.save(tmp_path / "runs" / run_id)
        store.register_record(rec, tmp_path / "runs" / run_id)
    return path


def one_line_error(code: object, out: str, err: str) -> str:
    assert code == 2, out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dtpo: error: "), err
    assert "Traceback" not in out + err
    return lines[0]


def test_list_show_compare(filled: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["runs", "list", "--store", str(filled)], capsys)
    assert code == 0, err
    assert out.index("wide") < out.index("base") and "150 samples/s" in out and "0.1 J/sample (estimated)" in out
    code, out, _ = run_cli(["runs", "list", "--store", str(filled), "--filter", "workers=2", "-f", "status=completed"],
                           capsys)
    assert code == 0 and "wide" in out and "base" not in out
    code, out, _ = run_cli(["runs", "list", "--store", str(filled), "--filter", "workload=lm"], capsys)
    assert code == 0 and "no runs matching workload=lm" in out
    code, out, _ = run_cli(["runs", "show", "ba", "--store", str(filled)], capsys)
    assert code == 0 and "run base" in out and "completed" in out
    assert "10 J (estimated)" in out and "100 samples/s" in out and '"workers": 1' in out
    code, out, _ = run_cli(["runs", "compare", "base", "wide", "--store", str(filled)], capsys)
    assert code == 0
    throughput = next(line for line in out.splitlines() if "throughput" in line)
    assert "+50 samples/s" in throughput and "+50.0%" in throughput
    assert "launch.workers" in out and "run_dir" not in out


def test_export_csv_to_a_file_and_to_stdout(filled: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "runs.csv"
    code, _, err = run_cli(["runs", "export", "--csv", str(target), "--store", str(filled)], capsys)
    assert code == 0 and "2 run(s) written" in err
    rows = list(csv.DictReader(target.open()))
    assert [r["id"] for r in rows] == ["wide", "base"] and rows[1]["throughput [samples/s]"] == "100.0"
    assert "energy_j" in rows[1]["estimated"].split(";") and "throughput" not in rows[1]["estimated"]
    code, out, _ = run_cli(["runs", "export", "--csv", "-", "--store", str(filled), "-f", "id=base"], capsys)
    assert code == 0 and [r["id"] for r in csv.DictReader(io.StringIO(out))] == ["base"]


@pytest.mark.parametrize(("args", "message"), [
    (["show", "zzz"], "no run 'zzz' in the run store"),
    (["compare", "base", "nope"], "`dtpo runs list --store"),
    (["list", "--filter", "colour=red"], "unknown key 'colour'"),
    (["list", "--filter", "status"], "--filter must be KEY=VALUE"),
    (["list", "--limit", "0"], "--limit must be >= 1"),
    (["export", "--csv", "{tmp}"], "is a directory"),
    (["export", "--csv", "{tmp}/no/such/x.csv"], "does not exist"),
])
def test_bad_requests_are_one_line_and_exit_2(args: list[str], message: str, filled: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    before = filled.read_bytes()
    code, out, err = run_cli(["runs", *(a.format(tmp=tmp_path) for a in args), "--store", str(filled)], capsys)
    assert message in one_line_error(code, out, err)
    assert filled.read_bytes() == before


@pytest.mark.parametrize("command", [["list"], ["show", "x"], ["export", "--csv", "-"], ["reindex"]])
def test_a_directory_store_is_refused_by_every_command(command: list[str], tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["runs", *command, "--store", str(tmp_path)], capsys)
    assert "is a directory" in one_line_error(code, out, err)


def test_no_store_yet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "none.sqlite"
    code, out, _ = run_cli(["runs", "list", "--store", str(path)], capsys)
    assert code == 0 and "no run store at" in out
    code, out, err = run_cli(["runs", "show", "x", "--store", str(path)], capsys)
    assert "dtpo runs reindex" in one_line_error(code, out, err)
    assert not path.exists()


def test_a_corrupt_store_says_so_and_reindex_brings_every_run_back(filled: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    for suffix in ("-wal", "-shm"):
        Path(f"{filled}{suffix}").unlink(missing_ok=True)
    filled.write_bytes(b"\x00garbage" * 512)
    code, out, err = run_cli(["runs", "list", "--store", str(filled)], capsys)
    line = one_line_error(code, out, err)
    assert "corrupt" in line and f"dtpo runs reindex --store {filled}" in line
    monkeypatch.chdir(tmp_path)  # the default folder of runs: ./runs
    code, out, err = run_cli(["runs", "reindex", "--store", str(filled)], capsys)
    assert code == 0, err
    assert "reindexed 2 run(s)" in out and "corrupt store was kept as" in out
    assert len(list(tmp_path.glob("store.sqlite.corrupt-*"))) == 1
    code, out, _ = run_cli(["runs", "list", "--store", str(filled)], capsys)
    assert code == 0 and "base" in out and "wide" in out


def test_simulate_writes_its_run_dir_and_registers_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store, run_dir, json_out = tmp_path / "s.sqlite", tmp_path / "sim", tmp_path / "out.json"
    code, out, err = run_cli(["simulate", "--steps", "10", "--gpus", "2", "--json", str(json_out),
                              "--run-dir", str(run_dir), "--store", str(store)], capsys)
    assert code == 0, err
    assert f"simulate result: {run_dir / 'simulate.json'}" in out
    assert json.loads((run_dir / "simulate.json").read_text()) == json.loads(json_out.read_text())
    run = RunStore.open(store).get("sim")
    assert (run.kind, run.status, run.workers, run.steps) == ("simulate", "completed", 2, 10)
    assert run.figures["joules_per_sample"].estimated and run.figures["joules_per_sample"].value > 0
    code, out, err = run_cli(["simulate", "--steps", "10", "--run-dir", str(run_dir), "--store", str(store)], capsys)
    assert "already holds a result" in one_line_error(code, out, err)


def test_a_tuning_simulation_is_listed_as_simulated_with_its_choice(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    store, run_dir = tmp_path / "s.sqlite", tmp_path / "sim"
    code, _, err = run_cli(["simulate", "--steps", "200", "--gpus", "2", "--tune", "power-limit", "--cost", "zeus:0.5",
                            "--run-dir", str(run_dir), "--store", str(store)], capsys)
    assert code == 0, err
    result = json.loads((run_dir / "simulate.json").read_text())["result"]
    chosen = f"{result['choice']['power_limit_w']:g} W"
    code, out, err = run_cli(["runs", "list", "--store", str(store)], capsys)
    assert code == 0, err
    row = next(line for line in out.splitlines() if "sim" in line and "simulate" in line)
    assert f"choice {chosen} (cost {result['choice_cost']:,.4g} J/sample, zeus:0.5)" in row
    assert row.rstrip(" │").split("│")[-2].strip().endswith("(simulated)") and "estimated" not in row
    assert "(simulated): from dtpo simulate's model" in out
    code, out, _ = run_cli(["runs", "show", "sim", "--store", str(store)], capsys)
    assert code == 0 and f"{result['choice']['power_limit_w']:g} W (simulated)" in out and "(estimated)" not in out


def test_headlines_name_the_setting_and_mark_what_a_model_gave() -> None:
    from dtpo.cli.runs import headline
    from dtpo.telemetry.store.figures import record_facts, simulate_facts
    from dtpo.telemetry.store.rows import StoredRun

    def stored(kind: str, facts: Any) -> StoredRun:
        return StoredRun("r", "r", kind, "completed", "/r", figures=facts.figures)

    tuned = simulate_facts({"knob": "both", "cost": "energy", "result": {
        "choice": {"power_limit_w": 300.0, "sm_clock_mhz": 1410}, "choice_cost": 2.5, "job_cost": 90.0,
        "default_job_cost": 100.0}})
    assert headline(stored("simulate", tuned)) == ("choice 300 W, SM 1410 MHz (cost 2.5 J/sample, energy), job cost "
                                                   "vs default -10.00% (simulated)")
    del tuned.figures["choice.power_limit_w"]  # a row stored before the store kept the setting
    assert headline(stored("simulate", tuned)).startswith("choice cost 2.5 J/sample, energy, ")
    setting = {"joules_per_sample": 2.0, "samples_per_s": 50.0, "power_limit_w": 200.0}
    sweep = simulate_facts({"baseline": setting, "results": [setting, {**setting, "joules_per_sample": 1.5,
                                                                       "power_limit_w": 150.0}]})
    assert headline(stored("simulate", sweep)) == "energy-optimal 150 W: 1.5 J/sample (simulated)"
    trained = record_facts(record("t", 100.0))
    assert headline(stored("train", trained)) == "100 samples/s, 0.1 J/sample (estimated)"  # measured: unmarked


def test_simulate_and_plan_default_to_runs_in_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DTPO_STORE")
    code, _, err = run_cli(["simulate", "--steps", "10", "--gpus", "2", "--tune", "stragglers", "--straggler",
                            "1:1.2"], capsys)
    assert code == 0, err
    code, _, err = run_cli(["plan", str(PLAN_EXAMPLE)], capsys)
    assert code == 0, err
    (sim,) = (tmp_path / "runs").glob("simulate-*/simulate.json")
    (plan,) = (tmp_path / "runs").glob("plan-*/plan.json")
    runs = {r.kind: r for r in RunStore.open(tmp_path / "runs" / "dtpo.sqlite").list_runs()}
    assert runs["simulate"].id == sim.parent.name and runs["plan"].id == plan.parent.name
    assert runs["simulate"].figures["energy_saved_share"].estimated
    largest = runs["plan"].workers
    assert runs["plan"].figures[f"throughput@{largest}gpu"].value > 0
    assert all(f.estimated for f in runs["plan"].figures.values())


def test_a_bad_store_stops_simulate_and_train_before_anything_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "folder").mkdir()
    code, out, err = run_cli(["simulate", "--steps", "10", "--store", "folder"], capsys)
    assert "is a directory" in one_line_error(code, out, err)
    (tmp_path / "bad.sqlite").write_text("not a database")
    code, out, err = run_cli(["train", "--steps", "5", "--warmup-steps", "2", "--workers", "1", "--run-dir", "run",
                              "--store", "bad.sqlite"], capsys)
    assert "dtpo runs reindex --store" in one_line_error(code, out, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.sqlite", "folder"]


def test_a_registration_that_fails_at_the_end_is_a_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str],
                                                           caplog: pytest.LogCaptureFixture) -> None:
    def locked(*args: object, **kwargs: object) -> None:
        raise StoreError("run store x stayed locked by another process for over 30 s")

    monkeypatch.setattr(RunStore, "register_result", locked)
    code, _, err = run_cli(["simulate", "--steps", "10", "--run-dir", str(tmp_path / "sim"), "--store",
                            str(tmp_path / "s.sqlite")], capsys)
    assert code == 0, err
    assert (tmp_path / "sim" / "simulate.json").is_file()
    assert "could not be registered" in err and "dtpo runs reindex --store" in err
    # the same for a train run's end: never raises, says how to repair
    store = RunStore.open(tmp_path / "t.sqlite")
    run_id = store.register("r", "train", tmp_path / "r", {})
    monkeypatch.setattr(RunStore, "finish", lambda *a, **k: (_ for _ in ()).throw(sqlite3.OperationalError("locked")))
    with caplog.at_level(logging.WARNING, logger="dtpo"):
        Registration(store, run_id, "train", tmp_path / "r").conclude(KeyboardInterrupt())
    assert "dtpo runs reindex --store" in caplog.text


# -- real processes --------------------------------------------------------------------------------------------------

TINY_TRAIN = ["train", "--workload", "mlp", "--workers", "1", "--warmup-steps", "2", "--no-report", "--no-trace"]


@pytest.mark.slow
def test_a_real_train_registers_a_completed_row(tmp_path: Path) -> None:
    store, run_dir = tmp_path / "x.sqlite", tmp_path / "run"
    result = subprocess.run(dtpo_cli(*TINY_TRAIN, "--steps", "5", "--run-dir", str(run_dir), "--store", str(store)),
                            capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    run = RunStore.open(store).get("run")
    assert (run.kind, run.status, run.workload, run.workers, run.steps) == ("train", "completed", "mlp", 1, 5)
    assert run.figures["throughput"].value > 0 and run.figures["throughput"].unit == "samples/s"
    assert run.config["launch"]["run_dir"] == str(run_dir) and run.run_dir == str(run_dir.resolve())


@pytest.mark.slow
def test_dtpo_runs_from_a_real_process(filled: Path) -> None:
    if "runs_app" not in Path(cli_app.__file__).read_text():
        pytest.skip("dtpo.cli.app does not register `dtpo runs` yet")
    listed = subprocess.run(dtpo_cli("runs", "list", "--store", str(filled)), capture_output=True, text=True,
                            timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert listed.returncode == 0 and "base" in listed.stdout and "wide" in listed.stdout, listed.stderr
    missing = subprocess.run(dtpo_cli("runs", "show", "nope", "--store", str(filled)), capture_output=True,
                             text=True, timeout=120)
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "no run 'nope'" in missing.stderr


def _kill_workers(run_dir: Path) -> None:
    """SIGKILL the workers a killed launcher leaves behind (torchrun starts each in a session of its own)."""
    marker = f"DTPO_CONFIG={run_dir / 'config.json'}".encode()
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            found = marker in environ.read_bytes().split(b"\0")
        except OSError:
            continue
        if found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(environ.parent.name), signal.SIGKILL)


@pytest.mark.slow
def test_a_sigkilled_train_leaves_a_failed_row(tmp_path: Path) -> None:
    store, run_dir = tmp_path / "x.sqlite", tmp_path / "run"
    proc = subprocess.Popen(dtpo_cli(*TINY_TRAIN, "--steps", "100000", "--run-dir", str(run_dir), "--store",
                                     str(store)), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 120
        while not (run_dir / "ranks" / "rank00000.json").exists():
            assert time.monotonic() < deadline and proc.poll() is None, "the run did not start"
            time.sleep(0.2)
        assert RunStore.open(store).get("run").status == "running"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(60)
        _kill_workers(run_dir)
    run = RunStore.open(store).get("run")
    assert run.status == "failed" and run.error == KILLED_ERROR


@pytest.mark.slow
def test_a_bench_registers_itself_and_its_runs(tmp_path: Path) -> None:
    store, bench_dir = tmp_path / "x.sqlite", tmp_path / "bench"
    result = subprocess.run(dtpo_cli("bench", "--workers", "1", "--workload", "mlp", "--steps", "5", "--warmup-steps",
                                     "2", "--no-report", "--no-trace", "--run-dir", str(bench_dir), "--store",
                                     str(store)), capture_output=True, text=True, timeout=300,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    runs = {r.id: r for r in RunStore.open(store).list_runs()}
    assert set(runs) == {"bench", "workers-1"}
    bench, child = runs["bench"], runs["workers-1"]
    assert (bench.kind, bench.status, bench.workers, bench.workload) == ("bench", "completed", 1, "mlp")
    assert bench.figures["throughput@1w"].value == child.figures["throughput"].value > 0
    assert (child.kind, child.status, child.parent) == ("train", "completed", "bench")
