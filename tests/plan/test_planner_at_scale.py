"""The planner at scale: a micro-batch's fixed part, throughput units, a framework term from a multi-node point,
and the shares of the step lost to what does not scale."""

from __future__ import annotations

from typing import Any

import pytest

from dtpo.core.errors import ConfigError
from dtpo.plan.batch_fit import fit_batch_times, t_quantile
from dtpo.plan.predict import plan, step_losses
from dtpo.plan.report import plan_dict, plan_table
from dtpo.plan.scenario_reader import scenario_from_dict


def _strong(**extra: Any) -> dict[str, Any]:
    """BERT-Large-like strong scaling on DGX A100: the global batch stays 3,200, the per-GPU batch shrinks 8x."""
    base = {"gpu": "A100", "gpu_counts": [8, 64], "intra_link": "nvlink3", "inter_link": "ib-hdr",
            "per_gpu_batch": {"8": 400, "64": 50}, "model": {"parameters": 336_000_000},
            "baseline": {"gpus": 8, "throughput": 3000.0}}
    return {**base, **extra}


def _compute_per_sample(result: Any, gpus: int) -> float:
    p = next(p for p in result.predictions if p.gpus == gpus)
    return (p.step.compute_s - p.step.interference_s) / p.samples_per_step * gpus


# -- item 1: a fixed and a per-sample part ----------------------------------------------------------------------

def test_two_batch_sizes_split_a_micro_batch_into_fixed_and_per_sample_parts() -> None:
    fit = fit_batch_times([(8, 0.010 + 8 * 0.001), (32, 0.010 + 32 * 0.001), (128, 0.010 + 128 * 0.001)])
    assert fit.fixed_s == pytest.approx(0.010) and fit.per_sample_s == pytest.approx(0.001)
    assert fit.fixed_share(10) == pytest.approx(0.5)
    with pytest.raises(ConfigError, match="two or more batch sizes"):
        fit_batch_times([(8, 0.1), (8, 0.2)])
    with pytest.raises(ConfigError, match="do not grow"):
        fit_batch_times([(8, 0.2), (32, 0.1)])
    assert fit_batch_times([(10, 0.05), (20, 0.15)]).fixed_s == 0.0  # a negative intercept is noise, not time


def test_strong_scaling_is_slower_per_sample_at_small_batches_with_a_fixed_part() -> None:
    flat = plan(scenario_from_dict(_strong(), where="t"))
    fixed = plan(scenario_from_dict(_strong(micro_batch={"fixed_share": 0.2}), where="t"))
    assert _compute_per_sample(flat, 64) == pytest.approx(_compute_per_sample(flat, 8), rel=1e-9)
    assert _compute_per_sample(fixed, 64) > 1.5 * _compute_per_sample(fixed, 8)  # 50 per GPU pays 8x the fixed part
    assert fixed.predictions[0].throughput == pytest.approx(3000.0, rel=1e-9)  # its calibration point still holds
    assert fixed.predictions[1].throughput < 0.8 * flat.predictions[1].throughput
    assert fixed.predictions[1].losses["fixed"] > flat.predictions[1].losses["fixed"]


def test_measured_times_at_several_batches_give_the_fixed_share_and_no_sensitivity() -> None:
    times = {"50": 0.010 + 50 * 0.001, "400": 0.010 + 400 * 0.001}  # fixed 10 ms: 2.4 % of a 400 micro-batch
    result = plan(scenario_from_dict(_strong(micro_batch={"times_s": times}), where="t"))
    assert result.calibration.fixed_s == pytest.approx(result.calibration.t_micro_s * 0.010 / 0.410)
    assert not result.calibration.fixed_assumed and all(p.sensitivity is None for p in result.predictions)
    assert any("fitted from batch sizes 50, 400" in a for a in result.assumptions)


