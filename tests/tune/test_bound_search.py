"""The ``MaxSlowdown`` search policy (``dtpo.tune.bound_search``): on the made-up job through a tuner, and alone on
candidates and judgements: ruling out what is too slow, placing a setting between candidates towards the bound,
interpolating the choice when the search ends, and checking an interpolated choice while it is held."""

from __future__ import annotations

import pytest
from synthetic_tuning_job import BATCH, POWER_W, STEP_S, SyntheticJob, on_grid, run_until_hold, slowdown_tuner

from dtpo.tune.bound_search import BoundPolicy
from dtpo.tune.cost import MaxSlowdown
from dtpo.tune.knob import power_limit_between
from dtpo.tune.setting import GpuSetting
from dtpo.tune.stats import Block, Estimate, SettingStats
from dtpo.tune.tuner import TunerOptions
from dtpo.tune.tuner_types import Candidate, Judgement, Room


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


# -- the policy alone, without a tuner --------------------------------------------------------------------------


def judged(times: list[float], steps: int = 12) -> tuple[list[Candidate], Judgement]:
    """Candidates at 300, 250, 200 and 175 W, each measured for ``steps`` steps, at ``times`` (the default's 1.0)
    and costs falling by 0.05 a setting."""
    limits = [300.0, 250.0, 200.0, 175.0]
    cands = [Candidate(i, SettingStats(GpuSetting(w), [Block(steps, steps, t * steps, 1.0)]), "measured")
             for i, (w, t) in enumerate(zip(limits, times, strict=True))]
    estimates = {i: Estimate(GpuSetting(w), steps, 1.0 - 0.05 * i, 0.001, t, 0.005, 1.0 - 0.05 * i)
                 for i, (w, t) in enumerate(zip(limits, times, strict=True))}
    return cands, Judgement(estimates, estimates[0], 2.0, cands[0], time_cv=0.01)


def bound_policy(factor: float, options: TunerOptions | None = None, between: bool = True) -> BoundPolicy:
    policy = BoundPolicy(MaxSlowdown(factor), options or TunerOptions())
    policy.start_knob(power_limit_between if between else None)
    return policy


ROOM = Room(left=100, warmup=1, current=GpuSetting(200.0))


def test_the_bound_policy_rules_out_what_is_clearly_too_slow_and_never_takes_a_quick_look() -> None:
    policy = bound_policy(1.1, between=False)
    assert not policy.quick_looks and not policy.refines_near_ties and policy.keeps_reference
    cands, j = judged([1.0, 1.02, 1.06, 1.15])
    assert policy.allowed(j.estimates[3], j.ref, j.z) is False and policy.allowed(j.estimates[2], j.ref, j.z)
    step = policy.decide(cands, j, ROOM)
    assert cands[3].status == "infeasible" and "allowed slowdown" in cands[3].reason
    assert step.best is cands[2]  # the cheapest setting fast enough, though 175 W costs less
    assert cands[0].status == "measured"  # the default is the reference: never dropped as costlier


def test_an_open_verdict_sends_the_race_to_that_setting_or_the_default() -> None:
    # 175 W takes exactly the allowed time: whether it is fast enough is open, and it is the cheapest; its time or
    # the default's is measured next, for revisit_steps
    policy = bound_policy(1.1, between=False)
    cands, j = judged([1.0, 1.02, 1.06, 1.10])
    step = policy.decide(cands, j, ROOM)
    assert step.visit in (cands[3], cands[0]) and step.steps == TunerOptions().revisit_steps


def test_the_race_places_one_setting_between_the_cheapest_allowed_and_the_too_slow_one_below() -> None:
    policy = bound_policy(1.1)
    cands, j = judged([1.0, 1.02, 1.06, 1.15])
    step = policy.decide(cands, j, ROOM)
    assert step.placed is not None and step.visit is None and step.steps == policy.fair_look
    assert step.placed.chord.fast is cands[2] and step.placed.chord.slow is cands[3]
    assert 175.0 < step.placed.setting.power_limit_w < 200.0
    assert "towards the allowed slowdown" in step.placed.reason
    assert policy.boundary_left == 0 and not policy.can_place  # one placement per knob (boundary_points=1)
    assert policy.decide(*judged([1.0, 1.02, 1.06, 1.15]), ROOM).placed is None
    without = bound_policy(1.1, between=False)  # a knob that cannot name settings between its candidates
    assert without.decide(*judged([1.0, 1.02, 1.06, 1.15]), ROOM).placed is None
    short = bound_policy(1.1)  # the budget would not pay for its fair look
    assert short.decide(*judged([1.0, 1.02, 1.06, 1.15]), Room(left=policy.fair_look, warmup=1,
                                                                    current=GpuSetting(200.0))).placed is None


def test_the_choice_is_interpolated_towards_the_bound_and_checked_while_held() -> None:
    policy = bound_policy(1.1)
    cands, j = judged([1.0, 1.02, 1.06, 1.15])
    assert policy.can_interpolate and policy.choice_margin(False, 2.0) == pytest.approx(0.25 * 2.0)
    placed = policy.interpolate(cands, cands[2], j)
    assert placed is not None and 175.0 < placed.setting.power_limit_w < 200.0
    assert placed.chord.fast is cands[2] and "not profiled" in placed.reason
    assert bound_policy(1.1, TunerOptions(interpolate_choice=False)).interpolate(cands, cands[2], j) is None
    # held: the interpolated choice is what the hold blocks measure until it had a fair look
    held = Candidate(3, SettingStats(placed.setting), "chosen", chord=placed.chord)
    cands.insert(3, held)
    cands[4].index = 4
    assert policy.held_to_check(cands, placed.setting) is held
    assert policy.held_to_check(cands, GpuSetting(200.0)) is None  # not the setting in force
    j.estimates[3] = Estimate(placed.setting, 4, 0.88, 0.001, 1.20, 0.005, 0.88)  # clearly too slow
    assert policy.step_back(held, j) is cands[2]
    assert held.status == "infeasible" and cands[2].status == "chosen"
    j.estimates[3] = Estimate(placed.setting, 4, 0.88, 0.001, 1.08, 0.005, 0.88)
    assert policy.step_back(held, j) is None  # fast enough so far: it stays
    held.stats.blocks.append(Block(policy.fair_look, policy.fair_look, 1.0, 1.0))
    held.status = "chosen"
    assert policy.held_to_check(cands, placed.setting) is None  # had its fair look: held like any choice
