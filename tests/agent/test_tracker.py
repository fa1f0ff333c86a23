"""An unmodified loop's iterations, batches and pauses, as the agent's hooks cut them into steps."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from agent_steps import Sink
from agent_steps import make_loader as _loader
from agent_steps import make_model as _model
from torch.utils.data import DataLoader

from dtpo.agent.torch_hooks import TorchHooks
from dtpo.agent.tracker import StepTracker
from dtpo.core.record import StepRecord


def test_iterations_and_their_samples_are_counted_and_evaluation_stays_out(
        tracked: tuple[StepTracker, Sink]) -> None:
    tracker, sink = tracked
    model, train, val = _model(), _loader(50, 8), _loader(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = 0
    pauses: list[tuple[float, float]] = []  # (start, end) of each evaluation, Unix time
    for _epoch in range(2):
        for x, y in train:
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            steps += 1
            with torch.no_grad():  # evaluation between iterations
                start = time.time()
                for vx, _ in val:
                    model(vx)
                time.sleep(0.005)
                pauses.append((start, time.time()))
    assert len(sink.closed) == steps == 14
    assert [s.samples for s in sink.closed] == [8] * 6 + [2] + [8] * 6 + [2]
    assert [s.step for s in sink.closed] == list(range(14))
    assert [s.warmup for s in sink.closed] == [True] + [False] * 13
    measured = sink.closed[1:]
    for s, (_, pause_end) in zip(measured, pauses, strict=False):  # step k+1 begins after the pause that follows k
        assert s.started_at is not None and s.started_at >= pause_end
    for s, (pause_start, _) in zip(sink.closed, pauses, strict=True):  # ... and step k ended before it
        assert s.started_at is not None and s.started_at + s.step_s <= pause_start + 1e-3
    for s in measured:  # the marks partition the step
        parts = s.data_wait_s + s.compute_s + (s.tail_s or 0.0) + s.optimizer_s
        assert parts == pytest.approx(s.step_s, abs=1e-3)
        assert s.data_wait_s > 0 and s.compute_s > 0 and s.optimizer_s > 0
        assert s.tokens is None
    assert sink.opened == list(range(1, 14))  # step 0 began before the run existed


def test_wrapped_optimizers_and_skipped_scaler_steps_are_one_iteration_each(
        tracked: tuple[StepTracker, Sink]) -> None:
    tracker, sink = tracked
    model = _model()
    inner = torch.optim.SGD(model.parameters(), lr=0.1)

    class Wrapper(torch.optim.Optimizer):  # an EMA-style wrapper that steps its inner optimizer
        def __init__(self, inner: torch.optim.Optimizer) -> None:
            super().__init__(model.parameters(), {})
            self.inner = inner

        def step(self, closure: Any = None) -> None:
            self.inner.step()

    wrapper = Wrapper(inner)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    for i, (x, y) in enumerate(_loader(40, 8)):
        wrapper.zero_grad()
        loss = F.cross_entropy(model(x), y) * (float("inf") if i == 2 else 1.0)
        scaler.scale(loss).backward()
        scaler.step(wrapper)  # skipped on step 2: inf gradients
        scaler.update()
    assert len(sink.closed) == 5
    assert [s.samples for s in sink.closed] == [8] * 5


def test_a_loop_without_a_data_loader_counts_steps_and_the_override_samples(
        tracked: tuple[StepTracker, Sink]) -> None:
    tracker, sink = tracked
    tracker.samples_per_step = 32
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 8), torch.randint(0, 3, (32,))
    for _ in range(4):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    assert [s.samples for s in sink.closed] == [32] * 4
    later = sink.closed[1:]
    assert all(s.data_wait_s == 0 and s.step_s > 0 for s in later)
    assert all(s.compute_s + s.tail_s + s.optimizer_s == pytest.approx(s.step_s, abs=1e-3) for s in later)


def test_tokens_are_counted_from_token_id_batches(tracked: tuple[StepTracker, Sink]) -> None:
    tracker, sink = tracked
    ids = torch.randint(0, 50, (24, 10))
    loader = DataLoader([{"input_ids": row, "labels": row} for row in ids], batch_size=6)
    emb = torch.nn.Embedding(50, 4)
    opt = torch.optim.SGD(emb.parameters(), lr=0.1)
    for batch in loader:
        emb(batch["input_ids"]).sum().backward()
        opt.step()
    assert [(s.samples, s.tokens) for s in sink.closed] == [(6, 60)] * 4


def test_an_error_of_the_agent_turns_it_off_without_touching_the_script(
        tracked: tuple[StepTracker, Sink], caplog: pytest.LogCaptureFixture) -> None:
    tracker, sink = tracked

    def broken(record: StepRecord) -> None:
        raise RuntimeError("disk on fire")

    sink.step_closed = broken  # type: ignore[method-assign]
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in _loader(24, 8):
        F.cross_entropy(model(x), y).backward()
        opt.step()  # the script goes on
    assert tracker.active is False
    assert "stopped measuring" in caplog.text and "disk on fire" in caplog.text


def test_hooks_come_out_cleanly() -> None:
    backward, next_ = torch.autograd.backward, torch.utils.data.dataloader._BaseDataLoaderIter.__next__
    hooks = TorchHooks(StepTracker(lambda tracker: None))
    hooks.install()
    assert torch.autograd.backward is not backward
    hooks.remove()
    assert torch.autograd.backward is backward
    assert torch.utils.data.dataloader._BaseDataLoaderIter.__next__ is next_
