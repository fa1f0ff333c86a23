"""The scenarios ``benchmarks/planner_vs_published.py`` builds from a published series' own text."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from dtpo.plan.predict import plan
from dtpo.plan.scenario import Scenario

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
    Scenario.from_dict(data, where="s")  # a valid scenario


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


def test_every_extra_series_builds_a_scenario_the_planner_predicts(bench: ModuleType) -> None:
    series = json.loads((BENCHMARKS / "data" / "published_scaling_extra.json").read_text())["series"]
    assert series and all(s["source"] and s["notes"] for s in series)
    for one in series:
        result = plan(bench.load(one)[0])
        assert [p.gpus for p in result.predictions] == sorted(p["gpus"] for p in one["points"])
        assert result.predictions[0].throughput == pytest.approx(min(one["points"], key=lambda p: p["gpus"])[
            "throughput"], rel=1e-6)
