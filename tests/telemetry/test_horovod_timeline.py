"""A Horovod timeline read into steps, stragglers and a dtpo trace (files written as Horovod writes them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from horovod_timelines import START_UNIX_US, Job, timeline_text

from dtpo.core.errors import ConfigError
from dtpo.telemetry.horovod_timeline import (
    analyse,
    parse_events,
    read_timeline,
    summary,
    trace_document,
)

STRAGGLER = Job(ranks=4, steps=5, late_ms={1: 30.0})  # rank 1 asks for every tensor 30 ms after the others


def _write(folder: Path, text: str, name: str = "timeline.json") -> Path:
    path = folder / name
    path.write_text(text)
    return path


def test_rank_one_is_named_last_in_every_step_with_its_lateness(tmp_path: Path) -> None:
    report = analyse(read_timeline(_write(tmp_path, timeline_text(STRAGGLER))))
    assert report.kind == "ALLREDUCE" and not report.timeline.truncated
    assert report.timeline.start_unix_us == START_UNIX_US and report.timeline.tensors == 4
    assert len(report.steps) == 5 and len(report.measured) == 5
    assert [len(s.negotiations) for s in report.steps] == [4] * 5
    assert [s.late_rank for s in report.steps] == [1] * 5
    assert all(29e-3 < s.lead_s < 31e-3 for s in report.steps)
    by_rank = {r.rank: r for r in report.ranks}
    assert sorted(by_rank) == [0, 1, 2, 3]
    assert (by_rank[1].last, by_rank[1].steps, by_rank[1].last_share) == (5, 5, 1.0)
    assert all(by_rank[r].last == 0 for r in (0, 2, 3))
    assert 29e-3 < by_rank[1].mean_lateness_s < 31e-3 and 29e-3 < by_rank[1].median_lateness_s < 31e-3
    assert all(by_rank[r].max_lateness_s < 1e-3 for r in (0, 2, 3))  # within one cycle of the first rank
    assert by_rank[0].mean_lateness_s == 0.0  # the coordinator stamps its own requests first
    assert by_rank[1].mean_wait_s < 0.01e-3 and 29e-3 < by_rank[0].mean_wait_s < 31e-3  # the others wait for it


def test_steps_follow_the_tensor_rounds(tmp_path: Path) -> None:
    """A step is one negotiation of each tensor: the next step begins where a tensor repeats."""
    report = analyse(read_timeline(_write(tmp_path, timeline_text(STRAGGLER))))
    for step in report.steps:
        assert sorted(n.tensor for n in step.negotiations) == sorted(STRAGGLER.tensors)
        assert step.start_us <= min(step.ready_us.values()) and max(step.ready_us.values()) <= step.negotiated_us
        assert step.negotiated_us < step.end_us
    for before, after in zip(report.steps, report.steps[1:], strict=False):
        assert after.start_us == before.end_us
    first = report.steps[0].negotiations[-1]  # the last gradient of step 0, with the allreduce that followed it
    assert first.tensor == "allreduce.fc1.weight"
    assert [a[0] for a in first.activities] == ["MEMCPY_IN_FUSION_BUFFER", "NCCL_ALLREDUCE",
                                                "MEMCPY_OUT_FUSION_BUFFER"]
    assert first.end_us is not None and first.op_start_us is not None and first.op_end_us is not None
    assert first.end_us < first.op_start_us < first.op_end_us


def test_a_timeline_horovod_never_closed_is_read_whole(tmp_path: Path) -> None:
    """Before Horovod 0.21 every event ends with a comma and the array is never closed."""
    text = timeline_text(STRAGGLER, layout="0.16")
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)
    report = analyse(read_timeline(_write(tmp_path, text)))
    assert report.timeline.truncated and report.timeline.start_unix_us is None
    assert len(report.measured) == 5 and [s.late_rank for s in report.steps] == [1] * 5


def test_a_file_cut_inside_an_event_keeps_every_whole_step(tmp_path: Path) -> None:
    """A job killed while Horovod was writing: the last step is incomplete and stays out of the figures."""
    text = timeline_text(STRAGGLER)
    cut = text.rindex('"name": "NEGOTIATE_ALLREDUCE"') + 60  # inside the event after the last negotiation began
    events, truncated = parse_events(text[:cut])
    assert truncated and len(events) < len(json.loads(text))
    report = analyse(read_timeline(_write(tmp_path, text[:cut])))
    assert report.timeline.truncated
    assert len(report.steps) == 5 and report.incomplete == 1 and not report.steps[-1].complete
    assert report.steps[-1].late_rank is None
    assert len(report.measured) == 4 and {r.rank: r.last for r in report.ranks}[1] == 4
    assert summary(report)["incomplete_steps"] == 1


def test_cycle_markers_are_ignored(tmp_path: Path) -> None:
    job = Job(ranks=4, steps=3, late_ms={1: 30.0}, mark_cycles=True)
    text = timeline_text(job)
    assert '"CYCLE_START"' in text
    report = analyse(read_timeline(_write(tmp_path, text)))
    assert [s.late_rank for s in report.steps] == [1, 1, 1]


def test_ranks_ready_within_one_cycle_name_no_late_rank(tmp_path: Path) -> None:
    """Without a straggler the ranks differ by the coordinator's gather only (µs): a tie, not a late rank."""
    path = _write(tmp_path, timeline_text(Job(ranks=4, steps=3)))
    report = analyse(read_timeline(path))
    assert [s.late_rank for s in report.steps] == [None] * 3 and all(r.last == 0 for r in report.ranks)
    eager = analyse(read_timeline(path), tie_s=0.0)  # without the tie threshold the last in rank order "wins"
    assert [s.late_rank for s in eager.steps] == [3] * 3


