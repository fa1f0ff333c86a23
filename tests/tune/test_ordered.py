"""Search order on an ordered knob: the next candidate to visit, a steep rise, and pruning what lies below."""

from __future__ import annotations

from dtpo.tune.ordered import next_unvisited, prune_below, steep_below
from dtpo.tune.setting import GpuSetting
from dtpo.tune.stats import Block, Estimate, SettingStats
from dtpo.tune.tuner_types import Candidate

LIMITS = [300.0, 275.0, 250.0, 225.0, 200.0]


def candidates(statuses: list[str]) -> list[Candidate]:
    return [Candidate(i, SettingStats(GpuSetting(w)), status) for i, (w, status) in enumerate(zip(LIMITS, statuses,
                                                                                                 strict=True))]


def est(i: int, cost: float, time: float, se: float = 0.01) -> Estimate:
    return Estimate(GpuSetting(LIMITS[i]), 10, cost, se, time, se, cost)


def test_the_guess_picks_the_second_visit_then_the_nearest_to_the_best() -> None:
    cands = candidates(["measured", "unvisited", "unvisited", "unvisited", "unvisited"])
    cands[0].stats.blocks.append(Block(1, 1, 1.0, 1.0))  # the default is measured
    estimates = {0: est(0, 1.0, 1.0)}
    unvisited = cands[1:]
    assert next_unvisited(cands, unvisited, cands[0], estimates, lambda settings, default: 3) is cands[3]
    assert next_unvisited(cands, unvisited, cands[0], estimates, None) is cands[1]  # nearest to the best

    def failing(settings: list[GpuSetting], default: Estimate) -> int:
        raise ValueError("no model")

    assert next_unvisited(cands, unvisited, cands[0], estimates, failing) is cands[1]  # a failed guess: order


def test_two_clear_rises_in_a_row_are_steep_one_is_not() -> None:
    cands = candidates(["measured"] * 5)
    for c in cands:
        c.stats.blocks.append(Block(1, 1, 1.0, 1.0))
    estimates = {0: est(0, 1.0, 1.0), 1: est(1, 1.2, 1.2), 2: est(2, 1.5, 1.5), 3: est(3, 1.5, 1.5),
                 4: est(4, 1.0, 1.0)}
    assert steep_below(cands, cands[2], cands[0], estimates, 2.0)
    assert not steep_below(cands, cands[1], cands[0], estimates, 2.0)  # right below the best
    assert not steep_below(cands, cands[3], cands[1], estimates, 2.0)  # a flat step above it


def test_pruning_drops_only_unvisited_candidates_below() -> None:
    cands = candidates(["measured", "unvisited", "measured", "unvisited", "unvisited"])
    prune_below(cands, 2, "why")
    assert [c.status for c in cands] == ["measured", "unvisited", "measured", "pruned", "pruned"]
    assert cands[3].reason == "why"
