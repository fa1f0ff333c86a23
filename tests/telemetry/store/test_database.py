"""The run store: WAL, rows and figures, filters, concurrent writers, runs whose process died, bad files,
and the rebuild from run directories."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from dtpo.core.errors import ConfigError
from dtpo.core.measurement import Measurement
from dtpo.core.record import RunRecord, write_json_atomic
from dtpo.telemetry.store.database import KILLED_ERROR, CorruptStore, RunStore, StoreError, StoreMissing
from dtpo.telemetry.store.figures import plan_facts, simulate_facts
from dtpo.telemetry.store.reindex import NO_RECORD_ERROR, reindex


def train_config(workload: str = "mlp", workers: int = 1, knob: str | None = None, **session: Any) -> dict:
    return {"schema": "dtpo.config/1", "workload": {"name": workload, "steps": 6, "batch_size": 8},
            "session": {"precision": "32-true", **session}, "tune": {"knob": knob},
            "launch": {"workers": workers, "run_dir": None}}


def energy(joules: float, source: str = "estimated") -> dict:
    return {name: {"value": joules * scale, "unit": unit, "source": source} for name, unit, scale in (
        ("energy_j", "J", 1.0), ("average_power_w", "W", 0.5), ("energy_per_sample_j", "J/sample", 0.01),
        ("kwh", "kWh", 1 / 3.6e6), ("co2_g", "g CO2e", 1e-4))}


def record(run_id: str, throughput: float, status: str = "completed", started: str = "2026-01-01T00:00:00+00:00",
           **config: Any) -> RunRecord:
    return RunRecord(run_id, status, started, finished_at=started, config=train_config(**config),
                     totals={"throughput": Measurement(throughput, "samples/s", "derived"),
                             "step_time_s": Measurement(0.1, "s", "derived")},
                     energy=energy(10.0), error=None if status == "completed" else "boom")


@pytest.fixture
def store(tmp_path: Path) -> RunStore:
    return RunStore.open(tmp_path / "db" / "dtpo.sqlite")


# -- opening ---------------------------------------------------------------------------------------------------------

def test_a_new_store_is_created_in_wal_mode_with_its_folder(tmp_path: Path) -> None:
    path = tmp_path / "new" / "folder" / "dtpo.sqlite"
    store = RunStore.open(path)
    assert path.is_file() and store.journal_mode() == "wal"
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
    assert RunStore.open(path).list_runs() == []  # opening again keeps it


def test_the_default_store_is_runs_dtpo_sqlite_in_the_working_directory_or_dtpo_store(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DTPO_STORE")
    assert RunStore.open(None).path == tmp_path / "runs" / "dtpo.sqlite"
    monkeypatch.setenv("DTPO_STORE", str(tmp_path / "team.sqlite"))
    assert RunStore.open(None).path == tmp_path / "team.sqlite"


def test_bad_store_paths_are_one_line_config_errors(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="is a directory") as error:
        RunStore.open(tmp_path)
    assert isinstance(error.value, ConfigError) and "\n" not in str(error.value)
    (tmp_path / "file").write_text("x")
    with pytest.raises(StoreError, match="lies under the file"):
        RunStore.open(tmp_path / "file" / "dtpo.sqlite")
    with pytest.raises(StoreError, match="empty string"):
        RunStore.open("  ")
    with pytest.raises(StoreMissing, match="reindex"):
        RunStore.open(tmp_path / "none.sqlite", create=False)
    assert not (tmp_path / "none.sqlite").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes in read-only folders")
def test_an_unwritable_folder_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        with pytest.raises(StoreError, match="cannot write in folder"):
            RunStore.open(folder / "dtpo.sqlite")
    finally:
        folder.chmod(0o700)


def test_a_corrupt_file_says_so_and_offers_reindex(tmp_path: Path) -> None:
    path = tmp_path / "dtpo.sqlite"
    path.write_bytes(b"this is not a database at all" * 100)
    with pytest.raises(CorruptStore, match="corrupt.*dtpo runs reindex --store") as error:
        RunStore.open(path)
    assert isinstance(error.value, ConfigError) and "\n" not in str(error.value)
    # A valid header over garbage pages is caught when SQLite reads it.
    path.write_bytes(b"SQLite format 3\x00" + b"\xff" * 4000)
    with pytest.raises(CorruptStore, match="reindex"):
        RunStore.open(path)
    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE mine (x)")
    with pytest.raises(CorruptStore, match="not a dtpo run store"):
        RunStore.open(other)


# -- rows --------------------------------------------------------------------------------------------------------------

def test_register_then_finish(store: RunStore, tmp_path: Path) -> None:
    run_id = store.register("r1", "train", tmp_path / "r1", train_config(workers=2))
    (running,) = store.list_runs()
    assert (running.id, running.status, running.workload, running.workers, running.steps) == ("r1", "running",
                                                                                               "mlp", 2, 6)
    assert running.pid == os.getpid() and running.hostname and running.run_dir == str((tmp_path / "r1").resolve())
    assert store.finish(run_id, "completed", {"throughput": Measurement(5.0, "samples/s", "derived"), "x": 1.5})
    done = store.get("r1")
    assert done.status == "completed" and done.finished_at is not None
    assert done.figures["throughput"].value == 5.0 and done.figures["throughput"].source == "derived"
    assert done.figures["x"].value == 1.5
    assert not store.finish("nope", "failed")


def test_a_record_gives_the_figures_with_their_sources(store: RunStore, tmp_path: Path) -> None:
    run_id = store.register_record(record("r1", 100.0), tmp_path / "r1")
    run = store.get(run_id)
    assert run.kind == "train" and run.status == "completed"
    assert run.figures["throughput"].unit == "samples/s" and not run.figures["throughput"].estimated
    assert run.figures["energy_j"].estimated and run.figures["energy_per_sample_j"].value == pytest.approx(0.1)
    tuned = store.register_record(record("r2", 90.0, knob="power-limit"), tmp_path / "r2")
    assert store.get(tuned).kind == "tune"


def test_the_same_run_dir_keeps_its_row_and_the_same_name_elsewhere_gets_its_own(store: RunStore,
                                                                                 tmp_path: Path) -> None:
    first = store.register("run", "train", tmp_path / "a" / "run", train_config())
    again = store.register("run", "train", tmp_path / "a" / "run", train_config())  # --overwrite
    other = store.register("run", "train", tmp_path / "b" / "run", train_config())
    third = store.register("run", "train", tmp_path / "c" / "b" / "run", train_config())
    assert first == again == "run" and other == "b/run" and third == "run~2"
    assert len(store.list_runs()) == 3


def test_list_is_newest_first_and_filters(store: RunStore, tmp_path: Path) -> None:
    store.register_record(record("old", 10.0, started="2026-01-01T00:00:00+00:00"), tmp_path / "old")
    store.register_record(record("lm", 20.0, started="2026-01-02T00:00:00+00:00", workload="lm", workers=2),
                          tmp_path / "lm")
    store.register_record(record("bad", 0.0, status="failed", started="2026-01-03T00:00:00+00:00",
                                 precision="bf16-mixed"), tmp_path / "bad")
    assert [r.id for r in store.list_runs()] == ["bad", "lm", "old"]
    assert [r.id for r in store.list_runs(limit=1)] == ["bad"]
    assert [r.id for r in store.list_runs(["status=completed"])] == ["lm", "old"]
    assert [r.id for r in store.list_runs(["workload=lm"])] == ["lm"]
    assert [r.id for r in store.list_runs(["workers>=2"])] == ["lm"]
    assert [r.id for r in store.list_runs(["status!=failed", "workload=m*"])] == ["old"]
    assert [r.id for r in store.list_runs(["config.session.precision=bf16-mixed"])] == ["bad"]
    assert [r.id for r in store.list_runs(["config.tune.knob=none", "kind=train", "id=o*"])] == ["old"]
    for bad, message in (("status", "KEY=VALUE"), ("colour=red", "unknown key 'colour'"),
                         ("workers=two", "is a number"), ("config.a;drop=1", "SECTION.FIELD")):
        with pytest.raises(ConfigError, match=message):
            store.list_runs([bad])


def test_get_by_prefix_run_dir_or_name_and_clear_errors(store: RunStore, tmp_path: Path) -> None:
    store.register_record(record("20260101-aaaa", 1.0), tmp_path / "20260101-aaaa")
    store.register_record(record("20260101-aabb", 1.0), tmp_path / "20260101-aabb")
    assert store.get("20260101-aaa").id == "20260101-aaaa"
    assert store.get(str(tmp_path / "20260101-aabb")).id == "20260101-aabb"
    with pytest.raises(StoreError, match="ambiguous.*20260101-aaaa, 20260101-aabb"):
        store.get("20260101-aa")
    with pytest.raises(StoreError, match="no run 'zzz' in the run store .*`dtpo runs list --store"):
        store.get("zzz")
    with pytest.raises(StoreError, match="no run '2026_'"):  # LIKE wildcards are plain text
        store.get("2026_")


def test_compare_gives_differences_and_config_changes(store: RunStore, tmp_path: Path) -> None:
    a = store.register_record(record("a", 100.0), tmp_path / "a")
    b = store.register_record(record("b", 150.0, workers=2), tmp_path / "b")
    comparison = store.compare(a, b)
    throughput = next(f for f in comparison.figures if f.name == "throughput")
    assert throughput.difference == 50.0 and throughput.relative == pytest.approx(0.5) and not throughput.estimated
    assert next(f for f in comparison.figures if f.name == "energy_j").estimated
    assert comparison.config == [("launch.workers", 1, 2)]  # the run dirs always differ: not listed


def test_export_rows_have_units_and_name_the_estimated_figures(store: RunStore, tmp_path: Path) -> None:
    store.register_record(record("a", 100.0), tmp_path / "a")
    store.register("b", "train", tmp_path / "b", train_config())
    header, rows = store.export_rows()
    assert "throughput [samples/s]" in header and "energy_j [J]" in header and header[-2:] == ["estimated", "config"]
    by_id = {row[0]: dict(zip(header, row, strict=True)) for row in rows}
    assert by_id["a"]["throughput [samples/s]"] == 100.0 and "energy_j" in by_id["a"]["estimated"].split(";")
    assert by_id["b"]["throughput [samples/s]"] is None and by_id["b"]["status"] == "running"
    assert json.loads(by_id["a"]["config"])["workload"]["name"] == "mlp"


# -- concurrency and dead processes ----------------------------------------------------------------------------------

def _register_many(path: str, tag: str, count: int, start: Any) -> None:
    start.wait()
    store = RunStore.open(path)  # both open the same new file at once: the schema is created once
    for i in range(count):
        run_id = store.register(f"{tag}-{i}", "train", Path(path).parent / tag / str(i), train_config())
        store.finish(run_id, "completed", {"throughput": float(i)})


@pytest.mark.slow
def test_two_processes_registering_at_once_lose_no_row(tmp_path: Path) -> None:
    path = str(tmp_path / "dtpo.sqlite")
    ctx = multiprocessing.get_context("fork")
    start = ctx.Event()
    workers = [ctx.Process(target=_register_many, args=(path, tag, 60, start)) for tag in ("a", "b")]
    for worker in workers:
        worker.start()
    start.set()
    for worker in workers:
        worker.join(120)
    assert [w.exitcode for w in workers] == [0, 0]
    runs = RunStore.open(path).list_runs()
    assert len(runs) == 120 and {r.status for r in runs} == {"completed"}
    assert len({r.id for r in runs}) == 120


def _register_and_die(path: str, run_dir: str) -> None:
    RunStore.open(path).register(Path(run_dir).name, "train", run_dir, train_config())
    os.kill(os.getpid(), signal.SIGKILL)


def _killed(path: Path, run_dir: Path) -> None:
    process = multiprocessing.get_context("fork").Process(target=_register_and_die, args=(str(path), str(run_dir)))
    process.start()
    process.join(60)
    assert process.exitcode == -signal.SIGKILL


@pytest.mark.slow
def test_a_run_whose_process_was_killed_reads_as_failed_not_missing(store: RunStore, tmp_path: Path) -> None:
    _killed(store.path, tmp_path / "killed")
    (run,) = store.list_runs()
    assert run.status == "failed" and run.error == KILLED_ERROR and run.finished_at is not None
    assert store.get("killed").status == "failed"


@pytest.mark.slow
def test_a_killed_run_that_wrote_its_record_takes_it(store: RunStore, tmp_path: Path) -> None:
    run_dir = tmp_path / "done"
    record("done", 42.0).save(run_dir)
    _killed(store.path, run_dir)
    run = store.get("done")
    assert run.status == "completed" and run.figures["throughput"].value == 42.0


def test_a_live_process_keeps_its_row_running_and_a_reused_pid_does_not(store: RunStore, tmp_path: Path) -> None:
    mine = store.register("mine", "train", tmp_path / "mine", train_config())
    other = store.register("reused", "train", tmp_path / "reused", train_config())
    with sqlite3.connect(store.path) as conn:  # the same pid, but a process that started at another time
        conn.execute("UPDATE runs SET proc_start = proc_start + 1 WHERE id = ?", (other,))
    assert store.get(mine).status == "running"
    assert store.get(other).status == "failed"


# -- figures of results ------------------------------------------------------------------------------------------------

def test_simulate_and_plan_figures_are_estimated() -> None:
    setting = {"time_s": 10.0, "energy_j": 1000.0, "joules_per_sample": 2.0, "samples_per_s": 50.0,
               "average_power_w": 100.0, "power_limit_w": 200.0, "sm_clock_mhz": None}
    facts = simulate_facts({"config": {"gpus": 4, "steps": 100}, "workload": "resnet50",
                            "baseline": {**setting, "energy_j": 1250.0, "time_s": 9.0},
                            "results": [setting]})
    assert facts.workers == 4 and facts.steps == 100 and facts.workload == "resnet50"
    assert facts.figures["energy_vs_default"].value == pytest.approx(-0.2)
    assert all(f.estimated for f in facts.figures.values()) and "sm_clock_mhz" not in facts.figures
    sweep = simulate_facts({"config": {}, "baseline": setting, "results": [
        {**setting, "joules_per_sample": 1.5, "power_limit_w": 150.0}, {**setting, "samples_per_s": 60.0}]})
    assert sweep.figures["energy_optimal.power_limit_w"].value == 150.0
    assert sweep.figures["time_optimal.samples_per_s"].value == 60.0
    plan = plan_facts({"plans": [
        {"gpu": "H100", "inter_link": "ib-ndr", "predictions": [
            {"gpus": 8, "throughput": 100.0, "scaling_efficiency": 1.0, "joules_per_sample": 1.0},
            {"gpus": 64, "throughput": 700.0, "scaling_efficiency": 0.9, "joules_per_sample": 1.2, "step_s": 0.5,
             "cost": {"hours": 2.0, "kwh": 30.0, "total": None}}]},
        {"inter_link": "roce-100g", "predictions": [{"gpus": 64, "throughput": 500.0}]}]})
    assert plan.workers == 64 and plan.config["gpu_counts"] == [8, 64]
    assert plan.figures["throughput@64gpu"].value == 700.0 and plan.figures["kwh@64gpu"].unit == "kWh"
    assert plan.figures["throughput@64gpu[roce-100g]"].value == 500.0 and "cost@64gpu" not in plan.figures
    assert all(f.estimated for f in plan.figures.values())


# -- reindex -----------------------------------------------------------------------------------------------------------

def make_runs(root: Path) -> None:
    """A project's runs: train, tune, a bench of two, a simulation, a plan, a killed run, a broken record."""
    record("train-1", 10.0).save(root / "train-1")
    record("tune-1", 11.0, knob="power-limit").save(root / "tune-1")
    bench = root / "bench-1"
    record("workers-1", 10.0).save(bench / "workers-1")
    record("workers-2", 18.0, workers=2).save(bench / "workers-2")
    write_json_atomic(bench / "bench.json", {"schema": "dtpo.bench/1", "workload": "mlp", "config": train_config(),
                                             "rows": [{"workers": 1, "throughput": {"value": 10.0,
                                                                                    "unit": "samples/s"}},
                                                      {"workers": 2, "throughput": {"value": 18.0,
                                                                                    "unit": "samples/s"},
                                                       "scaling_efficiency": {"value": 0.9, "unit": "fraction",
                                                                              "source": "derived"}}]})
    write_json_atomic(root / "simulate-1" / "simulate.json",
                      {"schema": "dtpo.simulate/1", "config": {"gpus": 2, "steps": 10}, "workload": "resnet50",
                       "baseline": {"joules_per_sample": 2.0, "energy_j": 5.0, "time_s": 1.0},
                       "results": [{"joules_per_sample": 1.8, "energy_j": 4.5, "time_s": 1.1}]})
    write_json_atomic(root / "plan-1" / "plan.json", {"plans": [{"gpu": "H100", "predictions": [
        {"gpus": 8, "throughput": 100.0, "scaling_efficiency": 1.0, "joules_per_sample": 1.0}]}]})
    write_json_atomic(root / "killed-1" / "config.json", train_config())
    (root / "broken-1").mkdir()
    (root / "broken-1" / "record.json").write_text("{not json")


