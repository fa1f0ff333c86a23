"""Where the agent listens inside torch, with the script unchanged.

* **Optimizer steps**: torch's global hooks (``register_optimizer_step_pre_hook`` / ``..._post_hook``), and
  ``GradScaler.step``, which may skip the optimizer on inf/NaN gradients (the iteration still happened).
* **Batches**: the data loader's iterator (``_BaseDataLoaderIter``), whichever loader made it; a loader that is
  not a torch ``DataLoader`` is not seen (the agent then counts steps only). Hugging Face Accelerate's loaders
  (``DataLoaderShard``, ``DataLoaderDispatcher``, ``SkipDataLoader``; the ``transformers`` Trainer's too) are heard
  at their own ``__iter__`` instead, once ``accelerate.data_loader`` is imported: they fetch one batch ahead (and
  skip or dispatch batches), so the batches they hand the script are the ones that count, and the inner
  iterator's are not reported.
* **Backward**: ``torch.autograd.backward`` (what ``Tensor.backward`` calls), for the end of compute.
* **DDP**: each ``DistributedDataParallel`` built, so gradient-ready stamps can be added to it. They are
  per-parameter hooks, not a comm hook: the one comm hook DDP allows stays the script's.
* **The end of a distributed script**: ``destroy_process_group()`` of the default group outside an error path
  (every rank calls it at the same point), when the ranks can still gather their records to rank 0.

Each listener call is a few microseconds of Python. :class:`TorchHooks` puts everything back on
:meth:`~TorchHooks.remove` (tests).
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils.data.dataloader import _BaseDataLoaderIter

from dtpo.core.post_import import when_imported

log = logging.getLogger(__name__)

ACCELERATE_LOADERS = ("DataLoaderShard", "DataLoaderDispatcher", "SkipDataLoader")
"""Accelerate's loader classes (``accelerate.data_loader``) whose ``__iter__`` the agent listens to."""

_muted = threading.local()  # depth > 0: inside an outer loader's fetch, the inner iterator's batches are not told


class Listener(Protocol):
    """What the hooks report to (:class:`~dtpo.agent.tracker.StepTracker`)."""

    def optimizer_entered(self, optimizer: Any) -> None:
        """An optimizer's ``step()`` (or ``GradScaler.step(optimizer)``) begins."""

    def optimizer_left(self) -> None:
        """The step that began last returned (or raised)."""

    def batch_requested(self, loader: int) -> None:
        """A data loader iterator is asked for its next batch (``loader``: which loader)."""

    def batch_arrived(self, loader: int, batch: Any) -> None:
        """It handed the batch out."""

    def batch_cancelled(self, loader: int) -> None:
        """It had none left (the epoch ended)."""

    def backward_starting(self) -> None:
        """``backward`` is called."""

    def backward_finished(self) -> None:
        """``backward`` returned."""

    def ddp_built(self, model: DistributedDataParallel) -> None:
        """A DDP model was built."""

    def group_ending(self) -> None:
        """The script is about to destroy its default process group (every rank, at the same point), with no
        exception in flight."""


