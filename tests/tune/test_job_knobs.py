"""Job settings, their search space, the guard's verdicts, and the tuner over job knobs on scripted figures."""

from __future__ import annotations

import math
import random

import pytest
import torch

from dtpo.core.config import TuneConfig
from dtpo.core.errors import ConfigError
from dtpo.tune.cost import CostContext, Energy, Time
from dtpo.tune.guard import GuardOptions, cosine_similarity, judge_loss, judge_probe
from dtpo.tune.job_setting import JobSetting, JobSpace, job_knobs
from dtpo.tune.stats import Block
from dtpo.tune.tuner import PowerTuner, TunerOptions


def test_a_setting_has_one_spelling_and_round_trips() -> None:
    s = JobSetting("bf16-mixed", 2, "powersgd", 4)
    assert s.label == "bf16-mixed, accum 2, powersgd-4"
    assert JobSetting.from_dict(s.as_dict()) == s
    assert JobSetting("32-true", 1, "fp16", 3) == JobSetting("32-true", 1, "fp16", 1)  # rank means nothing there
    assert not JobSetting().changes_numerics and JobSetting(compression="fp16").changes_numerics


def test_accumulations_at_a_fixed_global_batch_divide_the_step() -> None:
    space = JobSpace(("32-true",), ("none",), batch_samples=12, configured_accum=3)
    assert space.accumulations() == [1, 2, 3, 4]  # 8 and 16 do not divide 12 samples
    grown = JobSpace(("32-true",), ("none",), batch_samples=12, configured_accum=3, allow_batch_change=True)
    assert grown.accumulations() == [1, 2, 3, 4, 8, 16]


def test_knobs_start_from_the_choice_so_far_and_offer_every_powersgd_rank() -> None:
    space = JobSpace(("32-true", "bf16-mixed"), ("none", "fp16", "powersgd"), 16, 1)
    knobs = job_knobs(("compression", "precision"), space)
    assert [k.name for k in knobs] == ["precision", "compression"]  # the tuner's order, whatever was typed
    base = JobSetting("bf16-mixed", 2, "none")
    compression = knobs[1].candidates(base)
    assert compression[0] == base
    assert [c.compression_label for c in compression] == ["none", "fp16", "powersgd-1", "powersgd-2",
                                                          "powersgd-4"]
    assert all(c.precision == "bf16-mixed" and c.grad_accum == 2 for c in compression)


@pytest.mark.parametrize("text,problem", [
    ("precision,speed", "unknown knob 'speed'"),
    ("precision,precision", "names a knob twice"),
])
def test_the_knob_list_is_checked(text: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        TuneConfig(knob=text)


def test_allow_batch_change_needs_accumulation_in_the_list() -> None:
    with pytest.raises(ConfigError, match="only meaningful with --tune grad-accum"):
        TuneConfig(knob="precision,compression", allow_batch_change=True)
    assert TuneConfig(knob="compression , grad-accum", allow_batch_change=True).job_knobs == ("grad-accum",
                                                                                              "compression")
    assert TuneConfig(knob="power-limit").job_knobs == ()


def test_cosine_of_a_gradient_with_itself_its_opposite_and_an_orthogonal_one() -> None:
    g = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    assert cosine_similarity(g, g) == pytest.approx(1.0)
    assert cosine_similarity(g, -g) == pytest.approx(-1.0)
    assert cosine_similarity(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 2.0])) == pytest.approx(0.0)
    assert math.isnan(cosine_similarity(g, torch.zeros(1000)))


def test_the_probe_verdict_names_what_failed() -> None:
    options = GuardOptions(min_cosine=0.9, screen_slowdown=2.0)
    assert judge_probe(0.99, True, 1.1, options).accepted
    low = judge_probe(0.5, True, 1.0, options)
    assert not low.accepted and "0.500" in low.reason and low.cosine == 0.5
    assert "not finite" in judge_probe(0.99, False, 1.0, options).reason
    slow = judge_probe(0.99, True, 3.0, options)
    assert not slow.accepted and "3.0x slower" in slow.reason