def test_the_fit_gives_the_fixed_part_a_confidence_interval_that_widens_with_the_scatter() -> None:
    line = [(b, 0.010 + b * 0.001) for b in (100, 200, 400, 800)]
    assert fit_batch_times(line[:2]).fixed_range_s is None  # two points: no scatter to judge by
    exact = fit_batch_times(line).fixed_range_s
    assert exact == pytest.approx((0.010, 0.010))
    bumped = [(b, t * (1 + e)) for (b, t), e in zip(line, (0.01, -0.01, 0.01, -0.01), strict=True)]
    noisier = [(b, t * (1 + e)) for (b, t), e in zip(line, (0.03, -0.03, 0.03, -0.03), strict=True)]
    (low, high), (low3, high3) = fit_batch_times(bumped).fixed_range_s, fit_batch_times(noisier).fixed_range_s
    assert low < fit_batch_times(bumped).fixed_s < high and high3 - low3 > 2 * (high - low)
    assert low3 >= 0.0  # clamped: no time given back
    loose = fit_batch_times([(8, 0.020), (16, 0.012), (32, 0.060)]).fixed_range_s  # one degree of freedom: t = 12.7
    assert loose is not None and loose[1] == pytest.approx(0.020)  # never more than the smallest micro-batch took


def test_student_t_quantiles() -> None:
    assert t_quantile(0.95, 1) == pytest.approx(12.706, abs=1e-3)
    assert t_quantile(0.95, 2) == pytest.approx(4.303, abs=1e-3)
    assert t_quantile(0.95, 5) == pytest.approx(2.571, rel=0.01)
    assert t_quantile(0.95, 30) == pytest.approx(2.042, rel=0.005)
    assert t_quantile(0.95, 10_000) == pytest.approx(1.960, rel=0.001)


def test_times_fitted_from_several_points_show_the_throughput_at_both_ends_of_the_fit() -> None:
    times = {str(b): (0.010 + b * 0.001) * (1 + e) for b, e in ((50, 0.02), (100, -0.02), (200, 0.02), (400, -0.02))}
    result = plan(scenario_from_dict(_strong(micro_batch={"times_s": times}), where="t"))
    assert result.calibration.fixed_range is not None and not result.calibration.fixed_assumed
    at_8, at_64 = (p.sensitivity for p in result.predictions)
    assert at_8 == pytest.approx((0.0, 0.0), abs=1e-9)  # the calibration point moves with neither
    assert at_64[0] > 0 > at_64[1]  # the low end of the fixed part: faster at 50 per GPU; the high end: slower
    assert plan_dict(result)["predictions"][1]["sensitivity"] == {"fit_low": at_64[0], "fit_high": at_64[1]}
    assert "fit range" in [c.header for c in plan_table(result).columns]
    assert any("ms (95% confidence)" in a for a in result.assumptions)


def test_one_batch_size_says_what_it_assumed_and_how_far_the_answer_moves() -> None:
    result = plan(scenario_from_dict(_strong(), where="t"))
    assert any("assumed to be all per-sample" in a for a in result.assumptions)
    at_8, at_64 = (p.sensitivity for p in result.predictions)
    assert at_8 == pytest.approx((0.0, 0.0), abs=1e-9)  # the calibration point moves with neither
    assert at_64[0] == pytest.approx(0.0, abs=1e-9) and at_64[1] < -0.1  # 20 % fixed: much slower at 50 per GPU
    assert plan_dict(result)["predictions"][1]["sensitivity"]["fixed_0.2"] == at_64[1]
    columns = [c.header for c in plan_table(result).columns]
    assert "fixed 0% / 20%" in columns and "lost to" in columns


def test_a_bad_micro_batch_section_is_one_line() -> None:
    with pytest.raises(ConfigError, match="exactly one of fixed_share or times_s"):
        scenario_from_dict(_strong(micro_batch={}), where="t")
    with pytest.raises(ConfigError, match=r"fixed_share must be a number in \[0, 1\)"):
        scenario_from_dict(_strong(micro_batch={"fixed_share": 1.0}), where="t")
    with pytest.raises(ConfigError, match="two or more batch sizes"):
        scenario_from_dict(_strong(micro_batch={"times_s": {"8": 0.1}}), where="t")


# -- item 2: units ------------------------------------------------------------------------------------------------

def _txl(**extra: Any) -> dict[str, Any]:
    """Transformer-XL large on DGX-2H as DeepLearningExamples publishes it: 4 sequences of 384 tokens per GPU,
    69,070 tokens/s on 16 V100s (benchmarks/data/published_scaling_extra.json)."""
    base = {"gpu": "V100", "gpus_per_node": 16, "gpu_counts": [16, 32, 64, 128], "intra_link": "nvlink2",
            "inter_link": "ib-edr", "precision": "32-true", "per_gpu_batch": 4,
            "model": {"parameters": 284_000_000}, "baseline": {"gpus": 16, "throughput": 69070.0}}
    return {**base, **extra}


