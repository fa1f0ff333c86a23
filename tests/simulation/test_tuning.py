"""The tuner on simulated GPUs calibrated on every shipped trace (Zeus's A40 and V100 sweeps), judged against
the noise-free oracle: how close its choice comes, how many steps it spends profiling next to Zeus's sweep,
whether a slowdown limit holds, and whether the GPUs are put back afterwards.

Noise is 1 % on step time and on power, seeded by the trace's position. The sweeps over every trace use an
energy counter that reads continuously (``counter_period_s=0``) so they judge the search itself; the default
counter, which updates every 0.1 s like NVML's, is used on the traces whose steps last at least 0.5 s, and a
strict xfail records how the tuner does on steps shorter than the counter period.
"""

from __future__ import annotations

import math
from functools import cache
from pathlib import Path

import pytest

from dtpo.devices.journal import KnobJournal
from dtpo.devices.physics.gpu_model import CalibratedModel
from dtpo.devices.physics.traces import Trace, load_traces
from dtpo.devices.simulated import SimulatedGpu, SimulatedGpuConfig, SimulatedGpuGroup
from dtpo.simulation.tuning import (
    SimulatedTuning,
    candidate_settings,
    default_setting,
    oracle,
    true_cost,
    true_figures,
    tune_on_simulated,
)
from dtpo.tune.cost import CostMetric, Energy, MaxSlowdown, ZeusCost
from dtpo.tune.tuner import TunerOptions

NOISE = 0.01
GOAL = 1.02  # the choice's true cost within 2 % of the oracle's
ZEUS_STEPS_PER_LIMIT = 50  # Zeus's GlobalPowerLimitOptimizer: 10 warm-up + 40 profiled steps per limit
TRACES = load_traces()


@pytest.fixture(autouse=True)
def _state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DTPO_STATE_DIR", str(tmp_path / "state"))


@cache
def model(index: int) -> CalibratedModel:
    return CalibratedModel(TRACES[index])


def step_s(index: int) -> float:
    """Seconds per step at the default setting."""
    m = model(index)
    return m.at().time_per_sample_s * m.batch_size


def index_of(label: str) -> int:
    return next(i for i, t in enumerate(TRACES) if t.label == label)


def simulated_gpu(index: int, tmp_path: Path, counter_period_s: float = 0.0, seed: int | None = None
                  ) -> SimulatedGpu:
    trace: Trace = TRACES[index]
    config = SimulatedGpuConfig(trace.gpu, trace.workload, trace.batch_size, seed=index if seed is None else seed,
                                time_noise=NOISE, power_noise=NOISE, counter_period_s=counter_period_s)
    return SimulatedGpu(config, tmp_path / "gpu.json", model=model(index))


def tune(gpu: SimulatedGpu, metric: CostMetric, tmp_path: Path, knob: str = "power-limit") -> SimulatedTuning:
    """Tune until the choice is held; the GPU must be back at its defaults with nothing left in the journal."""
    run = tune_on_simulated(gpu, metric, knob=knob, journal_dir=tmp_path)
    assert not gpu.state_path.exists(), "the knob state file outlived the tuning run"
    assert KnobJournal(tmp_path / "knobs-journal.json").entries() == {}
    assert gpu.knob_state().power_limit_w == gpu.model.spec.max_power_w
    assert gpu.knob_state().locked_sm_clocks_mhz is None
    assert run.tuner.holding
    return run


def zeus_sweep_steps(gpu: SimulatedGpu) -> int:
    """Steps of Zeus's power-limit sweep on the 25 W grid: one warm-up step, then 50 per limit."""
    return 1 + ZEUS_STEPS_PER_LIMIT * len(candidate_settings(gpu, "power-limit"))


def judge(indices: list[int], metric: CostMetric, tmp_path: Path, counter_period_s: float) -> list[str]:
    """Tune on each trace; one line per trace that misses the 2 % goal or profiles longer than Zeus / 3."""
    misses = []
    for i in indices:
        gpu = simulated_gpu(i, tmp_path, counter_period_s)
        run = tune(gpu, metric, tmp_path)
        best, best_cost = oracle(gpu, metric)
        ratio = true_cost(gpu, run.choice, metric) / best_cost
        sweep = zeus_sweep_steps(gpu)
        if ratio > GOAL or run.profiling_steps > sweep / 3:
            misses.append(f"{TRACES[i].label} (seed {i}): {run.choice.label} costs {ratio:.4f} x the oracle "
                          f"{best.label}; {run.profiling_steps} profiling steps, Zeus {sweep}")
    return misses


@pytest.mark.parametrize("metric", [Energy(), ZeusCost(0.5)], ids=str)
def test_the_choice_is_within_2_percent_of_the_oracle_on_every_trace(metric: CostMetric, tmp_path: Path) -> None:
    assert len(TRACES) == 111
    misses = judge(list(range(len(TRACES))), metric, tmp_path, counter_period_s=0.0)
    assert not misses, "\n".join(misses)


LONG_STEPS_S = 0.5  # five periods of the default energy counter


