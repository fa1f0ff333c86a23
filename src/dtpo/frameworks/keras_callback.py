"""``DtpoCallback`` for Keras 3: the training batches of ``Model.fit``, on any backend, as dtpo's step stream::

    from dtpo.keras import DtpoCallback

    model.fit(x, y, epochs=3, callbacks=[DtpoCallback()])

Under ``dtpo launch --framework keras`` the agent adds one to every ``Model.fit`` on its own
(:mod:`~dtpo.frameworks.keras_fit`); a fit that already has one keeps its own.

**Steps.** One step per training batch Keras dispatches (per execution, with ``steps_per_execution``). A step
is cut where the next training batch begins (``on_train_batch_begin``), where validation begins
(``on_test_begin``), or where the epoch or the fit ends: never in ``on_train_batch_end``. Keras hands
``on_train_batch_end`` to a thread of its own, without waiting for the step's loss, unless some callback
overrides that hook (on backends whose callbacks may run on threads, ``keras.src.backend.IS_THREAD_SAFE``: JAX,
PyTorch); overriding it would make Keras read every step's loss back on the host, which serialises the device.
So there this callback leaves the hook as Keras's default (on TensorFlow, where Keras reads every step's logs
back anyway, it hooks it only to tell a batch that trained from one that began as the data ran out). It waits
for the device itself only where a window of steps closes (:class:`FrameworkSteps`): on JAX for the state the
last step returned, on PyTorch's GPU for the device, on TensorFlow never (Keras reads each step's logs there).
Validation, ``evaluate`` and ``predict`` batches fall outside every step.

**Samples.** Keras callbacks never see the batch. At ``on_train_begin`` the callback finds the fit's
``EpochIterator`` (the ``epoch_iterator`` local of the backend trainer's ``fit``, a few frames up: read, never
changed) and counts, in this order of preference:

1. the batches that fit's training iterator hands to the train function (JAX, PyTorch: the data passes through
   Python), through a wrapper put on that one iterator object's ``_get_iterator`` and taken off at the end:
   exact for every kind of input (arrays, ``tf.data``, ``PyDataset``, generators, torch ``DataLoader``), the
   partial last batch included; a JAX array sharded over processes counts this process's rows;
2. arithmetic from the data adapter (TensorFlow, where the train function pulls its batches inside the graph):
   ``num_batches``, ``batch_size`` and the partial last batch of arrays (``ArrayDataAdapter``), or a
   ``tf.data.Dataset`` with a static batch dimension; under a ``tf.distribute`` strategy this process's share,
   TensorFlow splitting each global batch as evenly as it goes over the replicas in order (a partial batch of
   5 over 2 replicas: 3 and 2);
3. ``samples_per_step`` (``DTPO_SAMPLES_PER_STEP`` under the agent);
4. else 0: the record then shows steps per second and says samples were not counted.

Where Keras's internals differ from what this expects, counting falls back down the list, with one debug line.

**Ending.** ``on_train_end`` finishes the run. Keras has no hook for an exception inside ``fit``: the agent's
wrapper of ``Model.fit`` finishes it with the error; a callback you added yourself is finished by the next fit's
``on_train_begin`` or at interpreter exit, with the exception that ended the script where Python kept it
(``sys.last_value``), else a :class:`FitAborted`, so the record says ``failed`` with what it measured.
"""

from __future__ import annotations

import atexit
import functools
import logging
import math
import os
import sys
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import keras

from dtpo.core.config import TuneConfig
from dtpo.core.record import RunRecord
from dtpo.frameworks.steps import FrameworkSteps

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])
_FRAMES_UP = 8  # how far above on_train_begin the trainer's fit may sit (CallbackList, wrappers)


class FitAborted(RuntimeError):
    """``Model.fit`` stopped without reaching ``on_train_end`` (an exception inside it)."""