def test_a_tokens_per_second_series_reproduces_its_calibration_point_exactly() -> None:
    result = plan(scenario_from_dict(_txl(unit="tokens/s", sequence_length=384), where="txl"))
    first = result.predictions[0]
    assert first.throughput * 384 == pytest.approx(69070.0, rel=1e-9)
    assert plan_dict(result)["predictions"][0]["throughput_in_unit"] == pytest.approx(69070.0, rel=1e-9)
    assert "tokens/s" in [c.header for c in plan_table(result).columns]


def test_tokens_read_as_samples_are_refused_in_one_line() -> None:
    with pytest.raises(ConfigError, match="check the unit") as refused:
        plan(scenario_from_dict(_txl(), where="txl"))
    assert "\n" not in str(refused.value) and str(refused.value).startswith("txl: ")
    with pytest.raises(ConfigError, match="needs sequence_length"):
        scenario_from_dict(_txl(unit="tokens/s"), where="txl")
    with pytest.raises(ConfigError, match="unit must be one of"):
        scenario_from_dict(_txl(unit="words/s"), where="txl")


# -- item 3: a framework term from a multi-node point -------------------------------------------------------------

def _paddle(**baseline: Any) -> dict[str, Any]:
    """PaddlePaddle BERT-Large phase 1 on DGX A100, global batch 65,536 (published_scaling_extra.json)."""
    return {"gpu": "A100", "gpu_counts": [8, 16, 32, 256], "intra_link": "nvlink3", "inter_link": "ib-hdr",
            "precision": "16-mixed", "per_gpu_batch": 256, "overlap": False,
            "grad_accum": {"8": 32, "16": 16, "32": 8, "256": 1}, "model": {"parameters": 336_000_000},
            "baseline": {"gpus": 8, "throughput": 5541.0, **baseline}}


def test_a_two_node_point_gives_a_framework_term_carried_to_larger_counts() -> None:
    one_node = plan(scenario_from_dict(_paddle(), where="p"))
    two = plan(scenario_from_dict(_paddle(multi_node_gpus=16, multi_node_throughput=10646.0), where="p"))
    assert one_node.calibration.framework_s == 0.0 and two.calibration.framework_s > 0
    at = {p.gpus: p for p in two.predictions}
    assert at[16].throughput == pytest.approx(10646.0, rel=1e-6)  # the point it was fitted on
    assert at[8].step.framework_s == 0.0 and at[32].step.framework_s > 0  # one node pays none
    assert at[32].throughput < {p.gpus: p for p in one_node.predictions}[32].throughput
    assert at[32].losses["framework"] > 0
    assert any(a.startswith("framework:") and "10,646 samples/s measured at 16 GPUs" in a for a in two.assumptions)
    assert not any("a one-node calibration cannot see" in a for a in two.assumptions)


def test_a_multi_node_point_faster_than_the_model_adds_nothing() -> None:
    result = plan(scenario_from_dict(_paddle(multi_node_gpus=16, multi_node_throughput=11082.0), where="p"))
    assert result.calibration.framework_s == 0.0


def test_a_multi_node_point_must_span_whole_nodes() -> None:
    with pytest.raises(ConfigError, match="multi_node_gpus must span 2 or more whole nodes"):
        scenario_from_dict(_paddle(multi_node_gpus=8, multi_node_throughput=5000.0), where="p")
    with pytest.raises(ConfigError, match="go together"):
        scenario_from_dict(_paddle(multi_node_gpus=16), where="p")


# -- item 5: what limits scaling, in shares of the step -------------------------------------------------------------

def test_the_losses_are_shares_of_the_step_and_grow_with_scale() -> None:
    result = plan(scenario_from_dict(_paddle(multi_node_gpus=16, multi_node_throughput=10646.0), where="p"))
    for p in result.predictions:
        losses = step_losses(p.step)
        assert set(losses) == {"network", "contention", "stragglers", "fixed", "framework"}
        assert all(0.0 <= share < 1.0 for share in losses.values())
        lost = p.step.exposed_comm_s + p.step.interference_s + p.step.sync_wait_s + p.step.fixed_s + \
            p.step.optimizer_s + p.step.framework_s
        assert sum(losses.values()) == pytest.approx(lost / p.step.step_s)
    first, last = result.predictions[0], result.predictions[-1]
    assert sum(last.losses.values()) > sum(first.losses.values())
    assert plan_dict(result)["predictions"][-1]["losses"] == last.losses
