"""Each step's samples and loss as the record keeps them, whatever the batch's form and the loss's dtype."""

from __future__ import annotations

from collections import namedtuple
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import dtpo

Pair = namedtuple("Pair", "inputs targets")


class Tagged(torch.Tensor):
    """A tensor subclass, as some libraries hand out."""


def _run(tmp_path: Path, batch: Any, loss_of: Any, steps: int = 3) -> list[Any]:
    session = dtpo.Session(energy=False, progress=False, summary=False, count_flops=False, warmup_steps=1,
                           window_steps=2, run_dir=tmp_path / "run")
    model = session.wrap(nn.Linear(6, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    for _ in session.batches([batch] * steps, steps=steps):
        session.backward(loss_of(model))
        session.step(opt)
    session.finish()
    return session.rank_record.steps


@pytest.mark.parametrize(("batch", "samples"), [
    ((torch.zeros(5, 6), torch.zeros(5)), 5),
    ([torch.zeros(4, 6), torch.zeros(4)], 4),
    (Pair(torch.zeros(3, 6), torch.zeros(3)), 3),
    ({"inputs": torch.zeros(7, 6)}, 7),
    (torch.zeros(2, 6), 2),
    (torch.zeros(6, 6).as_subclass(Tagged), 6),
    ((), 1),  # no tensor: one sample
    (torch.tensor(1.0), 1),  # a 0-dim tensor: one sample
])
def test_samples_come_from_the_first_tensors_leading_size(tmp_path: Path, batch: Any, samples: int) -> None:
    steps = _run(tmp_path, batch, lambda model: model(torch.ones(1, 6)).sum())
    assert [s.samples for s in steps] == [samples] * 3


@pytest.mark.parametrize(("dtype", "shape"), [
    (torch.float32, ()), (torch.float64, ()), (torch.bfloat16, ()), (torch.float32, (1,)),
])
def test_the_loss_is_read_as_float32_reads_it(tmp_path: Path, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    value = 0.1  # not exact in float32: a float64 loss is kept as float32 reads it, as on a device
    steps = _run(tmp_path, (torch.zeros(2, 6),),
                 lambda model: (model(torch.zeros(1, 6)).sum().to(dtype) * 0 + value).reshape(shape))
    expected = float(torch.tensor(value, dtype=dtype).float())
    assert [s.loss for s in steps] == [expected] * 3
