"""The run record: schema, round trip, atomic writes, partial records."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
from pathlib import Path

import pytest

from dtpo.core.errors import DtpoError
from dtpo.core.measurement import Measurement
from dtpo.core.record import (
    SCHEMA,
    EnergyTotals,
    RankRecord,
    Restart,
    RunRecord,
    StepRecord,
    current_umask,
    load_partial_records,
    rank_record_path,
    write_json_atomic,
)
from dtpo.core.steps import plain_step


def sample_record() -> RunRecord:
    step = StepRecord(step=0, warmup=False, samples=8, step_s=0.1, data_wait_s=0.01, compute_s=0.07,
                      tail_s=0.01, optimizer_s=0.01, loss=2.5)
    rank = RankRecord(rank=0, local_rank=0, node="n0", device="cpu", flops_per_step=1e9, steps=[step])
    return RunRecord(run_id="r1", status="completed", started_at="2026-01-01T00:00:00+00:00",
                     config={"workload": "mlp"}, ranks=[rank])


def test_round_trip(tmp_path: Path) -> None:
    record = sample_record()
    record.save(tmp_path)
    loaded = RunRecord.load(tmp_path)
    assert loaded == record
    assert json.loads((tmp_path / "record.json").read_text())["schema"] == SCHEMA


def test_an_evaluation_round_trips_and_a_record_without_one_has_no_key(tmp_path: Path) -> None:
    record = sample_record()
    assert "evaluation" not in record.to_dict()["ranks"][0]
    record.ranks[0].evaluation = {"loss": 0.52, "samples": 1024}
    record.save(tmp_path)
    assert RunRecord.load(tmp_path).ranks[0].evaluation == {"loss": 0.52, "samples": 1024}


def test_the_bookkeeping_per_step_round_trips_and_a_record_without_it_has_no_key(tmp_path: Path) -> None:
    record = sample_record()
    assert "bookkeeping_s_per_step" not in record.to_dict()["ranks"][0]  # records as before it existed
    record.save(tmp_path / "without")
    assert RunRecord.load(tmp_path / "without").ranks[0].bookkeeping_s_per_step is None
    record.ranks[0].bookkeeping_s_per_step = 21e-6
    record.save(tmp_path / "with")
    assert RunRecord.load(tmp_path / "with").ranks[0].bookkeeping_s_per_step == 21e-6


def test_unknown_schema_and_garbage_are_clear_errors(tmp_path: Path) -> None:
    (tmp_path / "record.json").write_text(json.dumps({"schema": "dtpo.run/999"}))
    with pytest.raises(DtpoError, match="unsupported record schema"):
        RunRecord.load(tmp_path)
    (tmp_path / "record.json").write_text("{not json")
    with pytest.raises(DtpoError, match="not valid JSON"):
        RunRecord.load(tmp_path)
    with pytest.raises(DtpoError, match="no run record"):
        RunRecord.load(tmp_path / "missing")


def test_atomic_write_keeps_the_old_file_when_serialising_fails(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    write_json_atomic(path, {"a": 1})
    with pytest.raises(TypeError):
        write_json_atomic(path, {"a": object()})
    assert json.loads(path.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]


def test_partial_records_are_found_in_rank_order_and_bad_ones_skipped(tmp_path: Path) -> None:
    for rank in (1, 0):
        record = sample_record()
        record.ranks[0].rank = rank
        write_json_atomic(rank_record_path(tmp_path, rank), record.to_dict())
    rank_record_path(tmp_path, 2).write_text("{truncated")
    partials = load_partial_records(tmp_path)
    assert [p.ranks[0].rank for p in partials] == [0, 1]


# -- dtpo.run/2 -------------------------------------------------------------------------------------------

V1_RECORD = {
    "schema": "dtpo.run/1", "run_id": "old", "status": "completed", "started_at": "2025-01-01T00:00:00+00:00",
    "finished_at": "2025-01-01T00:01:00+00:00", "config": {"workload": "mlp"}, "environment": {},
    "ranks": [{"rank": 0, "local_rank": 0, "node": "n0", "device": "cpu", "flops_per_step": 1e9,
               "peak_flops": {"value": 1e11, "unit": "FLOP/s", "source": "measured", "note": "cached"},
               "steps": [{"step": 0, "warmup": False, "samples": 8, "step_s": 0.1, "data_wait_s": 0.0,
                          "compute_s": 0.1, "tail_s": 0.0, "optimizer_s": 0.0, "comm_exposed_s": 0.0,
                          "sync_wait_s": 0.0, "loss": 1.0}],
               "error": None, "energy": None}],
    "totals": {"throughput": {"value": 80.0, "unit": "samples/s", "source": "derived"}},
    "energy": {"energy_j": {"value": 10.0, "unit": "J", "source": "estimated", "note": "from modelled 10.0 J"},
               "average_power_w": {"value": 100.0, "unit": "W", "source": "estimated"},
               "energy_per_sample_j": {"value": 1.25, "unit": "J/sample", "source": "estimated"},
               "kwh": {"value": 10 / 3.6e6, "unit": "kWh", "source": "estimated"},
               "co2_g": {"value": 0.001, "unit": "g CO2e", "source": "estimated", "note": "grid"},
               "by_source_j": {"modelled": 10.0}, "time_s": 0.1, "lost": {}},
    "error": None,
}


def test_a_v1_record_loads_as_attempt_0_with_typed_figures(tmp_path: Path,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "record.json").write_text(json.dumps(V1_RECORD))
    with caplog.at_level("WARNING"):
        record = RunRecord.load(tmp_path)
    assert not caplog.records  # nothing unknown in a v1 record
    assert record.schema == SCHEMA and record.attempt == 0 and record.restarts == [] and record.unknown == {}
    assert record.totals["throughput"] == Measurement(80.0, "samples/s", "derived")
    assert isinstance(record.energy, EnergyTotals) and record.energy.energy_j.estimated
    assert record.energy.cost is None and record.energy.by_source_j == {"modelled": 10.0}
    assert record.ranks[0].peak_flops == Measurement(1e11, "FLOP/s", "measured", "cached")
    # Written back it is a v2 record with the same figures in the same JSON form.
    record.save(tmp_path)
    saved = json.loads((tmp_path / "record.json").read_text())
    assert saved["schema"] == "dtpo.run/2" and saved["attempt"] == 0 and saved["restarts"] == []
    assert saved["energy"] == V1_RECORD["energy"] and saved["totals"] == V1_RECORD["totals"]
    assert saved["ranks"][0] == {**V1_RECORD["ranks"][0], "knobs": None, "switches": [], "tuning": None, "slack": None,
                                 "model": None,
                                 "steps": [{**s, "started_at": None} for s in V1_RECORD["ranks"][0]["steps"]]}


def test_v2_round_trip_with_restarts_and_energy(tmp_path: Path) -> None:
    record = sample_record()
    record.status = "interrupted"
    record.attempt = 1
    record.restarts = [Restart(0, "failed", "RuntimeError: boom", steps=12,
                               time_s=Measurement(3.5, "s"), energy_j=Measurement(120.0, "J", "estimated"))]
    record.totals = {"mfu": Measurement(None, "fraction", "derived", "FLOPs or peak unknown")}
    record.energy = EnergyTotals(Measurement(1.0, "J"), Measurement(2.0, "W"), Measurement(0.1, "J/sample"),
                                 Measurement(1 / 3.6e6, "kWh"), Measurement(0.1, "g CO2e", "estimated"),
                                 cost=Measurement(0.01, "EUR"), by_source_j={"rapl": 1.0}, time_s=0.5,
                                 lost={"rank1": "gone"})
    record.save(tmp_path)
    loaded = RunRecord.load(tmp_path)
    assert loaded == record
    assert loaded.restarts[0].energy_j == Measurement(120.0, "J", "estimated")


@pytest.mark.parametrize("status", ["completed", "failed", "interrupted", "diverged", "running"])
def test_every_status_is_accepted_and_others_refused(status: str) -> None:
    assert RunRecord("r", status, "t").status == status
    with pytest.raises(ValueError, match="unknown run status"):
        RunRecord("r", "exploded", "t")


def test_unknown_keys_are_reported_and_kept(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    data = sample_record().to_dict()
    data["from_the_future"] = {"x": 1}
    data["ranks"][0]["gpu_clock_mhz"] = 1410
    data["ranks"][0]["steps"][0]["power_w"] = 250.0
    data["totals"]["throughput"] = {"value": 1.0, "unit": "samples/s", "source": "derived", "ci95": [0.9, 1.1]}
    (tmp_path / "record.json").write_text(json.dumps(data))
    with caplog.at_level("WARNING", logger="dtpo.core.record"):
        record = RunRecord.load(tmp_path)
    assert record.unknown == {"from_the_future": {"x": 1}, "ranks[0].gpu_clock_mhz": 1410,
                              "ranks[0].steps[0].power_w": 250.0, "totals.throughput.ci95": [0.9, 1.1]}
    [warning] = caplog.records
    for key in record.unknown:
        assert key in warning.getMessage()
    # Kept through a save, and not reported again by the next load.
    record.save(tmp_path)
    caplog.clear()
    with caplog.at_level("WARNING", logger="dtpo.core.record"):
        assert RunRecord.load(tmp_path).unknown == record.unknown
    assert not caplog.records


def test_a_record_with_a_bad_shape_is_a_clear_error(tmp_path: Path) -> None:
    data = sample_record().to_dict()
    data["totals"] = {"throughput": 12.0}
    (tmp_path / "record.json").write_text(json.dumps(data))
    with pytest.raises(DtpoError, match="totals.throughput is not a measurement"):
        RunRecord.load(tmp_path)
    del data["totals"]
    del data["run_id"]
    (tmp_path / "record.json").write_text(json.dumps(data))
    with pytest.raises(DtpoError, match="not a valid run record"):
        RunRecord.load(tmp_path)


def test_old_constructor_calls_still_work() -> None:
    """The Session builds records with these shapes (peak as a dict, totals as dicts from older code)."""
    rank = RankRecord(0, 0, "n", "cpu", peak_flops={"value": 1e11, "unit": "FLOP/s", "source": "measured"})
    assert rank.peak_flops == Measurement(1e11, "FLOP/s")
    record = RunRecord(run_id="r", status="running", started_at="t", config={}, environment={},
                       totals={"wall_s": {"value": 1.0, "unit": "s"}})
    assert record.totals["wall_s"] == Measurement(1.0, "s") and record.totals["wall_s"]["value"] == 1.0


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_atomic_writes_respect_the_umask(tmp_path: Path, umask: int) -> None:
    old = os.umask(umask)
    try:
        path = tmp_path / "x.json"
        write_json_atomic(path, {"a": 1})
        assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask
        assert current_umask() == umask
    finally:
        os.umask(old)


def test_tokens_are_kept_where_counted_and_left_out_of_the_record_otherwise() -> None:
    rank = RankRecord(0, 0, "node", "cpu", steps=[plain_step(0, False, 8, 1.0, 0.1, False),
                                                  plain_step(1, False, 8, 1.1, 0.1, False, tokens=512)])
    steps = rank.to_dict()["steps"]
    assert "tokens" not in steps[0] and steps[1]["tokens"] == 512
    again = RankRecord.from_dict(rank.to_dict())
    assert [s.tokens for s in again.steps] == [None, 512]


def test_a_step_records_dict_holds_every_field_and_tokens_only_where_counted() -> None:
    names = {f.name for f in dataclasses.fields(StepRecord)}
    step = StepRecord(3, False, 8, 0.5, 0.1, 0.3, 0.05, 0.05, loss=1.5, started_at=100.0)
    assert set(step.to_dict()) == names - {"tokens"}
    step.tokens = 512
    assert set(step.to_dict()) == names and step.to_dict()["tokens"] == 512
    assert StepRecord.from_dict(step.to_dict()) == step
