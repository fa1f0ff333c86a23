"""Settling a near-tie while holding (``dtpo.tune.hold_refine``): on the made-up job through a tuner, and the hold
policies alone: training at the choice and its runner-up in turn until one is clearly cheaper, then holding that
one."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
from synthetic_tuning_job import POWER_W, STEP_S, SyntheticJob, make_tuner, run_until_hold, slowdown_tuner

from dtpo.tune.hold_refine import HoldPolicy, RefineHold
from dtpo.tune.setting import GpuSetting
from dtpo.tune.stats import Block, Estimate, SettingStats
from dtpo.tune.tuner import PowerTuner, TunerOptions
from dtpo.tune.tuner_types import Candidate, Judgement


def near_tie(monkeypatch: pytest.MonkeyPatch) -> None:
    """200 W costs 0.25 % more energy than 175 W (40.1 J against 40.0 J a step): too close for the search's
    budget at 3 % noise, clear over a thousand steps each."""
    monkeypatch.setitem(POWER_W, 200.0, 40.1 / STEP_S[200.0])


def refining_tuner(monkeypatch: pytest.MonkeyPatch) -> tuple[PowerTuner, SyntheticJob]:
    """A tuner on the near-tie job at 3 % noise, holding its choice and refining it."""
    near_tie(monkeypatch)
    tuner = make_tuner()
    job = SyntheticJob(noise=0.03, seed=2)
    run_until_hold(tuner, job)
    assert tuner.refined is not None and tuner.refined["outcome"] == "refining"
    return tuner, job


def hold_blocks(tuner: PowerTuner, job: SyntheticJob, blocks: int) -> list[GpuSetting]:
    """Feed ``blocks`` hold blocks; the setting each one ran at."""
    ran = []
    for _ in range(blocks):
        ran.append(tuner.current)
        tuner.feed(job.block(tuner.current, tuner.block_steps))
    return ran


def test_a_near_tie_is_trained_at_in_turn_until_the_cheaper_is_clear(monkeypatch: pytest.MonkeyPatch) -> None:
    tuner, job = refining_tuner(monkeypatch)
    assert tuner.refined is not None
    pair = {tuner.choice, GpuSetting.from_dict(tuner.refined["against"])}
    assert pair == {GpuSetting(175.0), GpuSetting(200.0)}
    ran = hold_blocks(tuner, job, 12)
    assert set(ran[:2]) == pair  # one hold block at each, in turn
    assert tuner.refined["outcome"] != "refining"  # told apart, or the refining steps spent
    assert tuner.choice == tuner.current == GpuSetting(175.0)  # the cheaper of the two
    assert set(hold_blocks(tuner, job, 3)) == {GpuSetting(175.0)}  # held from then on
    assert tuner.refined["steps_at_runner_up"] > 0
    assert tuner.refined["steps"] <= tuner.options.refine_steps
    assert tuner.report()["refined"] == tuner.refined
    assert any(line.startswith("refined: 175 W held") for line in tuner.history)


def test_refining_is_off_with_no_refine_steps_and_under_a_slowdown_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    near_tie(monkeypatch)
    off = make_tuner(options=TunerOptions(refine_steps=0))
    job = SyntheticJob(noise=0.03, seed=2)
    run_until_hold(off, job)
    held = off.choice
    assert off.refined is None and set(hold_blocks(off, job, 4)) == {held}
    bounded = slowdown_tuner(1.15)
    run_until_hold(bounded, SyntheticJob(noise=0.03, seed=2))
    assert bounded.refined is None  # MaxSlowdown checks its own choice while held (bound_search)


def test_a_lasting_drift_while_refining_searches_again(monkeypatch: pytest.MonkeyPatch) -> None:
    tuner, job = refining_tuner(monkeypatch)
    job.scale = 1.3  # the job draws 30 % more from now on
    hold_blocks(tuner, job, 2)
    assert tuner.retunes == 1 and not tuner.holding and not tuner.hold.active


def test_the_job_knob_tuner_holds_its_choice_without_refining(monkeypatch: pytest.MonkeyPatch) -> None:
    from dtpo.session.tuning.job_knobs import job_tuner_options

    near_tie(monkeypatch)
    tuner = make_tuner(options=job_tuner_options())
    job = SyntheticJob(noise=0.03, seed=2)
    run_until_hold(tuner, job)
    held = tuner.choice
    assert tuner.refined is None and set(hold_blocks(tuner, job, 4)) == {held}


# -- the hold policies alone, without a tuner --------------------------------------------------------------------


def tie(best_cost: float, runner_cost: float, se: float) -> tuple[list[Candidate], Callable[[], Judgement]]:
    """200 W (the choice) and 175 W, measured at ``best_cost`` and ``runner_cost`` (standard error ``se``, shrinking
    as their steps grow), and 300 W far costlier; a judge that reads them."""
    cands = [Candidate(i, SettingStats(GpuSetting(w), [Block(4, 4, 4.0, 4.0)]), "measured")
             for i, w in enumerate((300.0, 200.0, 175.0))]
    cands[1].status = "chosen"
    costs = {0: 2.0, 1: best_cost, 2: runner_cost}

    def judge() -> Judgement:
        return Judgement({i: Estimate(c.stats.setting, c.stats.steps, costs[i], se * 2 / math.sqrt(c.stats.steps),
                                      1.0, 0.01, costs[i]) for i, c in enumerate(cands)}, None, 2.0, cands[0])

    return cands, judge


def test_the_plain_hold_settles_nothing() -> None:
    cands, judge = tie(1.0, 1.001, 0.01)
    plain = HoldPolicy()
    assert plain.start(cands[1], cands, judge) is None
    assert not plain.active and plain.refined is None


def test_refining_alternates_then_holds_the_cheaper_once_told_apart() -> None:
    cands, judge = tie(1.0, 0.99, 0.01)  # within the noise after 4 steps, clear after a few hundred
    refine = RefineHold(refine_steps=2000)
    note = refine.start(cands[1], cands, judge)
    assert note is not None and note.startswith("refining: 200 W and 175 W") and refine.active
    assert refine.refined is not None and refine.refined["against"] == GpuSetting(175.0).as_dict()
    step = refine.feed(Block(100, 100, 1.0, 1.0), GpuSetting(200.0), judge)
    assert step.setting == GpuSetting(175.0) and not step.settled  # the other one, in turn
    current, steps = step.setting, [step]
    while refine.active:
        steps.append(refine.feed(Block(100, 100, 1.0, 1.0), current, judge))
        current = steps[-1].setting
    last = steps[-1]
    assert last.settled and last.setting == GpuSetting(175.0) and last.note == "refined: 175 W held (told apart)"
    assert cands[2].status == "chosen" and cands[1].status == "measured"
    assert refine.refined["steps"] == 100 * len(steps) and 0 < refine.refined["steps_at_runner_up"] < 100 * len(steps)


def test_refining_ends_when_its_steps_are_spent_and_stops_on_a_new_search() -> None:
    cands, judge = tie(1.0, 1.0, 0.5)  # never told apart
    refine = RefineHold(refine_steps=300)
    refine.start(cands[1], cands, judge)
    current, step = GpuSetting(200.0), None
    for _ in range(3):
        step = refine.feed(Block(100, 100, 1.0, 1.0), current, judge)
        current = step.setting
    assert step is not None and step.settled and step.note == "refined: 200 W held (refining steps spent)"
    assert not refine.active
    refine.start(cands[1], cands, judge)
    refine.stop()
    assert not refine.active and refine.refined is not None  # what it did so far stays reported


def test_nothing_close_nothing_to_refine() -> None:
    cands, judge = tie(1.0, 1.5, 0.01)
    refine = RefineHold(refine_steps=2000)
    assert refine.start(cands[1], cands, judge) is None and not refine.active and refine.refined is None
