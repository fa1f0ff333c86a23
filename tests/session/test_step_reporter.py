"""A plain loop's steps, reported by their ends, reach the same record, energy windows and tuner as a Session."""

from __future__ import annotations

import math
import runpy
from pathlib import Path
from typing import Any

import pytest
from conftest import run_ranks

import dtpo
from dtpo.core.callbacks import Callback
from dtpo.core.config import EnergyConfig, TuneConfig
from dtpo.core.errors import ConfigError
from dtpo.core.record import RunRecord
from dtpo.core.steps import RunView, TunableRun
from dtpo.devices.base import KnobState
from dtpo.devices.discovery import Discovery
from dtpo.devices.simulated import SimulatedGpu, SimulatedGpuConfig
from dtpo.session.callbacks import builtin as builtin_callbacks
from dtpo.session.step_reporter import StepReporter
from dtpo.simulation.tuning import default_setting, oracle, true_cost
from dtpo.tune.cost import parse_cost

REPO = Path(__file__).resolve().parents[2]
GOAL = 1.02  # the choice's true cost within 2 % of the best setting of a noise-free sweep


class Steps(Callback):
    """Writes down the hooks a plain loop's reporter calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def on_train_start(self, session: Any) -> None:
        self.calls.append(("train_start", None))

    def on_step_begin(self, session: Any, step: int) -> None:
        self.calls.append(("step_begin", step))

    def on_step_end(self, session: Any, step_record: Any) -> None:
        self.calls.append(("step_end", (step_record.step, step_record.samples, step_record.tokens)))

    def on_window_end(self, session: Any, window: Any) -> None:
        self.calls.append(("window_end", (window.first_step, window.last_step, window.samples)))

    def on_train_end(self, session: Any, record: Any) -> None:
        self.calls.append(("train_end", record is not None))


def _modelled_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Energy from the modelled CPU whatever this machine has (RAPL may or may not be readable)."""
    real = builtin_callbacks.discover
    monkeypatch.setattr(builtin_callbacks, "discover", lambda **kw: real(**{**kw, "cpu_tdp_w": 20.0}))


def test_a_plain_loop_gets_steps_windows_energy_and_a_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _modelled_cpu(monkeypatch)
    seen = Steps()
    sizes = [8 + i for i in range(12)]
    with dtpo.StepReporter(total_steps=len(sizes), warmup_steps=2, window_steps=4, run_dir=tmp_path, progress=False,
                           summary=False, energy=EnergyConfig(sample_interval_s=None), callbacks=[seen]) as steps:
        for i, n in enumerate(sizes):
            steps.step(samples=n, tokens=16 * n if i % 2 else None)
    record = RunRecord.load(tmp_path)
    assert record.status == "completed"
    (rank,) = record.ranks
    assert [s.samples for s in rank.steps] == sizes
    assert [s.warmup for s in rank.steps] == [True, True] + [False] * 10
    assert [s.tokens for s in rank.steps] == [16 * n if i % 2 else None for i, n in enumerate(sizes)]
    assert all(s.step_s >= 0 and s.compute_s == s.step_s and s.data_wait_s == 0 for s in rank.steps)
    # windows of 4 measured steps from step 2, the last one shorter, adding up to the run window
    windows = rank.energy["windows"]
    assert [(w["first_step"], w["last_step"]) for w in windows] == [(2, 5), (6, 9), (10, 11)]
    assert sum(w["total_j"] for w in windows) == pytest.approx(rank.energy["run"]["total_j"])
    assert record.totals["samples"]["value"] == sum(sizes[2:])
    assert record.energy["energy_j"]["value"] == pytest.approx(rank.energy["run"]["total_j"])
    # the hooks in the Session's order: a step begins before it ends, windows close after their last step
    hooks = [name for name, _ in seen.calls]
    assert hooks[0] == "train_start" and hooks[-1] == "train_end" and seen.calls[-1] == ("train_end", True)
    ends = [args for name, args in seen.calls if name == "step_end"]
    assert [step for step, _, _ in ends] == list(range(12))
    assert [args for name, args in seen.calls if name == "window_end"] == [
        (2, 5, sum(sizes[2:6])), (6, 9, sum(sizes[6:10])), (10, 11, sum(sizes[10:]))]
    first_window = seen.calls.index(("window_end", (2, 5, sum(sizes[2:6]))))
    assert seen.calls[first_window - 1] == ("step_end", (5, sizes[5], 16 * sizes[5]))
    assert (tmp_path / "ranks").is_dir() and not list((tmp_path / "ranks").glob("*.tmp"))


