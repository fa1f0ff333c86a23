"""``dtpo.jax.Tracker`` in this process: exact step and sample counts, waits for the device only where a window
closes, XLA's FLOPs for MFU, one-line refusals of bad arguments, and the power tuner on a simulated GPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dtpo.core.config import CONFIG_FILE, EnergyConfig, RunConfig
from dtpo.core.errors import ConfigError
from dtpo.core.frameworks import installed
from dtpo.core.launch_contract import CONFIG_ENV
from dtpo.core.record import RunRecord
from dtpo.devices.base import KnobState
from dtpo.devices.discovery import Discovery
from dtpo.devices.simulated import SimulatedGpu, SimulatedGpuConfig
from dtpo.session.callbacks import builtin as builtin_callbacks
from dtpo.simulation.tuning import default_setting, oracle, true_cost
from dtpo.tune.cost import parse_cost
from frameworks.support import needs

if installed("jax"):  # else every test here is skipped, saying so
    import jax
    import jax.numpy as jnp

    from dtpo.jax import Tracker, step_flops

pytestmark = [needs("jax"), pytest.mark.framework]

GOAL = 1.02  # the choice's true cost within 2 % of the best setting of a noise-free sweep
QUIET: dict[str, Any] = {"progress": False, "summary": False, "energy": False}


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """What the trackers made from now on wait for (``jax.block_until_ready`` wrapped), in order."""
    seen: list[Any] = []
    real = jax.block_until_ready

    def counted(value: Any) -> Any:
        seen.append(value)
        return real(value)

    monkeypatch.setattr(jax, "block_until_ready", counted)
    return seen


def _train_step() -> Any:
    @jax.jit
    def train_step(w: Any, x: Any) -> Any:
        loss, grad = jax.value_and_grad(lambda w: jnp.mean((x @ w) ** 2))(w)
        return w - 0.01 * grad, loss

    return train_step


def test_steps_and_samples_are_counted_exactly(tmp_path: Path) -> None:
    train_step, w = _train_step(), jnp.ones((4, 1))
    sizes = [3, 5, 8, 2, 7, 6]
    with Tracker(total_steps=3 * len(sizes), samples_per_step=9, run_dir=tmp_path, **QUIET) as tracker:
        for n in sizes:  # the batch's rows, the samples given, the tracker's default
            x = jnp.ones((n, 4))
            w, loss = train_step(w, x)
            tracker.step(loss, batch=(x, {"labels": jnp.zeros(n)}))
            tracker.step(loss, samples=n + 1, tokens=10 * n)
            tracker.step()
        assert tracker.step_count == 3 * len(sizes)
    (rank,) = RunRecord.load(tmp_path).ranks
    assert [s.samples for s in rank.steps] == [c for n in sizes for c in (n, n + 1, 9)]
    assert [s.tokens for s in rank.steps] == [t for n in sizes for t in (None, 10 * n, None)]
    assert rank.device == "cpu (jax)"


def test_the_device_is_waited_for_only_where_a_window_closes(tmp_path: Path, waits: list[Any]) -> None:
    total = 12
    tracker = Tracker(total_steps=total, samples_per_step=4, warmup_steps=2, window_steps=4, run_dir=tmp_path,
                      **QUIET)
    for step in range(total):
        tracker.step(jnp.asarray(step))
    # the warm-up's end and two windows, each waiting for the step before (the device goes on with the one queued),
    # then the last step itself
    assert [int(result) for result in waits] == [0, 4, 8, 11]
    tracker.finish()
    assert [int(result) for result in waits] == [0, 4, 8, 11, 11]  # and the last result once more at the end
    assert len(RunRecord.load(tmp_path).ranks[0].steps) == total


def test_finishing_without_a_step_writes_an_empty_completed_record(tmp_path: Path, waits: list[Any]) -> None:
    with Tracker(total_steps=5, run_dir=tmp_path, **QUIET) as tracker:
        pass
    assert tracker.finish() is None and waits == []  # nothing to wait for; a second finish does nothing
    record = RunRecord.load(tmp_path)
    assert record.status == "completed" and record.ranks[0].steps == []


def test_xla_flops_give_the_record_an_mfu(tmp_path: Path) -> None:
    assert step_flops(lambda a, b: a @ b, jnp.ones((8, 16)), jnp.ones((16, 4))) == 2 * 8 * 16 * 4
    train_step, w, x = _train_step(), jnp.ones((64, 64)), jnp.ones((128, 64))
    flops = step_flops(train_step, w, x)
    assert flops >= 2 * 2 * 128 * 64 * 64  # forward and the weights' gradient, at least
    with Tracker(total_steps=20, flops_per_step=flops, run_dir=tmp_path, **QUIET) as tracker:
        for _ in range(20):
            w, loss = train_step(w, x)
            tracker.step(loss, batch=x)
    record = RunRecord.load(tmp_path)
    (rank,) = record.ranks
    assert rank.flops_per_step == flops and rank.peak_flops is not None and rank.peak_flops.source == "measured"
    mfu = record.totals["mfu"]
    assert mfu["value"] is None or 0 < mfu["value"] <= 1, mfu


@pytest.mark.parametrize("kwargs, match", [
    ({"total_steps": -1}, "total_steps"),
    ({"samples_per_step": 2.5}, "samples_per_step"),
    ({"samples_per_step": True}, "samples_per_step"),
    ({"flops_per_step": 0}, "flops_per_step"),
    ({"flops_per_step": float("nan")}, "flops_per_step"),
    ({"precision": "fp8"}, "precision"),
    ({"tune": 3}, "tune"),
    ({"tune": "stragglers"}, "needs dtpo.Session"),
])
def test_bad_arguments_are_refused_in_one_line(tmp_path: Path, kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match) as refused:
        Tracker(run_dir=tmp_path, **QUIET, **kwargs)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("kwargs, match", [
    ({}, "say how many samples"),
    ({"samples": -1}, "whole numbers >= 0"),
    ({"samples": 1, "tokens": 1.5}, "whole numbers >= 0"),
    ({"batch": 7.0}, "must hold arrays"),
    ({"batch": ()}, "must hold arrays"),
])
def test_a_step_whose_samples_cannot_be_counted_is_refused(tmp_path: Path, kwargs: dict[str, Any],
                                                           match: str) -> None:
    with Tracker(run_dir=tmp_path, **QUIET) as tracker:
        with pytest.raises(ConfigError, match=match):
            tracker.step(jnp.zeros(()), **kwargs)
        with pytest.raises(ConfigError, match="scalar"):
            tracker.step(batch=jnp.zeros(()))
        tracker.step(samples=2)
    assert [s.samples for s in RunRecord.load(tmp_path).ranks[0].steps] == [2]


def test_the_launch_configuration_is_taken_and_what_is_passed_wins(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Under ``dtpo launch --tune``/``dtpo train`` the launch's configuration file reaches the tracker."""

    launched = RunConfig().replace(session={"window_steps": 5, "warmup_steps": 1}, tune={"cost": "energy"})
    monkeypatch.setenv(CONFIG_ENV, str(launched.save(tmp_path / CONFIG_FILE)))
    tracker = Tracker(run_dir=tmp_path / "run", warmup_steps=3, **QUIET)
    config = tracker.steps.reporter.run_config
    assert (config.session.window_steps, config.session.warmup_steps) == (5, 3)
    assert config.tune.cost == "energy" and not config.energy.enabled
    tracker.finish()


