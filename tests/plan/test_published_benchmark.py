"""The scenarios ``benchmarks/planner_vs_published.py`` builds from a published series' own text."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from dtpo.core.errors import ConfigError
from dtpo.plan.predict import plan
from dtpo.plan.scenario_reader import scenario_from_dict

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("planner_vs_published")


def _series(**extra: Any) -> dict[str, Any]:
    base = {"id": "s", "hardware": "DGX-2H (16x V100 32GB)", "model": "Transformer-XL large", "precision": "FP32",
            "per_gpu_batch": 1536, "points": [{"gpus": 16, "throughput": 69070}, {"gpus": 32, "throughput": 136960}],
            "notes": ""}
    return {**base, **extra}


def test_a_dgx2_series_gets_16_gpus_per_node_nvlink2_and_eight_edr_nics(bench: ModuleType) -> None:
    data = bench.scenario_for(_series())
    assert (data["gpu"], data["gpus_per_node"], data["intra_link"], data["inter_link"], data["nics_per_node"]) == (
        "V100", 16, "nvlink2", "ib-edr", 8)
    assert data["model"] == {"parameters": 284_000_000, "gradient_dtype": "fp32"}
    assert data["overlap"] is True
    scenario_from_dict(data, where="s")  # a valid scenario


def test_a_dgx1_p100_series_gets_the_cube_mesh_and_four_edr_nics(bench: ModuleType) -> None:
    data = bench.scenario_for(_series(hardware="DGX-1 (8x P100 SXM2)", model="VGG16", per_gpu_batch=64))
    assert (data["gpu"], data["gpus_per_node"], data["intra_link"], data["inter_link"], data["nics_per_node"]) == (
        "P100", 8, "nvlink1", "ib-edr", 4)


def test_mixed_precision_all_reduces_fp32_gradients_unless_the_notes_say_fp16(bench: ModuleType) -> None:
    assert bench.scenario_for(_series(precision="AMP"))["model"]["gradient_dtype"] == "fp32"
    fp16 = _series(precision="AMP (apex O2)", notes="DDP all-reduces fp16 gradients")
    assert bench.scenario_for(fp16)["model"]["gradient_dtype"] == "fp16"
    horovod = _series(precision="FP16", notes="all-reduced after accumulation with Horovod's fp16 compression")
    assert bench.scenario_for(horovod)["model"]["gradient_dtype"] == "fp16"


def test_the_notes_say_whether_the_all_reduce_overlaps_backward(bench: ModuleType) -> None:
    assert bench.scenario_for(_series(notes="all-reduce after accumulation"))["overlap"] is False
    assert bench.scenario_for(_series(notes="PyTorch DDP"))["overlap"] is True
    assert "overlap_slowdown" not in bench.scenario_for(_series(notes="PyTorch DDP"))  # the planner's default


def test_parameter_servers_overlap_backward_over_pcie_without_contending_with_it(bench: ModuleType) -> None:
    ps = bench.scenario_for(_series(notes="single node; PS on CPU"))
    assert ps["overlap"] is True and ps["overlap_slowdown"] == 0.0 and ps["intra_link"] == "pcie3"


@pytest.mark.parametrize("name", ["published_scaling_extra.json", "published_scaling_heldout.json"])
def test_every_extra_series_builds_a_scenario_the_planner_predicts(bench: ModuleType, name: str) -> None:
    series = json.loads((BENCHMARKS / "data" / name).read_text())["series"]
    assert series and all(s["source"] and s["notes"] for s in series)
    for one in series:
        result = plan(bench.load(one)[0])
        assert [p.gpus for p in result.predictions] == sorted(p["gpus"] for p in one["points"])
        assert result.predictions[0].throughput == pytest.approx(min(one["points"], key=lambda p: p["gpus"])[
            "throughput"], rel=1e-6)


def test_a_parameter_count_the_model_states_comes_before_the_table(bench: ModuleType) -> None:
    assert bench.parameters_of("GPT-3 1.3B") == 1_300_000_000
    assert bench.parameters_of("BERT-Large (340M parameters)") == 340_000_000
    assert bench.parameters_of("a 1.5 billion parameter decoder") == 1_500_000_000
    assert bench.parameters_of("BERT-Large pretrain phase1 seq128 (LAMB)") == 336_000_000
    assert bench.parameters_of("RoBERTa-large") == 355_000_000  # not BERT-Large's count
    assert bench.parameters_of("ResNet-50 v1.5") == 25_600_000
    assert bench.parameters_of("an unheard-of net") is None


def test_a_gpu_name_is_not_read_inside_a_longer_one(bench: ModuleType) -> None:
    assert bench.hardware_of(_series(hardware="8x A10 24GB (PCIe)", model="ResNet-50"))[:2] == ("A10", "pcie4")
    assert bench.hardware_of(_series(hardware="8x A100 40GB", model="ResNet-50"))[0] == "A100"
    assert bench.hardware_of(_series(hardware="8x L40S", model="ResNet-50"))[0] == "L40S"
    assert bench.hardware_of(_series(hardware="a cluster", model="GPT4-like")) is None
    assert bench.hardware_of(_series(hardware="8x AMD MI300X", model="GPT-3 1.3B"))[:3] == (
        "MI300X", "xgmi-mi300x", "ib-ndr")


def test_the_fabric_and_gpus_per_node_the_text_names_replace_the_systems(bench: ModuleType) -> None:
    hardware = bench.hardware_of(_series(hardware="DGX A100 (8 GPU/node)", interconnect="2x 100G RoCE per node"))
    assert hardware == ("A100", "nvlink3", "roce-100g", 2, 8)
    assert bench.hardware_of(_series(hardware="HGX H100", interconnect="8x 400G RoCE"))[2:4] == ("roce-400g", 8)
    assert bench.hardware_of(_series(hardware="DGX A100", interconnect="4x HDR IB"))[2:4] == ("ib-hdr", 4)
    assert bench.hardware_of(_series(hardware="HGX H100, 4 GPUs per node", interconnect="NDR"))[2:] == (
        "ib-ndr", 8, 4)


def test_accumulation_comes_from_each_points_own_column_first(bench: ModuleType) -> None:
    points = [{"gpus": 8, "throughput": 1.0, "grad_accum": 32}, {"gpus": 16, "throughput": 2.0, "global_batch": 4096}]
    assert bench.accumulation_schedule(_series(per_gpu_batch=16, points=points, notes="accum steps 1,1")) == [32, 16]
    assert bench.accumulation_schedule(_series(per_gpu_batch=16, notes="accum steps 4,2")) == [4, 2]


def test_bf16_is_its_own_mixed_precision(bench: ModuleType) -> None:
    assert bench.precision_of(_series(precision="BF16 (autocast)")) == "bf16-mixed"
    assert bench.precision_of(_series(precision="Mixed precision")) == "16-mixed"
    assert bench.precision_of(_series(precision="TF32")) == "32-true"


def test_a_series_can_be_calibrated_on_a_later_point(bench: ModuleType) -> None:
    series = _series(points=[{"gpus": 16, "throughput": 100.0}, {"gpus": 32, "throughput": 190.0},
                             {"gpus": 64, "throughput": 370.0}])
    scenario = bench.calibrated_on(bench.load(series)[0], series, 1)
    assert scenario.gpu_counts == (32, 64) and scenario.baseline.gpus == 32
    assert plan(scenario).predictions[0].throughput == pytest.approx(190.0, rel=1e-6)
    with pytest.raises(ConfigError, match="none to predict"):
        bench.calibrated_on(bench.load(series)[0], series, 2)


@pytest.mark.parametrize(("series", "field"), [
    ("junk", "a series must be a table"),
    ({"id": "s", "points": [{"gpus": 8, "throughput": 1.0}], "per_gpu_batch": 8}, "'points'"),
    ({"id": "s", "points": [{"gpus": 8, "throughput": 1.0}, {"gpus": 8, "throughput": 2.0}], "per_gpu_batch": 8},
     "GPU count twice"),
    ({"id": "s", "points": [{"gpus": 8, "throughput": 1.0}, {"gpus": 16, "throughput": 2.0}]}, "'per_gpu_batch'"),
])
def test_a_malformed_series_is_skipped_with_the_field_named(bench: ModuleType, series: Any, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        bench.load(series)


def test_a_per_gpu_batch_each_point_gives_becomes_a_table(bench: ModuleType) -> None:
    points = [{"gpus": 16, "throughput": 100.0, "per_gpu_batch": 6, "global_batch": 61440},
              {"gpus": 512, "throughput": 2900.0, "per_gpu_batch": 4, "global_batch": 32768}]
    series = _series(points=points)
    del series["per_gpu_batch"]
    scenario = bench.load(series)[0]
    assert scenario.per_gpu_batch == ((16, 6), (512, 4)) and scenario.grad_accum == ((16, 640), (512, 16))


def test_the_known_outliers_are_counted_apart_and_the_rest_meets_the_goals(bench: ModuleType,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    if not bench.DEFAULT_DATA.exists():
        pytest.skip(f"{bench.DEFAULT_DATA} is not beside the repository")
    assert bench.main([]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "known outliers counted apart: 2" in out and "OUTLIER dle_pt_bert_large_ph2_tf32_dgxa100 at 256" in out


def test_the_framework_point_is_the_series_first_point_on_two_nodes(bench: ModuleType) -> None:
    series = _series(hardware="DGX A100", model="BERT-Large", per_gpu_batch=32,
                     points=[{"gpus": 8, "throughput": 100.0}, {"gpus": 16, "throughput": 190.0},
                             {"gpus": 32, "throughput": 370.0}])
    scenario = bench.load(series)[0]
    baseline = bench.with_framework_point(scenario, series).baseline
    assert (baseline.multi_node_gpus, baseline.multi_node_throughput) == (16, 190.0)
    on_two = bench.calibrated_on(scenario, series, 1)  # calibrated on two nodes already: nothing to add
    assert bench.with_framework_point(on_two, series).baseline.multi_node_gpus is None
