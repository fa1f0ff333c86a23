"""The ``MaxSlowdown`` moves of the tuner's search (``dtpo.tune.bound_search``) on the made-up job: placing a
setting between candidates towards the bound, interpolating the choice when the search ends, and checking an
interpolated choice while it is held."""

from __future__ import annotations

import pytest
from synthetic_tuning_job import BATCH, POWER_W, STEP_S, SyntheticJob, on_grid, run_until_hold, slowdown_tuner

from dtpo.tune.setting import GpuSetting
from dtpo.tune.tuner import TunerOptions


def test_a_slowdown_search_moves_its_choice_off_the_grid_towards_the_bound() -> None:
    # at most 15 % slower than 300 W's 0.200 s: on the grid 200 W (0.215 s, 7.5 % slower) is the least energy
    # allowed and 175 W (0.235 s) is too slow; in between, time and power run linearly (186 W reaches 0.230 s):
    # the search measures a limit between 200 and 175 W, short of the bound by a margin for its noise, and holds
    # it once it is fast enough with that margin; 175 W stays in the race until its own figures rule it out
    tuner = slowdown_tuner(1.15)
    run_until_hold(tuner, SyntheticJob(noise=0.01, seed=3))
    choice = tuner.choice
    assert choice is not None and 175.0 < choice.power_limit_w < 200.0
    assert on_grid(STEP_S, choice.power_limit_w) <= 1.15 * STEP_S[300.0]
    energy = {w: on_grid(STEP_S, w) * on_grid(POWER_W, w) for w in (choice.power_limit_w, 200.0)}
    assert energy[choice.power_limit_w] < energy[200.0]
    rows = {row["power_limit_w"]: row for row in tuner.report()["settings"]}
    assert rows[175.0]["status"] == "infeasible" and "allowed slowdown" in rows[175.0]["reason"]
    assert rows[choice.power_limit_w]["status"] == "chosen"
    assert any("towards the allowed slowdown" in line for line in tuner.history)


def test_one_far_too_slow_setting_right_below_the_default_does_not_end_the_search(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # a zigzag as small jobs measure it: 275 W takes 0.260 s (30 % slower than 300 W, far past a 10 % bound), yet
    # 250 W and below are as in the made-up job; one slow setting is no evidence that every lower one is slower,
    # so the search goes on down and holds a setting within the bound that uses less energy than 300 W
    monkeypatch.setitem(STEP_S, 275.0, 0.260)
    tuner = slowdown_tuner(1.1)
    run_until_hold(tuner, SyntheticJob(noise=0.01, seed=3))
    choice = tuner.choice
    assert choice is not None and choice.power_limit_w <= 225.0
    assert on_grid(STEP_S, choice.power_limit_w) <= 1.1 * STEP_S[300.0]
    rows = {row["power_limit_w"]: row for row in tuner.report()["settings"]}
    assert rows[275.0]["status"] == "infeasible"
    assert not any(row["status"] == "pruned" and "far slower" in row["reason"] for row in rows.values())


@pytest.mark.parametrize("how", ["no boundary points, no interpolation", "knob without between"])
def test_a_slowdown_search_stays_on_the_grid_when_told_or_when_the_knob_cannot(how: str) -> None:
    if how == "no boundary points, no interpolation":
        tuner = slowdown_tuner(1.15, TunerOptions(boundary_points=0, interpolate_choice=False))
    else:
        tuner = slowdown_tuner(1.15, between=False)
    run_until_hold(tuner, SyntheticJob(noise=0.01, seed=3))
    assert tuner.choice == GpuSetting(200.0)
    assert all(row["power_limit_w"] in STEP_S for row in tuner.report()["settings"])


def test_with_no_setting_placed_the_search_still_ends_between_candidates_near_the_bound() -> None:
    # nothing is placed between grid limits (boundary_points=0): the search measures only the grid, then holds
    # the limit between 200 W and 175 W where their chord reaches the 15 % bound less its margin; the report marks
    # it read off the chord, with no steps of its own
    tuner = slowdown_tuner(1.15, TunerOptions(boundary_points=0))
    run_until_hold(tuner, SyntheticJob(noise=0.01, seed=3))
    choice = tuner.choice
    assert choice is not None and 175.0 < choice.power_limit_w < 200.0
    assert on_grid(STEP_S, choice.power_limit_w) <= 1.15 * STEP_S[300.0]
    rows = {row["power_limit_w"]: row for row in tuner.report()["settings"]}
    row = rows[choice.power_limit_w]
    assert row["status"] == "chosen" and row["steps"] == 0 and row.get("interpolated")
    assert "interpolated between 200 W and 175 W" in row["reason"]
    assert on_grid(STEP_S, 200.0) < row["time_per_sample_s"] * BATCH < on_grid(STEP_S, 175.0)
    assert list(rows) == sorted(rows, reverse=True)


def test_an_interpolated_choice_that_proves_too_slow_while_held_gives_way_to_the_setting_above(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # between 200 W and 175 W this job is as slow as at 175 W (the chord of the two says otherwise): the search
    # holds a limit between them, measures it while it trains, finds it too slow and holds 200 W instead
    for watt in range(176, 200):
        monkeypatch.setitem(STEP_S, float(watt), STEP_S[175.0])
    tuner = slowdown_tuner(1.15, TunerOptions(boundary_points=0))
    job = SyntheticJob(noise=0.01, seed=3)
    run_until_hold(tuner, job)
    interpolated = tuner.choice
    assert interpolated is not None and 175.0 < interpolated.power_limit_w < 200.0
    for _ in range(3):
        tuner.feed(job.block(tuner.current, tuner.block_steps))
    assert tuner.holding and tuner.choice == GpuSetting(200.0) and tuner.current == GpuSetting(200.0)
    rows = {row["power_limit_w"]: row for row in tuner.report()["settings"]}
    assert rows[interpolated.power_limit_w]["status"] == "infeasible"
    assert rows[interpolated.power_limit_w]["steps"] > 0  # measured while held
    assert rows[200.0]["status"] == "chosen"
    assert any("too slow while held" in line for line in tuner.history)


def test_an_interpolated_choice_that_holds_up_stays() -> None:
    tuner = slowdown_tuner(1.15, TunerOptions(boundary_points=0))
    job = SyntheticJob(noise=0.01, seed=3)
    run_until_hold(tuner, job)
    interpolated = tuner.choice
    for _ in range(3):
        tuner.feed(job.block(tuner.current, tuner.block_steps))
    assert tuner.choice == interpolated and tuner.current == interpolated


def test_a_setting_between_that_is_not_surely_fast_enough_is_not_chosen() -> None:
    # a bound just past 200 W (0.215 s against 0.2156 s allowed) leaves no room below 200 W for a measured margin,
    # and at 1 % noise 200 W itself is not surely within it: whatever the search looks at between grid limits, it
    # holds a setting above 200 W, within the bound
    tuner = slowdown_tuner(1.078)
    run_until_hold(tuner, SyntheticJob(noise=0.01, seed=5))
    assert tuner.choice is not None and tuner.choice.power_limit_w >= 200.0
    assert on_grid(STEP_S, tuner.choice.power_limit_w) <= 1.078 * STEP_S[300.0]