def test_tune_power_limit_on_a_jax_loop_with_a_simulated_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--tune power-limit`` on a JAX loop: the simulated GPU is the rank's energy device and knob, its clock the
    tuner's, and each jitted step advances it at whatever limit the tuner set."""
    monkeypatch.setenv("DTPO_STATE_DIR", str(tmp_path / "state"))
    gpu = SimulatedGpu(SimulatedGpuConfig("A40", "resnet50", seed=1), tmp_path / "gpu.json")
    monkeypatch.setattr(builtin_callbacks, "discover", lambda **kw: Discovery([gpu], ["gpu: simulated"]))
    config = RunConfig().replace(tune={"knob": "power-limit", "cost": "energy"}, energy={"sample_interval_s": None},
                                 session={"window_steps": 20})
    batch, total = gpu.model.batch_size, 1500
    train_step, w, x = _train_step(), jnp.ones((4, 1)), jnp.ones((8, 4))
    with Tracker(total_steps=total, samples_per_step=batch, run_dir=tmp_path / "run", run_config=config,
                 clock=lambda: gpu.now_s, progress=False, summary=False) as tracker:
        tuner = next(cb for cb in tracker.steps.reporter.callbacks
                     if isinstance(cb, builtin_callbacks.TuneCallback)).tuner
        assert tuner is not None  # built at the start, from the GPU's knob range
        for _ in range(total):
            w, loss = train_step(w, x)
            gpu.advance(*gpu.sample_steps(1))
            tracker.step(loss)
        assert tuner.holding and tuner.choice is not None
        held = tuner.choice
        assert gpu.knob_state().power_limit_w == held.power_limit_w  # in force while the loop trains on
    assert gpu.knob_state() == KnobState(default_setting(gpu).power_limit_w, None)  # put back at the end
    cost = parse_cost("energy")
    best, best_cost = oracle(gpu, cost)
    assert true_cost(gpu, held, cost) <= GOAL * best_cost, (held, best)
    record = RunRecord.load(tmp_path / "run")
    (rank,) = record.ranks
    assert rank.tuning.applied is True and rank.tuning.source == "measured"
    assert len(rank.steps) == total and all(s.samples == batch for s in rank.steps)
    assert record.config["user"]["framework"] == "jax"
    assert [d["source"] for d in rank.energy["devices"]] == ["simulated"]


def test_energy_is_labelled_for_a_modelled_cpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = builtin_callbacks.discover
    monkeypatch.setattr(builtin_callbacks, "discover", lambda **kw: real(**{**kw, "cpu_tdp_w": 20.0}))
    with Tracker(total_steps=6, samples_per_step=2, run_dir=tmp_path, progress=False, summary=False,
                 energy=EnergyConfig(sample_interval_s=None)) as tracker:
        for step in range(6):
            tracker.step(jnp.asarray(step))
    record = RunRecord.load(tmp_path)
    assert record.energy["energy_j"]["value"] > 0 and record.energy["energy_j"]["source"] == "estimated"


@pytest.mark.parametrize("argv, match", [
    (["--steps", "0"], "--steps must be > 0"),
    (["--batch-size", "-4"], "--batch-size must be > 0"),
    (["--lr", "nan"], "--lr must be a number > 0"),
    (["--bogus"], "unrecognized arguments"),
])
def test_the_workloads_bad_flags_end_it_in_one_line(argv: list[str], match: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from dtpo.workloads.jax_mlp import parse_args

    with pytest.raises(SystemExit) as ended:
        parse_args(argv)
    err = capsys.readouterr().err
    assert ended.value.code == 2 and err.count("\n") == 1 and match in err, err
