"""What the tests of the agent's step cutting share: a sink for the tracker's steps, the hooks installed around a
test (the ``tracked`` fixture), a small model and a loader of labelled batches."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from dtpo.agent.torch_hooks import TorchHooks
from dtpo.agent.tracker import StepTracker
from dtpo.core.record import StepRecord


class Sink:
    """Collects what the tracker hands to a run."""

    def __init__(self) -> None:
        self.opened: list[int] = []
        self.closed: list[StepRecord] = []

    def step_opened(self, step: int) -> None:
        self.opened.append(step)

    def step_closed(self, record: StepRecord) -> None:
        self.closed.append(record)


@pytest.fixture
def tracked() -> Iterator[tuple[StepTracker, Sink]]:
    """A tracker (one warm-up step) feeding a :class:`Sink`, its hooks in torch for the test."""
    sink = Sink()
    tracker = StepTracker(lambda tracker: sink, warmup_steps=1)
    hooks = TorchHooks(tracker)
    hooks.install()
    try:
        yield tracker, sink
    finally:
        hooks.remove()


def make_model() -> torch.nn.Module:
    """8 features in, 3 classes out, the same weights every time."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))


def make_loader(n: int, batch: int, **options: Any) -> DataLoader:
    """``n`` random samples for :func:`make_model` in batches of ``batch``."""
    return DataLoader(TensorDataset(torch.randn(n, 8), torch.randint(0, 3, (n,))), batch_size=batch, **options)
