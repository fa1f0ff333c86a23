"""Gradient communication for DDP: when this rank's last gradient was ready, and how gradients are sent.

:class:`GradientComm` stamps the moment each parameter's gradient has been accumulated (a post-accumulate
hook on every parameter); the last stamp of a backward is when this rank's backward math ended, and
whatever backward spends after it is collective time not hidden behind compute (or waiting for a slower
rank). The communication itself stays DDP's own C++ all-reduce while the compression is ``none``: no Python
runs on the collective thread. Choosing a compression (:mod:`dtpo.distributed.compression`) registers one Python
comm hook, once, that calls the current compression's hook; later switches only swap what it calls.
"""

# No `from __future__ import annotations` here: DDP checks a hook's annotations against dist.GradBucket
# and torch.futures.Future at registration, and string annotations fail that check.

import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from dtpo.distributed.compression import (
    COMPRESSIONS,
    InnerHook,
    PowerSGDHook,
    changes_numerics,
    check_compression,
    inner_hook,
)

__all__ = ["COMPRESSIONS", "GradientComm", "changes_numerics"]

log = logging.getLogger(__name__)

class GradientComm:
    """Last-gradient stamps and switchable gradient compression for one DDP model.

    Use: ``comm = GradientComm(clock.mark)``; ``comm.attach(ddp_model, "none")`` once; ``comm.reset()``
    before the backward whose stamps matter (the last micro-step's); after it, ``comm.last_ready`` is the
    mark of the last gradient when ``comm.ready_count > 0``. ``comm.set_compression(...)`` between optimizer
    steps takes effect from the next backward; every rank must make the same switch at the same step.

    Cost: one Python call per parameter per backward for the stamps (about 2 us each on a small shared CPU
    machine). While the compression has always been ``none`` nothing else runs in Python, and DDP's C++
    path scales each gradient by 1/world size as it copies it into its bucket. DDP accepts one comm hook per
    model, so the first switch to another compression registers a Python dispatcher for good; from then on
    ``none`` is DDP's all-reduce written in Python (``default_hooks.allreduce_hook``: same numerics, but a
    separate pass over every bucket to divide it, and a Python callback on the collective thread). With a
    1024-wide MLP on 2 gloo ranks that costs about 4 % of step time (``benchmarks/overhead.py``'s notes).

    Args:
        mark: Returns a timestamp (the session clock's ``mark``).

    Attributes:
        last_ready: The mark taken when the latest gradient since :meth:`reset` was accumulated.
        ready_count: Gradients stamped since :meth:`reset` (> 0 means ``last_ready`` is valid).
        compression: The current compression, one of :data:`COMPRESSIONS`.
        powersgd_rank: PowerSGD's matrix approximation rank (meaningful with ``powersgd``).
    """

    def __init__(self, mark: Callable[[], Any]) -> None:
        self._mark = mark
        self.last_ready: Any = None
        self.ready_count = 0
        self.compression = "none"
        self.powersgd_rank = 1
        self.error_feedback = True
        self._model: DistributedDataParallel | None = None
        self._backend: str | None = None
        self._handles: list[Any] = []
        self._dispatching = False  # a Python comm hook is registered on the model
        self._inner: InnerHook | None = None
        self._powersgd: PowerSGDHook | None = None  # the PowerSGD in force (whether or not it has started)

    @property
    def attached(self) -> bool:
        """Whether a model is attached."""
        return self._model is not None

    def attach(self, model: DistributedDataParallel, compression: str = "none", powersgd_rank: int = 1) -> None:
        """Stamp ``model``'s gradients and communicate them with ``compression`` (once, before training).

        Raises:
            ConfigError: Unknown compression, PowerSGD rank out of range, or one the backend cannot do.
        """
        if self._model is not None:
            raise RuntimeError("GradientComm.attach() was already called; one GradientComm serves one model")
        backend = str(dist.get_backend(model.process_group))
        check_compression(compression, backend, powersgd_rank)
        self._model, self._backend = model, backend
        stamp = self._stamp
        self._handles = [p.register_post_accumulate_grad_hook(stamp)
                         for p in model.module.parameters() if p.requires_grad]
        self.compression = "none"  # what an unhooked DDP does, whatever was chosen before attaching
        self.set_compression(compression, powersgd_rank)

    def detach(self) -> None:
        """Stop stamping (a registered comm hook stays: DDP cannot remove one)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def reset(self) -> None:
        """Forget the previous backward's stamps."""
        self.last_ready = None
        self.ready_count = 0

    def set_compression(self, name: str, powersgd_rank: int = 1, error_feedback: bool = True) -> None:
        """Communicate gradients with ``name`` from the next backward on (``error_feedback=False`` turns off
        PowerSGD's error feedback: a deliberately worse compression, for testing a convergence guard).

        Switching to the setting already in force keeps its state (PowerSGD's error feedback); any other
        switch starts the new compression afresh. Before :meth:`attach` this only records the choice.

        Raises:
            ConfigError: Unknown compression, PowerSGD rank out of range, or one the backend cannot do.
        """
        check_compression(name, self._backend, powersgd_rank)
        if name == self.compression and (name != "powersgd" or (powersgd_rank, error_feedback)
                                          == (self.powersgd_rank, self.error_feedback)):
            return
        model = self._model
        if model is not None:
            if name != "none" and not self._dispatching:
                model.register_comm_hook(None, self._dispatch)
                self._dispatching = True
            if self._dispatching:
                self._inner = self._powersgd_when_ready(model, powersgd_rank, error_feedback) \
                    if name == "powersgd" else inner_hook(name, model.process_group)
        if name != "powersgd":
            self._powersgd = None
        log.debug("gradient compression %s -> %s", self.compression, name)
        self.compression, self.powersgd_rank, self.error_feedback = name, powersgd_rank, error_feedback

    def powersgd_state(self) -> dict[str, Any] | None:
        """PowerSGD's state in force (error feedback and warm-start factors of this rank), for a checkpoint;
        ``None`` with another compression."""
        return self._powersgd.state_dict() if self._powersgd is not None else None

    def load_powersgd_state(self, saved: dict[str, Any] | None) -> None:
        """Continue PowerSGD from a checkpoint's :meth:`powersgd_state` (after switching to the same PowerSGD).

        PowerSGD starts once DDP has settled its buckets, so the first step after a resume is all-reduced exactly,
        as at the start of any run; the restored error feedback is added from the next step on.
        """
        if saved is None or self._powersgd is None or self._model is None:
            return
        device = next(self._model.module.parameters()).device
        self._powersgd.load_state_dict(saved, device)

    def _stamp(self, param: torch.Tensor) -> None:
        self.last_ready = self._mark()
        self.ready_count += 1

    def _dispatch(self, state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        """The Python comm hook: hands each bucket to the current compression."""
        return self._inner(bucket)  # type: ignore[misc]

    def _powersgd_when_ready(self, model: DistributedDataParallel, rank: int, error_feedback: bool = True
                             ) -> InnerHook:
        """PowerSGD, with DDP's all-reduce until DDP has settled its buckets (after its first synced step).

        PowerSGD keeps error feedback per bucket, so it must not start before the bucket layout is final.
        """
        powersgd = PowerSGDHook(model.process_group, rank, in_order=self._backend != "nccl",
                                error_feedback=error_feedback)
        self._powersgd = powersgd
        plain = inner_hook("none", model.process_group)

        def hook(bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
            if not _buckets_final(model):
                return plain(bucket)
            if self._inner is hook:
                self._inner = powersgd  # settled for good: stop checking
            return powersgd(bucket)

        return hook


def _buckets_final(model: DistributedDataParallel) -> bool:
    """Whether DDP will keep its current buckets (it rebuilds them once, at the forward after the first sync)."""
    rebuilds = not getattr(model, "find_unused_parameters", False) or getattr(model, "static_graph", False)
    return not rebuilds or bool(getattr(model, "_has_rebuilt_buckets", True))
