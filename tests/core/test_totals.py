"""Splitting the post-backward tail into sync wait and exposed communication; run totals."""

from __future__ import annotations

import pytest

from dtpo.core.record import RankRecord, StepRecord
from dtpo.core.totals import compute_totals, split_tail


def step(i: int, data: float, compute: float, tail: float | None, opt: float = 0.01,
         warmup: bool = False) -> StepRecord:
    total = data + compute + (tail or 0.0) + opt
    return StepRecord(step=i, warmup=warmup, samples=10, step_s=total, data_wait_s=data, compute_s=compute,
                      tail_s=tail, optimizer_s=opt)


def test_the_fast_rank_waits_for_the_slow_one() -> None:
    fast = RankRecord(0, 0, "n", "cpu", steps=[step(0, 0.0, 0.10, 0.06)])
    slow = RankRecord(1, 1, "n", "cpu", steps=[step(0, 0.0, 0.15, 0.01)])
    split_tail([fast, slow])
    assert fast.steps[0].sync_wait_s == pytest.approx(0.05)
    assert fast.steps[0].comm_exposed_s == pytest.approx(0.01)
    assert slow.steps[0].sync_wait_s == 0.0
    assert slow.steps[0].comm_exposed_s == pytest.approx(0.01)


def test_wait_never_exceeds_the_tail_and_data_wait_counts_as_lateness() -> None:
    fast = RankRecord(0, 0, "n", "cpu", steps=[step(0, 0.0, 0.10, 0.02)])
    slow = RankRecord(1, 1, "n", "cpu", steps=[step(0, 0.08, 0.10, 0.01)])  # late because of its data
    split_tail([fast, slow])
    assert fast.steps[0].sync_wait_s == pytest.approx(0.02)  # capped at the tail
    assert fast.steps[0].comm_exposed_s == pytest.approx(0.0)


def test_no_tail_means_not_measured() -> None:
    a = RankRecord(0, 0, "n", "cpu", steps=[step(0, 0.0, 0.1, None)])
    split_tail([a])
    assert a.steps[0].sync_wait_s is None and a.steps[0].comm_exposed_s is None


def test_totals_skip_warmup_and_carry_units() -> None:
    ranks = []
    for r in range(2):
        steps = [step(0, 0.0, 1.0, 0.0, warmup=True)] + [step(i, 0.01, 0.08, 0.01) for i in range(1, 5)]
        ranks.append(RankRecord(r, r, "n", "cpu", flops_per_step=1e9, peak_flops={"value": 1e11, "unit": "FLOP/s"},
                                steps=steps))
    split_tail(ranks)
    totals = compute_totals(ranks)
    assert totals["measured_steps"]["value"] == 4
    assert totals["samples"]["value"] == 80
    assert totals["throughput"]["unit"] == "samples/s"
    assert totals["throughput"]["value"] == pytest.approx(80 / (4 * 0.11))  # each step: 0.01+0.08+0.01+0.01
    assert totals["mfu"]["value"] == pytest.approx(1e9 / 0.11 / 1e11)
    assert totals["comm_overhead"]["value"] == pytest.approx(0.01 / 0.11)
    assert totals["data_wait_fraction"]["value"] == pytest.approx(0.01 / 0.11)


def test_totals_of_nothing_measured_are_empty() -> None:
    assert compute_totals([RankRecord(0, 0, "n", "cpu", steps=[step(0, 0, 1, 0, warmup=True)])]) == {}
