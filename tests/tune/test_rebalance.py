"""The rebalancer: whole-sample shares toward the ranks' speeds, for what persists, with hysteresis."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from dtpo.tune.rebalance import RankSpeed, Rebalancer, even_shares, pace, split_batch


def window(rebalancer: Rebalancer, per_sample_s: list[float] | np.ndarray, fixed_s: float = 0.0,
           spread: float = 0.01, steps: int = 20, rng: np.random.Generator | None = None) -> list[RankSpeed]:
    """A window of the ranks at the rebalancer's shares: each ready time ``fixed + per_sample * share``, and with
    ``rng`` the mean of ``steps`` noisy steps (relative noise ``spread``)."""
    out = []
    for r, t in enumerate(per_sample_s):
        share = rebalancer.shares[r]
        ready = fixed_s + float(t) * share
        if rng is not None:
            ready *= 1 + spread * rng.standard_normal() / np.sqrt(steps)
        out.append(RankSpeed(ready, share, spread, steps))
    return out


def test_even_shares_give_the_remainder_to_the_first_ranks() -> None:
    assert even_shares(10, 4) == (3, 3, 2, 2)
    assert even_shares(8, 4) == (2, 2, 2, 2)


def test_the_split_minimises_the_slowest_rank_among_all_splits() -> None:
    for sample_s in ([1.0, 1.5, 1.0], [2.0, 1.0, 1.3], [1.0, 1.0, 3.0]):
        best = min(pace(s, sample_s) for s in itertools.product(range(1, 11), repeat=3) if sum(s) == 12)
        got = split_batch(12, sample_s, [1, 1, 1], [10, 10, 10])
        assert sum(got) == 12
        assert pace(got, sample_s) == pytest.approx(best)


def test_the_split_keeps_every_rank_within_its_bounds() -> None:
    got = split_batch(40, [1.0, 5.0, 1.0, 1.0], [1, 1, 1, 1], [12, 12, 12, 12])
    assert sum(got) == 40 and max(got) <= 12 and min(got) >= 1
    with pytest.raises(ValueError):
        split_batch(40, [1.0, 1.0], [1, 1], [10, 10])  # cannot hold 40
    with pytest.raises(ValueError):
        split_batch(4, [1.0, float("nan")], [1, 1], [4, 4])


def test_a_persistent_straggler_gets_fewer_samples_after_the_persistence_windows() -> None:
    rng = np.random.default_rng(0)
    base = np.full(8, 1e-3)
    base[3] *= 1.5
    rebalancer = Rebalancer(256, 8)
    decisions = [rebalancer.decide(window(rebalancer, base, rng=rng)) for _ in range(8)]
    assert not any(d.changed for d in decisions[:2])  # not before persist_windows windows agree
    first = next(i for i, d in enumerate(decisions) if d.changed)
    assert first == rebalancer.persist_windows - 1
    shares = decisions[-1].shares
    assert sum(shares) == 256
    assert shares[3] == min(shares) and shares[3] < 256 / 8 / 1.4
    assert decisions[-1].slow_ranks == (3,)
    ideal = 256 / float(np.sum(1 / base))  # the step time at the sum of the speeds
    assert pace(shares, base) <= ideal * 1.03
    assert sum(d.changed for d in decisions) == 1  # then it holds


def test_noise_alone_moves_nothing() -> None:
    rng = np.random.default_rng(1)
    rebalancer = Rebalancer(512, 16)
    base = np.full(16, 2e-3)
    assert not any(rebalancer.decide(window(rebalancer, base, spread=0.03, rng=rng)).changed for _ in range(60))
    assert rebalancer.shares == even_shares(512, 16)


def test_a_transient_straggler_is_left_to_the_clocks() -> None:
    """Slow in one window, not in the next: its windows never agree, so its share never moves."""
    rebalancer = Rebalancer(256, 8)
    for i in range(30):
        base = np.full(8, 1e-3)
        if i % 2 == 0:
            base[5] *= 1.5
        assert not rebalancer.decide(window(rebalancer, base)).changed


def test_a_small_gap_is_not_worth_a_change() -> None:
    base = np.full(8, 1e-3)
    base[2] *= 1.015  # within the band: counts as the median
    rebalancer = Rebalancer(256, 8)
    assert not any(rebalancer.decide(window(rebalancer, base)).changed for _ in range(10))


def test_a_straggler_that_recovers_gets_its_share_back() -> None:
    rebalancer = Rebalancer(256, 8)
    slow = np.full(8, 1e-3)
    slow[1] *= 2.0
    for _ in range(4):
        rebalancer.decide(window(rebalancer, slow))
    assert rebalancer.shares[1] < 20
    for _ in range(4):
        rebalancer.decide(window(rebalancer, np.full(8, 1e-3)))
    assert rebalancer.shares == even_shares(256, 8)
    assert rebalancer.changes == 2


def test_no_rank_takes_more_than_its_headroom() -> None:
    rebalancer = Rebalancer(64, 4, max_share=1.25)
    base = np.array([1e-3, 1e-3, 1e-3, 1e-1])  # rank 3 a hundred times slower
    for _ in range(4):
        rebalancer.decide(window(rebalancer, base))
    assert max(rebalancer.shares) <= 20 and sum(rebalancer.shares) == 64
    assert rebalancer.shares[3] == 64 - 3 * 20


def test_a_rank_many_times_slower_for_long_gets_one_recommendation() -> None:
    rebalancer = Rebalancer(64, 4, drop_windows=5)
    base = np.array([1e-3, 1e-3, 4e-3, 1e-3])
    said = [d.recommendation for d in (rebalancer.decide(window(rebalancer, base)) for _ in range(12))]
    told = [s for s in said if s is not None]
    assert len(told) == 1 and said.index(told[0]) == 4
    assert "rank 2" in told[0] and "restart" in told[0]


def test_the_loss_weights_make_the_ranks_mean_the_global_mean() -> None:
    rebalancer = Rebalancer(16, 2, shares=(3, 13))
    weights = rebalancer.loss_weights()
    # each rank's mean loss times its weight, averaged over ranks, is the mean over all 16 samples
    losses = np.arange(16, dtype=float)
    ranks = [losses[:3].mean() * weights[0], losses[3:].mean() * weights[1]]
    assert np.mean(ranks) == pytest.approx(losses.mean())


def test_the_decision_continues_from_its_state() -> None:
    base = np.full(4, 1e-3)
    base[0] *= 1.6
    one = Rebalancer(64, 4)
    for _ in range(2):
        one.decide(window(one, base))
    two = Rebalancer(64, 4)
    two.load_state_dict(one.state_dict())
    assert one.decide(window(one, base)) == two.decide(window(two, base))
    assert one.shares == two.shares != even_shares(64, 4)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError):
        Rebalancer(3, 4)
    with pytest.raises(ValueError):
        Rebalancer(64, 4, max_share=0.5)
    with pytest.raises(ValueError):
        Rebalancer(64, 4).decide(window(Rebalancer(64, 3), [1e-3] * 3))


def test_two_noisy_ranks_rebalance_once_and_never_flap_back() -> None:
    """Two ranks (the median would fall between them) with 25 % step-to-step noise, as on a busy CPU: the slow one
    loses samples, and no window of noise sends the shares back to even."""
    for seed in range(10):
        rng = np.random.default_rng(seed)
        rebalancer = Rebalancer(256, 2)
        base = np.array([1e-3, 1.5e-3])
        decisions = (rebalancer.decide(window(rebalancer, base, spread=0.25, steps=10, rng=rng)) for _ in range(30))
        changes = [d.shares for d in decisions if d.changed]
        assert 1 <= len(changes) <= 2, (seed, changes)
        assert all(shares[1] < 128 - 15 for shares in changes), (seed, changes)


def test_a_fixed_time_per_step_is_fitted_and_the_shares_stop_at_equal_ready_times() -> None:
    """Each step costs 30 ms whatever the share (the global batch's loading, Python) plus 0.1 or 0.2 ms per sample:
    time per sample alone would keep cutting the slow rank's share; the fitted lines stop at equal ready times."""
    fixed, per_sample = 30e-3, np.array([0.1e-3, 0.2e-3])
    best = min(((s, 256 - s) for s in range(1, 256)), key=lambda p: pace(p, per_sample, [fixed] * 2))
    for seed in range(5):
        rng = np.random.default_rng(seed)
        rebalancer = Rebalancer(256, 2)
        changed = [d.shares for d in (rebalancer.decide(window(rebalancer, per_sample, fixed, 0.05, 10, rng))
                                      for _ in range(40)) if d.changed]
        assert 1 <= len(changed) <= 6, (seed, changed)
        slow = [shares[1] for shares in changed]
        assert slow == sorted(slow, reverse=True), (seed, changed)  # toward the balance, never back and forth
        assert min(slow) >= best[1] - 10, (seed, changed, best)  # and no further than noise
        assert pace(rebalancer.shares, per_sample, [fixed] * 2) <= 1.03 * pace(best, per_sample, [fixed] * 2)


def test_a_line_through_one_point_bounds_what_counts_as_the_same_speed() -> None:
    """After a first move, a rank whose time falls in between (some of it fixed) is the same rank; one whose time
    falls out of every line through its first point changed speed, and its points start again."""
    rebalancer = Rebalancer(64, 2, shares=(32, 32))
    rebalancer.points[1] = {32: (1.0, 0.0)}
    rebalancer.shares = (40, 24)
    rebalancer._add_point(1, 0.9, 0.0)  # between 0.75 (all per sample) and 1.0 (all fixed)
    assert rebalancer.points[1] == {32: (1.0, 0.0), 24: (0.9, 0.0)}
    rebalancer.points[0] = {32: (1.0, 0.0)}
    rebalancer._add_point(0, 2.0, 0.0)  # 40 samples cannot take twice the time of 32: it slowed down
    assert rebalancer.points[0] == {40: (2.0, 0.0)}


def test_a_change_names_the_slow_rank_even_before_the_fast_one_settled() -> None:
    # rank 0's windows disagree (a loaded machine), rank 1's agree: the change the settled rank justifies names it
    rebalancer = Rebalancer(256, 2)
    noisy = iter([0.8, 1.25, 0.9, 1.2, 0.85, 1.1])
    decisions = []
    for _ in range(6):
        speeds = window(rebalancer, [1e-3, 4e-3])
        speeds[0] = RankSpeed(speeds[0].ready_s * next(noisy), speeds[0].share, 0.01, 20)
        decisions.append(rebalancer.decide(speeds))
    changed = [d for d in decisions if d.changed]
    assert changed and rebalancer.lines()[0] is None  # rank 0 never settled
    assert changed[0].slow_ranks == (1,)
