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

The Session is three parts: a :class:`~dtpo.session.timer.StepTimer` (the marks of each step), a
:class:`~dtpo.session.lifecycle.RunLifecycle` (run dir, record, partial flushes, signals, gather, save) and
a list of :class:`~dtpo.core.callbacks.Callback` s (energy windows, GPU knobs, progress, partial flushes,
and whatever the user passes). The knobs a tuner turns (precision, gradient accumulation, gradient
compression) are held by its :class:`~dtpo.session.switches.Switches` and can change between optimizer steps
through :meth:`Session.set_precision`, :meth:`Session.set_grad_accum` and :meth:`Session.set_compression`;
``dtpo.Session(tune=dtpo.TuneConfig(knob="precision,grad-accum,compression", cost="energy"))`` has dtpo turn
them itself, toward the cost, with every numerics change guarded (:mod:`dtpo.session.job_tuning`) on probe
steps (:class:`~dtpo.session.probe_steps.ProbeSteps`). :meth:`Session.state_dict` is what checkpoints keep of
the Session itself: step, switches, gradient scaler and data position.
"""

from __future__ import annotations

import contextlib
import logging
import os
import types
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_leaves, tree_map
from torch.utils.flop_counter import FlopCounterMode

from dtpo.core.callbacks import Callback, Window
from dtpo.core.config import (
    CheckpointConfig,
    EnergyConfig,
    KnobConfig,
    RunConfig,
    SessionConfig,
    TuneConfig,
)
from dtpo.core.errors import ConfigError
from dtpo.core.launch_contract import LaunchContract
from dtpo.core.logs import configure_logging
from dtpo.core.record import RECORD_FILE, RankRecord, RunRecord, StepRecord
from dtpo.devices.discovery import discover
from dtpo.dist.comm_timing import GradientComm
from dtpo.dist.process_group import DistContext, join, leave
from dtpo.dist.wrap import wrap_model
from dtpo.session.builtin_callbacks import ArtifactsCallback, FlushCallback, ProgressCallback
from dtpo.session.checkpoint import Checkpoints
from dtpo.session.clock import clock_for
from dtpo.session.divergence import check_loss
from dtpo.session.environment import describe_device, environment
from dtpo.session.gpu_knobs import KnobCallback, rank_gpus
from dtpo.session.job_tuning import JobTuneCallback
from dtpo.session.lifecycle import RunLifecycle, agree_on_run_dir, now_iso
from dtpo.session.mfu import peak_flops
from dtpo.session.power_tuning import TuneCallback
from dtpo.session.precision import Precision
from dtpo.session.probe import ProbeRequest
from dtpo.session.probe_steps import ProbeSteps
from dtpo.session.rebatch import cut_batch, join_batches
from dtpo.session.step_energy import EnergyCallback
from dtpo.session.straggler_tuning import StragglerCallback
from dtpo.session.switches import Switch, Switches
from dtpo.session.timer import StepTimer
from dtpo.telemetry.summary import print_summary

log = logging.getLogger(__name__)


_HOOKS = ("on_train_start", "on_step_begin", "on_step_end", "on_window_end", "on_rank_end", "on_train_end")


class Session:
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
        self.ctx: DistContext = join(device, backend or run_config.launch.backend)
        self.device = self.ctx.device
        self._clock = clock_for(self.device)
        ddp = self.ctx.distributed and cfg.strategy == "ddp"
        self.comm: GradientComm | None = GradientComm(self._clock.mark) if ddp else None
        self._switches = Switches(cfg, self.device, self.comm, self.ctx.world_size, announce=self.ctx.rank == 0)
        self.timer = StepTimer(self._clock, self.comm, tail_measured=cfg.strategy == "ddp",
                               distributed=self.ctx.distributed)
        self.run_dir = agree_on_run_dir(self.ctx, run_dir)
        self._print_summary = summary and not LaunchContract.from_environ().launched
        record_config = run_config.to_dict()
        record_config["launch"]["run_dir"] = str(self.run_dir)
        record_config["world_size"] = self.ctx.world_size
        if config:
            record_config["user"] = dict(config)
        record = RunRecord(run_id=self.run_dir.name, status="running", started_at=now_iso(),
                           config=record_config, environment=environment(self.ctx))
        record.attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0) or 0)
        peak = peak_flops(self.device, self.precision.compute_dtype) if cfg.count_flops else None
        rank = RankRecord(self.ctx.rank, self.ctx.local_rank, self.ctx.node, describe_device(self.device),
                          peak_flops=peak.to_dict() if peak else None)
        self.lifecycle = RunLifecycle(self.ctx, self.run_dir, record, rank)
        self.lifecycle.install_signal_handlers()
        self.target_steps: int | None = None
        self._model: nn.Module | None = None
        self._started = False
        self._step = 0
        self._micro = 0
        self._loss: torch.Tensor | None = None
        self._flop_mode: FlopCounterMode | None = None
        self._flops = 0
        self._sync_ctx: contextlib.ExitStack | None = None
        self._cut: list[Any] = []  # micro-batches re-cut from this step's loader batches, not yet handed out
        self._probes = ProbeSteps(self._switches)
        self._window_steps: list[StepRecord] = []
        self._windows = 0
        self.energy: EnergyCallback | None = None
        self.callbacks: list[Callback] = self._builtin_callbacks(run_config, progress) + list(callbacks)
        self.callbacks.append(FlushCallback(cfg.flush_every, cfg.warmup_steps))
        if not LaunchContract.from_environ().launched:  # under dtpo launch, the launcher writes them once final
            self.callbacks.append(ArtifactsCallback())
        self._listeners: dict[str, list[Any]] = {}
        self._listeners_of: list[Callback] | None = None
        self._listened = 0
        self.start_step = 0  # the step this attempt started at: more than 0 after resuming from a checkpoint
        self.checkpoints = Checkpoints(run_config.checkpoint, self.ctx, self.run_dir, record.attempt)

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
    def rank(self) -> int:
        """Global rank of this process."""
        return self.ctx.rank

    @property
    def world_size(self) -> int:
        """Number of processes in the run."""
        return self.ctx.world_size

    @property
    def is_main(self) -> bool:
        """True on rank 0."""
        return self.ctx.rank == 0

    @property
    def step_count(self) -> int:
        """Optimizer steps done so far."""
        return self._step

    @property
    def record(self) -> RunRecord:
        """The run's record (ranks and totals are filled at :meth:`finish`)."""
        return self.lifecycle.record

    @property
    def rank_record(self) -> RankRecord:
        """This rank's measurements so far."""
        return self.lifecycle.rank

    @property
    def model(self) -> nn.Module | None:
        """The model :meth:`wrap` returned (``None`` before)."""
        return self._model

    # -- what tuners change between steps, and the state a checkpoint keeps ----------------------------------

    @property
    def precision(self) -> Precision:
        """The current precision (:meth:`set_precision` changes it; a probe pass runs in its own)."""
        return self._switches.precision

    @property
    def grad_accum(self) -> int:
        """Micro-batches per optimizer step (:meth:`set_grad_accum` changes it)."""
        return self._switches.grad_accum

    @property
    def switch_log(self) -> list[dict[str, Any]]:
        """Every switch so far, in order: ``{"step", "setting", "value"}``."""
        return self._switches.log

    @property
    def switches(self) -> dict[str, Switch]:
        """The settings a tuner may change between optimizer steps, with whether each changes numerics."""
        return self._switches.current()

    def set_precision(self, name: str) -> None:
        """Train in precision ``name`` from the next micro-batch on (changes numerics unless ``32-true``)."""
        self._check_between_steps("precision")
        self._switches.set_precision(name, self._step)

    def set_grad_accum(self, micro_batches: int, *, keep_global_batch: bool = False) -> None:
        """Take ``micro_batches`` micro-batches per optimizer step from the next step on.

        Args:
            micro_batches: Micro-batches per optimizer step.
            keep_global_batch: Keep the samples of each step: the Session joins the loader batches a step took
                so far and cuts them into ``micro_batches`` equal micro-batches (:mod:`dtpo.session.rebatch`),
                which leaves every update as it was. Otherwise each loader batch stays a micro-batch, so the
                global batch (and the optimisation) changes with the accumulation.
        """
        self._check_between_steps("grad_accum")
        self._switches.set_grad_accum(micro_batches, self._step, keep_global_batch=keep_global_batch)

    def set_compression(self, name: str, powersgd_rank: int | None = None, *, error_feedback: bool = True) -> None:
        """Compress gradients with ``name`` (``none``, ``fp16``, ``bf16``, ``powersgd``) from the next step on.

        Raises:
            ConfigError: Not a DDP run with several processes, or the backend cannot do it (16-bit floats on MPI).
        """
        self._check_between_steps("compression")
        self._switches.set_compression(name, self._step, powersgd_rank, error_feedback=error_feedback)

    def keep_probe_batch(self) -> None:
        """Keep a copy of the next micro-batch as the batch every probe runs on."""
        self._probes.keep_next_batch()

    def request_probe(self, request: ProbeRequest) -> None:
        """Run a probe (:mod:`dtpo.session.probe`) before the next optimizer step; every rank must ask for the
        same probes at the same step. ``request.done`` gets the result."""
        self._probes.request(request)

    def state_dict(self) -> dict[str, Any]:
        """This rank's training state: ``step`` (optimizer steps done), ``switches``, the gradient ``scaler``
        (``16-mixed``) and the ``data`` position of the current :meth:`batches` call; what checkpoints save
        besides the model, the optimizers, the RNG states and the callbacks."""
        scaler = self.precision.scaler
        return {"step": self._step, "switches": self._switches.state_dict(),
                "scaler": scaler.state_dict() if scaler is not None else None,
                "data": self.checkpoints.data.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Put back what :meth:`state_dict` returned, between optimizer steps: the switches through their
        ``set_*`` methods, and training continues at ``state["step"]`` (a new warm-up counts from there); the
        next :meth:`batches` call moves its iterable to the saved data position."""
        self._check_between_steps("the state")
        self._switches.load_state_dict(state["switches"])
        scaler = self.precision.scaler
        if state.get("scaler") is not None and scaler is not None:
            scaler.load_state_dict(state["scaler"])
        self.checkpoints.data.load_state_dict(state["data"])
        self.start_step = self._step = int(state["step"])

    def _check_between_steps(self, what: str) -> None:
        if self._micro != 0 or self.timer.batch_ready is not None or self.timer.backward_done:
            raise RuntimeError(f"{what} can change only between optimizer steps (not inside an accumulation "
                               "window or between backward and step)")

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
        inner_forward = model.forward
        session = self

        def forward(self_: nn.Module, *args: Any, **kwargs: Any) -> Any:
            precision = session.precision  # read at every call: the precision may change between steps
            if precision.autocast_dtype is None:
                return inner_forward(*args, **kwargs)
            with precision.forward_context():
                return precision.to_float32(inner_forward(*args, **kwargs))

        model.forward = types.MethodType(forward, model)  # type: ignore[method-assign]
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
        if self._micro != 0 or self.timer.batch_ready is not None or self.timer.backward_done:
            raise RuntimeError("a checkpoint can be saved only between optimizer steps")
        self.checkpoints.save(self)

    def batches(self, iterable: Iterable[Any], steps: int | None = None) -> Iterator[Any]:
        """Yield micro-batches, on this rank's device, until ``steps`` more optimizer steps are done.

        With ``grad_accum = k`` every k consecutive micro-batches make one optimizer step. The time spent
        getting each batch is the step's data wait. Call :meth:`backward` and :meth:`step` for each one.

        After a resume from a checkpoint the first call continues where the checkpoint was taken: ``steps``
        still counts from the start of training, and the iterable is moved to the saved position (replayed, or
        through its own ``load_state_dict``).

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
        timer = self.timer
        while target is None or self._step < target:
            first = self._micro == 0
            if first:
                if self._probes.pending:
                    yield from self._probes.run()
                self._dispatch("on_step_begin", self._step)
            timer.batch_requested(first)
            try:
                batch = self._next_micro_batch(iterator)
            except StopIteration:
                return
            if self.device.type != "cpu":
                batch = _to_device(batch, self.device)
            if self._probes.keep_next:
                self._probes.keep(batch)
            timer.batch_arrived(_count_samples(batch))
            self._enter_micro_step()
            yield batch
            if timer.batch_ready is not None:
                raise RuntimeError("call session.backward(loss) for every batch from session.batches()")
            if timer.backward_done:
                raise RuntimeError("call session.step(optimizer) after session.backward(loss)")

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of a micro-batch's loss, scaled by ``1 / grad_accum`` so k micro-batches equal one
        k-times larger batch, and through the gradient scaler for ``16-mixed``."""
        if self._probes.backward(loss):
            return
        if self.timer.batch_ready is None:
            raise RuntimeError("session.backward() must follow a batch from session.batches()")
        last = self._micro == self.grad_accum - 1
        self.timer.backward_starting()
        try:
            scaled = loss / self.grad_accum if self.grad_accum > 1 else loss
            self.precision.backward(scaled)
        finally:
            self._exit_micro_step()
        self.timer.backward_finished(last)
        summed = self._loss if self._micro > 0 and self._loss is not None else None
        self._loss = loss.detach() if summed is None else summed + loss.detach()  # the step's loss: the mean

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """End a micro-step; at the end of an accumulation window, step the optimizer and zero gradients.

        Returns:
            True when the optimizer stepped.

        Raises:
            DivergedError: The loss is NaN or infinite (the run ends with ``status: "diverged"``).
        """
        if self._probes.step(optimizer, self._model):
            return False
        if not self.timer.backward_done:
            raise RuntimeError("session.step() must follow session.backward(loss)")
        self.timer.backward_done = False
        if self._micro < self.grad_accum - 1:
            self._micro += 1
            return False
        if self.config.max_grad_norm is not None:
            self.precision.unscale(optimizer)
            assert self._model is not None
            torch.nn.utils.clip_grad_norm_(self._model.parameters(), self.config.max_grad_norm)
        self.precision.optimizer_step(optimizer)
        optimizer.zero_grad(set_to_none=True)
        end = self._clock.mark()
        self._clock.settle()
        self._close_step(end)
        self.checkpoints.after_step(self)
        return True

    def close_window(self) -> None:
        """Close the open window of steps now (:meth:`finish` would close it), so that work after the last step,
        such as an evaluation, counts in no window, nor in the run's time and energy."""
        if self._window_steps:
            self._close_window()

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
        try:
            self.checkpoints.close(error)
        except Exception as exc:  # a checkpoint that could not be completed must not cost the record
            log.warning("the last checkpoint could not be completed: %s", exc)
        self.close_window()
        rank_record = self.lifecycle.rank
        rank_record.switches = list(self.switch_log)
        for callback in self.callbacks:
            try:
                callback.on_rank_end(self, rank_record)
            except Exception as exc:  # one broken callback must not cost the record
                log.warning("callback %s failed at the end of the run: %s", type(callback).__name__, exc)
        record = self.lifecycle.finish(error)
        if error is None:
            leave(self.ctx)
        self._dispatch("on_train_end", record)
        if record is not None and self._print_summary:
            print_summary(record, record_path=str(self.run_dir / RECORD_FILE))
        return record

    def __enter__(self) -> Session:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        self.finish(error=exc)

    def _next_micro_batch(self, iterator: Iterator[Any]) -> Any:
        """The next micro-batch: the loader's own, or one re-cut from the step's loader batches."""
        loader_batches = self._switches.loader_batches
        if self.grad_accum == loader_batches:
            return next(iterator)
        if not self._cut:
            self._cut = cut_batch(join_batches([next(iterator) for _ in range(loader_batches)]),
                                  self.grad_accum)
        return self._cut.pop(0)

    # -- internals ------------------------------------------------------------------------------------

    def _builtin_callbacks(self, config: RunConfig, progress: bool) -> list[Callback]:
        """Knobs first (restored before anything else at the end), then energy, then progress."""
        out: list[Callback] = []
        energy_devices = None
        if config.energy.enabled:
            found = discover(local_rank=self.ctx.local_rank, gpus=self.device.type == "cuda",
                             node_shared=self.ctx.local_rank == 0, cpu_tdp_w=config.energy.cpu_tdp_w)
            if self.is_main:
                for note in found.notes:
                    log.info("energy: %s", note)
            self.energy = EnergyCallback(found, self.config.warmup_steps, config.energy.sample_interval_s)
            energy_devices = found.devices
        if config.knobs.requested:
            gpus = rank_gpus(energy_devices, self.ctx.local_rank, self.device.type == "cuda")
            out.append(KnobCallback(config.knobs, gpus))
        if config.tune.job_knobs:
            out.append(JobTuneCallback(config.tune))
        elif config.tune.knob == "stragglers":
            gpus = rank_gpus(energy_devices, self.ctx.local_rank, self.device.type == "cuda")
            out.append(StragglerCallback(config.knobs.mode, gpus))
        elif config.tune.knob is not None:
            gpus = rank_gpus(energy_devices, self.ctx.local_rank, self.device.type == "cuda")
            out.append(TuneCallback(config.tune, config.knobs.mode, gpus))
        if self.energy is not None:
            out.append(self.energy)
        if progress:
            out.append(ProgressCallback())
        if config.telemetry.metrics_addr is not None:  # after energy and tuners: a window's figures are all in
            from dtpo.session.metrics_callback import MetricsCallback

            out.append(MetricsCallback(config.telemetry.metrics_addr))
        return out

    def _dispatch(self, hook: str, *args: Any) -> None:
        """Call ``hook`` on the callbacks that implement it, in list order."""
        listeners = self._listeners.get(hook)
        if listeners is None or self._listeners_of is not self.callbacks or len(self.callbacks) != self._listened:
            self._listeners = {name: [getattr(cb, name) for cb in self.callbacks
                                      if getattr(type(cb), name, None) is not getattr(Callback, name)]
                               for name in _HOOKS}
            self._listeners_of, self._listened = self.callbacks, len(self.callbacks)
            listeners = self._listeners[hook]
        for method in listeners:
            method(self, *args)

    def _enter_micro_step(self) -> None:
        """Turn off gradient sync on all but the last micro-step; count FLOPs on the first step."""
        accum = self.grad_accum
        counting = self.config.count_flops and self._step == self.start_step
        if accum == 1 and not counting:
            return
        stack = contextlib.ExitStack()
        last = self._micro == accum - 1
        model = self._model
        if self.ctx.distributed and accum > 1:
            if self.config.strategy == "ddp" and not last:
                stack.enter_context(model.no_sync())  # type: ignore[union-attr, operator]
            elif self.config.strategy == "fsdp":
                model.set_requires_gradient_sync(last)  # type: ignore[union-attr, operator]
        if counting:
            self._flop_mode = FlopCounterMode(display=False)
            stack.enter_context(self._flop_mode)
        self._sync_ctx = stack

    def _exit_micro_step(self) -> None:
        if self._sync_ctx is not None:
            self._sync_ctx.close()
            self._sync_ctx = None
        if self._flop_mode is not None:
            self._flops += self._flop_mode.get_total_flops()
            self._flop_mode = None

    def _close_step(self, end: Any) -> None:
        loss = float(self._loss.float().item()) / self.grad_accum if self._loss is not None else None
        self._loss = None
        step = self._step
        record = self.timer.close(step, step < self.start_step + self.config.warmup_steps, end, loss)
        rank = self.lifecycle.rank
        rank.steps.append(record)
        if step == self.start_step and self.config.count_flops:
            rank.flops_per_step = float(self._flops)
        self._step += 1
        self._micro = 0
        check_loss(loss, step, self.rank)
        self._dispatch("on_step_end", record)
        if not record.warmup:
            self._window_steps.append(record)
            if len(self._window_steps) >= self.config.window_steps:
                self._close_window()

    def _close_window(self) -> None:
        steps, self._window_steps = self._window_steps, []
        times = sorted(s.step_s for s in steps)
        window = Window(index=self._windows, first_step=steps[0].step, last_step=steps[-1].step,
                        time_s=sum(times), samples=sum(s.samples for s in steps), step_time_s=times[len(times) // 2],
                        settings={name: switch.value for name, switch in self.switches.items()})
        self._windows += 1
        self._dispatch("on_window_end", window)


def _to_device(batch: Any, device: torch.device) -> Any:
    return tree_map(lambda t: t.to(device, non_blocking=True) if isinstance(t, torch.Tensor) else t, batch)


def _count_samples(batch: Any) -> int:
    """The leading dimension of the first tensor in a batch."""
    first = batch[0] if isinstance(batch, tuple | list) and batch else batch
    if isinstance(first, torch.Tensor) and first.dim() > 0:  # the common (inputs, targets) case, without pytree
        return int(first.shape[0])
    for leaf in tree_leaves(batch):
        if isinstance(leaf, torch.Tensor) and leaf.dim() > 0:
            return int(leaf.shape[0])
    return 1
