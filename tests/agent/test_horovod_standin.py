"""A ``horovod.torch`` script under the agent, with a faithful stand-in for ``hvd.DistributedOptimizer``.

Horovod cannot be installed (no release since June 2023; it does not build against current torch), so the
stand-in reproduces what ``horovod/torch/optimizer.py`` does to the optimizer, with the collectives faked:

* ``DistributedOptimizer(opt, ...)`` builds a *subclass* of ``opt``'s class at run time,
  ``type(opt.__class__.__name__, (opt.__class__,), dict(_DistributedOptimizer.__dict__))``, and returns a new
  instance of it over ``opt.param_groups`` (the user's optimizer object is never stepped again);
* ``__init__`` calls ``super(self.__class__, self).__init__(params)``, so torch's ``Optimizer.__init__`` patches
  the new class's ``step`` with its hook wrapper too: the global step hooks fire for the subclass's ``step`` *and*
  for the ``super().step()`` it calls, nested, on the same optimizer object;
* a hook on each parameter's gradient accumulator counts down ``backward_passes_per_step`` and starts the
  parameter's allreduce when it reaches 0;
* ``step()`` calls ``synchronize()`` (waits for every allreduce; here a sleep stands for the wait on the
  slowest rank) unless inside ``skip_synchronize()``, then ``super(self.__class__, self).step(closure)``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from agent_steps import Sink
from agent_steps import make_loader as _loader
from agent_steps import make_model as _model
from torch.optim.optimizer import register_optimizer_step_pre_hook

from dtpo.agent.tracker import StepTracker

SYNC_WAIT_S = 0.02  # what the fake synchronize() waits: the allreduce and the slowest rank


class _DistributedOptimizer(torch.optim.Optimizer):
    """Horovod's ``_DistributedOptimizer`` (``horovod/torch/optimizer.py``), its collectives faked."""

    def __init__(self, params: Any, named_parameters: Any, backward_passes_per_step: int = 1) -> None:
        super(self.__class__, self).__init__(params)  # type: ignore[misc]  # as Horovod writes it
        named = list(named_parameters)
        self._parameter_names = {v: k for k, v in sorted(named)}
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay = {v: backward_passes_per_step for _, v in sorted(named)}
        self._handles: dict[Any, Any] = {}
        self._grad_accs: list[Any] = []
        self._requires_update: set[Any] = set()
        self._synchronized = False
        self._should_synchronize = True
        self.allreduces: list[str] = []  # names of the (fake) allreduces started, in order
        self.synchronizations = 0
        self._register_hooks()

    def _register_hooks(self) -> None:
        for param_group in self.param_groups:
            for p in param_group["params"]:
                if p.requires_grad:
                    self._requires_update.add(p)
                    p_tmp = p.expand_as(p)
                    grad_acc = p_tmp.grad_fn.next_functions[0][0]
                    grad_acc.register_hook(self._make_hook(p))
                    self._grad_accs.append(grad_acc)

    def _allreduce_grad_async(self, p: Any) -> tuple[Any, Any]:
        self.allreduces.append(self._parameter_names[p])
        return p.grad.clone(), None  # the "handle": the averaged gradient of a world of identical ranks

    def _make_hook(self, p: Any) -> Any:
        def hook(*ignore: Any) -> None:
            if p in self._handles and self._handles[p][0] is not None and self._allreduce_delay[p] <= 0:
                raise AssertionError("Gradients were computed more than backward_passes_per_step times before "
                                     "call to step().")
            handle, ctx = None, None
            self._allreduce_delay[p] -= 1
            if self._allreduce_delay[p] == 0:
                handle, ctx = self._allreduce_grad_async(p)
            self._handles[p] = (handle, ctx)

        return hook

    def synchronize(self) -> None:
        missing_p = self._requires_update - set(self._handles)
        for p in missing_p:
            self._handles[p] = self._allreduce_grad_async(p)
        for p, (handle, _ctx) in list(self._handles.items()):
            if handle is None:
                self._handles[p] = self._allreduce_grad_async(p)
        time.sleep(SYNC_WAIT_S)  # hvd.synchronize(handle) on every handle: the wait for the other ranks
        for p, (handle, _ctx) in self._handles.items():
            self._allreduce_delay[p] = self.backward_passes_per_step
            p.grad.set_(handle)
        self._handles.clear()
        self._synchronized = True
        self.synchronizations += 1

    @contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure: Any = None) -> Any:
        if self._should_synchronize:
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)  # type: ignore[misc]


def DistributedOptimizer(optimizer: torch.optim.Optimizer, named_parameters: Any,  # noqa: N802 - Horovod's name
                         backward_passes_per_step: int = 1) -> Any:
    """``hvd.DistributedOptimizer``: a new instance of a subclass of the optimizer's class, made at run time."""
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, backward_passes_per_step)


