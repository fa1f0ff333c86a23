"""Energy and cost of a predicted step: hand-computed energy, cost arithmetic, named assumptions, power limits."""

from __future__ import annotations

import logging

import pytest

from dtpo.core.errors import ConfigError
from dtpo.plan.power_at_scale import (
    BUSY_FRACTION_OF_MAX,
    StepEnergy,
    gpu_power,
    price,
    scenario_step_energy,
    step_energy,
)
from dtpo.plan.scenario import PowerSection, Prices
from dtpo.plan.scenario_reader import scenario_from_dict

# 2 nodes x 8 GPUs; each GPU computes 0.1 s at 400 W and waits 0.02 s (exposed communication) at 100 W
# (0.25 x 400 W); each node draws 1500 W besides its GPUs for the whole 0.12 s step; PUE 1.2; 512 samples.
#   GPUs:     16 x (400 W x 0.1 s + 100 W x 0.02 s) = 16 x (40 + 2) J  = 672 J
#   nodes:     2 x 1500 W x 0.12 s                                      = 360 J
#   IT:      672 + 360                                                  = 1032 J
#   facility: (1.2 - 1) x 1032                                          = 206.4 J
#   per step: 1032 x 1.2                                                = 1238.4 J
#   per sample: 1238.4 / 512                                            = 2.41875 J
SMALL = PowerSection(busy_power_w=400.0, waiting_power_fraction=0.25, node_overhead_w=1500.0, pue=1.2)


def small_step() -> StepEnergy:
    return step_energy(compute_s=0.1, exposed_comm_s=0.02, gpus=16, gpus_per_node=8, samples_per_step=512,
                       gpu="A100", power=SMALL)


def test_hand_computed_step_energy() -> None:
    energy = small_step()
    assert energy.gpu_j == pytest.approx(672.0)
    assert energy.node_j == pytest.approx(360.0)
    assert energy.facility_j == pytest.approx(206.4)
    assert energy.joules_per_step == pytest.approx(1238.4)
    assert energy.joules_per_sample == pytest.approx(2.41875)
    assert energy.joules_per_step == pytest.approx(energy.gpu_j + energy.node_j + energy.facility_j)
    assert (energy.gpus, energy.step_s, energy.samples_per_step) == (16, pytest.approx(0.12), 512)


def test_cost_arithmetic() -> None:
    # 30000 steps of 512 samples at 512 / 0.12 samples/s: 30000 x 0.12 s = 3600 s = 1 h.
    #   kWh:  30000 x 1238.4 J / 3.6e6 J/kWh = 10.32 kWh
    #   CO2:  10.32 kWh x 475 g/kWh          = 4.902 kg
    #   energy: 10.32 kWh x 0.15             = 1.548
    #   GPU-hours: 1 h x 16 GPUs x 2.0       = 32.0;   total 33.548
    cost = price(30000 * 512, 512 / 0.12, small_step(), Prices(per_gpu_hour=2.0, per_kwh=0.15))
    assert cost.hours == pytest.approx(1.0)
    assert cost.kwh == pytest.approx(10.32)
    assert cost.co2_kg == pytest.approx(4.902)
    assert cost.energy_cost == pytest.approx(1.548)
    assert cost.gpu_hour_cost == pytest.approx(32.0)
    assert cost.total == pytest.approx(33.548)


def test_unpriced_figures_are_none() -> None:
    energy = small_step()
    bare = price(30000 * 512, 512 / 0.12, energy)
    assert bare.energy_cost is None and bare.gpu_hour_cost is None and bare.total is None
    assert bare.co2_kg == pytest.approx(4.902)  # the default grid intensity, 475 g/kWh
    rental = price(30000 * 512, 512 / 0.12, energy, Prices(per_gpu_hour=2.0, grid_g_co2_per_kwh=0.0))
    assert rental.energy_cost is None and rental.total == pytest.approx(32.0) and rental.co2_kg == 0.0


