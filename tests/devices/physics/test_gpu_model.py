"""The GPU models: the calibrated one reproduces the measured traces, the parametric one behaves physically
and finds the traces' energy-optimal power limits."""

from __future__ import annotations

import csv
import io
import math
from importlib import resources

import numpy as np
import pytest

from dtpo.core.errors import ConfigError
from dtpo.devices.physics.gpu_model import (
    CalibratedModel,
    GpuModel,
    ParametricModel,
    known_workloads,
    load_model,
    samples_per_epoch,
)
from dtpo.devices.physics.power_specs import POWER_SPECS, find_power_spec
from dtpo.devices.physics.traces import Trace, load_traces

ALL_TRACES = load_traces(all_optimizers=True)
UNTRACED = ("H100-SXM", "A100-SXM", "MI250X")

# Traces whose measured energy-optimal limit is meaningful enough to hold the parametric model to 10 %:
# the knob matters (energy per epoch varies by at least VAR_MIN over the limits) and the optimum is
# resolved (every measured limit more than 10 % away from it costs at least SHARP_MIN more energy; where a
# limit outside the tolerance band is within measurement noise of the minimum, no model can be held to it).
VAR_MIN = 0.25
SHARP_MIN = 0.03


def energy_variation(trace: Trace) -> float:
    energies = trace.energy_per_epoch_j
    return max(energies) / min(energies) - 1


def sharpness(trace: Trace) -> float:
    best = trace.optimal_power_limit_w
    far = [e for p, e in zip(trace.points, trace.energy_per_epoch_j, strict=True)
           if abs(p.power_limit_w - best) > 0.1 * best]
    return min(far) / min(trace.energy_per_epoch_j) - 1


def model_optimum(model: GpuModel) -> float:
    """The energy-optimal power limit of a model on a 1 W grid."""
    spec = model.spec
    grid = np.arange(spec.min_power_w, spec.max_power_w + 0.5, 1.0)
    energy = [model.at(float(limit)).energy_per_sample_j for limit in grid]
    return float(grid[int(np.argmin(energy))])


RESOLVED = [t for t in load_traces() if energy_variation(t) >= VAR_MIN and sharpness(t) >= SHARP_MIN]
KNOB_MATTERS = [t for t in load_traces() if energy_variation(t) >= VAR_MIN]


def csv_rows(trace: Trace) -> list[dict[str, str]]:
    name = {"A40": "summary_power_a40.csv", "V100": "summary_power_v100.csv"}[trace.gpu]
    text = (resources.files("dtpo.devices.physics") / "data" / "zeus_nsdi23" / name).read_text(encoding="utf-8")
    key = (trace.network, trace.dataset, str(trace.batch_size), trace.optimizer)
    return [r for r in csv.DictReader(io.StringIO(text))
            if (r["network"], r["dataset"], r["batch_size"], r["optimizer"]) == key]


# -- calibrated model ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("trace", ALL_TRACES, ids=lambda t: t.label)
def test_calibrated_reproduces_every_measured_point(trace: Trace) -> None:
    model = CalibratedModel(trace)
    samples = samples_per_epoch(trace.dataset)
    rows = csv_rows(trace)
    assert len(rows) == len(trace.points) >= 5
    for row in rows:
        point = model.at(float(row["power_limit"]))
        assert point.time_per_sample_s * samples == pytest.approx(float(row["time_per_epoch"]), rel=0.03)
        assert point.power_w == pytest.approx(float(row["average_power"]), rel=0.03)


@pytest.mark.parametrize("trace", ALL_TRACES, ids=lambda t: t.label)
def test_interpolation_lies_between_neighbouring_measurements(trace: Trace) -> None:
    model = CalibratedModel(trace)
    samples = samples_per_epoch(trace.dataset)
    for lo, hi in zip(trace.points, trace.points[1:], strict=False):
        for w in (0.25, 0.5, 0.75):
            point = model.at(lo.power_limit_w + w * (hi.power_limit_w - lo.power_limit_w))
            t = point.time_per_sample_s * samples
            assert min(lo.time_per_epoch_s, hi.time_per_epoch_s) - 1e-9 <= t
            assert t <= max(lo.time_per_epoch_s, hi.time_per_epoch_s) + 1e-9
            assert min(lo.average_power_w, hi.average_power_w) - 1e-9 <= point.power_w
            assert point.power_w <= max(lo.average_power_w, hi.average_power_w) + 1e-9