def test_steps_of_the_response_cache_are_counted_but_not_measured(tmp_path: Path) -> None:
    report = analyse(read_timeline(_write(tmp_path, timeline_text(Job(steps=4, late_ms={2: 10.0},
                                                                      cached_from_step=1)))))
    assert len(report.steps) == 4 and report.cached == 3 and len(report.measured) == 1
    assert report.steps[0].late_rank == 2 and all(s.cached and s.late_rank is None for s in report.steps[1:])
    assert {r.rank: r.steps for r in report.ranks} == {0: 1, 1: 1, 2: 1, 3: 1}


def test_a_timeline_without_any_rank_tick_asks_for_the_cache_off(tmp_path: Path) -> None:
    timeline = read_timeline(_write(tmp_path, timeline_text(Job(steps=2, cached_from_step=0))))
    with pytest.raises(ConfigError, match="HOROVOD_CACHE_CAPACITY=0"):
        analyse(timeline)


def test_an_operation_the_timeline_lacks_is_refused(tmp_path: Path) -> None:
    timeline = read_timeline(_write(tmp_path, timeline_text(STRAGGLER)))
    with pytest.raises(ConfigError, match=r"no BROADCAST; it has ALLREDUCE \(20\)"):
        analyse(timeline, kind="broadcast")
    assert analyse(timeline, kind="NEGOTIATE_ALLREDUCE").kind == "ALLREDUCE"


@pytest.mark.parametrize(("text", "message"), [
    ("", "is empty"),
    ("   \n", "is empty"),
    ("hello", "is not JSON"),
    ("[\n{\"ph\": \"B\", \"name\": \"NEGO", "is not JSON"),
    ('{"a": 1}', "not an array of trace events"),
    ('[1, 2, 3]', "holds no trace events"),
    ('{"traceEvents": [{"name": "step 0", "ph": "X", "pid": 0, "ts": 0, "dur": 5}]}', "has no NEGOTIATE_"),
])
def test_what_is_not_a_horovod_timeline_is_one_config_error(tmp_path: Path, text: str, message: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError, match=message) as caught:
        read_timeline(path)
    assert "\n" not in str(caught.value) and str(path) in str(caught.value)


def test_a_missing_file_or_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        read_timeline(tmp_path / "missing.json")
    with pytest.raises(ConfigError, match="is a directory"):
        read_timeline(tmp_path)


def test_the_trace_has_a_track_per_rank_and_the_wait_on_the_others(tmp_path: Path) -> None:
    report = analyse(read_timeline(_write(tmp_path, timeline_text(STRAGGLER))))
    doc = trace_document(report, tmp_path / "timeline.json")
    events = doc["traceEvents"]
    assert json.loads(json.dumps(doc)) == doc
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names == {0: "rank 0", 1: "rank 1", 2: "rank 2", 3: "rank 3"}
    assert doc["otherData"]["time_zero_unix_s"] == pytest.approx((START_UNIX_US + report.steps[0].start_us) / 1e6)

    def spans(pid: int, name: str) -> list[dict]:
        return [e for e in events if e["pid"] == pid and e["name"] == name and e["ph"] == "X"]

    for pid in range(4):
        assert len(spans(pid, "step 0")) == 1 and len(spans(pid, "allreduce")) == 5
        for step, compute, wait, reduce in zip(*(spans(pid, n) for n in ("step 0", "compute", "negotiation wait",
                                                                           "allreduce")), strict=False):
            assert compute["ts"] == step["ts"]  # the parts follow each other through the step
            assert wait["ts"] == pytest.approx(compute["ts"] + compute["dur"], abs=0.2)
            assert reduce["ts"] == pytest.approx(wait["ts"] + wait["dur"], abs=0.2)
            assert reduce["ts"] + reduce["dur"] == pytest.approx(step["ts"] + step["dur"], abs=0.2)
    waits = {pid: [w["dur"] for w in spans(pid, "negotiation wait")] for pid in range(4)}
    assert all(29_000 < d < 31_000 for pid in (0, 2, 3) for d in waits[pid])  # µs: waiting for rank 1
    assert all(d < 10 for d in waits[1])
    late = [e for e in events if e["ph"] == "i"]
    assert len(late) == 5 and {e["pid"] for e in late} == {1} and late[0]["name"].startswith("last ready (+")
    assert spans(1, "step 0")[0]["args"]["late_rank"] == 1
    assert 29 < spans(1, "step 0")[0]["args"]["lateness_ms"] < 31


def test_the_summary_holds_every_figure(tmp_path: Path) -> None:
    figures = summary(analyse(read_timeline(_write(tmp_path, timeline_text(STRAGGLER)))))
    assert json.loads(json.dumps(figures)) == figures
    assert (figures["op"], figures["steps"], figures["measured_steps"], figures["cached_steps"]) == (
        "ALLREDUCE", 5, 5, 0)
    assert [r["last"] for r in figures["ranks"]] == [0, 5, 0, 0]
    assert [s["late_rank"] for s in figures["per_step"]] == [1] * 5
    assert 29e-3 < figures["per_step"][0]["lateness_s"]["1"] < 31e-3