def test_the_loss_check_rejects_a_clear_rise_and_tolerates_noise_and_falls() -> None:
    rng = random.Random(0)
    options = GuardOptions(loss_rise=0.05, z=2.0)
    before = [3.0 + rng.gauss(0, 0.1) for _ in range(8)]
    assert judge_loss(before, [2.9 + rng.gauss(0, 0.1) for _ in range(6)], options) is None
    assert judge_loss(before, [3.05 + rng.gauss(0, 0.1) for _ in range(6)], options) is None  # within 5 %
    rose = judge_loss(before, [4.0 + rng.gauss(0, 0.1) for _ in range(6)], options)
    assert rose is not None and not rose.accepted and rose.loss_during == pytest.approx(4.0, abs=0.2)
    assert judge_loss(before, [float("nan"), 3.0], options) is not None
    assert judge_loss(before, [9.0], options) is None  # one step is too few to judge


# -- the tuner on scripted figures ------------------------------------------------------------------------------

SPACE = JobSpace(("32-true", "bf16-mixed"), ("none", "fp16", "powersgd"), 16, 1)

# seconds per sample and watts of each setting: bf16 is fast; accumulation 2 is a little faster still with
# fp32; fp16 compression saves communication; powersgd-1 would be cheapest of all but the guard refuses it
FIGURES = {
    ("32-true", 1, "none"): (0.010, 100.0),
    ("bf16-mixed", 1, "none"): (0.006, 110.0),
    ("bf16-mixed", 2, "none"): (0.0062, 110.0),
    ("bf16-mixed", 4, "none"): (0.0070, 108.0),
    ("bf16-mixed", 1, "fp16"): (0.0055, 110.0),
    ("bf16-mixed", 1, "powersgd-1"): (0.0040, 105.0),
    ("bf16-mixed", 1, "powersgd-2"): (0.0052, 108.0),
    ("bf16-mixed", 1, "powersgd-4"): (0.0058, 110.0),
}


def _figures(s: JobSetting) -> tuple[float, float]:
    key = (s.precision, s.grad_accum, s.compression_label)
    if key in FIGURES:
        return FIGURES[key]
    per_sample, watts = FIGURES.get((s.precision, 1, s.compression_label), FIGURES[("32-true", 1, "none")])
    return per_sample * (1 + 0.05 * s.grad_accum), watts


@pytest.mark.parametrize("metric", [Energy(), Time()], ids=["energy", "time"])
def test_the_tuner_picks_the_cheapest_candidate_the_guard_admits(metric: Energy | Time) -> None:
    rng = random.Random(1)
    tuner = PowerTuner(job_knobs(("precision", "grad-accum", "compression"), SPACE), metric,
                       CostContext(gpus=1, max_power_w=100.0), JobSetting(), TunerOptions(ordered=False))
    refused = {JobSetting("bf16-mixed", 1, "powersgd", 1): "gradient cosine 0.41 with the exact gradient is below 0.8"}
    setting, steps = tuner.current, 0
    while not tuner.holding and steps < 2000:
        while setting in refused:
            setting = tuner.reject(setting, refused[setting])
        per_sample, watts = _figures(setting)
        t = 32 * per_sample * (1 + rng.gauss(0, 0.01))
        setting = tuner.feed(Block(1, 32, t, watts * t))
        steps += 1
    assert tuner.holding
    costs = {s: metric.per_sample(p, p * w, CostContext(1, 100.0)) for s in tuner.stats
             for p, w in [_figures(s)] if s not in refused}
    assert tuner.choice == min(costs, key=costs.__getitem__)
    report = tuner.report()
    assert any("rejected bf16-mixed, accum 1, powersgd-1" in h for h in report["history"])
    assert JobSetting("bf16-mixed", 1, "powersgd", 1) not in {JobSetting.from_dict(r) for r in report["settings"]}


def test_the_starting_setting_cannot_be_rejected() -> None:
    tuner = PowerTuner(job_knobs(("precision",), SPACE), Energy(), CostContext(1, 100.0), JobSetting(),
                       TunerOptions(ordered=False, wait_steps=1))
    tuner.feed(Block(1, 32, 0.3, 30.0))
    with pytest.raises(ValueError, match="cannot be rejected"):
        tuner.reject(JobSetting(), "no")
    with pytest.raises(ValueError, match="not a candidate"):
        tuner.reject(JobSetting(compression="fp16"), "no")