def _guarded(method: F) -> F:
    """A hook that, on a callback made with ``guarded=True``, turns dtpo off instead of raising into ``fit``."""

    @functools.wraps(method)
    def call(self: DtpoCallback, *args: Any, **kwargs: Any) -> Any:
        if not self.guarded:
            return method(self, *args, **kwargs)
        if self.broken:
            return None
        try:
            return method(self, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - the script must never fail because of dtpo
            self.broken = True
            log.warning("dtpo: stopped measuring Model.fit after an error of its own (%s: %s); the fit goes on",
                        type(exc).__name__, exc)
            self._abandon()
            return None

    return call  # type: ignore[return-value]


class DtpoCallback(keras.callbacks.Callback):
    """Reports each training batch of ``Model.fit`` to dtpo, on the TensorFlow, JAX or PyTorch backend.

    Args:
        run_dir: Where rank 0 writes ``record.json`` (default: ``$DTPO_RUN_DIR`` or ``runs/<run-id>``).
        tune: What to tune while training (GPU knobs: ``TuneConfig(knob="power-limit")``).
        samples_per_step: Samples of each step on this process, where dtpo cannot count them from the data
            (a generator on TensorFlow).
        guarded: Errors of dtpo's own are logged and end the measuring instead of failing the fit (what the
            agent uses).
        options: Further :class:`~dtpo.session.step_reporter.StepReporter` arguments (``warmup_steps``,
            ``window_steps``, ``energy``, ``progress``, ``summary``, ``run_config``, ...); progress is off by
            default (Keras shows its own).

    Attributes:
        steps: The running fit's :class:`FrameworkSteps` (``None`` before it starts and once it finished).
        record: The record of the last finished fit on rank 0.
    """

    def __init__(self, run_dir: str | os.PathLike[str] | None = None, tune: TuneConfig | None = None,
                 samples_per_step: int | None = None, *, guarded: bool = False, **options: Any) -> None:
        super().__init__()
        self.run_dir = run_dir
        self.tune = tune
        self.samples_per_step = samples_per_step
        self.guarded = guarded
        self.broken = False
        self.options = {"progress": False, **options}
        self.steps: FrameworkSteps | None = None
        self.record: RunRecord | None = None
        self._backend = keras.backend.backend()
        self._counter: _Counter = _Fixed(samples_per_step)
        self._open: int | None = None  # the begun batch (execution) not yet reported
        self._trained: int | None = None  # the last begun batch whose on_train_batch_end ran (where hooked)
        self._at_exit_registered = False
        self._hooks_end = not _async_callbacks(keras)
        if not self._hooks_end:  # Keras sees the default hook and keeps dispatching batch ends on its thread
            self.on_train_batch_end = super().on_train_batch_end  # type: ignore[method-assign]

    # -- Keras's hooks -------------------------------------------------------------------------------------------

    @_guarded
    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        """Start the run: find how to count samples, make the :class:`FrameworkSteps`, start the first step."""
        if self.steps is not None:  # the previous fit raised inside Keras: finish it as failed first
            self.finish(FitAborted("the previous Model.fit stopped without reaching on_train_end"))
        self.broken = False
        model = self.model
        per_execution = max(int(getattr(model, "steps_per_execution", 1) or 1), 1)
        self._counter = _counter_for(_find_epoch_iterator(model), model, self._backend, per_execution,
                                     self.samples_per_step)
        wait, gpu = _device_wait(self._backend)
        options = {"run_dir": self.run_dir, "tune": self.tune, **self.options}
        # lag=False: Keras on JAX donates each step's state to the next, so the state before the last is gone
        self.steps = FrameworkSteps(wait, f"keras/{self._backend}", gpu=gpu, total_steps=self._total_steps(),
                                    lag=False, **options)
        self._open = None
        if not self._at_exit_registered:
            atexit.register(self._at_exit)
            self._at_exit_registered = True
        self.steps.start()

    @_guarded
    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        """A new epoch: a new pass over the data where the fit does not carry the iterator across epochs."""
        self._counter.epoch_begins()

    @_guarded
    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        """The previous training batch's step ends here; this one's begins."""
        if self.steps is None:
            return
        if self._open is not None:
            self._close(next_begun=True)
        self._open = batch

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        """The batch trained (hooked only where Keras calls batch ends on the training thread anyway:
        TensorFlow); a batch that began but never ended (the data ran out) is no step."""
        self._trained = self._open  # Keras passes the execution's last batch here, its first to the begin hook

    @_guarded
    def on_test_begin(self, logs: dict[str, Any] | None = None) -> None:
        """Validation begins: the last training step of the epoch ends before it."""
        self._close_open()

    @_guarded
    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        """The epoch ended (without validation, its last step ends here)."""
        self._close_open()

    @_guarded
    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        """The fit ended: report the last step and write the record."""
        self._close_open()
        self.finish()

    # -- ending ------------------------------------------------------------------------------------------------

    def finish(self, error: BaseException | None = None) -> RunRecord | None:
        """End the running fit's run (after an error: this rank's partial record, ``failed``), once.

        Returns:
            The run record on rank 0, ``None`` elsewhere or where nothing runs.
        """
        steps, self.steps = self.steps, None
        self._open = None
        self._counter.remove()
        if self._at_exit_registered:
            atexit.unregister(self._at_exit)
            self._at_exit_registered = False
        if steps is None or steps.finished:
            return None
        self.record = steps.finish(error)
        return self.record

    def _at_exit(self) -> None:
        if self.steps is None:
            return
        error = getattr(sys, "last_value", None)
        try:
            self.finish(error if isinstance(error, BaseException) else FitAborted("Model.fit never returned"))
        except Exception as exc:  # noqa: BLE001 - at exit: say it, never a traceback
            log.warning("dtpo: could not write this rank's Keras record (%s: %s)", type(exc).__name__, exc)

    def _abandon(self) -> None:
        """After an error of dtpo's own: drop the run quietly, keep the fit going."""
        self._open = None
        self._counter.remove()
        steps, self.steps = self.steps, None
        if steps is not None and not steps.finished:
            try:
                steps.finish(RuntimeError("dtpo stopped measuring"))
            except Exception:  # noqa: BLE001 - already reported once
                log.debug("dtpo: could not end the abandoned Keras run", exc_info=True)

    # -- steps -------------------------------------------------------------------------------------------------

    def _close_open(self) -> None:
        if self.steps is not None and self._open is not None:
            self._close(next_begun=False)

    def _close(self, next_begun: bool) -> None:
        """Report the open batch as a step, unless it never trained (the data ran out when it began)."""
        assert self.steps is not None
        batch, self._open = self._open, None
        samples = self._counter.take(next_begun)
        known = (self.params or {}).get("steps")
        if not next_begun and (samples is None or (isinstance(known, int) and batch is not None and batch >= known)
                               or (self._hooks_end and self._trained != batch)):
            return
        self.steps.step(samples, result=self._result() if self.steps.reporter.settles_next else None)

    def _result(self) -> Any:
        """What to wait on for the step just cut, where a window closes (``None``: nothing to wait on); asked only
        there (gathering a model's state costs about as much as a small step's dispatch)."""
        if self._backend == "jax":
            state = getattr(self.model, "_jax_state", None)
            if state:
                return state
            return [getattr(v, "value", None) for v in getattr(self.model, "trainable_variables", [])] or None
        if self._backend == "torch":
            return True if self.steps is not None and self.steps.reporter.device.type == "cuda" else None
        return None

    def _total_steps(self) -> int | None:
        params = self.params or {}
        epochs, steps = params.get("epochs"), params.get("steps")
        if not isinstance(epochs, int) or not isinstance(steps, int) or steps <= 0:
            return None
        per_execution = max(int(getattr(self.model, "steps_per_execution", 1) or 1), 1)
        return epochs * math.ceil(steps / per_execution)


def _async_callbacks(keras: Any) -> bool:
    """Whether Keras may run ``on_train_batch_end`` on a thread of its own (its backend is thread-safe)."""
    try:
        from keras.src import backend

        return bool(backend.IS_THREAD_SAFE)
    except (ImportError, AttributeError):
        return keras.backend.backend() != "tensorflow"


# -- the device ----------------------------------------------------------------------------------------------------

def _device_wait(backend: str) -> tuple[Callable[[Any], Any], bool]:
    """How to wait for the backend's device, and whether it computes on a GPU."""
    if backend == "jax":
        import jax

        def wait_jax(result: Any) -> None:
            try:
                jax.block_until_ready(result)
            except (RuntimeError, ValueError):  # a buffer a later step consumed: that step waits instead
                log.debug("keras/jax: the awaited state was consumed already", exc_info=True)

        return wait_jax, jax.devices()[0].platform == "gpu"
    if backend == "tensorflow":
        import tensorflow as tf

        return (lambda result: None), bool(tf.config.list_physical_devices("GPU"))
    if backend == "torch":
        import torch

        gpu = torch.cuda.is_available()
        return (lambda result: torch.cuda.synchronize() if gpu else None), gpu
    return (lambda result: None), False


# -- samples -------------------------------------------------------------------------------------------------------

class _Counter:
    """Samples of each step on this process."""

    def epoch_begins(self) -> None:
        """A new epoch begins."""

    def take(self, next_begun: bool) -> int | None:
        """The samples of the step being cut (``None``: it had no batch); ``next_begun``: cut by the next batch."""
        raise NotImplementedError

    def remove(self) -> None:
        """Take off whatever was put on Keras's objects."""


class _Fixed(_Counter):
    """``samples_per_step`` for every step, else 0 (not counted)."""

    def __init__(self, samples: int | None) -> None:
        self.samples = samples or 0

    def take(self, next_begun: bool) -> int | None:
        return self.samples


class _Pulled(_Counter):
    """Counts the batches fit's training iterator hands out (JAX, PyTorch: pulled in Python).

    PyTorch pulls a step's batch before ``on_train_batch_begin``, JAX inside the train function: both are in the
    queue when the next batch begins, and a step takes its ``per_execution`` batches from its front.
    """

    def __init__(self, epoch_iterator: Any, per_execution: int) -> None:
        self.iterator = epoch_iterator
        self.per_execution = per_execution
        self.queue: deque[int] = deque()
        original = epoch_iterator._get_iterator

        def counted() -> Iterator[Any]:
            for batch in original():
                self.queue.append(local_samples(batch))
                yield batch

        epoch_iterator._get_iterator = counted  # this object only; ``remove`` takes it off

    def take(self, next_begun: bool) -> int | None:
        count = self.per_execution if next_begun else len(self.queue)
        taken = [self.queue.popleft() for _ in range(min(count, len(self.queue)))]
        if not taken:
            return 0 if next_begun else None
        return sum(taken)

    def remove(self) -> None:
        self.iterator.__dict__.pop("_get_iterator", None)


class _Arithmetic(_Counter):
    """Batch sizes from the data adapter (TensorFlow): every batch ``batch_size``, the last of each pass over the
    data ``partial``, this process's share of each under a ``tf.distribute`` strategy."""

    def __init__(self, epoch_iterator: Any, batch_size: int, num_batches: int, partial: int,
                 per_execution: int, share: Callable[[int], int]) -> None:
        self.iterator = epoch_iterator
        self.batch_size, self.num_batches, self.partial = batch_size, num_batches, partial
        self.per_execution = per_execution
        self.share = share
        self.position = 0

    def epoch_begins(self) -> None:
        if not getattr(self.iterator, "steps_per_epoch", None):  # a fresh pass over the data every epoch
            self.position = 0

    def take(self, next_begun: bool) -> int | None:
        first = self.position
        last = min(first + self.per_execution, self.num_batches)
        self.position = 0 if last >= self.num_batches else last
        sizes = [self.partial if i == self.num_batches - 1 and self.partial else self.batch_size
                 for i in range(first, last)]
        return sum(self.share(size) for size in sizes)


def _counter_for(epoch_iterator: Any, model: Any, backend: str, per_execution: int,
                 samples_per_step: int | None) -> _Counter:
    """The best way to count this fit's samples (see the module's docstring)."""
    if epoch_iterator is None:
        log.debug("keras: fit's epoch iterator not found; samples %s",
                  "from samples_per_step" if samples_per_step else "not counted")
        return _Fixed(samples_per_step)
    if backend in ("jax", "torch") and callable(getattr(epoch_iterator, "_get_iterator", None)):
        return _Pulled(epoch_iterator, per_execution)
    adapter = getattr(epoch_iterator, "data_adapter", None)
    sizes = _adapter_sizes(adapter)
    if sizes is not None:
        batch_size, num_batches, partial = sizes
        return _Arithmetic(epoch_iterator, batch_size, num_batches, partial, per_execution,
                           _share(getattr(model, "distribute_strategy", None)))
    log.debug("keras: %s does not say its batch sizes; samples %s", type(adapter).__name__,
              "from samples_per_step" if samples_per_step else "not counted")
    return _Fixed(samples_per_step)


def _adapter_sizes(adapter: Any) -> tuple[int, int, int] | None:
    """``(batch_size, num_batches, partial)`` where the adapter knows every batch's size exactly."""
    try:
        name = type(adapter).__name__
        batch_size, num_batches = adapter.batch_size, adapter.num_batches
        if not isinstance(batch_size, int) or not isinstance(num_batches, int) or batch_size <= 0 or num_batches <= 0:
            return None
        if name == "ArrayDataAdapter":
            return batch_size, num_batches, int(adapter.partial_batch_size or 0)
        if name == "TFDatasetAdapter":  # a static batch dimension: every batch has it
            return batch_size, num_batches, 0
    except Exception:  # noqa: BLE001 - another Keras: not counted
        log.debug("keras: cannot read the data adapter's sizes", exc_info=True)
    return None


def _share(strategy: Any) -> Callable[[int], int]:
    """This process's part of a global batch under a ``tf.distribute`` strategy (all of it without one)."""
    try:
        replicas = int(strategy.num_replicas_in_sync)
        local = len(strategy.extended.worker_devices)
        resolver = getattr(strategy, "cluster_resolver", None)
        task = int(getattr(resolver, "task_id", 0) or 0) if resolver is not None else 0
    except Exception:  # noqa: BLE001 - no strategy, or another TensorFlow: the whole batch is this process's
        return lambda size: size
    if replicas <= local:
        return lambda size: size
    mine = range(task * local, task * local + local)

    def share(size: int) -> int:
        per, extra = divmod(size, replicas)
        return sum(per + (1 if replica < extra else 0) for replica in mine)

    return share


def local_samples(batch: Any) -> int:
    """Samples in a batch on this process: the leading dimension of its first array (of a JAX array sharded over
    processes, the rows this process holds); 0 where it holds none."""
    leaf = _first_array(batch)
    if leaf is None:
        return 0
    if getattr(leaf, "is_fully_addressable", True) is False:
        rows = {(shard.index[0].start, shard.index[0].stop) for shard in leaf.addressable_shards if shard.index}
        return sum((stop if stop is not None else leaf.shape[0]) - (start or 0) for start, stop in rows)
    shape = getattr(leaf, "shape", None)
    return int(shape[0]) if shape else 0


def _first_array(batch: Any) -> Any:
    if hasattr(batch, "shape") and not isinstance(batch, type):
        return batch
    items = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, list | tuple) else ()
    for item in items:
        found = _first_array(item)
        if found is not None:
            return found
    return None


def _find_epoch_iterator(model: Any) -> Any:
    """The running fit's ``EpochIterator``: the ``epoch_iterator`` local of the trainer's ``fit`` for ``model``,
    a few frames above ``on_train_begin`` (``None`` where Keras does it otherwise)."""
    frame = sys._getframe(1)
    try:
        for _ in range(_FRAMES_UP):
            frame = frame.f_back
            if frame is None:
                return None
            local = frame.f_locals
            found = local.get("epoch_iterator")
            if found is not None and local.get("self") is model and hasattr(found, "data_adapter"):
                return found
        return None
    finally:
        del frame
