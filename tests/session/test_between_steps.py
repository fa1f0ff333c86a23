"""Session.state_dict / load_state_dict: step, switches, gradient scaler and data position round-trip."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dtpo


def _session(tmp_path: Path, name: str, **kwargs: Any) -> dtpo.Session:
    return dtpo.Session(energy=False, progress=False, summary=False, count_flops=False, warmup_steps=0,
                        run_dir=tmp_path / name, **kwargs)


def _batches(n: int = 40) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    return [(torch.randn(4, 6, generator=gen), torch.randint(0, 3, (4,), generator=gen)) for _ in range(n)]


def _train(session: dtpo.Session, data: list[Any], steps: int, seen: list[torch.Tensor] | None = None) -> None:
    model = session.model or session.wrap(nn.Linear(6, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in session.batches(data, steps=steps):
        if seen is not None:
            seen.append(x)
        session.backward(F.cross_entropy(model(x), y))
        if session.step(opt) and session.step_count == 2:
            session.set_grad_accum(2)
            session.set_precision("bf16-mixed")


def test_state_round_trips_and_training_continues_where_it_was(tmp_path: Path) -> None:
    data = _batches()
    first = _session(tmp_path, "a")
    _train(first, data, steps=4)
    state = first.state_dict()
    assert state["step"] == 4 and state["data"]["batches"] == 2 + 2 * 2
    assert state["switches"]["grad_accum"] == 2 and state["switches"]["precision"] == "bf16-mixed"
    first.finish()

    second = _session(tmp_path, "b")
    second.wrap(nn.Linear(6, 3))
    second.load_state_dict(state)
    assert second.state_dict() == state
    assert (second.step_count, second.start_step, second.grad_accum) == (4, 4, 2)
    assert second.switch_log == first.switch_log and second.precision.name == "bf16-mixed"
    seen: list[torch.Tensor] = []
    _train(second, data, steps=1, seen=seen)
    assert len(seen) == 2 and torch.equal(seen[0], data[6][0])  # two micro-batches, from where the first stopped
    assert second.step_count == 5
    record = second.finish()
    assert record is not None and [s.step for s in record.ranks[0].steps] == [4]


def test_the_data_position_moves_the_next_iterable_there(tmp_path: Path) -> None:
    data = _batches()
    session = _session(tmp_path, "s")
    session.wrap(nn.Linear(6, 3))
    session.load_state_dict({"step": 3, "switches": session.state_dict()["switches"], "scaler": None,
                             "data": {"batches": 5, "state": None}})
    seen: list[torch.Tensor] = []
    _train(session, data, steps=1, seen=seen)
    assert torch.equal(seen[0], data[5][0])
    assert session.state_dict()["data"]["batches"] == 6
    session.finish()


def test_the_gradient_scaler_comes_back(tmp_path: Path) -> None:
    session = _session(tmp_path, "s", precision="16-mixed")
    session.wrap(nn.Linear(6, 3))
    state = session.state_dict()
    assert state["scaler"] is not None
    state["scaler"]["scale"] = 8.0
    session.load_state_dict(state)
    assert session.precision.scaler is not None and float(session.precision.scaler.get_scale()) == 8.0
    session.finish()


def test_state_loads_only_between_optimizer_steps(tmp_path: Path) -> None:
    session = _session(tmp_path, "s", grad_accum=2)
    model = session.wrap(nn.Linear(6, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    state = session.state_dict()
    with pytest.raises(RuntimeError, match="only between optimizer steps"):
        for x, y in session.batches(_batches(), steps=1):
            session.backward(F.cross_entropy(model(x), y))
            session.step(opt)
            session.load_state_dict(state)
    session.finish()
