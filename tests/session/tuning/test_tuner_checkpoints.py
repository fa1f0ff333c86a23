"""Tuners and compression state across a checkpoint: a resumed job-knob search holds its choice without
profiling again (or starts again from the starting setting when it was cut short), per-rank straggler slowdown
keeps its locks and memory, and PowerSGD keeps its error feedback."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from conftest import run_ranks, train_behind_a_straggler
from fakes import FakeGpu
from torch import nn

import dtpo
from dtpo.core.config import CheckpointConfig, EnergyConfig, LaunchConfig, RunConfig, SessionConfig, TuneConfig
from dtpo.session.tuning import rebalance
from dtpo.session.tuning.job_knobs import JobTuneCallback
from dtpo.session.tuning.stragglers import StragglerCallback
from dtpo.tune.job_setting import JobSetting
from dtpo.tune.rebalance import RankSpeed, Rebalancer
from dtpo.tune.straggler import RankWindow, StragglerSlowdown
from dtpo.tune.tuner import TunerOptions

pytestmark = pytest.mark.slow


def _tiny_job(session: dtpo.Session, rank: int, batches: int) -> tuple[nn.Module, torch.optim.Optimizer, list]:
    """A small MLP wrapped and attached, its optimizer, and this rank's ``batches`` batches of 8 samples."""
    torch.manual_seed(0)
    model = session.wrap(nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    session.attach(opt)
    gen = torch.Generator().manual_seed(10 + rank)
    return model, opt, [(torch.randn(8, 16, generator=gen), torch.randint(0, 4, (8,), generator=gen))
                        for _ in range(batches)]


# -- job knobs ----------------------------------------------------------------------------------------------------

def _job_run(rank: int, world_size: int, out: str, name: str, resume: bool, stop: str) -> None:
    """Tune accumulation and compression on 2 ranks; the first run saves a checkpoint at ``stop`` (``hold``: once
    the search holds a choice; ``search``: while it is still profiling) and ends there."""
    config = RunConfig(session=SessionConfig(warmup_steps=1, count_flops=False, window_steps=5),
                       energy=EnergyConfig(enabled=True), launch=LaunchConfig(run_dir=str(Path(out) / name)),
                       checkpoint=CheckpointConfig(dir=str(Path(out) / "ckpt"), resume="latest" if resume else None))
    tuner = JobTuneCallback(TuneConfig(knob="grad-accum,compression", cost="time"),
                            options=TunerOptions(ordered=False, quick_look_steps=1))
    session = dtpo.Session.from_config(config, callbacks=[tuner], progress=False, summary=False)
    model, opt, data = _tiny_job(session, rank, 400)
    saved = None
    for x, y in session.batches(data, steps=saved_step(out) + 30 if resume else 300):
        session.backward(F.cross_entropy(model(x), y))
        if not session.step(opt) or resume:
            continue
        t = tuner.tuner
        in_search = t is not None and len([s for s in t.stats.values() if s.measured]) >= 2 and not t.holding
        if (stop == "hold" and t is not None and t.holding) or (stop == "search" and in_search):
            session.save_checkpoint()
            saved = {"step": session.step_count, "verdicts": len(tuner.verdicts),
                     "choice": t.choice.label if t.choice is not None and t.holding else None,
                     "default": t.default.label}
            break
    (Path(out) / f"{name}{rank}.json").write_text(json.dumps(
        {"saved": saved, "switches": session.switch_log, "verdicts": len(tuner.verdicts)}))
    session.finish()


def saved_step(out: str) -> int:
    return json.loads((Path(out) / "first0.json").read_text())["saved"]["step"]


def _tuning(out: Path, name: str) -> dict:
    return json.loads((out / name / "record.json").read_text())["ranks"][0]["tuning"]


def test_a_resumed_job_tuner_holds_its_choice_without_profiling_again(tmp_path: Path) -> None:
    run_ranks(_job_run, 2, str(tmp_path), "first", False, "hold")
    first = json.loads((tmp_path / "first0.json").read_text())
    assert first["saved"] is not None and first["saved"]["choice"] is not None, "the search never held a choice"
    run_ranks(_job_run, 2, str(tmp_path), "second", True, "hold")
    second = json.loads((tmp_path / "second0.json").read_text())
    tuning = _tuning(tmp_path, "second")
    assert tuning["resumed"].startswith("held the checkpoint's choice")
    assert JobSetting.from_dict(tuning["choice"]).label == first["saved"]["choice"]
    assert second["verdicts"] == first["saved"]["verdicts"]  # nothing probed again
    resumed_blocks = [t for t in tuning["trajectory"] if t["step"] > first["saved"]["step"]]
    assert resumed_blocks and all(t["phase"] == "hold" for t in resumed_blocks)
    assert all(t["setting"] == first["saved"]["choice"] for t in resumed_blocks)
    # what was tried before the checkpoint is still in the record
    assert len(tuning["trajectory"]) > len(resumed_blocks)


def test_a_search_cut_short_starts_again_from_the_starting_setting(tmp_path: Path) -> None:
    run_ranks(_job_run, 2, str(tmp_path), "first", False, "search")
    first = json.loads((tmp_path / "first0.json").read_text())
    assert first["saved"] is not None and first["saved"]["choice"] is None
    run_ranks(_job_run, 2, str(tmp_path), "second", True, "search")
    tuning = _tuning(tmp_path, "second")
    assert "started again from the starting setting" in tuning["resumed"]
    resumed_blocks = [t for t in tuning["trajectory"] if t["step"] > first["saved"]["step"]]
    assert resumed_blocks[0]["setting"] == first["saved"]["default"]


# -- stragglers ---------------------------------------------------------------------------------------------------

def test_the_straggler_policy_decides_alike_after_its_state_is_restored() -> None:
    policy = StragglerSlowdown([900, 1100, 1300, 1500], margin=0.03)
    windows = [[RankWindow(0.010, 1500, False, 0.01, 2.0, 10), RankWindow(0.013, 1500, False, 0.01, 2.0, 10)],
               [RankWindow(0.011, 1300, True, 0.01, 1.8, 10), RankWindow(0.013, 1500, False, 0.01, 2.0, 10)],
               [RankWindow(0.0135, 1100, True, 0.01, 1.9, 10), RankWindow(0.013, 1500, False, 0.01, 2.0, 10)]]
    for window in windows[:2]:
        policy.decide(window)
    copy = StragglerSlowdown([900, 1100, 1300, 1500], margin=0.03)
    copy.load_state_dict(json.loads(json.dumps(policy.state_dict())))
    assert copy.state_dict() == policy.state_dict()
    assert copy.decide(windows[2]) == policy.decide(windows[2])
    assert copy.floor == policy.floor and copy.floor  # the third window made a floor: both learnt it


STEPS, WINDOW, LAG_S = 42, 10, 0.03


def _straggler_run(rank: int, world_size: int, out: str, name: str, resume: bool) -> None:
    os.environ["DTPO_STATE_DIR"] = str(Path(out) / f"state{rank}")
    gpu = FakeGpu(f"gpu{rank}")
    callback = StragglerCallback("apply", [gpu])
    session = dtpo.Session(warmup_steps=2, window_steps=WINDOW, count_flops=False, progress=False, energy=False,
                           run_dir=Path(out) / name, callbacks=[callback],
                           checkpoint=CheckpointConfig(dir=str(Path(out) / "ckpt"), every="20",
                                                       resume="latest" if resume else None))
    train_behind_a_straggler(session, rank, STEPS, LAG_S)
    (Path(out) / f"{name}{rank}.json").write_text(json.dumps({"calls": gpu.calls, "changes": callback.changes}))


def test_a_resumed_rank_locks_its_clock_again_and_keeps_its_changes(tmp_path: Path) -> None:
    run_ranks(_straggler_run, 2, str(tmp_path), "first", False)
    first = json.loads((tmp_path / "first0.json").read_text())
    before = [c for c in first["changes"] if c["step"] <= 40]
    assert before and before[-1]["clock_mhz"] is not None, f"not locked at the checkpoint: {first['changes']}"
    run_ranks(_straggler_run, 2, str(tmp_path), "second", True)  # resumes at step 40 of 42
    second = json.loads((tmp_path / "second0.json").read_text())
    clock = int(before[-1]["clock_mhz"])
    assert second["calls"][0] == f"lock {clock}-{clock}", (first, second)  # the lock at the checkpoint, again
    assert second["calls"][-1] == "unlock"  # and restored at the end
    assert second["changes"][:len(before)] == before, (first, second)
    straggler = json.loads((tmp_path / "second1.json").read_text())
    assert not any(call.startswith("lock") for call in straggler["calls"])


# -- PowerSGD's error feedback ------------------------------------------------------------------------------------

def _powersgd_run(rank: int, world_size: int, out: str, name: str, resume: bool) -> None:
    session = dtpo.Session(compression="powersgd", warmup_steps=0, energy=False, progress=False, summary=False,
                           count_flops=False, run_dir=Path(out) / name,
                           checkpoint=CheckpointConfig(dir=str(Path(out) / "ckpt"), every="3",
                                                       resume="latest" if resume else None))
    model, opt, data = _tiny_job(session, rank, 10)
    if resume:
        assert session.resume() == 6
        torch.save(session.comm.powersgd_state(), Path(out) / f"loaded{rank}.pt")
    for x, y in session.batches(data, steps=8 if resume else 6):
        session.backward(F.cross_entropy(model(x), y))
        session.step(opt)
    if not resume:
        torch.save(session.comm.powersgd_state(), Path(out) / f"saved{rank}.pt")
    session.finish()


def test_powersgd_error_feedback_is_restored_on_every_rank(tmp_path: Path) -> None:
    run_ranks(_powersgd_run, 2, str(tmp_path), "first", False)
    run_ranks(_powersgd_run, 2, str(tmp_path), "second", True)
    for rank in range(2):
        saved, loaded = torch.load(tmp_path / f"saved{rank}.pt", weights_only=False), \
            torch.load(tmp_path / f"loaded{rank}.pt", weights_only=False)
        assert saved["error_dict"], "PowerSGD kept no error feedback: nothing was compressed"
        assert saved["iter"] == loaded["iter"]
        for key in ("error_dict", "p_memory_dict", "q_memory_dict"):
            assert saved[key].keys() == loaded[key].keys()
            assert all(torch.equal(saved[key][k], loaded[key][k]) for k in saved[key])
    errors = [torch.load(tmp_path / f"saved{rank}.pt", weights_only=False)["error_dict"] for rank in range(2)]
    assert any(not torch.equal(errors[0][k], errors[1][k]) for k in errors[0])  # each rank's own error


# -- batch shares ------------------------------------------------------------------------------------------------

class _RankOneThreeTimesSlower(Rebalancer):
    """The real decision on fixed figures: rank 1 takes three times as long per sample, with no noise (what the
    rebalancer makes of measured, noisy times is tested on its own; here, what a checkpoint keeps of it)."""

    def decide(self, speeds: list[RankSpeed]) -> Any:
        return super().decide([replace(s, ready_s=s.share * (3e-3 if r == 1 else 1e-3), spread=0.0)
                               for r, s in enumerate(speeds)])


def _rebalance_run(rank: int, world_size: int, out: str, name: str, resume: bool) -> None:
    """Two ranks trade a global batch of 32; the rebalancer sees rank 1 three times slower per sample."""
    rebalance.Rebalancer = _RankOneThreeTimesSlower  # this process only: a spawned rank
    config = RunConfig(session=SessionConfig(warmup_steps=2, window_steps=WINDOW, count_flops=False),
                       energy=EnergyConfig(enabled=False), launch=LaunchConfig(workers=2),
                       tune=TuneConfig(knob="rebalance"),
                       checkpoint=CheckpointConfig(dir=str(Path(out) / "ckpt"), every="20",
                                                   resume="latest" if resume else None))
    session = dtpo.Session(run_config=config, progress=False, summary=False, run_dir=Path(out) / name)
    torch.manual_seed(0)
    model = session.wrap(nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    session.attach(opt)
    batch = (torch.randn(32, 8), torch.randint(0, 2, (32,)))
    sizes: list[int] = []

    def data() -> object:
        while True:
            yield batch

    for x, y in session.batches(data(), steps=STEPS):
        sizes.append(len(x))
        session.backward(F.cross_entropy(model(x), y))
        session.step(opt)
    session.finish()
    (Path(out) / f"{name}{rank}.json").write_text(json.dumps({"sizes": sizes}))


def test_a_resumed_run_trains_on_the_shares_of_its_checkpoint(tmp_path: Path) -> None:
    run_ranks(_rebalance_run, 2, str(tmp_path), "first", False)
    first = json.loads((tmp_path / "first1.json").read_text())["sizes"]
    assert first[0] == 16 and first[39] < 16, first  # rebalanced before the checkpoint at step 40
    run_ranks(_rebalance_run, 2, str(tmp_path), "second", True)  # resumes at step 40 of 42
    second = json.loads((tmp_path / "second1.json").read_text())["sizes"]
    assert second[0] == first[39], (first, second)  # the checkpoint's shares from its first step
    record = json.loads((tmp_path / "second" / "record.json").read_text())
    assert record["ranks"][1]["slack"]["share_changes"]  # the changes before the checkpoint kept
