"""``--tune`` on two gloo ranks: the ranks agree on every decision, and a rank without knobs turns tuning off
everywhere instead of leaving the others waiting in a block all-reduce."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import run_ranks
from fakes import FakeGpu
from torch import nn

import dtpo
from dtpo.core.config import TuneConfig
from dtpo.session.tuning.power import TuneCallback
from dtpo.tune.tuner import TunerOptions

pytestmark = pytest.mark.slow


def _train(rank: int, world_size: int, out: str, knobs_on: list[int]) -> None:
    os.environ["DTPO_STATE_DIR"] = str(Path(out) / f"state{rank}")
    gpu = FakeGpu(f"gpu{rank}")
    # one-step blocks (the fake GPU has no counter to wait for), so the search ends within the run
    callback = TuneCallback(TuneConfig(knob="power-limit", cost="time", profile_dir=str(Path(out) / "profiles")),
                            "apply", [gpu] if rank in knobs_on else [], options=TunerOptions())
    session = dtpo.Session(warmup_steps=1, count_flops=False, progress=False, energy=False,
                           run_dir=Path(out) / "run", callbacks=[callback])
    torch.manual_seed(0)
    model = session.wrap(nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = (torch.randn(4, 8), torch.randint(0, 2, (4,)))
    for x, y in session.batches([batch] * 200, steps=200):
        session.backward(F.cross_entropy(model(x), y))
        session.step(opt)
    session.finish()
    (Path(out) / f"rank{rank}.json").write_text(json.dumps({
        "tuning": session.lifecycle.rank.tuning.to_dict(), "calls": gpu.calls, "restored": gpu.state.power_limit_w}))


def _results(out: Path) -> list[dict]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def test_two_ranks_reach_the_same_decisions_and_restore(tmp_path: Path) -> None:
    run_ranks(_train, 2, str(tmp_path), [0, 1])
    first, second = _results(tmp_path)
    assert first["tuning"]["source"] == second["tuning"]["source"] == "measured"
    assert first["tuning"]["choice"] is not None and first["tuning"]["choice"] == second["tuning"]["choice"]
    # every setting each rank applied, in order, is the same on both: one decision, taken twice
    assert first["calls"] == second["calls"] and len(first["calls"]) > 2
    assert first["restored"] == second["restored"] == 300.0


def test_a_rank_without_knobs_turns_tuning_off_on_every_rank(tmp_path: Path) -> None:
    run_ranks(_train, 2, str(tmp_path), [0])
    for result in _results(tmp_path):
        assert result["tuning"]["applied"] is False
        assert result["calls"] == []  # nothing was changed, and nobody waited for a peer that never came
