"""Splitting the post-backward tail into sync wait and exposed communication; run totals and energy."""

from __future__ import annotations

import pytest

from dtpo.core.measurement import Measurement
from dtpo.core.record import RankRecord, RunRecord, StepRecord
from dtpo.core.totals import compute_totals, energy_totals, finalize, split_tail


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


def test_a_utilisation_above_100_percent_is_reported_unknown_with_the_reason() -> None:
    steps = [step(i, 0.0, 0.09, 0.0) for i in range(3)]  # 0.1 s per step
    rank = RankRecord(0, 0, "n", "cpu", flops_per_step=5e9, steps=steps,
                      peak_flops=Measurement(1e10, "FLOP/s", "measured", "float16 mm 256x256"))
    mfu = compute_totals([rank])["mfu"]
    assert mfu.value is None  # 5e9 FLOP in 0.1 s is 5x the peak: cannot be true
    assert "500%" in mfu.note and "float16 mm" in mfu.note
    rank.flops_per_step = 5e8
    assert compute_totals([rank])["mfu"].value == pytest.approx(0.5)


# -- energy -----------------------------------------------------------------------------------------------

WARMUP = 2
WINDOW = 10
POWER_W = 50.0


def rank_with_energy(rank: int, last_step: int, tail_s: float = 0.0,
                     step_s: float = 0.1, samples: int = 32, devices: bool = True) -> RankRecord:
    """A rank that ran steps 0..last_step at POWER_W (if it has devices), with windows of WINDOW steps.

    The last window is closed by ``finish``: when the rank stopped, ``tail_s`` after its last step (a
    healthy rank of a failed run sits in a collective with a dead peer before it gives up).
    """
    steps = [StepRecord(step=i, warmup=i < WARMUP, samples=samples, step_s=step_s, data_wait_s=0.0,
                        compute_s=step_s, tail_s=0.0, optimizer_s=0.0) for i in range(last_step + 1)]
    power = POWER_W if devices else 0.0
    windows = []
    first = WARMUP
    while first <= last_step:
        last = min(first + WINDOW - 1, last_step)
        time_s = (last - first + 1) * step_s + (tail_s if last == last_step else 0.0)
        energy = {"cpu": power * time_s} if devices else {}
        windows.append({"first_step": first, "last_step": last, "name": f"steps-from-{first}", "time_s": time_s,
                        "energy_j": energy, "total_j": sum(energy.values()),
                        "sources": {"cpu": "rapl"} if devices else {}, "estimated": False, "lost": []})
        first = last + 1
    run = {"name": "run", "time_s": sum(w["time_s"] for w in windows),
           "energy_j": {"cpu": sum(w["energy_j"].get("cpu", 0.0) for w in windows)} if devices else {},
           "sources": {"cpu": "rapl"} if devices else {}, "estimated": False, "lost": []}
    run["total_j"] = sum(run["energy_j"].values())
    section = {"devices": [], "notes": [], "estimated": False, "windows": windows, "run": run, "lost": {}}
    return RankRecord(rank, rank, "n", "cpu", steps=steps, energy=section)


def test_a_completed_run_counts_energy_and_samples_over_all_measured_steps() -> None:
    ranks = [rank_with_energy(0, 31), rank_with_energy(1, 31, devices=False)]
    energy = energy_totals(ranks, {}, completed=True, window_steps=WINDOW)
    assert energy is not None
    assert energy.energy_j.value == pytest.approx(POWER_W * 30 * 0.1)
    assert energy.average_power_w.value == pytest.approx(POWER_W)
    assert energy.energy_per_sample_j.value == pytest.approx(POWER_W * 30 * 0.1 / (2 * 30 * 32))
    assert energy.lost == {}
    assert energy["energy_j"] is energy.energy_j and "cost" not in energy  # the JSON form's keys still work


