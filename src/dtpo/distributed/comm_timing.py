"""Gradient communication for DDP: when this rank's last gradient was ready, and how gradients are sent.

:class:`GradientComm` stamps the moment the last parameter gradient of a backward has been accumulated (a
post-accumulate hook); that is when this rank's backward math ended, and whatever backward spends after it is
collective time not hidden behind compute (or waiting for a slower rank). To learn which parameter's gradient
comes last it hooks every parameter for a couple of backwards, then keeps one hook, on that parameter: in a
static graph autograd accumulates the parameters in the same order every backward (the input layer's last). A
backward that leaves the watched parameter out, and a re-learning every :data:`RELEARN_EVERY` backwards, catch
a graph that changed; a graph whose last parameter keeps changing keeps every hook. The communication itself
stays DDP's own C++ all-reduce while the compression is ``none``: no Python runs on the collective thread.
Choosing a compression (:mod:`dtpo.distributed.compression`) registers one Python comm hook, once, that calls
the current compression's hook; later switches only swap what it calls.
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

__all__ = ["COMPRESSIONS", "LEARN_BACKWARDS", "RELEARN_EVERY", "GradientComm", "changes_numerics"]

log = logging.getLogger(__name__)

LEARN_BACKWARDS = 2
"""Consecutive backwards, each giving every hooked parameter a gradient, that must end with the same parameter
before :class:`GradientComm` hooks that parameter alone."""

RELEARN_EVERY = 500
"""Backwards between learning attempts: a watched parameter is re-learned this often (a graph whose order
changed), and after a failed attempt every parameter stays hooked this long before the next."""

# What the hooks do now (GradientComm._phase).
_OFF, _LEARNING, _ALL, _WATCHING = range(4)  # no hooks; every parameter hooked: learning, or given up; one hooked


class GradientComm:
    """Last-gradient stamps and switchable gradient compression for one DDP model.

    Use: ``comm = GradientComm(clock.mark)``; ``comm.attach(ddp_model, "none")`` once; ``comm.reset()``
    before every backward (each micro-step's: the hooking changes there, from what the previous backward
    stamped); after it, ``comm.last_ready`` is the mark of the last gradient when ``comm.ready_count > 0``.
    ``comm.set_compression(...)`` between optimizer steps takes effect from the next backward; every rank must
    make the same switch at the same step.

    Cost: one Python call per hooked parameter per backward (about 2 us each on a small shared CPU machine),
    and once learned one parameter is hooked. :meth:`attach` hooks every trainable parameter with a stamp that
    also notes which parameter it was; once the same parameter was the last stamped in
    :data:`LEARN_BACKWARDS` consecutive backwards that gave every parameter a gradient, only that parameter
    stays hooked (about 2 us per backward whatever the model's size). That is safe because in a static graph
    autograd accumulates the parameters in the same order every backward (the input layer's last), so the
    watched parameter's stamp is the backward's last gradient. A changed graph is caught by a backward that
    leaves the watched parameter out (its next :meth:`reset` sees no stamp: every parameter is hooked again,
    and that backward has no stamp, so the timer counts its tail as compute) and by re-learning every
    :data:`RELEARN_EVERY` backwards; a last parameter that keeps changing (a dynamic graph), or watches that
    keep missing, keep every parameter hooked (never wrong, only dearer) until the next attempt
    :data:`RELEARN_EVERY` backwards later. While the compression has always been ``none`` nothing else runs in
    Python, and DDP's C++ path scales each gradient by 1/world size as it copies it into its bucket. DDP accepts
    one comm hook per model, so the first switch to another compression registers a Python dispatcher for good;
    from then on ``none`` is DDP's all-reduce written in Python (``default_hooks.allreduce_hook``: same
    numerics, but a separate pass over every bucket to divide it, and a Python callback on the collective
    thread). With a 1024-wide MLP on 2 gloo ranks that costs about 4 % of step time
    (``benchmarks/overhead.py``'s notes).

    Args:
        mark: Returns a timestamp (the session clock's ``mark``).
        learn_backwards: :data:`LEARN_BACKWARDS`.
        relearn_every: :data:`RELEARN_EVERY`.

    Attributes:
        last_ready: The mark taken when the latest stamped gradient since :meth:`reset` was accumulated: the
            backward's last gradient.
        ready_count: Stamps since :meth:`reset` (> 0 means ``last_ready`` is valid): gradients accumulated while
            every parameter is hooked, and only the watched parameter's (1 per backward) once learned.
        compression: The current compression, one of :data:`COMPRESSIONS`.
        powersgd_rank: PowerSGD's matrix approximation rank (meaningful with ``powersgd``).
    """

    # slots: the stamp and reset() run inside and right before each backward, when the caches are cold; a slot is
    # read and written in the object itself, where an attribute in a __dict__ is one more place to fetch
    __slots__ = ("_mark", "last_ready", "ready_count", "compression", "powersgd_rank", "error_feedback", "_model",
                 "_backend", "_handles", "_dispatching", "_inner", "_powersgd", "_learn_backwards", "_relearn_every",
                 "_attempt_len", "_params", "_phase", "_last", "_seen", "_candidate", "_streak", "_tries", "_left",
                 "_misses")

    def __init__(self, mark: Callable[[], Any], learn_backwards: int = LEARN_BACKWARDS,
                 relearn_every: int = RELEARN_EVERY) -> None:
        if learn_backwards < 1 or relearn_every < 1:
            raise ValueError(f"learn_backwards and relearn_every must be >= 1, got {learn_backwards}, {relearn_every}")
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
        # Which parameter to stamp (see the class docstring): the parameters the hooks are on, the phase, ...
        self._learn_backwards, self._relearn_every = learn_backwards, relearn_every
        self._attempt_len = 4 * learn_backwards  # backwards a learning attempt may take before giving up
        self._params: list[torch.Tensor] = []
        self._phase = _OFF
        self._last = -1  # learning: the index of the parameter stamped last
        self._seen = bytearray()  # learning: 1 for each parameter stamped since reset()
        self._candidate = -1  # learning: the last parameter of the previous complete backward ...
        self._streak = 0  # ... and how many complete backwards in a row it ended
        self._tries = 0  # learning: backwards in this attempt
        self._left = 0  # watching, or every parameter hooked after giving up: backwards until the next attempt
        self._misses = 0  # watches in a row that ended with a backward leaving the watched parameter out

    @property
    def attached(self) -> bool:
        """Whether a model is attached."""
        return self._model is not None

    @property
    def hooked(self) -> int:
        """How many parameters are hooked now (all while learning, 1 once learned, 0 before attach/after detach)."""
        return len(self._handles)

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
        self._hook_parameters([p for p in model.module.parameters() if p.requires_grad])
        self.compression = "none"  # what an unhooked DDP does, whatever was chosen before attaching
        self.set_compression(compression, powersgd_rank)

    def detach(self) -> None:
        """Stop stamping (a registered comm hook stays: DDP cannot remove one)."""
        self._unhook()
        self._params = []
        self._phase = _OFF

    def reset(self) -> None:
        """Forget the previous backward's stamps; call it before every backward (the hooking changes here)."""
        count = self.ready_count
        self.last_ready = None
        self.ready_count = 0
        phase = self._phase
        if phase == _WATCHING:
            self._left -= 1
            if count == 0:  # a backward since the last reset() left the watched parameter out: the graph changed
                self._misses += 1
                if self._misses > 1:  # again: hook every parameter until the next attempt
                    self._hook_all(_ALL)
                else:
                    self._hook_all(_LEARNING)
                log.debug("gradient stamps: a backward left the watched parameter out; hooking every parameter")
            elif self._left <= 0:  # watched for RELEARN_EVERY backwards: check that the last one is still last
                self._misses = 0
                self._hook_all(_LEARNING)
        elif phase != _OFF:
            self._review(count)

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

    def _hook_parameters(self, params: list[torch.Tensor]) -> None:
        """Stamp the gradients of ``params`` (the trainable ones, each once): start learning which comes last."""
        self._unhook()
        self._params = list(params)
        self._misses = 0
        if self._params:
            self._hook_all(_LEARNING)
        else:
            self._phase = _OFF

    def _unhook(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _hook_all(self, phase: int) -> None:
        """Hook every parameter with a learning stamp; ``phase`` is ``_LEARNING`` (an attempt starts now) or
        ``_ALL`` (the next attempt starts in ``RELEARN_EVERY`` backwards)."""
        self._unhook()
        self._handles = [p.register_post_accumulate_grad_hook(self._learning_stamp(i))
                         for i, p in enumerate(self._params)]
        self._seen = bytearray(len(self._params))
        self._start(phase)

    def _start(self, phase: int) -> None:
        self._phase = phase
        self._candidate, self._streak, self._tries = -1, 0, 0
        self._left = self._relearn_every

    def _review(self, count: int) -> None:
        """At reset() with every parameter hooked: learn from the backward that ended (if one did)."""
        n = len(self._params)
        complete = count == n and 0 not in self._seen  # one backward that gave each parameter a gradient
        self._seen = bytearray(n)
        if self._phase == _ALL:
            self._left -= 1
            if self._left > 0:
                return
            self._start(_LEARNING)  # try again, from this backward
        self._tries += 1
        last = self._last
        if not complete:
            self._streak = 0
        elif self._streak and last == self._candidate:
            self._streak += 1
        else:
            self._candidate, self._streak = last, 1
        if self._streak >= self._learn_backwards:
            self._watch(last)
        elif self._tries >= self._attempt_len:
            log.debug("gradient stamps: the last gradient's parameter did not settle; every parameter stays hooked")
            self._start(_ALL)

    def _watch(self, index: int) -> None:
        """Hook only parameter ``index``, whose gradient came last, with the plain stamp."""
        self._unhook()
        self._handles = [self._params[index].register_post_accumulate_grad_hook(self._stamp)]
        self._phase = _WATCHING
        self._left = self._relearn_every

    def _learning_stamp(self, index: int) -> Callable[[torch.Tensor], None]:
        """The stamp while every parameter is hooked: it also notes that parameter ``index`` was stamped."""

        def stamp(param: torch.Tensor) -> None:
            self.last_ready = self._mark()
            self.ready_count += 1
            self._last = index
            self._seen[index] = 1  # self._seen is replaced at each reset()

        return stamp

    def _stamp(self, param: torch.Tensor) -> None:
        """The stamp on the watched parameter."""
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
