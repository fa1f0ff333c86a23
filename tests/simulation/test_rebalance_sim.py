"""Uneven per-rank batches on simulated GPUs: the rebalancer's shares against no tuning and per-rank slowdown, and
the noise-free yardstick (the sum of the ranks' speeds)."""

from __future__ import annotations

import pytest

from dtpo.core.errors import ConfigError
from dtpo.simulation.job import JobConfig
from dtpo.simulation.stragglers import ideal_throughput, run_job, true_shares
from dtpo.tune.rebalance import even_shares

BATCH = 256  # the A40 resnet50 model's per-GPU batch
GLOBAL = 8 * BATCH


def job(**changes: object) -> JobConfig:
    fields: dict[str, object] = {"gpus": 8, "steps": 600, "stragglers": ((1, 1.5),), "noise": 0.01, "seed": 4}
    fields.update(changes)
    return JobConfig("A40", "resnet50", **fields)  # type: ignore[arg-type]


def test_a_persistent_straggler_gets_fewer_samples_and_the_job_runs_faster() -> None:
    static = job()
    none = run_job(static, tune=False)
    clocks = run_job(static, tune=True)
    rebalanced = run_job(static, tune=False, rebalance=True)
    both = run_job(static, tune=True, rebalance=True)
    assert none.samples == clocks.samples == rebalanced.samples == both.samples == GLOBAL * 600
    for result in (rebalanced, both):
        assert result.samples_per_s > 1.2 * clocks.samples_per_s and result.samples_per_s > 1.2 * none.samples_per_s
        assert len(result.shares) == 600 // 20 and all(sum(row) == GLOBAL for row in result.shares)
        final = result.shares[-1]
        assert final[1] == min(final) and final[1] < BATCH < min(s for r, s in enumerate(final) if r != 1)
        assert 1 <= result.share_changes <= 3  # decided once the straggler persists, and then left alone
        assert result.shares[0] == [BATCH] * 8  # even at first
    ideal = ideal_throughput(static)
    assert none.samples_per_s < rebalanced.samples_per_s < ideal


def test_without_a_straggler_the_shares_stay_even() -> None:
    for tune in (False, True):
        result = run_job(job(stragglers=()), tune=tune, rebalance=True)
        assert result.share_changes == 0 and all(row == [BATCH] * 8 for row in result.shares)


def test_a_transient_straggler_is_left_to_the_clocks() -> None:
    transient = job(pattern="intermittent", period_steps=40)  # slow for two windows, then not for two
    clocks = run_job(transient, tune=True)
    both = run_job(transient, tune=True, rebalance=True)
    rebalanced = run_job(transient, tune=False, rebalance=True)
    assert rebalanced.share_changes == both.share_changes == 0  # never the same speed for three windows
    # the shares untouched, the clock policy ran exactly as without the rebalancer
    assert (both.time_s, both.energy_j, both.clocks) == (clocks.time_s, clocks.energy_j, clocks.clocks)


@pytest.mark.parametrize("tune", [False, True])
def test_the_new_options_leave_untuned_and_tuned_runs_as_they_were(tune: bool) -> None:
    static = job(steps=200, noise=0.03)
    plain = run_job(static, tune=tune)
    off = run_job(static, tune=tune, rebalance=False)
    even = run_job(static, tune=tune, fixed_shares=even_shares(GLOBAL, 8))
    for other in (off, even):
        assert (other.time_s, other.energy_j, other.wait_energy_j, other.clocks, other.critical) == (
            plain.time_s, plain.energy_j, plain.wait_energy_j, plain.clocks, plain.critical)
    assert plain.samples == GLOBAL * 200 and plain.share_changes == 0 and plain.recommendations == []


def test_the_ideal_is_the_sum_of_the_speeds_and_the_true_split_comes_close_without_noise() -> None:
    static = job(noise=0.0)
    even = run_job(static, tune=False)
    ideal = ideal_throughput(static)
    # noise-free, every rank at full clock: the even split runs at the straggler's pace, 8 ranks / 1.5
    assert even.samples_per_s == pytest.approx(ideal * (8 / 1.5) / (7 + 1 / 1.5), rel=1e-9)
    oracle = run_job(static, tune=False, fixed_shares=true_shares(static))
    assert 0.99 * ideal < oracle.samples_per_s <= ideal * (1 + 1e-9)  # whole samples: just short of it
    assert oracle.shares[0][1] < BATCH and sum(oracle.shares[0]) == GLOBAL
    # a straggler slow half of the time: the time-weighted mean of the two sums of speeds
    half = job(noise=0.0, pattern="intermittent", period_steps=100)
    slow, fast = 7 + 1 / 1.5, 8.0
    assert ideal_throughput(half) == pytest.approx(ideal * 2 / (1 + slow / fast), rel=1e-9)


def test_a_rank_many_times_slower_for_long_gets_a_recommendation() -> None:
    result = run_job(job(stragglers=((1, 5.0),), steps=400), tune=False, rebalance=True)
    assert len(result.recommendations) == 1 and "rank 1" in result.recommendations[0]
    assert "\n" not in result.recommendations[0]


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"fixed_shares": [256] * 7}, "fixed shares must be 8 whole samples"),
    ({"fixed_shares": [0, *[256] * 6, 512]}, "fixed shares must be"),
    ({"fixed_shares": [255.5, 256.5, *[256] * 6]}, "fixed shares must be"),
    ({"fixed_shares": [256] * 8, "rebalance": True}, "takes no fixed shares"),
])
def test_bad_shares_are_refused_in_one_line(kwargs: dict[str, object], words: str) -> None:
    with pytest.raises(ConfigError, match=words) as err:
        run_job(job(steps=20), tune=False, **kwargs)  # type: ignore[arg-type]
    assert "\n" not in str(err.value)
