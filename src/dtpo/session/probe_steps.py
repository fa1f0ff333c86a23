"""Probe steps as the Session runs them: the kept batch handed to the training loop once per probe pass, in
the probe's setting, and the gradient taken instead of an update (see :mod:`dtpo.session.probe`).

:class:`ProbeSteps` is a mixin of :class:`~dtpo.session.session.Session`: it uses the Session's precision,
gradient communication, model and loss, and its probe queue.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from dtpo.core.errors import ConfigError
from dtpo.session.precision import Precision
from dtpo.session.probe import MAX_SCALE_RETRIES, ProbeQueue, ProbeRequest

if TYPE_CHECKING:
    from torch import nn

    from dtpo.dist.comm_timing import GradientComm


class ProbeSteps:
    """The Session's probe steps: :meth:`keep_probe_batch`, :meth:`request_probe`, and the two hooks its
    ``batches``, ``backward`` and ``step`` call."""

    precision: Precision
    device: torch.device
    comm: GradientComm | None
    _probes: ProbeQueue
    _probe_state: str | None
    _model: nn.Module | None
    _loss: torch.Tensor | None

    def keep_probe_batch(self) -> None:
        """Keep a copy of the next micro-batch as the batch every probe runs on."""
        self._probes.keep_next = True

    def request_probe(self, request: ProbeRequest) -> None:
        """Run a probe (:mod:`dtpo.session.probe`) before the next optimizer step; every rank must ask for the
        same probes at the same step. ``request.done`` gets the result."""
        if request.compression != "none" and self.comm is None:
            raise ConfigError(f"compression {request.compression!r} needs DDP with more than one process")
        self._probes.pending.append(request)

    def _run_probes(self) -> Iterator[Any]:
        """Hand the kept batch to the training loop once per probe pass, each probe in its own setting."""
        queue = self._probes
        if queue.batch is None:
            raise RuntimeError("a probe needs a kept batch: call keep_probe_batch() before training")
        while queue.pending:
            request = queue.pending.popleft()
            saved_precision = self.precision
            saved_comm = (self.comm.compression, self.comm.powersgd_rank) if self.comm is not None else None
            self.precision = Precision(request.precision, self.device)
            if self.comm is not None:
                self.comm.set_compression(request.compression, request.powersgd_rank,
                                          error_feedback=request.error_feedback)
            queue.begin(request)
            try:
                done, retries = 0, 0
                while done < request.passes:
                    queue.pass_started()
                    self._probe_state = "batch"
                    yield queue.batch
                    if self._probe_state is not None:
                        raise RuntimeError("call session.backward(loss) and session.step(optimizer) for every "
                                           "batch from session.batches()")
                    if queue.retry and retries < MAX_SCALE_RETRIES:
                        retries += 1
                        continue
                    done += 1
            finally:
                self._probe_state = None
                self.precision = saved_precision
                if self.comm is not None and saved_comm is not None:
                    self.comm.set_compression("none")  # afresh: a probe must not leave error feedback behind
                    self.comm.set_compression(*saved_comm)
            request.done(queue.finish())

    def _finish_probe_pass(self, optimizer: torch.optim.Optimizer) -> None:
        """The end of a probe pass: take the gradient, update nothing."""
        assert self._model is not None
        scaler = self.precision.scaler
        scale = float(scaler.get_scale()) if scaler is not None else None
        taken = self._probes.pass_finished([p for p in self._model.parameters() if p.requires_grad], self._loss,
                                           scale)
        if not taken:
            assert scaler is not None and scale is not None
            scaler.update(scale / 2)
            self._probes.retry = True
        optimizer.zero_grad(set_to_none=True)
        self._loss = None
        self._probe_state = None
