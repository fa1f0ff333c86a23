"""The partial record's text: the same JSON a full encoding gives, each step and energy window encoded once."""

from __future__ import annotations

import json

import pytest

from dtpo.core.partial_text import PartialRecordText
from dtpo.core.record import RankRecord, RunRecord, StepRecord


def step(i: int, tokens: int | None = None) -> StepRecord:
    return StepRecord(step=i, warmup=i < 2, samples=8, step_s=0.1 + i / 1e3, data_wait_s=0.01, compute_s=0.07,
                      tail_s=0.01, optimizer_s=0.01, loss=2.5 - i / 100, tokens=tokens)


def partial(steps: list[StepRecord], config: dict | None = None) -> RunRecord:
    rank = RankRecord(rank=1, local_rank=1, node="n0", device="cpu", flops_per_step=1e9, steps=steps,
                      energy={"windows": [{"first_step": 2, "last_step": 3, "energy_j": {"cpu": 1.5}}]})
    return RunRecord(run_id="r1", status="running", started_at="2026-01-01T00:00:00+00:00",
                     config=config or {"workload": "mlp"}, ranks=[rank])


def full(record: RunRecord) -> str:
    return json.dumps(record.to_dict(), separators=(",", ":"))


def test_each_flush_writes_what_a_full_encoding_writes_as_the_steps_grow() -> None:
    steps: list[StepRecord] = []
    record, text = partial(steps), PartialRecordText()
    assert text.encode(record) == full(record)  # no step yet
    for grown in (1, 4, 4, 9):
        steps.extend(step(i, tokens=64 if i % 2 else None) for i in range(len(steps), grown))
        record.ranks[0].energy["windows"].append({"first_step": grown, "last_step": grown})  # the rest grows too
        record.status = "running" if grown < 9 else "completed"
        assert text.encode(record) == full(record)
    assert RunRecord.from_dict(json.loads(text.encode(record))).ranks[0].steps == steps


def test_each_step_is_encoded_once(monkeypatch: pytest.MonkeyPatch) -> None:
    encoded: list[int] = []
    to_dict = StepRecord.to_dict
    monkeypatch.setattr(StepRecord, "to_dict", lambda self: encoded.append(self.step) or to_dict(self))
    steps = [step(i) for i in range(5)]
    record, text = partial(steps), PartialRecordText()
    text.encode(record)
    steps.extend(step(i) for i in range(5, 8))
    text.encode(record)
    text.encode(record)
    assert encoded == list(range(8))


def test_steps_replaced_or_cut_are_encoded_afresh() -> None:
    record, text = partial([step(i) for i in range(6)]), PartialRecordText()
    text.encode(record)
    record.ranks[0].steps = [step(i) for i in range(3)]  # cut (a resume that starts from an earlier step)
    assert text.encode(record) == full(record)
    record.ranks[0].steps = [step(i) for i in range(3, 7)]  # another list of the same length and more
    assert text.encode(record) == full(record)
    record.ranks[0].steps = []
    assert text.encode(record) == full(record)


def test_strings_in_the_record_never_stand_for_the_steps_or_windows() -> None:
    record, text = partial([step(0)], config={"note": "\x00list-", "more": "[]"}), PartialRecordText()
    assert text.encode(record) == full(record)


def test_a_partial_record_holds_one_rank() -> None:
    record = partial([step(0)])
    record.ranks.append(record.ranks[0])
    with pytest.raises(ValueError, match="one rank, not 2"):
        PartialRecordText().encode(record)


def test_each_energy_window_is_encoded_once_and_windows_replaced_are_encoded_afresh(
        monkeypatch: pytest.MonkeyPatch) -> None:
    record, text = partial([step(0)]), PartialRecordText()
    windows = record.ranks[0].energy["windows"]
    encoded: list[int] = []
    dumps = json.dumps

    def counting(value, **kwargs):  # the windows' own encoding: a list of their dicts
        if isinstance(value, list) and value and isinstance(value[0], dict) and "first_step" in value[0]:
            encoded.extend(w["first_step"] for w in value)
        return dumps(value, **kwargs)

    monkeypatch.setattr("dtpo.core.partial_text.json.dumps", counting)
    assert text.encode(record) == full(record)
    windows.extend({"first_step": i, "last_step": i, "energy_j": {"cpu": i / 2}} for i in (4, 6))
    assert text.encode(record) == full(record)
    assert text.encode(record) == full(record)
    assert encoded == [2, 4, 6]  # each once, however often the record is written
    record.ranks[0].energy["windows"] = [{"first_step": 9, "last_step": 9}]  # another list: encoded afresh
    assert text.encode(record) == full(record)
    record.ranks[0].energy = {"windows": None, "run": None}
    assert text.encode(record) == full(record)
    record.ranks[0].energy = None
    assert text.encode(record) == full(record)
