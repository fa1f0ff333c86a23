"""Per-rank slowdown: the policy on hand-made windows (whole jobs with stragglers: tests/simulation)."""

from __future__ import annotations

import json

import pytest

from dtpo.tune.straggler import RankWindow, StragglerSlowdown

CLOCKS = [600.0, 900.0, 1200.0, 1500.0]


def test_a_rank_with_slack_locks_to_the_lowest_clock_that_keeps_up_and_the_pace_setter_runs_free() -> None:
    policy = StragglerSlowdown(CLOCKS, margin=0.03, max_step=1.0)
    # rank 1 is ready after 1.5 s, rank 0 after 1.0 s: at time ~ 1/clock, 1200 MHz takes 1.25 s (fine), 900 takes
    # 1.67 s (too slow for 1.5 s minus the margin)
    out = policy.decide([RankWindow(1.0, 1500.0), RankWindow(1.5, 1500.0)])
    assert out == [1200.0, None]


def test_too_little_slack_changes_nothing() -> None:
    policy = StragglerSlowdown(CLOCKS, margin=0.03, max_step=1.0)
    assert policy.decide([RankWindow(1.0, 1500.0), RankWindow(1.01, 1500.0)]) == [None, None]


def test_noise_widens_the_margin() -> None:
    quiet = StragglerSlowdown(CLOCKS, max_step=1.0).decide([RankWindow(1.0, 1500.0), RankWindow(1.3, 1500.0)])
    noisy = StragglerSlowdown(CLOCKS, max_step=1.0).decide([RankWindow(1.0, 1500.0, spread=0.08),
                                              RankWindow(1.3, 1500.0, spread=0.08)])
    assert quiet[0] == 1200.0 and noisy[0] is None  # 2 x 11 % of noise leaves no room for a 20 % slower clock


def test_a_slowed_rank_that_becomes_the_straggler_is_freed_and_nobody_is_slowed_for_its_locked_pace() -> None:
    policy = StragglerSlowdown(CLOCKS, margin=0.03, max_step=1.0)
    assert policy.decide([RankWindow(1.0, 1500.0), RankWindow(1.5, 1500.0)]) == [1200.0, None]
    # now rank 0 is the slow one, while still locked at 1200 MHz: 2.0 s locked means at least 1.6 s free
    # rank 1 aims at 1.6 s minus the margin (1.55 s): 966 MHz would do, 1200 MHz is the lowest supported above it,
    # not 900 (which the locked 2.0 s would have allowed)
    assert policy.decide([RankWindow(2.0, 1200.0, locked=True), RankWindow(1.0, 1500.0)]) == [None, 1200.0]


def test_one_decision_lowers_a_clock_by_at_most_max_step_and_never_to_a_clock_that_made_it_the_pace_setter() -> None:
    fine = [float(c) for c in range(600, 1501, 15)]
    policy = StragglerSlowdown(fine, margin=0.03, max_step=0.10)
    first = policy.decide([RankWindow(1.0, 1500.0), RankWindow(2.0, 1500.0)])
    assert first[1] is None and first[0] == 1350.0  # 10 % down, though 1.0 s leaves room for far less
    # the model bent: at 1125 MHz rank 0 became the slowest; it is freed, and stays above 1125 MHz afterwards
    assert policy.decide([RankWindow(2.1, 1125.0, locked=True), RankWindow(2.0, 1500.0)]) == [None, None]
    later = policy.decide([RankWindow(1.0, 1500.0), RankWindow(2.0, 1500.0)])
    assert later[0] is not None and later[0] > 1125.0


def test_a_rank_whose_energy_rose_when_its_clock_dropped_goes_back_up_and_stays_there() -> None:
    fine = [float(c) for c in range(600, 1501, 15)]
    policy = StragglerSlowdown(fine, margin=0.03, max_step=0.10)
    assert policy.decide([RankWindow(1.0, 1500.0, energy_j=300.0, steps=20), RankWindow(2.0, 1500.0)])[0] == 1350.0
    assert policy.decide([RankWindow(1.1, 1350.0, locked=True, energy_j=280.0, steps=20),
                          RankWindow(2.0, 1500.0)])[0] == 1215.0  # cheaper: on down
    # 1215 MHz cost more per step than 1350 MHz: below the least-energy clock, so back to 1350 and no lower
    assert policy.decide([RankWindow(1.2, 1215.0, locked=True, energy_j=290.0, steps=20),
                          RankWindow(2.0, 1500.0)])[0] == 1350.0
    assert policy.decide([RankWindow(1.1, 1350.0, locked=True, energy_j=280.0, steps=20),
                          RankWindow(2.0, 1500.0)])[0] == 1350.0