def test_reindex_rebuilds_every_kind_from_the_run_directories(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    make_runs(runs)
    path = tmp_path / "store.sqlite"
    report = reindex(path, [runs])
    assert report.counts == {"train": 4, "tune": 1, "bench": 1, "simulate": 1, "plan": 1}
    assert [p.name for p, _ in report.skipped] == ["broken-1"] and "not valid JSON" in report.skipped[0][1]
    store = RunStore.open(path)
    assert store.get("bench-1").figures["scaling_efficiency@2w"].value == 0.9
    assert store.get("workers-2").parent == "bench-1" and store.get("workers-2").workers == 2
    assert store.get("tune-1").kind == "tune"
    assert store.get("simulate-1").figures["joules_per_sample"].estimated
    assert store.get("plan-1").figures["throughput@8gpu"].value == 100.0
    killed = store.get("killed-1")
    assert killed.status == "failed" and killed.error == NO_RECORD_ERROR


def test_reindex_keeps_ids_and_runs_elsewhere_and_drops_gone_ones(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    make_runs(runs)
    path = tmp_path / "store.sqlite"
    store = RunStore.open(path)
    elsewhere = store.register_record(record("x", 5.0), tmp_path / "elsewhere" / "x")
    record("x", 5.0).save(tmp_path / "elsewhere" / "x")
    store.register_record(record("gone", 1.0), tmp_path / "gone")
    renamed = store.register_record(record("train-1", 10.0), runs / "train-1")
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE runs SET id = 'my-id' WHERE id = ?", (renamed,))
        conn.execute("UPDATE figures SET run_id = 'my-id' WHERE run_id = ?", (renamed,))
    report = reindex(path, [runs])
    assert report.dropped == 1
    ids = {r.id for r in store.list_runs()}
    assert {"my-id", elsewhere}.issubset(ids) and "gone" not in ids and "train-1" not in ids


def test_reindex_replaces_a_corrupt_store_and_keeps_it_aside(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    make_runs(runs)
    path = tmp_path / "store.sqlite"
    path.write_bytes(b"garbage" * 1000)
    report = reindex(path, [runs])
    assert report.corrupt_copy is not None and report.corrupt_copy.read_bytes() == b"garbage" * 1000
    assert report.corrupt_copy.name.startswith("store.sqlite.corrupt-")
    store = RunStore.open(path)
    assert store.journal_mode() == "wal" and len(store.list_runs()) == 8
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temporary left


def test_reindex_refuses_a_missing_folder_and_a_directory_store(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="not a directory of runs"):
        reindex(tmp_path / "s.sqlite", [tmp_path / "nowhere"])
    with pytest.raises(StoreError, match="is a directory"):
        reindex(tmp_path, [tmp_path])


def test_a_rebalanced_run_keeps_its_share_changes_and_the_smallest_share(store: RunStore, tmp_path: Path) -> None:
    from dtpo.core.record import RankRecord
    from dtpo.core.record_sections import SlackSection

    def rebalanced(run_id: str, changes: list[dict]) -> RunRecord:
        run = record(run_id, 100.0, knob="rebalance")
        final = changes[-1]["shares"] if changes else [32, 32]
        run.ranks = [RankRecord(r, r, "n", "cpu", slack=SlackSection(
            windows=8, steps=80, wait_s_per_step=0.01, wait_share=0.1, shares=final, initial_shares=[32, 32],
            share_changes=changes, recommendations=[])) for r in range(2)]
        return run

    changes = [{"window": 2, "step": 30, "shares": [24, 40], "gain": 0.1, "slow_ranks": [0]},
               {"window": 4, "step": 50, "shares": [22, 42], "gain": 0.05, "slow_ranks": [0]}]
    run = store.get(store.register_record(rebalanced("rb", changes), tmp_path / "rb"))
    assert run.kind == "tune"
    made = run.figures["rebalance.share_changes"]
    assert (made.value, made.unit, made.source, made.note) == (2, "changes", "derived", "last from step 50")
    smallest = run.figures["rebalance.smallest_share"]
    assert smallest.value == pytest.approx(22 / 32) and smallest.unit == "x even" and not smallest.estimated
    assert "rank 0" in smallest.note and "22 of 64 samples per step" in smallest.note
    even = store.get(store.register_record(rebalanced("even", []), tmp_path / "even"))
    assert even.figures["rebalance.share_changes"].value == 0
    assert even.figures["rebalance.smallest_share"].value == 1.0
    plain = store.get(store.register_record(record("plain", 100.0), tmp_path / "plain"))
    assert not any(name.startswith("rebalance.") for name in plain.figures)
