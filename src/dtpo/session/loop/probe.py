"""Probe steps: a forward and backward on a kept batch in another setting, without an optimizer update.

The convergence guard (:mod:`dtpo.tune.guard`) compares the gradient a candidate precision or compression
produces with the exact one on the *same* batch and the *same* weights. A probe is that measurement: the
Session yields the kept batch from :meth:`~dtpo.session.session.Session.batches` in the candidate's setting,
the training loop computes its loss and calls ``backward`` and ``step`` as for any batch, and ``step`` takes
the (all-reduced) gradient instead of updating the model. The loop needs no change; probes are not
optimizer steps, are not timed as steps, and count toward no step target.

A compression with error feedback (PowerSGD) is probed over several passes on the same batch, and the
passes' gradients are averaged: what error feedback delivers over a few steps, which is how it earns its
keep. Probes start such a compression afresh and put the running one back afresh afterwards.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_map

MAX_SCALE_RETRIES = 12
"""A float16 probe pass whose gradient overflowed is run again at half the loss scale, at most this often."""


@dataclass(frozen=True)
class ProbeRequest:
    """One probe: the setting to probe in and how many passes to average.

    Attributes:
        precision: Precision of the probe's forward and backward.
        compression: Compression of its all-reduce.
        powersgd_rank: PowerSGD's rank (with ``powersgd``).
        error_feedback: PowerSGD's error feedback (only a test turns it off).
        passes: Passes on the kept batch, averaged.
        done: Called with the :class:`ProbeResult` on every rank.
    """

    precision: str
    compression: str
    powersgd_rank: int
    passes: int
    done: Callable[[ProbeResult], None]
    error_feedback: bool = True


@dataclass(frozen=True)
class ProbeResult:
    """What a probe measured on this rank.

    Attributes:
        request: The probe.
        gradient: The passes' mean gradient, every parameter's flattened into one float32 vector (this rank's
            shard under FSDP).
        loss: Mean loss of the passes.
        seconds: Mean wall time of a pass (forward, backward, all-reduce).
        finite: False when a pass's gradient held an infinity or a NaN.
    """

    request: ProbeRequest
    gradient: torch.Tensor
    loss: float
    seconds: float
    finite: bool


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (FSDP2), else the tensor itself."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if to_local is not None else tensor


class ProbeQueue:
    """Probes asked for, the kept batch they run on, and the passes of the probe under way."""

    def __init__(self) -> None:
        self.pending: deque[ProbeRequest] = deque()
        self.batch: object | None = None
        self.keep_next = False
        self.active: ProbeRequest | None = None
        self._sum: torch.Tensor | None = None
        self._losses: list[float] = []
        self._seconds: list[float] = []
        self._finite = True
        self._started = 0.0
        self.retry = False

    def keep(self, batch: object) -> None:
        """Keep a copy of ``batch`` as the probe batch (the loader may reuse its buffers)."""
        self.batch = tree_map(lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, batch)
        self.keep_next = False

    def begin(self, request: ProbeRequest) -> None:
        """Start collecting ``request``'s passes."""
        self.active, self._sum, self._losses, self._seconds, self._finite = request, None, [], [], True

    def pass_started(self) -> None:
        """A pass's batch is handed to the training loop."""
        self._started = time.perf_counter()
        self.retry = False

    def pass_finished(self, parameters: list[torch.nn.Parameter], loss: torch.Tensor | None,
                      scale: float | None) -> bool:
        """Take the gradient of a pass (divided by the loss ``scale`` when there is one); ``False`` when it
        overflowed under a loss scale, so the pass must run again at a lower scale."""
        grads = [_local(p.grad).float().reshape(-1) if p.grad is not None
                 else torch.zeros(_local(p).numel(), dtype=torch.float32, device=p.device) for p in parameters]
        flat = torch.cat(grads) if grads else torch.zeros(0)
        finite = bool(torch.isfinite(flat).all().item())
        if scale is not None:
            if not finite:
                return False
            flat = flat / scale
        self._finite &= finite
        self._sum = flat if self._sum is None else self._sum + flat
        self._losses.append(float(loss.detach().float().item()) if loss is not None else float("nan"))
        self._seconds.append(time.perf_counter() - self._started)
        return True

    def finish(self) -> ProbeResult:
        """The probe's result, after its last pass."""
        request = self.active
        assert request is not None and self._sum is not None
        n = len(self._losses)
        result = ProbeResult(request, self._sum / n, sum(self._losses) / n, sum(self._seconds) / n, self._finite)
        self.active, self._sum = None, None
        return result