def test_load_model_picks_calibrated_where_a_trace_exists() -> None:
    model = load_model("a40", "resnet50", 128)
    assert isinstance(model, CalibratedModel) and model.calibrated
    assert model is load_model("A40", "resnet50/imagenet", 128)  # cached
    assert load_model("A40", "resnet50").batch_size == 256
    unmeasured = load_model("A40", "resnet50", 100)
    assert isinstance(unmeasured, ParametricModel) and not unmeasured.calibrated
    assert any("nearest measured batch" in a for a in unmeasured.assumptions)
    assert not load_model("A40", "resnet50", 128, calibrated=False).calibrated
    with pytest.raises(ConfigError, match="measured batch sizes"):
        load_model("A40", "resnet50", 100, calibrated=True)


def test_clock_lock_on_calibrated_model() -> None:
    model = load_model("A40", "bert_base_uncased/squad", 32)
    spec = model.spec
    free = model.at(250.0)
    assert model.at(250.0, spec.max_sm_mhz) == free  # a lock at the top clock changes nothing
    locked = model.at(250.0, 900)
    assert locked.sm_clock_mhz == 900
    assert locked.time_per_sample_s > free.time_per_sample_s and locked.power_w < free.power_w
    # Lock and cap together: the effective clock is the lower of the two.
    capped = model.at(100.0)
    assert model.at(100.0, spec.max_sm_mhz).sm_clock_mhz == capped.sm_clock_mhz
    assert model.at(300.0, spec.min_sm_mhz).sm_clock_mhz == spec.min_sm_mhz
    # A lock below the clock of the lowest measured limit: the lowest measured point, scaled by the physics.
    deep = model.at(300.0, spec.min_sm_mhz)
    assert capped.sm_clock_mhz > spec.min_sm_mhz
    assert deep.time_per_sample_s > capped.time_per_sample_s and 0 < deep.power_w < capped.power_w


# -- parametric model against the measurements --------------------------------------------------------------


def test_enough_traces_have_a_resolved_optimum() -> None:
    assert len(RESOLVED) >= 30
    assert {t.gpu for t in RESOLVED} == {"A40", "V100"}
    assert {t.network for t in RESOLVED} >= {"resnet50", "bert_base_uncased", "deepspeech2", "shufflenetv2"}


@pytest.mark.parametrize("trace", RESOLVED, ids=lambda t: t.label)
def test_parametric_finds_the_measured_energy_optimal_limit(trace: Trace) -> None:
    model = load_model(trace.gpu, trace.workload, trace.batch_size, calibrated=False)
    measured = trace.optimal_power_limit_w
    predicted = model_optimum(model)
    assert abs(predicted - measured) <= 0.10 * measured, f"model {predicted:g} W, measured {measured:g} W"


@pytest.mark.parametrize("trace", KNOB_MATTERS, ids=lambda t: t.label)
def test_parametric_optimum_costs_little_measured_energy(trace: Trace) -> None:
    """Where the limit matters at all, the measured energy at the model's chosen limit is near the minimum."""
    model = load_model(trace.gpu, trace.workload, trace.batch_size, calibrated=False)
    energy = np.interp(model_optimum(model), trace.power_limits_w, trace.energy_per_epoch_j)
    assert energy <= 1.10 * min(trace.energy_per_epoch_j)


# -- parametric physics -------------------------------------------------------------------------------------


