"""The shipped MLPerf power result: its file loads, its figures are recomputed from the shipped logs, and the
benchmark's power section calibrates on the 1-node point and predicts the 8-node one."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def extract(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("mlperf_power_extract")


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("planner_vs_published")


def test_data_file_loads_with_its_source_and_both_systems(extract: ModuleType) -> None:
    record = json.loads(extract.FIGURES.read_text())
    assert record["source"]["repo"] == "mlcommons/training_results_v4.0"
    assert len(record["source"]["commit"]) == 40
    assert "Apache" in record["source"]["licence"]
    systems = record["systems"]
    assert {s["nodes"] for s in systems.values()} == {1, 8}
    for system in systems.values():
        assert len(system["runs"]) == 5 and len(system["olympic_runs"]) == 3
        assert system["joules_per_sample"] == pytest.approx(system["node_energy_j"] / system["samples"])
    shipped = sum(p.stat().st_size for p in (extract.ARCHIVE, extract.FIGURES))
    assert shipped < 1_000_000


def test_the_derivation_reproduces_the_files_figures(extract: ModuleType) -> None:
    record = json.loads(extract.FIGURES.read_text())
    assert extract.differences(record["systems"], extract.extract()) == []


def test_a_changed_figure_is_caught(extract: ModuleType) -> None:
    record = json.loads(extract.FIGURES.read_text())
    record["systems"]["8xSMC-H100-SXM-80GB"]["joules_per_sample"] *= 1.01
    found = extract.differences(record["systems"], extract.extract())
    assert found and "joules_per_sample" in found[0]


def test_energy_integrates_over_the_window_holding_edge_readings(extract: ModuleType) -> None:
    # readings at 1, 2 and 3 s; over 0..4 s: 1000 W held for 1 s, trapezoids 1500 J and 2000 J, 2000 W held 1 s
    readings = [(1000, 1000.0), (2000, 2000.0), (3000, 2000.0)]
    assert extract.energy_in_window(readings, 0, 4000) == pytest.approx(1000 + 1500 + 2000 + 2000)
    assert extract.energy_in_window(readings, 1500, 2500) == pytest.approx((1500 + 2000) / 2 * 0.5 + 2000 * 0.5)
    with pytest.raises(ValueError):
        extract.energy_in_window(readings, 10, 10)


def test_run_figures_count_epochs_and_refuse_an_inconsistent_log(extract: ModuleType) -> None:
    def line(t: int, key: str, value: object = None, **metadata: object) -> str:
        event = {"namespace": "", "time_ms": t, "event_type": "POINT_IN_TIME", "key": key, "value": value,
                 "metadata": metadata}
        return ":::MLLOG " + json.dumps(event)

    head = [line(0, "run_start"), line(0, "train_samples", 100), line(0, "global_batch_size", 20),
            line(0, "d_batch_size", 10), line(1000, "epoch_stop"), line(2000, "epoch_stop"),
            line(2000, "eval_accuracy", 0.8)]
    node = "\n".join(line(t, "power_reading", 500) for t in (0, 1000, 2000))
    good = "\n".join([*head, line(2000, "run_stop", status="success", epoch=1)])
    figures = extract.run_figures(good, [node, node], [])
    assert figures["samples"] == 200 and figures["time_to_train_s"] == 2.0 and figures["throughput"] == 100.0
    assert figures["node_energy_j"] == pytest.approx(2 * 500 * 2.0)
    assert figures["joules_per_sample"] == pytest.approx(10.0) and figures["node_power_w"] == pytest.approx(500)
    bad = "\n".join([*head, line(2000, "run_stop", status="success", epoch=4)])
    with pytest.raises(ValueError, match="epoch"):
        extract.run_figures(bad, [node], [])


def test_power_section_reproduces_its_calibration_point_and_predicts_the_other(bench: ModuleType) -> None:
    record = json.loads(bench.POWER_DATA.read_text())
    scenario = bench.power_scenario(record)
    assert scenario.gpu_counts == (8, 64) and scenario.unit == "images/s"
    assert scenario.batch_at(8) == 400 and scenario.batch_at(64) == 50
    result = bench.plan(scenario)
    first, last = result.predictions
    one_node = record["systems"]["1xSMC-H100-SXM-80GB"]
    assert first.throughput == pytest.approx(one_node["throughput"], rel=1e-6)
    assert first.energy.joules_per_sample == pytest.approx(one_node["joules_per_sample"], rel=bench.CALIBRATION_MATCH)
    assert last.gpus == 64 and last.throughput > first.throughput


def test_the_power_goals_are_counted_in_the_verdict(bench: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    extra = BENCHMARKS / "data" / "published_scaling_heldout.json"
    code = bench.main(["--data", str(extra), "--power"])
    out = " ".join(capsys.readouterr().out.split())
    assert "energy at scale: throughput at 64 GPUs" in out and "J/sample at 64 GPUs" in out
    power_missed = "MISSED mlperf_v4.0_smc_resnet50_ac_power" in out
    assert ("of 2 met" in out) and (code == 1 if power_missed else True)


def test_batch_times_file_names_its_sources_and_is_reproduced(extract: ModuleType) -> None:
    record = json.loads(extract.BATCH_FIGURES.read_text())
    repos = record["source"]["repos"]
    assert {r["repo"] for r in repos} == {f"mlcommons/training_results_{v}" for v in ("v3.0", "v3.1", "v4.0")}
    assert all(len(r["commit"]) == 40 for r in repos) and "Apache" in record["source"]["licence"]
    points = record["points"]
    assert len({p["per_gpu_batch"] for p in points}) >= 2  # a fit needs two batch sizes or more
    assert not any(p["submitter"].startswith("smc") for p in points)  # the checked submitter's own runs stay out
    assert extract.BATCH_ARCHIVE.stat().st_size < 1_000_000
    assert extract.differences(points, extract.batch_times(), "points") == []


def test_training_step_is_the_global_batch_over_the_median_epoch_without_the_first(extract: ModuleType) -> None:
    def line(t: int, key: str, value: object = None, **metadata: object) -> str:
        event = {"namespace": "", "time_ms": t, "event_type": "POINT_IN_TIME", "key": key, "value": value,
                 "metadata": metadata}
        return ":::MLLOG " + json.dumps(event)

    epochs = [(0, 9000), (9000, 11000), (11000, 13000), (13000, 16000)]  # 9 s warm-up, then 2 s, 2 s, 3 s
    lines = [line(0, "global_batch_size", 100), line(0, "d_batch_size", 25), line(0, "train_samples", 1000)]
    for number, (start, stop) in enumerate(epochs, 1):
        lines += [line(start, "epoch_start", epoch_num=number), line(stop, "epoch_stop", epoch_num=number)]
    text = "\n".join([*lines, line(16000, "run_stop", status="success")])
    step = extract.training_step(text)
    assert step["gpus"] == 4 and step["per_gpu_batch"] == 25
    assert step["step_s"] == pytest.approx(100 * 2.0 / 1000)
    with pytest.raises(ValueError, match="success"):
        extract.training_step(text.replace('"success"', '"aborted"'))


def test_power_section_with_batch_times_fits_the_split_and_takes_overhead_from_the_log(bench: ModuleType) -> None:
    record = json.loads(bench.POWER_DATA.read_text())
    times = json.loads(bench.BATCH_TIMES.read_text())
    scenario = bench.power_scenario(record, times)
    assert scenario.micro_batch is not None and len(scenario.micro_batch.times_s) == len(times["points"])
    # every published step is longer than the compute the planner solves from it
    assert all(t < p["step_s"] for (_, t), p in zip(scenario.micro_batch.times_s, times["points"], strict=True))
    one_node = record["systems"]["1xSMC-H100-SXM-80GB"]
    idle = scenario.power_spec.idle_power_w
    assert scenario.power.node_overhead_w == pytest.approx(one_node["rest_node_power_w"] - 8 * idle)
    result = bench.plan(scenario)
    first, last = result.predictions
    assert first.energy.joules_per_sample == pytest.approx(one_node["joules_per_sample"], rel=bench.CALIBRATION_MATCH)
    assert any("fitted from batch sizes" in a for a in result.assumptions)
    assert first.sensitivity == pytest.approx((0.0, 0.0), abs=1e-9)  # the calibration point does not move
    assert last.sensitivity[0] > 0 > last.sensitivity[1]  # 34 scattered points: the fit's range moves 64 GPUs
    assert last.step.fixed_s > 0
    assert scenario.power.busy_power_w <= scenario.power_spec.max_power_w  # a GPU cannot draw above its limit
