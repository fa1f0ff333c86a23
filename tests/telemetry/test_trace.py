"""Chrome traces built from a run record and its power timelines."""

from __future__ import annotations

from pathlib import Path

import pytest

from dtpo.core.record import RankRecord, RunRecord, StepRecord
from dtpo.telemetry.trace import TIMELINE_START, load_trace, power_timeline_path, step_parts, write_traces

T0 = 1_800_000_000.0


def _step(i: int, rank: int, split: bool = True) -> StepRecord:
    return StepRecord(step=i, warmup=i == 0, samples=8, step_s=0.1, data_wait_s=0.01, compute_s=0.06,
                      tail_s=0.02, optimizer_s=0.01, comm_exposed_s=0.015 if split else None,
                      sync_wait_s=0.005 if split else None, loss=1.0, started_at=T0 + 0.1 * i + 0.001 * rank)


def _record(tmp_path: Path, split: bool = True) -> RunRecord:
    ranks = [RankRecord(rank, rank, "host", "cpu", steps=[_step(i, rank, split) for i in range(3)],
                        switches=[{"step": 2, "setting": "grad_accum", "value": 2}] if rank == 0 else [],
                        energy={TIMELINE_START: T0 - 0.5}) for rank in range(2)]
    power = power_timeline_path(tmp_path, 0)
    power.parent.mkdir(parents=True)
    power.write_text("t_s,cpu (modelled) [W],dram (modelled) [W]\n0.000,5.0,8.0\n0.100,6.0,\n")
    return RunRecord(run_id="r", status="completed", started_at="now", ranks=ranks)


def test_every_rank_gets_a_trace_and_the_merged_one_holds_them_all(tmp_path: Path) -> None:
    record = _record(tmp_path)
    merged = write_traces(record, tmp_path)
    assert merged == tmp_path / "trace" / "merged.json"
    assert sorted(p.name for p in merged.parent.iterdir()) == ["merged.json", "rank00000.json", "rank00001.json"]
    events = load_trace(merged)["traceEvents"]
    assert {e["pid"] for e in events} == {0, 1}
    steps = [e for e in events if e.get("cat") == "step"]
    parts = [e for e in events if e.get("cat") == "part"]
    assert len(steps) == 6 and len(parts) == 6 * 5
    # Parts lie end to end inside their step, in the order they happen.
    for step in steps:
        inside = [p for p in parts if p["pid"] == step["pid"] and p["args"]["step"] == int(step["name"].split()[1])]
        assert [p["name"] for p in inside] == ["data wait", "compute", "sync wait", "comm exposed", "optimizer"]
        assert inside[0]["ts"] == step["ts"]
        assert inside[-1]["ts"] + inside[-1]["dur"] <= step["ts"] + step["dur"] + 0.5
    # Time zero is the first power sample (0.5 s before the first step); rank 1 starts 1 ms after rank 0.
    first = {e["pid"]: e["ts"] for e in steps if e["name"] == "step 0"}
    assert first == {0: pytest.approx(500_000.0, abs=1), 1: pytest.approx(501_000.0, abs=1)}
    counters = [e for e in events if e["ph"] == "C"]
    assert [(e["name"], e["args"]["W"]) for e in counters] == [
        ("power cpu (modelled)", 5.0), ("power dram (modelled)", 8.0), ("power cpu (modelled)", 6.0)]
    assert [e["ts"] for e in counters] == pytest.approx([0.0, 0.0, 100_000.0], abs=1)
    [switch] = [e for e in events if e["ph"] == "i"]
    assert switch["name"] == "grad_accum = 2" and switch["ts"] == pytest.approx(700_000.0, abs=1)
    names = {e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names == {"rank 0 (host)", "rank 1 (host)"}
    assert len(load_trace(tmp_path / "trace" / "rank00001.json")["traceEvents"]) < len(events)


def test_an_unsplit_tail_is_one_part_and_a_record_without_start_times_has_no_trace(tmp_path: Path) -> None:
    step = _step(0, 0, split=False)
    assert step_parts(step) == [("data wait", 0.01), ("compute", 0.06), ("comm + sync wait", 0.02),
                                ("optimizer", 0.01)]
    old = RunRecord(run_id="old", status="completed", started_at="now",
                    ranks=[RankRecord(0, 0, "h", "cpu", steps=[StepRecord(0, False, 8, 0.1, 0.0, 0.1, 0.0, 0.0)])])
    assert write_traces(old, tmp_path) is None
    assert not (tmp_path / "trace").exists()
