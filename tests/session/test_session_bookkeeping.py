"""The Session's bookkeeping counter counts the Session's own code on each measured step (its entry points and the
callbacks it runs) and none of the user's work: the loader, the loop body, autograd's backward, the optimizer's
step. A fake CPU clock that only the test moves: no timing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import dtpo
from dtpo.core.callbacks import Callback
from dtpo.core.record import StepRecord
from dtpo.core.steps import RunView
from dtpo.session.loop.bookkeeping import BookkeepingCounter

USER_NS = 10**9  # each piece of the user's work: would swamp the count if any leaked in
CALLBACK_NS = 1000  # a callback's work at each step's end: dtpo's dispatch runs it, so it counts
WARMUP_NS = 10**12  # a warm-up step's callback work: left out


class FakeCpuClock:
    """Nanoseconds that move by one at each read, and by whatever the test's code adds."""

    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        self.now += 1
        return self.now - 1


class WorkAtStepEnd(Callback):
    """A callback with work of its own at each step's end (much more during the warm-up)."""

    def __init__(self, clock: FakeCpuClock) -> None:
        self.clock = clock

    def on_step_end(self, session: RunView, step_record: StepRecord) -> None:
        self.clock.now += WARMUP_NS if step_record.warmup else CALLBACK_NS


def _train(tmp_path: Path, grad_accum: int, steps: int = 6) -> tuple[dtpo.Session, FakeCpuClock]:
    clock = FakeCpuClock()
    session = dtpo.Session(energy=False, progress=False, summary=False, count_flops=False, warmup_steps=2,
                           grad_accum=grad_accum, run_dir=tmp_path / "run", callbacks=[WorkAtStepEnd(clock)])
    session.bookkeeping = BookkeepingCounter(clock, sample_one_in=1)
    model = session.wrap(nn.Linear(6, 3))
    for parameter in model.parameters():  # autograd's backward: the user's work, inside session.backward
        parameter.register_hook(lambda grad: setattr(clock, "now", clock.now + USER_NS))
    model.register_forward_hook(lambda *_: setattr(clock, "now", clock.now + USER_NS))

    class Optimizer(torch.optim.SGD):
        def step(self, closure: Any = None) -> Any:  # the optimizer's step: inside session.step
            clock.now += USER_NS
            return super().step(closure)

    opt = Optimizer(model.parameters(), lr=0.1)

    def loader() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        gen = torch.Generator().manual_seed(0)
        while True:
            clock.now += USER_NS  # the loader's next: inside the Session's batch generator
            yield torch.randn(4, 6, generator=gen), torch.randint(0, 3, (4,), generator=gen)

    for x, y in session.batches(loader(), steps=steps):
        clock.now += USER_NS  # the loop body
        session.backward(F.cross_entropy(model(x), y))
        session.step(opt)
    return session, clock


def test_it_counts_the_sessions_code_and_callbacks_and_none_of_the_users_work(tmp_path: Path) -> None:
    session, _ = _train(tmp_path, grad_accum=1)
    counter = session.bookkeeping
    assert counter.steps == 4  # the measured steps: the two warm-up steps are left out
    per_step = counter.total_ns / counter.steps
    # the callback's work, plus one tick of the fake clock per stretch of the Session's code; no user's work
    assert CALLBACK_NS + 3 <= per_step < CALLBACK_NS + 100
    record = session.finish()
    assert record is not None and record.ranks[0].bookkeeping_s_per_step == per_step / 1e9


def test_with_accumulation_every_micro_batch_is_counted_in_its_step(tmp_path: Path) -> None:
    one, _ = _train(tmp_path / "one", grad_accum=1)
    three, _ = _train(tmp_path / "three", grad_accum=3)
    assert three.bookkeeping.steps == one.bookkeeping.steps == 4
    per_step = three.bookkeeping.total_ns / three.bookkeeping.steps
    assert CALLBACK_NS + 3 <= per_step < CALLBACK_NS + 100
    assert per_step > one.bookkeeping.total_ns / one.bookkeeping.steps  # more stretches: three micro-batches
    one.finish()
    three.finish()


def test_a_run_that_ends_in_its_warm_up_records_no_bookkeeping(tmp_path: Path) -> None:
    session, _ = _train(tmp_path, grad_accum=1, steps=2)
    record = session.finish()
    assert record is not None and record.ranks[0].bookkeeping_s_per_step is None
    assert "bookkeeping_s_per_step" not in record.ranks[0].to_dict()


def test_the_session_does_not_keep_the_loss_graph_alive(tmp_path: Path) -> None:
    """The Session keeps the loss's value (on the host; a detached copy on a device): the autograd graph is freed
    where the loop lets go of the loss (in the user's code, as in a plain loop), not inside the Session's counted
    code."""
    import weakref

    class Marker:
        """Lives as long as the graph node that holds it."""

    class Tagged(torch.autograd.Function):
        """The identity, with a marker on its graph node."""

        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            ctx.marker = Marker()
            return x.clone()

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
            return grad

    session = dtpo.Session(energy=False, progress=False, summary=False, count_flops=False, warmup_steps=0,
                           run_dir=tmp_path / "run")
    model = session.wrap(nn.Linear(6, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(4, 6), torch.randint(0, 3, (4,))
    for bx, by in session.batches(iter([(x, y)] * 2)):
        loss = F.cross_entropy(Tagged.apply(model(bx)), by)
        graph = weakref.ref(loss.grad_fn.next_functions[0][0].next_functions[0][0].marker)
        session.backward(loss)
        expected = loss.item()
        del loss
        assert graph() is None  # nothing in the Session holds the graph between backward and step
        session.step(opt)
        assert session.rank_record.steps[-1].loss == expected
    session.finish()