def test_the_stand_in_is_built_as_horovod_builds_it() -> None:
    """What the other tests rely on: a subclass of the user's class, hooked by torch at both levels."""
    model = _model()
    user = torch.optim.SGD(model.parameters(), lr=0.1)
    opt = DistributedOptimizer(user, model.named_parameters())
    assert type(opt) is not torch.optim.SGD and isinstance(opt, torch.optim.SGD)
    assert type(opt).__name__ == "SGD" and type(opt).__mro__[1] is torch.optim.SGD
    assert "step" in vars(type(opt)) and getattr(type(opt).step, "hooked", False)  # torch wrapped the subclass's
    assert getattr(torch.optim.SGD.step, "hooked", False)  # ... and SGD's own
    entered: list[int] = []
    pre = register_optimizer_step_pre_hook(lambda o, a, k: entered.append(id(o)))
    try:
        F.cross_entropy(model(torch.randn(4, 8)), torch.randint(0, 3, (4,))).backward()
        opt.step()
    finally:
        pre.remove()
    assert entered == [id(opt), id(opt)]  # nested: the subclass's step, then SGD.step from super()
    assert opt.synchronizations == 1 and sorted(opt.allreduces) == sorted(n for n, _ in model.named_parameters())


def test_one_iteration_per_outer_step_with_its_samples(tracked: tuple[StepTracker, Sink]) -> None:
    tracker, sink = tracked
    model = _model()
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters())
    for x, y in _loader(44, 8):  # 5 batches of 8, then 4
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    assert opt.synchronizations == 6
    assert len(sink.closed) == 6
    assert [s.step for s in sink.closed] == list(range(6))
    assert [s.samples for s in sink.closed] == [8] * 5 + [4]
    assert tracker.counter.counts == {id(opt): 6}  # the user's own SGD object never steps
    for s in sink.closed[1:]:
        assert s.optimizer_s >= SYNC_WAIT_S  # synchronize() runs inside step(): the wait lands in the optimizer
        assert s.data_wait_s + s.compute_s + (s.tail_s or 0.0) + s.optimizer_s == pytest.approx(s.step_s, abs=1e-3)


def test_backward_passes_per_step_makes_one_iteration_of_two_batches(tracked: tuple[StepTracker, Sink]) -> None:
    """``backward_passes_per_step=2``: two backward passes accumulate locally, one allreduce, one step()."""
    tracker, sink = tracked
    model = _model()
    params = list(model.named_parameters())
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), params, backward_passes_per_step=2)
    for i, (x, y) in enumerate(_loader(48, 6)):  # 8 batches of 6: 4 iterations of 12 samples
        F.cross_entropy(model(x), y).backward()
        if i % 2 == 1:
            opt.step()
            opt.zero_grad()
    assert len(opt.allreduces) == 4 * len(params)  # one allreduce per parameter per iteration, not per backward
    assert len(sink.closed) == 4
    assert [s.samples for s in sink.closed] == [12] * 4
    assert all(s.data_wait_s > 0 and s.compute_s > 0 for s in sink.closed[1:])


def test_synchronize_then_skip_synchronize_under_a_grad_scaler(tracked: tuple[StepTracker, Sink]) -> None:
    """Horovod's AMP recipe: ``synchronize()``, ``scaler.unscale_``, then ``scaler.step`` inside
    ``skip_synchronize()``: one iteration each, the skipped (inf) one included."""
    tracker, sink = tracked
    model = _model()
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters())
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    for i, (x, y) in enumerate(_loader(40, 8)):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y) * (float("inf") if i == 2 else 1.0)
        scaler.scale(loss).backward()
        opt.synchronize()
        scaler.unscale_(opt)
        with opt.skip_synchronize():
            scaler.step(opt)
        scaler.update()
    assert opt.synchronizations == 5
    assert len(sink.closed) == 5
    assert [s.samples for s in sink.closed] == [8] * 5
    # synchronize() ran before step(), but after backward returned: its wait is still in the optimizer part
    assert all(s.optimizer_s >= SYNC_WAIT_S for s in sink.closed[1:])


def test_horovod_ranks_leave_comm_and_sync_wait_unmeasured(tracked: tuple[StepTracker, Sink],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """What the record should say for one rank of two under ``horovodrun`` (which sets ``HOROVOD_RANK`` /
    ``HOROVOD_SIZE``; under ``mpirun``: ``OMPI_COMM_WORLD_SIZE``): not measured, never a measured zero."""
    for name, value in (("HOROVOD_RANK", "0"), ("HOROVOD_SIZE", "2"), ("OMPI_COMM_WORLD_SIZE", "2")):
        monkeypatch.setenv(name, value)
    tracker, sink = tracked
    model = _model()
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters())
    for x, y in _loader(24, 8):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    assert len(sink.closed) == 3
    assert all(s.sync_wait_s is None and s.comm_exposed_s is None for s in sink.closed)
