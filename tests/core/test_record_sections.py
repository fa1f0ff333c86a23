"""Typed rank-record sections: the JSON they write is the JSON the dicts wrote, and old records load as types."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dtpo.core.errors import DtpoError
from dtpo.core.record import RankRecord, RunRecord
from dtpo.core.record_sections import JobTuning, KnobSection, PowerTuning, SlackSection, tuning_from_dict

# Each section as the dict writers put into record.json before the sections had types (key order included).
KNOBS = {"power_limit_w": 250.0, "sm_clock_mhz": None, "applied": True, "mode": "apply", "gpus": ["nvidia0"],
         "note": "set for the run and restored at its end"}
SLACK = {"windows": 3, "steps": 30, "wait_s_per_step": 0.01, "wait_share": 0.1, "critical_ranks": {"1": 3},
         "note": "learned online"}
STRAGGLER_SLACK = {**SLACK, "mode": "apply", "clock_changes": [{"step": 12, "clock_mhz": 1200.0}], "tuned": True}
TUNER_REPORT = {"metric": "energy", "metric_description": "energy per sample", "unit": "J/sample", "phase": "hold",
                "choice": {"power_limit_w": 200.0, "sm_clock_mhz": None}, "profiling_steps": 40, "refined": None,
                "settings": [{"power_limit_w": 200.0, "cost": 1.0, "status": "chosen"}], "segments": []}
POWER = {**TUNER_REPORT, "knob": "power-limit", "mode": "apply", "source": "measured", "note": None, "applied": True,
         "profile": {"loaded": False}}
POWER_WITH_MODEL = {**POWER, "source": "model", "model": {"choice": {"power_limit_w": 175.0}}}
POWER_UNTUNED = {"knob": "power-limit", "metric": "energy", "applied": False, "note": "no GPU with power knobs"}
JOB = {"knob": "precision,grad-accum", "kind": "job", "metric": "energy", "applied": True,
       "screened": {"precision bf16-mixed": "slow here"}, "metric_description": "energy per sample", "phase": "hold",
       "choice": {"precision": "32-true", "grad_accum": 2}, "settings": [], "rejected": [], "trajectory": []}
JOB_UNTUNED = {"knob": "precision", "kind": "job", "metric": "time", "applied": True, "screened": {},
               "note": "training ended before the tuner had measured a step"}


@pytest.mark.parametrize(("data", "kind"), [
    (KNOBS, KnobSection), (SLACK, SlackSection), (STRAGGLER_SLACK, SlackSection), (POWER, PowerTuning),
    (POWER_WITH_MODEL, PowerTuning), (POWER_UNTUNED, PowerTuning), (JOB, JobTuning), (JOB_UNTUNED, JobTuning)])
def test_sections_write_what_they_read_key_for_key(data: dict[str, Any], kind: type) -> None:
    section = tuning_from_dict(data) if kind in (PowerTuning, JobTuning) else kind.from_dict(data)
    assert type(section) is kind
    assert list(section.to_dict().items()) == list(data.items())  # same keys, same order, same values


def test_tuning_kinds_are_told_apart_by_type() -> None:
    power, job = tuning_from_dict(POWER), tuning_from_dict(JOB)
    assert isinstance(power, PowerTuning) and power.kind == "power" and "kind" not in power.to_dict()
    assert isinstance(job, JobTuning) and job.kind == "job" and job.report is not None
    assert job.report["choice"] == {"precision": "32-true", "grad_accum": 2} and "metric" not in job.report
    assert tuning_from_dict(POWER_UNTUNED).report is None and tuning_from_dict(JOB_UNTUNED).report is None
    with pytest.raises(ValueError, match="unknown tuning kind 'clock'"):
        tuning_from_dict({**JOB, "kind": "clock"})


def test_sections_built_by_the_writers_match_the_old_dicts() -> None:
    power = PowerTuning("power-limit", "energy", applied=True, mode="apply", source="measured",
                        profile={"loaded": False}, report=dict(TUNER_REPORT))
    assert list(power.to_dict().items()) == list(POWER.items())
    job = JobTuning("precision,grad-accum", "energy", screened={"precision bf16-mixed": "slow here"},
                    report={k: v for k, v in JOB.items() if k not in ("knob", "kind", "applied", "screened")})
    assert list(job.to_dict().items()) == list(JOB.items())
    slack = SlackSection(**SLACK)
    assert slack.to_dict() == SLACK and "tuned" not in slack.to_dict()


def test_a_record_round_trips_byte_for_byte() -> None:
    ranks = [{"rank": 0, "local_rank": 0, "node": "n", "device": "cpu", "knobs": KNOBS, "tuning": POWER,
              "slack": STRAGGLER_SLACK},
             {"rank": 1, "local_rank": 1, "node": "n", "device": "cpu", "knobs": None, "tuning": JOB_UNTUNED,
              "slack": None}]
    data = RunRecord("r", "completed", "2026-01-01T00:00:00+00:00",
                     ranks=[RankRecord.from_dict(r) for r in ranks]).to_dict()
    text = json.dumps(data, indent=1)
    loaded = RunRecord.from_dict(json.loads(text))
    assert isinstance(loaded.ranks[0].knobs, KnobSection) and isinstance(loaded.ranks[0].slack, SlackSection)
    assert isinstance(loaded.ranks[0].tuning, PowerTuning) and isinstance(loaded.ranks[1].tuning, JobTuning)
    assert json.dumps(loaded.to_dict(), indent=1) == text
    assert loaded.ranks[0].slack.clock_changes == [{"step": 12, "clock_mhz": 1200.0}]


def test_dicts_given_to_a_rank_record_become_sections() -> None:
    rank = RankRecord(0, 0, "n", "cpu", knobs=KNOBS, tuning=JOB, slack=SLACK)  # type: ignore[arg-type]
    assert isinstance(rank.knobs, KnobSection) and rank.knobs.gpus == ["nvidia0"]
    assert isinstance(rank.tuning, JobTuning) and isinstance(rank.slack, SlackSection)


def test_unknown_section_keys_are_kept_under_unknown() -> None:
    data = RunRecord("r", "completed", "t", ranks=[RankRecord(0, 0, "n", "cpu")]).to_dict()
    data["ranks"][0]["slack"] = {**SLACK, "future": 1}
    data["ranks"][0]["knobs"] = {**KNOBS, "later": 2}
    record = RunRecord.from_dict(data)
    assert record.unknown == {"ranks[0].slack.future": 1, "ranks[0].knobs.later": 2}
    assert record.to_dict()["unknown"] == record.unknown


def test_a_section_missing_what_it_needs_is_an_invalid_record() -> None:
    data = RunRecord("r", "completed", "t", ranks=[RankRecord(0, 0, "n", "cpu")]).to_dict()
    data["ranks"][0]["slack"] = {"windows": 3}
    with pytest.raises(DtpoError, match="not a valid run record"):
        RunRecord.from_dict(data, source="x")
