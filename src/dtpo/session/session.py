"""``dtpo.Session``: data-parallel training that measures where every worker's time goes.

A plain DDP loop becomes a dtpo loop by changing about five lines::

    session = dtpo.Session(precision="bf16-mixed", grad_accum=2)   # joins torchrun's process group
    model = session.wrap(Net())                                     # DDP (or FSDP2), precision
    optimizer = torch.optim.AdamW(model.parameters())
    for x, y in session.batches(loader, steps=1000):                # times data wait, moves to device
        loss = F.cross_entropy(model(x), y)
        session.backward(loss)                                      # scaled backward, timed
        session.step(optimizer)                                     # steps at the end of each window
    session.finish()                                                # gathers ranks, writes the record

The Session is the richest producer of the step stream (:mod:`dtpo.core.steps`): a
:class:`~dtpo.session.loop.timer.StepTimer` gives every mark of each step, and a
:class:`~dtpo.session.stream_run.StreamRun` does the rest, as for any producer: the
:class:`~dtpo.session.lifecycle.RunLifecycle` (run dir, record, partial flushes, signals, gather, save) and the
:class:`~dtpo.core.callbacks.Callback` s (energy windows, GPU knobs, progress, partial flushes, and whatever the
user passes) that its :class:`~dtpo.core.stream.StepStream` feeds with steps and windows. The knobs a tuner
turns (precision, gradient accumulation, gradient compression) are held by its
:class:`~dtpo.session.loop.switches.Switches` and can change between optimizer steps through
:meth:`Session.set_precision`, :meth:`Session.set_grad_accum` and :meth:`Session.set_compression` (the
Session's between-steps surface, :mod:`dtpo.session.between_steps`);
``dtpo.Session(tune=dtpo.TuneConfig(knob="precision,grad-accum,compression", cost="energy"))`` has dtpo turn
them itself, toward the cost, with every numerics change guarded (:mod:`dtpo.session.tuning.job_knobs`) on probe
steps (:class:`~dtpo.session.loop.probe_steps.ProbeSteps`). :meth:`Session.state_dict` is what checkpoints keep of
the Session itself: step, switches, gradient scaler and data position.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map

from dtpo.core.callbacks import Callback
from dtpo.core.config import (
    CheckpointConfig,
    EnergyConfig,
    KnobConfig,
    RunConfig,
    SessionConfig,
    TuneConfig,
)
from dtpo.core.errors import ConfigError
from dtpo.core.logs import configure_logging
from dtpo.core.record import RankRecord, RunRecord
from dtpo.distributed.comm_timing import GradientComm
from dtpo.distributed.process_group import join
from dtpo.distributed.wrap import wrap_model
from dtpo.session.between_steps import BetweenSteps
from dtpo.session.checkpoint.checkpoints import Checkpoints
from dtpo.session.environment import describe_device
from dtpo.session.lifecycle import agree_on_run_dir
from dtpo.session.loop.batch_size import count_samples
from dtpo.session.loop.bookkeeping import BookkeepingCounter
from dtpo.session.loop.clock import clock_for
from dtpo.session.loop.divergence import DivergedError
from dtpo.session.loop.mfu import peak_flops
from dtpo.session.loop.micro_step import MicroStepContexts
from dtpo.session.loop.precision import cast_forward
from dtpo.session.loop.probe_steps import ProbeSteps
from dtpo.session.loop.rebatch import RecutBatches
from dtpo.session.loop.shares import BatchShares
from dtpo.session.loop.slowdown import ComputeSlowdown
from dtpo.session.loop.step_ends import StepEnds
from dtpo.session.loop.switches import Switches
from dtpo.session.loop.timer import StepTimer, read_loss
from dtpo.session.stream_run import StreamProducer, StreamRun, new_record

log = logging.getLogger(__name__)


class Session(BetweenSteps, StreamProducer):
    """One rank's view of a data-parallel training run.

    Args:
        precision: ``"32-true"``, ``"bf16-mixed"`` or ``"16-mixed"``.
        strategy: ``"ddp"`` or ``"fsdp"``.
        grad_accum: Micro-batches per optimizer step.
        warmup_steps: Optimizer steps left out of totals.
        max_grad_norm: Clip gradients to this norm before each optimizer step.
        compression: Gradient compression in DDP's comm hook (``none``, ``fp16``, ``bf16``, ``powersgd``).
        powersgd_rank: Rank of PowerSGD's approximation.
        window_steps: Measured optimizer steps per window (what ``on_window_end`` callbacks receive).
        run_dir: Where rank 0 writes ``record.json`` (default: ``$DTPO_RUN_DIR`` or ``runs/<run-id>``).
        device: Device to compute on (default: ``cuda:<local_rank>`` or the CPU).
        backend: Collective backend (default: ``nccl`` on CUDA, else ``gloo``).
        config: Extra settings to keep in the record (under ``config["user"]``).
        energy: Measure energy (``True``/``False``, or an :class:`EnergyConfig`). GPUs through NVML, CPUs
            through RAPL or, where no counter exists, a model labelled estimated.
        knobs: GPU power limit / SM clock to hold for the run on this rank's GPU (restored at the end, on a
            signal, or by the next dtpo start after a crash); see :class:`KnobConfig`.
        tune: What to tune while training (:class:`TuneConfig`): e.g. ``TuneConfig(knob="precision,grad-accum,
            compression", cost="energy")`` for the job knobs, numerics guarded.
        callbacks: Your own :class:`~dtpo.core.callbacks.Callback` s, called after the built-in energy and
            knob callbacks.
        progress: Show progress on rank 0.
        summary: Print the summary table on rank 0 at :meth:`finish` (``dtpo launch`` prints it instead).
        count_flops: Count model FLOPs on the first step, for MFU.
        flush_every: Write this rank's partial record every N steps.
        checkpoint: Checkpoints and resuming (:class:`CheckpointConfig`, see :mod:`dtpo.session.checkpoint`);
            they need the optimizer: call :meth:`attach` before :meth:`batches`.
        run_config: A whole :class:`~dtpo.core.config.RunConfig` (what :meth:`from_config` passes); its
            session, energy, knob, tune and checkpoint sections replace the arguments above and it is kept in
            the record.
    """

    def __init__(self, precision: str = "32-true", strategy: str = "ddp", grad_accum: int = 1,
                 warmup_steps: int = 2, *, max_grad_norm: float | None = None, compression: str = "none",
                 powersgd_rank: int = 1, window_steps: int = 10, run_dir: str | os.PathLike[str] | None = None,
                 device: torch.device | str | None = None, backend: str | None = None,
                 config: dict[str, Any] | None = None, energy: bool | EnergyConfig = True,
                 knobs: KnobConfig | None = None, tune: TuneConfig | None = None,
                 callbacks: Sequence[Callback] = (), progress: bool = True,
                 summary: bool = True, count_flops: bool = True, flush_every: int = 50,
                 checkpoint: CheckpointConfig | None = None, run_config: RunConfig | None = None) -> None:
        configure_logging()
        if run_config is None:
            run_config = RunConfig(
                session=SessionConfig(precision=precision, strategy=strategy, grad_accum=grad_accum,
                                      compression=compression, powersgd_rank=powersgd_rank,
                                      warmup_steps=warmup_steps, window_steps=window_steps,
                                      max_grad_norm=max_grad_norm, count_flops=count_flops,
                                      flush_every=flush_every),
                energy=energy if isinstance(energy, EnergyConfig) else EnergyConfig(enabled=bool(energy)),
                knobs=knobs or KnobConfig(), tune=tune or TuneConfig(), checkpoint=checkpoint or CheckpointConfig())
        self.run_config = run_config
        self.config: SessionConfig = run_config.session
        cfg = self.config
        super().__init__(join(device, backend or run_config.launch.backend))
        self._clock = clock_for(self.device)
        ddp = self.ctx.distributed and cfg.strategy == "ddp"
        self.comm: GradientComm | None = GradientComm(self._clock.mark) if ddp else None
        self._switches = Switches(cfg, self.device, self.comm, self.ctx.world_size, announce=self.ctx.rank == 0)
        self.timer = StepTimer(self._clock, self.comm, tail_measured=cfg.strategy == "ddp",
                               distributed=self.ctx.distributed)
        self.run_dir = agree_on_run_dir(self.ctx, run_dir)
        record = new_record(self.ctx, self.run_dir, run_config, config)
        peak = peak_flops(self.device, self.precision.compute_dtype) if cfg.count_flops else None
        rank = RankRecord(self.ctx.rank, self.ctx.local_rank, self.ctx.node, describe_device(self.device),
                          peak_flops=peak.to_dict() if peak else None)
        self._run = StreamRun(self, self.ctx, self.run_dir, run_config, record, rank, callbacks, progress,
                              summary, settings=self._switches.values)
        self._step_ends = StepEnds(self.timer, self._run, self.ctx.rank)
        self.target_steps: int | None = None
        self._model: nn.Module | None = None
        self._started = False
        self._step = 0
        self._micro = 0
        self._loss: torch.Tensor | float | None = None  # the step's loss so far (a float: read on the host)
        self._on_host = self.device.type == "cpu"  # batches stay where they are; losses are read at once
        self._micro_steps = MicroStepContexts(self.ctx.distributed, cfg.strategy)  # no-sync, FLOP counting
        self._recut = RecutBatches()  # micro-batches re-cut from this step's loader batches
        self._probes = ProbeSteps(self._switches)
        # virtual GPUs with slow steps: a labelled wait inside compute (set by their callback, CPU clock only)
        self.compute_slowdown: ComputeSlowdown | None = None
        # --tune rebalance: batches() gets the global batch and hands this rank its share (set by the rebalancer)
        self.batch_shares = BatchShares(self.ctx.rank, self.ctx.world_size) if run_config.tune.rebalance else None
        self.start_step = 0  # the step this attempt started at: more than 0 after resuming from a checkpoint
        self.checkpoints = Checkpoints(run_config.checkpoint, self.ctx, self.run_dir, record.attempt)
        self._saves_when_due = self.checkpoints.periodic  # whether a step's end asks the checkpoints
        self._warmup_steps = cfg.warmup_steps  # read at every step's end (the config is not)
        # the CPU time of the Session's own code per measured step (its entry points less the user's work in them)
        self.bookkeeping = BookkeepingCounter()

    @classmethod
    def from_config(cls, config: RunConfig, *, callbacks: Sequence[Callback] = (), **kwargs: Any) -> Session:
        """A Session for the whole configuration tree (what ``dtpo train`` workers use).

        Args:
            config: The run's configuration; it is kept in the record as given.
            callbacks: Your own callbacks.
            kwargs: ``device``, ``progress``, ``summary`` or ``config`` (extra settings for the record).
        """
        return cls(run_config=config, run_dir=config.launch.run_dir, callbacks=callbacks, **kwargs)

    # -- where this rank is ---------------------------------------------------------------------------

    @property
    def step_count(self) -> int:
        """Optimizer steps done so far."""
        return self._step

    @property
    def rank_record(self) -> RankRecord:
        """This rank's measurements so far, with every finished step's record (reading it builds the records that
        wait for their window's end: :meth:`settle_steps`)."""
        self.settle_steps()
        return self._run.lifecycle.rank

    @property
    def model(self) -> nn.Module | None:
        """The model :meth:`wrap` returned (``None`` before)."""
        return self._model

    # -- the training loop ----------------------------------------------------------------------------

    def wrap(self, module: nn.Module) -> nn.Module:
        """Move a model to this rank's device, make it data parallel and apply the precision.

        Returns:
            The module to train: a ``DistributedDataParallel``, an FSDP2-sharded module, or the module
            itself when running alone.
        """
        if self._model is not None:
            raise RuntimeError("Session.wrap() was already called; one Session trains one model")
        cfg = self.config
        self.checkpoints.wrapped(module)
        model = wrap_model(module, self.ctx, cfg.strategy, self.comm, compression=cfg.compression,
                           powersgd_rank=cfg.powersgd_rank)
        switches = self._switches
        # the forward under autocast once a mixed precision is in force (at once, or at the first switch to one)
        switches.when_autocast(lambda: cast_forward(model, lambda: switches.precision))
        trainable = [p for p in module.parameters() if p.requires_grad]
        self.lifecycle.rank.model = {
            "parameters": sum(p.numel() for p in trainable),
            "gradient_bytes": sum(p.numel() * p.element_size() for p in trainable),
            "matrix_shapes": [list(p.shape) for p in trainable],
            "bucket_cap_bytes": getattr(model, "bucket_bytes_cap", None)}
        self._model = model
        return model

    def attach(self, *optimizers: torch.optim.Optimizer, **state: Any) -> None:
        """Name what checkpoints save besides the model: its optimizers, and any other object with
        ``state_dict()`` / ``load_state_dict()`` (an LR scheduler: ``attach(opt, scheduler=sched)``). Call it
        before :meth:`batches` when checkpoints are on; a resume restores them too."""
        self.checkpoints.attach(optimizers, state)

    def resume(self) -> int:
        """Load the checkpoint to resume from now, rather than when :meth:`batches` starts (every rank together;
        it needs :meth:`wrap` and :meth:`attach` first). A script that loops over epochs can then start at the
        right one. Returns the step training continues at (0 without a checkpoint)."""
        step = self.checkpoints.resume(self)
        return step if step is not None else 0

    def save_checkpoint(self) -> None:
        """Save a checkpoint now, between optimizer steps (every rank together); ``--checkpoint-every`` saves
        by itself. Needs checkpoints configured (at least ``CheckpointConfig(dir=...)``)."""
        if not self.checkpoints.enabled:
            raise RuntimeError("no checkpoints configured: pass dtpo.Session(checkpoint=dtpo.CheckpointConfig(...))")
        if not self._between_steps():
            raise RuntimeError("a checkpoint can be saved only between optimizer steps")
        self.checkpoints.save(self)

    def batches(self, iterable: Iterable[Any], steps: int | None = None) -> Iterator[Any]:
        """Yield micro-batches, on this rank's device, until ``steps`` more optimizer steps are done.

        With ``grad_accum = k`` every k consecutive micro-batches make one optimizer step. The time spent
        getting each batch is the step's data wait. Call :meth:`backward` and :meth:`step` for each one.

        After a resume from a checkpoint the first call continues where the checkpoint was taken: ``steps``
        still counts from the start of training, and the iterable is moved to the saved position (replayed, or
        through its own ``load_state_dict``).

        Under ``--tune rebalance`` (:attr:`batch_shares`) the iterable yields each step's *global* batch, the same
        on every rank, and this rank gets its share of it (:mod:`dtpo.session.loop.shares`).

        Args:
            iterable: A DataLoader or any iterable of batches (tensors, tuples, dicts of tensors).
            steps: Optimizer steps to run; ``None`` runs until the iterable ends.
        """
        if self._model is None:
            raise RuntimeError("call Session.wrap(model) before Session.batches()")
        if steps is not None and steps < 0:
            raise ConfigError(f"steps must be >= 0, got {steps}")
        target = None if steps is None else self._step + steps
        if not self._started:
            self._started = True
            self.target_steps = target
            self.checkpoints.resume(self)
            self._dispatch("on_train_start")
            self.checkpoints.restore_callbacks(self)
        iterator = self.checkpoints.iterate(iterable)
        # read once per call, not per micro-batch: what the loop below needs of the Session
        timer, probes, switches, stream = self.timer, self._probes, self._switches, self._run.stream
        probe_queue = probes.queue
        bookkeeping = self.bookkeeping  # around each stretch of the Session's own code, on counted steps
        device, on_host = self.device, self._on_host
        micro_steps, warmup_steps = self._micro_steps, self._warmup_steps
        micro_contexts = True  # a call that starts inside a step: let the contexts decide
        while target is None or self._step < target:
            first = self._micro == 0
            if first:
                if probe_queue.pending:  # probe passes: the tuner's work, before the step begins
                    yield from probes.run()
                step, start = self._step, self.start_step
                bookkeeping.begin_step(step, step < start + warmup_steps)  # enters the step's stretch if counted
                counting = bookkeeping.counting
                # no-sync / FLOP counting contexts only with accumulation or on the first step (FLOPs counted)
                micro_contexts = switches.grad_accum > 1 or step == start
                if stream.begin_listeners or len(stream.callbacks) != stream.listened:  # else it calls nothing
                    stream.step_begin(step)
            else:
                counting = bookkeeping.counting
                if counting:
                    bookkeeping.enter()
            timer.batch_requested(first)
            plain = self.batch_shares is None and switches.grad_accum == switches.loader_batches
            if counting:
                bookkeeping.leave()
            try:
                batch = next(iterator) if plain else self._next_micro_batch(iterator)
            except StopIteration:
                self.settle_steps()
                return
            if counting:
                bookkeeping.enter()
            if not on_host:
                batch = _to_device(batch, device)
            if probe_queue.keep_next:
                probes.keep(batch)
            # count_samples' common case written out ((inputs, targets) of tensors: the first one's leading size), a
            # call less where the caches are cold; anything else goes through it
            inputs = batch[0] if (type(batch) is tuple or type(batch) is list) and batch else batch
            shape = inputs.shape if type(inputs) is torch.Tensor else None
            timer.batch_arrived(int(shape[0]) if shape else count_samples(batch))
            if micro_contexts:
                accum = switches.grad_accum
                micro_steps.enter(self._model, accum, self._micro == accum - 1,
                                  self._step == self.start_step and self.config.count_flops)
            if counting:
                bookkeeping.leave()
            yield batch
            if timer.batch_ready is not None:
                raise RuntimeError("call session.backward(loss) for every batch from session.batches()")
            if timer.backward_done:
                raise RuntimeError("call session.step(optimizer) after session.backward(loss)")
        self.settle_steps()  # the last steps' records, in the loop (a NaN among them raises where the loop runs)

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of a micro-batch's loss, scaled by ``1 / grad_accum`` so k micro-batches equal one
        k-times larger batch, and through the gradient scaler for ``16-mixed``."""
        probes = self._probes
        if probes.state is not None and probes.backward(loss):  # a probe pass's
            return
        bookkeeping = self.bookkeeping
        counting = bookkeeping.counting
        if counting:
            bookkeeping.enter()
        timer = self.timer
        if timer.batch_ready is None:
            raise RuntimeError("session.backward() must follow a batch from session.batches()")
        switches = self._switches
        accum = switches.grad_accum
        last = self._micro == accum - 1
        if timer.stamps is not None:  # the previous backward's gradient stamps forgotten (timer.backward_starting)
            timer.stamps.reset()
        if self.compute_slowdown is not None and isinstance(timer.batch_ready, float):
            self.compute_slowdown.wait(timer.batch_ready)
        # on the host the value of a step's only loss is read before backward: it is ready, and the read costs less
        # here than after backward, which leaves the caches cold (about 10 us less a step under DDP on a small CPU
        # machine, benchmarks/overhead.py's model)
        value = loss.tolist() if accum == 1 and self._on_host else None  # read_loss's float32 case written out
        if value is not None and (type(value) is not float or loss.dtype is not torch.float32):
            value = read_loss(loss)
        try:
            scaled = loss / accum if accum > 1 else loss
            if self.batch_shares is not None:
                scaled = scaled * self.batch_shares.loss_weight  # DDP's mean over ranks: the global batch's mean
            if counting:
                bookkeeping.leave()
            switches.precision.backward(scaled)
        finally:
            if counting:
                bookkeeping.enter()
            if self._micro_steps.open:
                self._micro_steps.exit()
        timer.backward_finished(last)
        if accum == 1:  # on the host its value, read above: one operation, where keeping a tensor to read is two; on
            # a device detached (reading it would wait for the device), read as the step ends or with its window. No
            # reference to the graph stays: it dies where the loop drops the loss, as in a plain loop
            self._loss = value if self._on_host else loss.detach()
        else:  # the step's loss: the mean of its micro-batches'
            summed = self._loss if self._micro > 0 and self._loss is not None else None
            self._loss = loss.detach() if summed is None else summed + loss.detach()
        if counting:
            bookkeeping.leave()

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """End a micro-step; at the end of an accumulation window, step the optimizer and zero gradients.

        Returns:
            True when the optimizer stepped.

        Raises:
            DivergedError: The loss is NaN or infinite (the run ends with ``status: "diverged"``): this step's, or
                that of a step whose record waited for the window's end (:meth:`settle_steps`), at most a window
                later; the checkpoint saves and the loop's end check it first.
        """
        probes = self._probes
        if probes.state is not None and probes.step(optimizer, self._model):  # a probe pass's
            return False
        bookkeeping = self.bookkeeping
        counting = bookkeeping.counting
        if counting:
            bookkeeping.enter()
        timer = self.timer
        if not timer.backward_done:
            raise RuntimeError("session.step() must follow session.backward(loss)")
        timer.backward_done = False
        precision = self._switches.precision
        if self._micro < self._switches.grad_accum - 1:
            self._micro += 1
            if counting:
                bookkeeping.leave()
            return False
        if counting:
            bookkeeping.leave()
        max_grad_norm = self.config.max_grad_norm
        if max_grad_norm is not None:
            precision.unscale(optimizer)
            assert self._model is not None
            torch.nn.utils.clip_grad_norm_(self._model.parameters(), max_grad_norm)
        precision.optimizer_step(optimizer)
        optimizer.zero_grad(set_to_none=True)
        clock = self._clock
        end = clock.mark()
        clock.settle()  # the wait for the device: the step's work, not bookkeeping
        if counting:
            bookkeeping.enter()
        # the step's end, written out (a call costs here, with the caches cold): its record now or with its window
        summed, self._loss = self._loss, None
        step, start = self._step, self.start_step
        if step == start and self.config.count_flops:
            self._run.lifecycle.rank.flops_per_step = float(self._micro_steps.flops)
        self._step = step + 1
        self._micro = 0
        first_measured = start + self._warmup_steps
        stream = self._run.stream
        if step > first_measured and not stream.live_step_end:  # its record waits for its window (StepEnds)
            timer = self.timer
            timer.defer(step, end, summed, self._switches.grad_accum)
            if stream.open_steps + len(timer.deferred) >= stream.window_steps:
                self._step_ends.settle()
        else:
            self._step_ends.close(step, step < first_measured, end, summed, self._switches.grad_accum)
        if self._saves_when_due:
            self.checkpoints.after_step(self)
        if counting:
            bookkeeping.leave()
            bookkeeping.step_done()
        return True

    def close_window(self) -> None:
        """Close the open window of steps now (:meth:`finish` would close it), so that work after the last step,
        such as an evaluation, counts in no window, nor in the run's time and energy."""
        self.settle_steps()
        self._run.stream.close_window()

    def settle_steps(self) -> None:
        """Hand over the steps whose records wait for their window's end (:mod:`dtpo.session.loop.step_ends`), before
        anything reads this rank's steps: a checkpoint, the end, a window.

        Raises:
            DivergedError: A waiting step's loss is NaN or infinite (the steps after it are dropped).
        """
        self._step_ends.settle()

    def note_evaluation(self, loss: float, samples: int) -> None:
        """Put the trained model's loss on a fixed evaluation set (``samples`` samples, the same in every run) in
        this rank's record and the summary; call it after the last step, before the Session finishes."""
        self.lifecycle.rank.evaluation = {"loss": float(loss), "samples": int(samples)}

    def finish(self, error: BaseException | None = None) -> RunRecord | None:
        """Gather every rank's measurements to rank 0, which writes ``record.json`` and prints a summary.

        After an error (or an interrupt) only this rank's partial record is written, with the status
        ``failed``, ``interrupted`` or ``diverged`` (the other ranks may be gone); the launcher merges them.

        Returns:
            The run record on rank 0, ``None`` on other ranks.
        """
        if self.lifecycle.finished:
            return None
        diverged = None
        try:  # first: a last checkpoint must not save a run that diverged
            self.settle_steps()
        except DivergedError as exc:  # a waiting step's loss (a loop left early): the run ends diverged
            diverged = exc
            error = error or exc
        try:
            self.checkpoints.close(error)
        except Exception as exc:  # a checkpoint that could not be completed must not cost the record
            log.warning("the last checkpoint could not be completed: %s", exc)
        self.close_window()
        rank = self.lifecycle.rank
        rank.switches = list(self.switch_log)
        rank.bookkeeping_s_per_step = self.bookkeeping.seconds_per_step
        record = self._run.finish(error)
        if diverged is not None and diverged is error:
            raise diverged
        return record

    def __enter__(self) -> Session:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        self.finish(error=exc)

    def _next_micro_batch(self, iterator: Iterator[Any]) -> Any:
        """The next micro-batch: the loader's own, or one re-cut from the step's loader batches."""
        if self.batch_shares is not None:
            return self.batch_shares.take(next(iterator))
        loader_batches = self._switches.loader_batches
        if self.grad_accum == loader_batches:
            return next(iterator)
        return self._recut.next(iterator, loader_batches, self.grad_accum)

    # -- internals ------------------------------------------------------------------------------------

    def _dispatch(self, hook: str, *args: Any) -> None:
        """Call ``hook`` on the callbacks that implement it, in list order."""
        self._run.stream.dispatch(hook, *args)


def _to_device(batch: Any, device: torch.device) -> Any:
    return tree_map(lambda t: t.to(device, non_blocking=True) if isinstance(t, torch.Tensor) else t, batch)