def test_tune_power_limit_reaches_its_choice_on_a_simulated_gpu(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """``--tune power-limit`` through a plain loop: the simulated GPU is the rank's energy device and knob; the
    loop's clock is the GPU's simulated one, and each step advances it at whatever limit the tuner set."""
    monkeypatch.setenv("DTPO_STATE_DIR", str(tmp_path / "state"))
    gpu = SimulatedGpu(SimulatedGpuConfig("A40", "resnet50", seed=1), tmp_path / "gpu.json")
    monkeypatch.setattr(builtin_callbacks, "discover", lambda **kw: Discovery([gpu], ["gpu: simulated"]))
    batch = gpu.model.batch_size
    total = 1500
    cost = parse_cost("energy")
    with dtpo.StepReporter(total_steps=total, window_steps=20, run_dir=tmp_path / "run", progress=False,
                           summary=False, energy=EnergyConfig(sample_interval_s=None),
                           tune=TuneConfig(knob="power-limit", cost="energy"), clock=lambda: gpu.now_s) as steps:
        tuner = next(cb for cb in steps.callbacks if isinstance(cb, builtin_callbacks.TuneCallback)).tuner
        assert tuner is not None  # built at the start, from the GPU's knob range
        for _ in range(total):
            times, powers = gpu.sample_steps(1)
            gpu.advance(times, powers)
            steps.step(samples=batch)
        assert tuner.holding and tuner.choice is not None
        held = tuner.choice
        assert gpu.knob_state().power_limit_w == held.power_limit_w  # the choice is in force while holding
    assert gpu.knob_state() == KnobState(default_setting(gpu).power_limit_w, None)  # put back at the end
    best, best_cost = oracle(gpu, cost)
    assert held.power_limit_w < default_setting(gpu).power_limit_w
    assert true_cost(gpu, held, cost) <= GOAL * best_cost, (held, best)
    record = RunRecord.load(tmp_path / "run")
    (rank,) = record.ranks
    assert rank.tuning.applied is True and rank.tuning.source == "measured"
    assert rank.tuning.report["choice"] == {"power_limit_w": held.power_limit_w, "sm_clock_mhz": None}
    assert len(rank.steps) == total and all(s.samples == batch for s in rank.steps)
    windows = rank.energy["windows"]
    assert len(windows) == math.ceil((total - 2) / 20)
    assert sum(w["total_j"] for w in windows) == pytest.approx(rank.energy["run"]["total_j"])
    assert record.energy["energy_j"]["value"] == pytest.approx(rank.energy["run"]["total_j"])
    assert record.totals["samples"]["value"] == (total - 2) * batch


@pytest.mark.parametrize("knob", ["stragglers", "precision"])
def test_tuning_that_needs_the_session_is_refused_in_one_line(knob: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="needs dtpo.Session"):
        StepReporter(run_dir=tmp_path, tune=TuneConfig(knob=knob, cost="time"), energy=False, progress=False)


def test_negative_samples_are_refused(tmp_path: Path) -> None:
    with StepReporter(run_dir=tmp_path, energy=False, progress=False, summary=False) as steps:
        with pytest.raises(ConfigError, match="samples"):
            steps.step(samples=-1)
        steps.step(samples=4)
    assert [s.samples for s in RunRecord.load(tmp_path).ranks[0].steps] == [4]


def test_the_plain_loop_example_writes_a_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _modelled_cpu(monkeypatch)
    example = runpy.run_path(str(REPO / "examples" / "plain_loop.py"))
    example["main"](["--steps", "14", "--run-dir", str(tmp_path)])
    record = RunRecord.load(tmp_path)
    (rank,) = record.ranks
    assert record.status == "completed" and [s.samples for s in rank.steps] == [64] * 14
    assert [(w["first_step"], w["last_step"]) for w in rank.energy["windows"]] == [(2, 11), (12, 13)]
    assert record.totals["samples"]["value"] == 12 * 64


def public(protocol: type) -> list[str]:
    """A protocol's members: methods, properties and annotated attributes."""
    names = set(protocol.__dict__) | set(protocol.__dict__.get("__annotations__", {}))
    return sorted(name for name in names if not name.startswith("_"))


def test_both_producers_offer_everything_a_callback_may_read(tmp_path: Path) -> None:
    members = public(RunView)
    assert {"rank", "world_size", "ctx", "device", "run_dir", "record", "rank_record", "start_step"} <= set(members)
    with StepReporter(run_dir=tmp_path / "plain", energy=False, progress=False, summary=False) as reporter:
        assert [name for name in members if not hasattr(reporter, name)] == []
    session = dtpo.Session(run_dir=tmp_path / "session", energy=False, progress=False, summary=False)
    try:
        assert [name for name in members if not hasattr(session, name)] == []
        assert [name for name in public(TunableRun) if not hasattr(session, name)] == []
    finally:
        session.finish()


def _example_rank(rank: int, world_size: int, out: str) -> None:
    runpy.run_path(str(REPO / "examples" / "plain_loop.py"))["main"](["--steps", "8", "--run-dir", out])


@pytest.mark.slow
def test_the_example_under_two_ranks_joins_the_scripts_own_process_group(tmp_path: Path) -> None:
    run_ranks(_example_rank, 2, str(tmp_path))
    record = RunRecord.load(tmp_path)
    assert record.status == "completed" and [r.rank for r in record.ranks] == [0, 1]
    for rank in record.ranks:
        assert [s.samples for s in rank.steps] == [64] * 8
        assert all(s.tail_s is None and s.compute_s == s.step_s for s in rank.steps)  # no finer marks
    assert record.config["world_size"] == 2 and record.totals["samples"]["value"] == 2 * 6 * 64


def test_it_says_ahead_which_steps_end_the_warm_up_a_window_or_the_run(tmp_path: Path) -> None:
    """Where a caller whose device runs ahead waits (dtpo.frameworks): the warm-up's last step, each window's last,
    the last of a known total; asked one or two steps ahead, and right after a window closed early."""
    reporter = StepReporter(13, warmup_steps=2, window_steps=4, run_dir=tmp_path / "run", progress=False,
                            summary=False, energy=False)
    assert [reporter.settles_at(ahead) for ahead in range(1, 14)] == [
        False, True, False, False, False, True, False, False, False, True, False, False, True]
    seen = []
    for _ in range(13):
        seen.append((reporter.settles_next, reporter.settles_at(2), reporter.last_step_next))
        reporter.step(1)
    assert [i for i, (now, _, _) in enumerate(seen) if now] == [1, 5, 9, 12]
    assert [i for i, (_, soon, _) in enumerate(seen) if soon] == [0, 4, 8, 11]
    assert [i for i, (_, _, last) in enumerate(seen) if last] == [12]
    reporter.finish()
    early = StepReporter(warmup_steps=0, window_steps=4, run_dir=tmp_path / "early", progress=False, summary=False,
                         energy=False)
    early.step(1)
    early.close_window()  # an evaluation: the next window counts from here
    assert [early.settles_at(ahead) for ahead in range(1, 6)] == [False, False, False, True, False]
    early.finish()