@pytest.mark.parametrize("metric", [Energy(), ZeusCost(0.5)], ids=str)
def test_with_nvml_like_energy_counter_on_steps_of_half_a_second_or_more(metric: CostMetric,
                                                                          tmp_path: Path) -> None:
    """The default counter updates every 0.1 s. Over 10 seeds, the 30 traces with steps >= 0.5 s never missed
    by more than 0.8 %; between 0.2 and 0.5 s an occasional seed misses by a hair (up to 2.1 %)."""
    indices = [i for i in range(len(TRACES)) if step_s(i) >= LONG_STEPS_S]
    assert len(indices) >= 25
    assert SimulatedGpuConfig("A40", "x").counter_period_s == 0.1
    misses = judge(indices, metric, tmp_path, counter_period_s=0.1)
    assert not misses, "\n".join(misses)


@pytest.mark.xfail(strict=True, reason="known limit: blocks of 0.2 s read through a counter that updates every 0.1 s "
                                       "are off by up to half; one short visit can then misjudge an isolated optimum "
                                       "(here 100 W, 15 % below its neighbours)")
def test_with_nvml_like_energy_counter_on_steps_shorter_than_its_period(tmp_path: Path) -> None:
    """A40 shufflenetv2/CIFAR-100 batch 64 steps in 42 ms: with blocks of at least two counter periods most seeds
    land within 2 % (one-step blocks missed by 18-24 % on every seed); this seed misses (with a continuous counter
    it is within 2 %)."""
    i = index_of("A40 shufflenetv2/cifar100 b64 adadelta")
    assert step_s(i) < 0.1
    misses = judge([i], Energy(), tmp_path, counter_period_s=0.1)
    assert not misses, "\n".join(misses)


def test_a_slowdown_limit_holds_on_every_trace(tmp_path: Path) -> None:
    """The choice's true time stays within 1.1 x the default's, give or take the noise of the estimates the tuner
    decides on: it judges its final choice by point estimates, each of >= ``first_visit_steps`` (4) steps at 1 %
    noise, so the ratio of two of them has a relative standard error of at most 0.01 * sqrt(1/4 + 1/4) = 0.7 %;
    three of those (2.1 %) is the tolerance. (Observed: never above 0.997 x the limit, tolerance unused.)"""
    metric = MaxSlowdown(1.1)
    steps = TunerOptions().first_visit_steps
    tolerance = 3 * NOISE * math.sqrt(2 / steps)
    over = []
    for i in range(len(TRACES)):
        gpu = simulated_gpu(i, tmp_path)
        run = tune(gpu, metric, tmp_path)
        time_at_choice, _ = true_figures(gpu, run.choice)
        time_at_default, _ = true_figures(gpu, default_setting(gpu))
        if time_at_choice > 1.1 * time_at_default * (1 + tolerance):
            over.append(f"{TRACES[i].label}: {run.choice.label} is {time_at_choice / time_at_default:.4f} x slower")
        assert run.profiling_steps <= zeus_sweep_steps(gpu) / 3
    assert not over, "\n".join(over)


KNOB_TRACES = ["A40 resnet50/imagenet b256 adadelta", "V100 bert_base_uncased/squad b32 adamw"]


@pytest.mark.parametrize("knob", ["sm-clock", "both"])
@pytest.mark.parametrize("metric", [Energy(), ZeusCost(0.5)], ids=str)
@pytest.mark.parametrize("label", KNOB_TRACES)
def test_clock_knobs_converge_near_their_oracle(label: str, metric: CostMetric, knob: str, tmp_path: Path) -> None:
    """``sm-clock`` finds its oracle's clock exactly here; ``both`` (clock at the maximum limit first, then the
    limit at that clock) lands within 2.3 % of the oracle over every clock and limit, which it cannot always
    reach by searching one knob after the other (A40 resnet50, energy: 250-275 W at 1125 MHz against 200 W with
    clocks floating)."""
    i = index_of(label)
    gpu = simulated_gpu(i, tmp_path, counter_period_s=0.1)
    run = tune(gpu, metric, tmp_path, knob=knob)
    best, best_cost = oracle(gpu, metric, knob)
    ratio = true_cost(gpu, run.choice, metric) / best_cost
    assert ratio <= (1.02 if knob == "sm-clock" else 1.03), (run.choice.label, best.label, ratio)
    assert run.profiling_steps <= len(candidate_settings(gpu, knob)) * ZEUS_STEPS_PER_LIMIT / 3


def test_tuning_a_group_restores_every_gpu(tmp_path: Path) -> None:
    i = index_of("A40 resnet50/imagenet b256 adadelta")
    trace = TRACES[i]
    group = SimulatedGpuGroup(SimulatedGpuConfig(trace.gpu, trace.workload, trace.batch_size, seed=1,
                                                 time_noise=NOISE, power_noise=NOISE), 4, tmp_path / "job.json",
                              model=model(i))
    run = tune_on_simulated(group, Energy(), journal_dir=tmp_path)
    assert run.choice != default_setting(group) and run.tuner.context.gpus == 4
    assert not (tmp_path / "job.json").exists() and not (tmp_path / "knobs-journal.json").exists()
    assert {m.operating_point().power_limit_w for m in group.members} == {group.model.spec.max_power_w}
    best, best_cost = oracle(group, Energy())
    assert true_cost(group, run.choice, Energy()) <= GOAL * best_cost