class TorchHooks:
    """The agent's hooks in torch, installed together and removed together.

    Args:
        listener: Receives every event.
    """

    def __init__(self, listener: Listener) -> None:
        self.listener = listener
        self._handles: list[Any] = []
        self._patched: list[tuple[Any, str, Any]] = []

    def install(self) -> None:
        """Start listening."""
        listener = self.listener
        self._handles = [register_optimizer_step_pre_hook(lambda opt, args, kwargs: listener.optimizer_entered(opt)),
                         register_optimizer_step_post_hook(lambda opt, args, kwargs: listener.optimizer_left())]
        self._patch(torch.amp.GradScaler, "step", _scaler_step)
        self._patch(_BaseDataLoaderIter, "__init__", _iterator_init)
        self._patch(_BaseDataLoaderIter, "__next__", _iterator_next)
        self._patch(torch.autograd, "backward", _backward)
        self._patch(DistributedDataParallel, "__init__", _ddp_init)
        if torch.distributed.is_available():
            import torch.distributed.distributed_c10d as c10d

            self._patch(torch.distributed, "destroy_process_group", _destroy_process_group)
            self._patch(c10d, "destroy_process_group", _destroy_process_group)
        when_imported("accelerate.data_loader", self._accelerate_imported)

    def _accelerate_imported(self, module: Any) -> None:
        """Listen to Accelerate's loaders (``accelerate.data_loader`` was just imported)."""
        if not self._handles:  # removed before Accelerate came (the watch itself stays, harmless)
            return
        for name in ACCELERATE_LOADERS:
            owner = getattr(module, name, None)
            if owner is not None and "__iter__" in vars(owner):
                self._patch(owner, "__iter__", _outer_iter)

    def remove(self) -> None:
        """Stop listening and put torch back as it was."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        for owner, name, original in reversed(self._patched):
            setattr(owner, name, original)
        self._patched = []

    def _patch(self, owner: Any, name: str, wrap: Callable[[Listener, Any], Any]) -> None:
        original = getattr(owner, name)
        self._patched.append((owner, name, original))
        setattr(owner, name, functools.wraps(original)(wrap(self.listener, original)))


def _scaler_step(listener: Listener, original: Any) -> Any:
    def step(scaler: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        listener.optimizer_entered(optimizer)
        try:
            return original(scaler, optimizer, *args, **kwargs)
        finally:
            listener.optimizer_left()

    return step


def _iterator_init(listener: Listener, original: Any) -> Any:
    def __init__(iterator: Any, loader: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N807 - the method it wraps
        original(iterator, loader, *args, **kwargs)
        iterator._dtpo_loader = id(loader)

    return __init__


def _iterator_next(listener: Listener, original: Any) -> Any:
    def __next__(iterator: Any) -> Any:  # noqa: N807 - the method it wraps
        if getattr(_muted, "depth", 0):  # an outer loader fetching ahead: it tells what it hands out
            return original(iterator)
        loader = getattr(iterator, "_dtpo_loader", id(iterator))
        listener.batch_requested(loader)
        try:
            batch = original(iterator)
        except StopIteration:
            listener.batch_cancelled(loader)
            raise
        listener.batch_arrived(loader, batch)
        return batch

    return __next__


def _outer_iter(listener: Listener, original: Any) -> Any:
    """A loader that wraps a torch ``DataLoader`` and may fetch batches it does not hand out yet (or at all):
    its batches are told when it yields them, and its inner iterator is muted meanwhile."""

    def __iter__(loader: Any) -> Any:  # noqa: N807 - the method it wraps
        if getattr(_muted, "depth", 0):  # nested in another outer loader: that one tells
            yield from original(loader)
            return
        key = id(loader)
        inner = original(loader)
        try:
            while True:
                listener.batch_requested(key)
                _muted.depth = getattr(_muted, "depth", 0) + 1
                try:
                    batch = next(inner)
                except StopIteration:
                    listener.batch_cancelled(key)
                    return
                finally:
                    _muted.depth -= 1
                listener.batch_arrived(key, batch)
                yield batch
        finally:
            inner.close()

    return __iter__


def _backward(listener: Listener, original: Any) -> Any:
    def backward(*args: Any, **kwargs: Any) -> Any:
        listener.backward_starting()
        result = original(*args, **kwargs)
        listener.backward_finished()
        return result

    return backward


def _ddp_init(listener: Listener, original: Any) -> Any:
    def __init__(model: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N807 - the method it wraps
        original(model, *args, **kwargs)
        listener.ddp_built(model)

    return __init__


def _destroy_process_group(listener: Listener, original: Any) -> Any:
    def destroy_process_group(group: Any = None) -> None:
        if group is None and sys.exc_info()[0] is None:  # the whole world ends normally (not in an error path)
            listener.group_ending()
        original(group)

    return destroy_process_group
