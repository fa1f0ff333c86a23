"""The plain search policy (``dtpo.tune.race``) alone, without a tuner: from candidates and a judgement of their
figures to what to measure next, or the end of the search."""

from __future__ import annotations

from dtpo.tune.cost import Energy
from dtpo.tune.race import RacePolicy, stay_if_nearly
from dtpo.tune.setting import GpuSetting
from dtpo.tune.stats import Block, Estimate, SettingStats
from dtpo.tune.tuner_types import Candidate, Judgement, Room, TunerOptions

LIMITS = [300.0, 250.0, 200.0, 175.0, 150.0]
OPTIONS = TunerOptions()


def judged(costs: list[float | None], steps: int = 4, se: float = 0.01) -> tuple[list[Candidate], Judgement]:
    """Candidates at ``LIMITS``; those with a cost are measured for ``steps`` steps at that cost (standard error
    ``se``), the others unvisited. The first is the default."""
    cands, estimates = [], {}
    for i, (w, cost) in enumerate(zip(LIMITS, costs, strict=True)):
        blocks = [] if cost is None else [Block(steps, steps, steps * 1.0, steps * cost)]
        cands.append(Candidate(i, SettingStats(GpuSetting(w), blocks), "unvisited" if cost is None else "measured"))
        if cost is not None:
            estimates[i] = Estimate(GpuSetting(w), steps, cost, se, 1.0, 0.01, cost)
    return cands, Judgement(estimates, estimates.get(0), 2.0, cands[0])


def room(left: int = 100, current: float = 300.0) -> Room:
    return Room(left, 1, GpuSetting(current))


def test_without_a_constraint_everything_is_allowed_and_nothing_is_placed_or_checked() -> None:
    policy = RacePolicy(Energy(), OPTIONS)
    cands, j = judged([1.0, 0.9, None, None, None])
    assert policy.allowed(j.estimates[1], j.ref, 2.0) is True
    assert policy.allowed(Estimate(GpuSetting(250.0), 4, 1.0, 0.0, 9.0, 0.0, 1.0), j.ref, 0.0) is True
    assert policy.quick_looks and policy.refines_near_ties and not policy.can_interpolate
    assert policy.interpolate(cands, cands[1], j) is None
    assert policy.held_to_check(cands, GpuSetting(250.0)) is None


def test_the_next_visit_is_the_guessed_candidate_then_the_nearest_unvisited() -> None:
    cands, j = judged([1.0, None, None, None, None])
    guessed = RacePolicy(Energy(), OPTIONS, guess=lambda settings, default: 3).decide(cands, j, room())
    assert guessed.visit is cands[3] and guessed.steps == OPTIONS.first_visit_steps and not guessed.ends
    plain = RacePolicy(Energy(), OPTIONS).decide(*judged([1.0, None, None, None, None]), room())
    assert plain.visit is not None and plain.visit.stats.setting == GpuSetting(250.0)


def test_a_clearly_costlier_setting_is_dropped_with_its_gap_and_an_empty_budget_ends_the_search() -> None:
    cands, j = judged([1.0, 0.8, None, None, None])
    step = RacePolicy(Energy(), OPTIONS).decide(cands, j, room(left=0))
    assert step.ends and step.best is cands[1] and step.why == "profiling budget spent"
    assert cands[0].status == "dropped" and cands[0].reason == "25.0 % costlier than 250 W"


def test_a_steep_rise_prunes_every_lower_setting_on_an_ordered_knob_only() -> None:
    # from 250 W (the best) down, cost and time rise clearly twice in a row (200 W, then 175 W far costlier): the
    # limit bites, and 150 W below is dropped unvisited, unless the knob's candidates are not ordered so
    for options, left in ((OPTIONS, "pruned"), (TunerOptions(ordered=False), "unvisited")):
        cands, j = judged([1.0, 0.8, 1.0, 1.3, None])
        for i, time in ((2, 1.2), (3, 1.5)):
            j.estimates[i] = Estimate(cands[i].stats.setting, 4, j.estimates[i].cost, 0.01, time, 0.01, 1.0)
        RacePolicy(Energy(), options).decide(cands, j, room())
        assert [c.status for c in cands[2:]] == ["dropped", "dropped", left]


def test_the_race_ends_once_the_best_is_within_tolerance_of_every_survivor() -> None:
    cands, j = judged([1.0, 0.80, 0.70, 0.90, 0.95], se=0.001)
    step = RacePolicy(Energy(), OPTIONS).decide(cands, j, room())
    assert step.ends and step.best is cands[2] and step.why == "best within tolerance of every survivor"


def test_a_close_challenger_gets_a_fair_look_before_the_budget_is_shared_out() -> None:
    # 175 W is within the noise of 200 W after a first visit of 4 steps: it is revisited for revisit_steps
    cands, j = judged([1.0, 0.80, 0.70, 0.705, 0.95], se=0.01)
    step = RacePolicy(Energy(), OPTIONS).decide(cands, j, room())
    assert step.visit is cands[3] and step.steps == OPTIONS.revisit_steps
    # once both had a fair look, the steps go where they decide most: to one of the two, within the race's cap
    cands, j = judged([1.0, 0.80, 0.70, 0.705, 0.95], steps=OPTIONS.first_visit_steps + OPTIONS.revisit_steps)
    step = RacePolicy(Energy(), OPTIONS).decide(cands, j, room())
    assert step.visit in (cands[2], cands[3])
    assert OPTIONS.revisit_steps <= step.steps <= 2 * OPTIONS.revisit_steps


def test_staying_at_the_setting_in_force_wins_when_its_score_is_nearly_the_highest() -> None:
    group, _ = judged([1.0, 1.0, None, None, None])
    score = {0: 1.0, 1: 0.6}
    assert stay_if_nearly(group[:2], score, 0.5, GpuSetting(250.0)) is group[1]
    assert stay_if_nearly(group[:2], score, 0.8, GpuSetting(250.0)) is group[0]
    assert stay_if_nearly(group[:2], score, 0.5, GpuSetting(175.0)) is group[0]  # in force is none of them
