"""Probe steps as the Session runs them: the kept batch handed to the training loop once per probe pass, in
the probe's setting, and the gradient taken instead of an update (see :mod:`dtpo.session.loop.probe`).

:class:`ProbeSteps` is one part of :class:`~dtpo.session.session.Session`: it owns the probe queue and the
state of the pass under way, and puts each probe's setting on the Session's
:class:`~dtpo.session.loop.switches.Switches` while it runs. The Session hands it the batches, losses and optimizer
steps of a probe pass (its ``batches``, ``backward`` and ``step`` ask it first).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from dtpo.core.errors import ConfigError
from dtpo.session.loop.probe import MAX_SCALE_RETRIES, ProbeQueue, ProbeRequest

if TYPE_CHECKING:
    from torch import nn

    from dtpo.session.loop.switches import Switches


class ProbeSteps:
    """The probes asked for, and the pass under way.

    Args:
        switches: The settings a probe changes for its passes (and puts back).
    """

    def __init__(self, switches: Switches) -> None:
        self.switches = switches
        self.queue = ProbeQueue()
        # "batch", then "backward", while a probe pass is in the loop; None outside one (what the Session checks
        # before asking :meth:`backward` and :meth:`step`)
        self.state: str | None = None
        self._loss: torch.Tensor | None = None

    @property
    def pending(self) -> bool:
        """Whether probes wait to run before the next optimizer step."""
        return bool(self.queue.pending)

    @property
    def keep_next(self) -> bool:
        """Whether the next micro-batch is to be kept as the probe batch."""
        return self.queue.keep_next

    def keep_next_batch(self) -> None:
        """Keep a copy of the next micro-batch as the batch every probe runs on."""
        self.queue.keep_next = True

    def keep(self, batch: Any) -> None:
        """Keep a copy of ``batch`` as the probe batch."""
        self.queue.keep(batch)

    def request(self, request: ProbeRequest) -> None:
        """Queue a probe (see :meth:`~dtpo.session.session.Session.request_probe`).

        Raises:
            ConfigError: A compression but no DDP communication to compress.
        """
        if request.compression != "none" and self.switches.comm is None:
            raise ConfigError(f"compression {request.compression!r} needs DDP with more than one process")
        self.queue.pending.append(request)

    def run(self) -> Iterator[Any]:
        """Hand the kept batch to the training loop once per probe pass, each probe in its own setting."""
        queue = self.queue
        if queue.batch is None:
            raise RuntimeError("a probe needs a kept batch: call keep_probe_batch() before training")
        while queue.pending:
            request = queue.pending.popleft()
            with self.switches.trying(request.precision, request.compression, request.powersgd_rank,
                                      error_feedback=request.error_feedback):
                queue.begin(request)
                try:
                    done, retries = 0, 0
                    while done < request.passes:
                        queue.pass_started()
                        self.state = "batch"
                        yield queue.batch
                        if self.state is not None:
                            raise RuntimeError("call session.backward(loss) and session.step(optimizer) for every "
                                               "batch from session.batches()")
                        if queue.retry and retries < MAX_SCALE_RETRIES:
                            retries += 1
                            continue
                        done += 1
                finally:
                    self.state = None
            request.done(queue.finish())

    def backward(self, loss: torch.Tensor) -> bool:
        """The backward of a probe pass, unscaled by accumulation; ``False`` (nothing done) outside one."""
        if self.state != "batch":
            return False
        self.state = "backward"
        self.switches.precision.backward(loss)
        self._loss = loss.detach()
        return True

    def step(self, optimizer: torch.optim.Optimizer, model: nn.Module | None) -> bool:
        """The end of a probe pass: take the gradient, update nothing; ``False`` (nothing done) outside one."""
        if self.state != "backward":
            return False
        assert model is not None
        scaler = self.switches.precision.scaler
        scale = float(scaler.get_scale()) if scaler is not None else None
        taken = self.queue.pass_finished([p for p in model.parameters() if p.requires_grad], self._loss, scale)
        if not taken:
            assert scaler is not None and scale is not None
            scaler.update(scale / 2)
            self.queue.retry = True
        optimizer.zero_grad(set_to_none=True)
        self._loss = None
        self.state = None
        return True
