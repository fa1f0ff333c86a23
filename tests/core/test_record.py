"""The run record: schema, round trip, atomic writes, partial records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dtpo.core.errors import DtpoError
from dtpo.core.record import (
    SCHEMA,
    RankRecord,
    RunRecord,
    StepRecord,
    load_partial_records,
    rank_record_path,
    write_json_atomic,
)


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