def test_price_rejects_nonsense_and_warns_on_a_throughput_mismatch(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(ValueError, match="must be positive"):
        price(100, 0.0, small_step())
    with caplog.at_level(logging.WARNING, logger="dtpo.plan.power_at_scale"):
        price(100, 1000.0, small_step())
    assert "pricing at 1000 samples/s" in caplog.text


def test_given_powers_are_named_as_given() -> None:
    notes = " | ".join(small_step().assumptions)
    assert "busy power 400 W per GPU: given (power.busy_power_w" in notes
    assert "waiting power 100 W = 0.25 x busy power (power.waiting_power_fraction)" in notes
    assert "node overhead 1500 W per node" in notes and "2 nodes" in notes
    assert "PUE 1.2 multiplies all energy" in notes


def test_assumed_powers_are_named_with_their_figures() -> None:
    watts = gpu_power("A100", PowerSection())
    assert watts.busy_w == pytest.approx(BUSY_FRACTION_OF_MAX * 400.0)  # 360 W
    assert watts.waiting_w == pytest.approx(50.0 + 0.1 * 400.0)  # idle 50 W + 10 % of 400 W = 90 W
    busy, waiting = watts.assumptions
    assert "assumed 90% of the 400 W maximum of the A100-SXM power model" in busy
    assert "idle power (50 W, from the A100-SXM power model) + 10% of the 400 W maximum" in waiting
    assert "NCCL" in waiting
    notes = " | ".join(step_energy(1.0, 0.0, 8, 8, 8, "A100", PowerSection()).assumptions)
    assert "dtpo's default" in notes and "PUE 1.0: no cooling" in notes


def test_gpu_without_a_power_model_uses_its_datasheet() -> None:
    watts = gpu_power("A10", PowerSection())  # in the catalogue, without a power spec
    assert watts.busy_w == pytest.approx(0.9 * 150.0)
    assert watts.waiting_w == pytest.approx(0.1 * 150.0 + 0.1 * 150.0)  # idle assumed 10 % of 150 W, + 10 %
    notes = " | ".join(watts.assumptions)
    assert "no power model" in notes and "NVIDIA A10 datasheet" in notes and "assumed 10% of the maximum" in notes


def test_a_power_limit_below_busy_power_lowers_gpu_energy() -> None:
    at_max = step_energy(0.1, 0.02, 16, 8, 512, "A100", PowerSection())
    limited = step_energy(0.1, 0.02, 16, 8, 512, "A100", PowerSection(setting=250.0))
    assert gpu_power("A100", PowerSection(setting=250.0)).busy_w == 250.0
    assert limited.gpu_j < at_max.gpu_j
    assert limited.node_j == at_max.node_j  # same times: the caller gives the time at the limit
    assert any("power limit 250 W caps busy power (from 360 W)" in note for note in limited.assumptions)
    above = gpu_power("A100", PowerSection(setting=400.0))
    assert above.busy_w == pytest.approx(360.0)
    assert any("no effect" in note for note in above.assumptions)


def test_a_measured_busy_power_is_capped_by_the_limit_and_caps_waiting() -> None:
    assert gpu_power("A100", PowerSection(setting=300.0, busy_power_w=380.0)).busy_w == 300.0
    low = gpu_power("A100", PowerSection(busy_power_w=80.0))
    assert low.waiting_w == 80.0  # idle + margin (90 W) would exceed the measured busy power


def test_cpu_workers() -> None:
    with pytest.raises(ConfigError, match="busy_power_w is required"):
        gpu_power("cpu", PowerSection())
    watts = gpu_power("cpu", PowerSection(busy_power_w=65.0))
    assert watts.busy_w == watts.waiting_w == 65.0
    assert any("gloo" in note for note in watts.assumptions)
    assert gpu_power("cpu", PowerSection(busy_power_w=65.0, waiting_power_fraction=0.5)).waiting_w == 32.5


def test_unknown_gpu() -> None:
    with pytest.raises(ConfigError, match="not a GPU model"):
        gpu_power("Z9000", PowerSection())


def test_a_partly_used_node_counts_whole() -> None:
    energy = step_energy(1.0, 0.0, 4, 8, 4, "A100", PowerSection(busy_power_w=100.0))
    assert energy.node_j == pytest.approx(1500.0) and energy.gpu_j == pytest.approx(400.0)
    assert any("partly used" in note for note in energy.assumptions)


@pytest.mark.parametrize(("compute_s", "exposed_s", "gpus"), [(-0.1, 0.0, 8), (0.0, 0.0, 8), (0.1, -1.0, 8),
                                                              (0.1, 0.0, 0)])
def test_step_energy_rejects_nonsense(compute_s: float, exposed_s: float, gpus: int) -> None:
    with pytest.raises(ValueError):
        step_energy(compute_s, exposed_s, gpus, 8, 8, "A100", PowerSection())


def test_scenario_step_energy_uses_the_scenario() -> None:
    scenario = scenario_from_dict({
        "gpu": "A100", "gpu_counts": [8, 16], "per_gpu_batch": 32, "grad_accum": {"8": 2, "16": 1},
        "model": {"parameters": 10}, "baseline": {"gpus": 8, "throughput": 100.0},
        "power": {"busy_power_w": 400.0, "waiting_power_fraction": 0.25, "pue": 1.2}})
    energy = scenario_step_energy(scenario, 16, compute_s=0.1, exposed_comm_s=0.02)
    assert energy.samples_per_step == 512
    assert energy.joules_per_step == pytest.approx(1238.4)  # the hand-computed case above