def test_the_expected_step_time_is_the_expected_maximum_over_noisy_ranks() -> None:
    import numpy as np

    from dtpo.tune.straggler import expected_max

    assert expected_max(np.array([0.0, 0.0]), np.array([1.0, 1.0])) == pytest.approx(1 / np.sqrt(np.pi), abs=1e-4)
    assert expected_max(np.array([1.0, 0.5]), np.array([0.0, 0.0])) == pytest.approx(1.0)  # no noise: the largest


def test_more_noisy_ranks_leave_the_waiting_ones_less_room_and_a_quiet_job_all_of_it() -> None:
    from dtpo.tune.straggler import noisy_aim

    aims = [noisy_aim([1.1] + [1.0] * (n - 1), [0.03] * n, 0, 1.1, 0.003) for n in (8, 16, 64)]
    assert 1.0 < aims[2] < aims[1] < aims[0] < 1.1  # the slowest of more ranks comes closer to the pace
    assert noisy_aim([1.1, 1.0, 1.0], [0.0, 0.0, 0.0], 0, 1.1, 0.003) == pytest.approx(1.1)


def test_a_rank_whose_time_barely_follows_its_clock_goes_as_low_as_its_own_points_allow() -> None:
    fine = [float(c) for c in range(900, 1501, 15)]
    policy = StragglerSlowdown(fine, margin=0.005, max_step=0.10)

    def ready(clock: float) -> float:  # 1 % slower per 10 % of clock: mostly memory-bound
        return 1.0 * (1500.0 / clock) ** 0.1

    aim = 1.03 * (1 - 0.005)
    clock, locked = 1500.0, False
    for _ in range(40):
        out = policy.decide([RankWindow(ready(clock), clock, locked, 0.0), RankWindow(1.03, 1500.0)])
        assert out[1] is None
        if out[0] is not None:
            clock, locked = out[0], True
        assert ready(clock) <= aim  # never past the aim on the way down
    assert clock < 1300.0  # 1 / clock from the start would have said 1463 MHz
    copy = StragglerSlowdown(fine, margin=0.005, max_step=0.10)
    copy.load_state_dict(json.loads(json.dumps(policy.state_dict())))
    assert copy.measured == policy.measured


def test_the_fleet_curve_recovers_the_shared_shape_whatever_each_rank_s_own_speed() -> None:
    from dtpo.tune.straggler import Pooled, fleet_curve

    shape = {1500.0: 1.0, 1350.0: 1.02, 1200.0: 1.08}  # time against clock, common to every rank
    levels = {0: 1.0, 1: 1.05, 2: 0.97}  # each rank's own speed
    visited = {0: [1500.0, 1350.0], 1: [1350.0, 1200.0], 2: [1500.0, 1200.0]}
    measured = {r: {c: [Pooled(levels[r] * shape[c], 20, 1, 0.0, levels[r] * shape[c], levels[r] * shape[c])]
                    for c in clocks} for r, clocks in visited.items()}
    measured[3] = {1500.0: [Pooled(2.0, 20, 1, 0.0, 2.0, 2.0)]}  # one clock only: a level, no say on the shape
    curve = fleet_curve(measured)
    predicted = curve.predict(3, 1500.0, min_ranks=2)
    assert predicted[1200.0] == pytest.approx(2.0 * 1.08, rel=1e-6)
    assert predicted[1350.0] == pytest.approx(2.0 * 1.02, rel=1e-6)
    assert curve.predict(1, 1350.0, min_ranks=3) == {}  # no clock was run at by three ranks


def test_a_rank_that_changes_speed_starts_its_pools_again() -> None:
    policy = StragglerSlowdown(CLOCKS)
    for _ in range(3):
        policy.decide([RankWindow(1.0, 1500.0, spread=0.01, steps=20), RankWindow(1.3, 1500.0, spread=0.01, steps=20)])
    assert len(policy.measured[0][1500.0]) == 3
    # rank 0 is now 20 % slower (a straggler arrived): far beyond the noise of the pooled windows
    policy.decide([RankWindow(1.2, 1500.0, spread=0.01, steps=20), RankWindow(1.3, 1500.0, spread=0.01, steps=20)])
    assert [row.mean for row in policy.measured[0][1500.0]] == [1.2]
    assert len(policy.measured[1][1500.0]) == 4  # rank 1 did not change: its windows keep pooling


def test_the_held_out_half_of_a_window_is_its_odd_numbered_steps() -> None:
    window = RankWindow(1.0, 1500.0, steps=20, holdout_s=1.1)
    even, odd = window.split()
    assert odd == 1.1 and (even + odd) / 2 == pytest.approx(1.0)
    assert RankWindow(1.0, 1500.0, steps=20).split() == (1.0, 1.0)
