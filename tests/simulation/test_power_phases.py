"""Simulated jobs with step power phases: compute near the limit, wait at idle, communicate in between; the sampled
timeline keeps the energy; the run directory it writes is read by the power-swing report like a train run's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dtpo.core.errors import ConfigError
from dtpo.devices.journal import KnobJournal
from dtpo.simulation.job import JobConfig
from dtpo.simulation.power_phases import StepPhases, simulate_phases
from dtpo.telemetry.power_swing_run import swing_of_run
from dtpo.telemetry.report.data import load_run


@pytest.fixture(autouse=True)
def _state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DTPO_STATE_DIR", str(tmp_path / "state"))


def job(**kwargs: object) -> JobConfig:
    base = {"gpu": "H100-SXM", "workload": "resnet50", "gpus": 4, "steps": 30, "batch_size": 2048, "noise": 0.01,
            "counter_period_s": 0.0}
    return JobConfig(**{**base, **kwargs})  # type: ignore[arg-type]


def test_every_step_computes_waits_for_the_slowest_then_communicates() -> None:
    run = simulate_phases(job(), StepPhases(comm_share=0.25, comm_power_share=0.3))
    step = np.diff(run.step_start_s)
    assert step == pytest.approx(run.compute_s.max(axis=0) + run.comm_s)
    assert np.all(run.wait_s >= 0) and np.all(run.wait_s.min(axis=0) == 0)  # the slowest rank never waits
    assert run.idle_w < run.comm_w < run.compute_w.min()
    assert run.comm_w == pytest.approx(run.idle_w + 0.3 * (run.compute_w.mean() - run.idle_w), rel=0.02)
    assert run.comm_s.mean() == pytest.approx(0.25 * run.compute_s.mean(), rel=0.05)
    assert run.limit_w == 700.0
    times, energy = run.segments(0)
    expected = float((run.compute_s[0] * run.compute_w[0]).sum() + run.wait_s[0].sum() * run.idle_w
                     + run.comm_s.sum() * run.comm_w)
    assert energy[-1] == pytest.approx(expected) and times[-1] == pytest.approx(run.duration_s)


def test_the_gpus_draw_their_own_noise_and_stragglers_slow_their_rank() -> None:
    run = simulate_phases(job(stragglers=((2, 1.3),)))
    assert run.compute_s[2].mean() == pytest.approx(1.3 * run.compute_s[0].mean(), rel=0.02)
    assert run.wait_s[0].mean() > 0.2 * run.compute_s[0].mean()  # everyone else waits for rank 2
    assert simulate_phases(job()).compute_s == pytest.approx(simulate_phases(job()).compute_s)  # seeded


@pytest.mark.parametrize("counter_period_s", [0.0, 0.1])
def test_the_sampler_keeps_the_energy_and_sees_the_phases(counter_period_s: float) -> None:
    run = simulate_phases(job(), StepPhases(sample_hz=50.0, counter_period_s=counter_period_s))
    t, watts = run.sampled()
    interval = 1 / 50.0
    assert np.diff(t) == pytest.approx(np.full(t.size - 1, interval))
    last_read = t[-1] if counter_period_s == 0 else np.floor(t[-1] / counter_period_s + 1e-9) * counter_period_s
    # the readings add up to the energy the counter showed at the last reading (it starts at 0)
    assert float(watts.sum() * interval) == pytest.approx(float(run.energy_at(np.array([last_read]), summed=True)[0]),
                                                          rel=1e-9)
    if counter_period_s == 0:
        assert np.percentile(watts[0], 95) == pytest.approx(run.compute_w[0].mean(), rel=0.03)
        assert np.percentile(watts[0], 5) == pytest.approx(run.comm_w, rel=0.05)
    else:  # a counter that updates every 0.1 s: most 20 ms readings see no change, one sees 0.1 s of energy
        assert (watts[0] == 0).mean() > 0.7


def test_exact_mean_power_over_intervals() -> None:
    run = simulate_phases(job())
    edges = np.linspace(0, run.duration_s, 7)
    power = run.mean_power(edges, summed=True)
    assert float((power * np.diff(edges)).sum()) == pytest.approx(float(run.energy_at(edges[-1:], summed=True)[0]))


def test_a_written_run_is_read_by_the_power_swing_report(tmp_path: Path) -> None:
    run = simulate_phases(job(gpus=4, steps=40))
    folder = run.write_run(tmp_path / "sim")
    swing = swing_of_run(load_run(folder))
    assert swing.simulated and swing.unit == "GPU" and len(swing.devices) == 4
    assert swing.step_rate_hz == pytest.approx(1 / float(np.median(np.diff(run.step_start_s))))
    assert swing.job.dominant_hz == pytest.approx(swing.step_rate_hz, rel=0.1)
    assert swing.correlation is not None and swing.correlation > 0.9  # synchronous ranks swing in phase
    per_gpu = swing.devices[0]
    assert per_gpu.swing_w == pytest.approx(run.compute_w[0].mean() - run.comm_w, rel=0.05)
    assert swing.limit_w == pytest.approx(4 * 700.0)
    assert any(w.what_if.name == "fill communication gaps" for w in swing.what_ifs)
    with pytest.raises(ConfigError, match="already holds"):
        run.write_run(folder)


def test_a_power_limit_is_set_through_the_journal_and_put_back(tmp_path: Path) -> None:
    state = tmp_path / "knobs"
    run = simulate_phases(job(), power_limit_w=400.0, state_folder=state)
    assert run.limit_w == 400.0
    assert run.compute_w.mean() <= 400.0 * 1.05
    assert KnobJournal().entries() == {}  # restored on exit
    assert not any(state.glob("*.json"))


@pytest.mark.parametrize(("phases", "message"), [
    (StepPhases(comm_share=-0.1), "communication share"),
    (StepPhases(comm_power_share=1.5), "communication power share"),
    (StepPhases(sample_hz=0.0), "sample rate"),
    (StepPhases(counter_period_s=float("nan")), "counter period"),
    (StepPhases(floor_share=1.2), "power floor must be a share of the power limit between 0 and 1, got 1.2"),
])
def test_bad_phases_are_one_line(phases: StepPhases, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        simulate_phases(job(), phases)


def test_a_power_floor_lifts_waiting_and_communicating_but_not_computing() -> None:
    plain = simulate_phases(job(), StepPhases(comm_power_share=0.3))
    floored = simulate_phases(job(), StepPhases(comm_power_share=0.3, floor_share=0.5))
    assert plain.idle_w < plain.comm_w < 350.0  # below the floor without it
    assert floored.idle_w == floored.comm_w == 350.0  # 50 % of the H100's 700 W limit
    assert floored.compute_w == pytest.approx(plain.compute_w)  # computing draws more than the floor anyway
    assert floored.step_start_s == pytest.approx(plain.step_start_s)  # a floor costs energy, not time
    extra = float((plain.wait_s[0].sum() * (350.0 - plain.idle_w)) + plain.comm_s.sum() * (350.0 - plain.comm_w))
    assert floored.segments(0)[1][-1] - plain.segments(0)[1][-1] == pytest.approx(extra)
    assert "a power floor of 50 % of the limit" in floored.detail