def test_a_sigkilled_rank_does_not_inflate_energy_per_sample() -> None:
    """Rank 1 was killed with SIGKILL: its partial record was last written after step 2 (one measured
    step) and holds no energy section; rank 0 did 41 measured steps and then hung 5 s on its dead peer.
    dtpo.run/1 divided rank 0's whole energy by the samples of the one step both recorded."""
    healthy = rank_with_energy(0, WARMUP + 40, tail_s=5.0)
    killed = RankRecord(1, 1, "n", "cpu", steps=healthy.steps[:WARMUP + 1])
    record = finalize(RunRecord("r", "failed", "t", config={"session": {"window_steps": WINDOW}},
                                ranks=[healthy, killed]))
    assert record.totals["measured_steps"].value == 1
    assert "rank 0 recorded 41, rank 1 recorded 1" in record.totals["measured_steps"].note
    energy = record.energy
    assert energy is not None
    # What rank 0 measured is all there, with its own time: 41 steps plus the 5 s it hung.
    assert energy.energy_j.value == pytest.approx(POWER_W * (41 * 0.1 + 5.0))
    assert energy.average_power_w.value == pytest.approx(POWER_W)
    assert "rank1" in energy.lost
    # No energy window ends within the one step every rank recorded: unknown, not 3.9 J/sample.
    assert energy.energy_per_sample_j.value is None
    assert "every rank recorded" in energy.energy_per_sample_j.note


def test_a_failed_run_counts_joules_and_samples_over_the_same_steps() -> None:
    """Both ranks recorded 41 measured steps before rank 1 died; rank 0 then hung 5 s. The per-sample
    figure uses the windows that ended at a step boundary (steps 2-41), not the hang."""
    healthy = rank_with_energy(0, WARMUP + 40, tail_s=5.0)
    dying = rank_with_energy(1, WARMUP + 40, tail_s=0.0, devices=False)
    record = finalize(RunRecord("r", "failed", "t", config={"session": {"window_steps": WINDOW}},
                                ranks=[healthy, dying]))
    per_sample = record.energy.energy_per_sample_j  # type: ignore[union-attr]
    steps = 40  # steps 2-41, four full windows; step 42's window was closed by the failure
    assert per_sample.value == pytest.approx(POWER_W * steps * 0.1 / (2 * steps * 32))
    assert per_sample.note.startswith("steps 2-41")
    # The same records as a completed run: every window counts, the last one included.
    record.status = "completed"
    finalize(record)
    assert record.energy.energy_per_sample_j.value == pytest.approx(  # type: ignore[union-attr]
        POWER_W * (41 * 0.1 + 5.0) / (2 * 41 * 32))


def test_steps_without_counted_samples_give_a_step_rate_not_zero_throughput() -> None:
    """A script whose batches the agent cannot see: its throughput is unknown, said with the steps per second."""
    steps = [step(i, 0.0, 0.09, 0.0) for i in range(4)]
    for s in steps:
        s.samples = 0
    totals = compute_totals([RankRecord(0, 0, "n", "cpu", steps=steps)])
    assert totals["throughput"].value is None
    assert "DTPO_SAMPLES_PER_STEP" in totals["throughput"].note and "10 steps/s" in totals["throughput"].note


def test_a_silent_rank_says_what_ended_it_where_the_launcher_knows() -> None:
    from dtpo.core.totals import SILENT_RANK, record_from_partials

    def partial(rank: int, status: str, error: str | None) -> RunRecord:
        return RunRecord("r", status, "2025-01-01T00:00:00+00:00", error=error,
                         ranks=[RankRecord(rank, rank, "n", "cpu", steps=[step(0, 0.0, 0.1, 0.01)], error=error)])

    killed = "out of memory (the kernel's OOM killer ended it at the limit of memory cgroup /job)"
    partials = [partial(0, "failed", "interrupted by SIGTERM"), partial(1, "running", None),
                partial(2, "running", None)]
    record = record_from_partials("unused", "failed", "rank 1 was killed by SIGKILL: " + killed, partials,
                                  rank_errors={1: killed})
    assert record is not None
    assert [r.error for r in record.ranks] == ["interrupted by SIGTERM", killed, SILENT_RANK]