@pytest.mark.parametrize("gpu", [s.name for s in POWER_SPECS])
@pytest.mark.parametrize("workload", ["resnet50", "bert_base_uncased/squad", "ncf"])
def test_power_and_time_are_monotone(gpu: str, workload: str) -> None:
    model = load_model(gpu, workload, calibrated=False)
    spec = model.spec
    by_limit = [model.at(float(limit)) for limit in np.linspace(spec.min_power_w, spec.max_power_w, 60)]
    by_clock = [model.at(None, clock) for clock in spec.sm_clocks_mhz]
    for points in (by_limit, by_clock):
        power = [p.power_w for p in points]
        times = [p.time_per_sample_s for p in points]
        clocks = [p.sm_clock_mhz for p in points]
        assert all(b >= a - 1e-9 for a, b in zip(power, power[1:], strict=False))
        assert all(b <= a + 1e-15 for a, b in zip(times, times[1:], strict=False))
        assert all(b >= a for a, b in zip(clocks, clocks[1:], strict=False))
        assert all(math.isfinite(p.power_w) and p.power_w > 0 and p.time_per_sample_s > 0 for p in points)


def test_energy_has_an_interior_minimum_on_h100() -> None:
    model = load_model("H100-SXM", "bert_base_uncased/squad", calibrated=False)
    assert model.memory_fraction < 0.2  # compute-bound
    spec = model.spec
    best = model_optimum(model)
    assert spec.min_power_w + 10 < best < spec.max_power_w - 10
    energies = [model.at(None, c).energy_per_sample_j for c in spec.sm_clocks_mhz]
    i = int(np.argmin(energies))
    assert 0 < i < len(energies) - 1
    assert energies[i] < 0.95 * min(energies[0], energies[-1])


@pytest.mark.parametrize("gpu", UNTRACED)
def test_untraced_gpus_load_with_datasheet_assumptions(gpu: str) -> None:
    for workload in known_workloads():
        model = load_model(gpu, workload)
        assert not model.calibrated and model.spec.name == gpu
        assert any("datasheet" in a for a in model.assumptions)
        for point in (model.at(), model.at(model.spec.min_power_w), model.at(None, model.spec.min_sm_mhz)):
            assert math.isfinite(point.time_per_sample_s) and point.time_per_sample_s > 0
            assert math.isfinite(point.power_w) and point.power_w > 0 and point.idle_power_w > 0
    with pytest.raises(ConfigError, match="no measured trace"):
        load_model(gpu, "resnet50", calibrated=True)


def test_untraced_gpu_is_faster_than_the_a40_it_is_scaled_from() -> None:
    a40 = load_model("A40", "resnet50", 256, calibrated=False).at()
    h100 = load_model("h100", "resnet50", 256).at()
    assert h100.time_per_sample_s < a40.time_per_sample_s / 2


# -- bad input ----------------------------------------------------------------------------------------------


def test_bad_input_raises_one_line_config_errors() -> None:
    model = load_model("A40", "resnet50")
    for call, pattern in [
        (lambda: model.at(50.0), "100-300 W"),
        (lambda: model.at(301.0), "100-300 W"),
        (lambda: model.at(None, 5000), "210-1740 MHz"),
        (lambda: model.at(200.0, 100), "210-1740 MHz"),
        (lambda: load_model("Z80", "resnet50"), "H100-SXM"),
        (lambda: load_model("A40", "gpt9"), "resnet50/imagenet"),
        (lambda: load_model("h100", "gpt9"), "resnet50/imagenet"),
        (lambda: load_model("A40", "resnet50", 0), "positive integer"),
        (lambda: find_power_spec("z9000"), "A40, V100, H100-SXM, A100-SXM, MI250X, P100-PCIe, .*, MI300X$"),
        (lambda: load_model("unlisted-125-250W", "resnet50"), "outside the catalogue known only by its measured"),
    ]:
        with pytest.raises(ConfigError, match=pattern) as err:
            call()
        assert "\n" not in str(err.value)


def test_power_spec_aliases_and_clocks() -> None:
    assert find_power_spec("h100").name == "H100-SXM" and find_power_spec("A100").name == "A100-SXM"
    for spec in POWER_SPECS:
        clocks = spec.sm_clocks_mhz
        assert list(clocks) == sorted(set(clocks))
        assert clocks[0] == spec.min_sm_mhz and clocks[-1] == spec.max_sm_mhz
        assert 0 < spec.idle_power_w <= spec.static_power_w < spec.min_power_w < spec.max_power_w
        assert spec.peak_flops > 1e13 and spec.memory_bandwidth_bps > 1e11 and spec.source
    assert len(find_power_spec("A40").sm_clocks_mhz) == 103  # 210..1740 MHz every 15 MHz
