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

Each optimizer step is cut at five marks: batch requested, batch in hand, last gradient bucket ready
(from a DDP comm hook), backward returned, optimizer done. The cuts give data wait, compute, the
post-backward tail (later split into exposed communication and sync wait, see :mod:`dtpo.core.totals`)
and optimizer time; they partition the step, so the parts add up to it.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import signal
import sys
import threading
import types
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._pytree import tree_leaves, tree_map
from torch.utils.flop_counter import FlopCounterMode

from dtpo.core.errors import ConfigError
from dtpo.core.record import (
    RECORD_FILE,
    RankRecord,
    RunRecord,
    StepRecord,
    new_run_id,
    rank_record_path,
    write_json_atomic,
)
from dtpo.core.totals import finalize
from dtpo.devices.discovery import discover
from dtpo.dist.comm_timing import TimedCommHook
from dtpo.dist.process_group import DistContext, join, leave
from dtpo.dist.wrap import wrap_model
from dtpo.session.clock import clock_for
from dtpo.session.config import EnergyConfig, KnobConfig, SessionConfig
from dtpo.session.environment import describe_device, environment
from dtpo.session.gpu_knobs import rank_gpus, start_knobs
from dtpo.session.mfu import peak_flops
from dtpo.session.precision import Precision
from dtpo.session.step_energy import StepEnergy, write_power_timeline
from dtpo.telemetry.progress import StepProgress
from dtpo.telemetry.summary import print_summary


class Session:
    """One rank's view of a data-parallel training run.

    Args:
        precision: ``"32-true"``, ``"bf16-mixed"`` or ``"16-mixed"``.
        strategy: ``"ddp"`` or ``"fsdp"``.
        grad_accum: Micro-batches per optimizer step.
        warmup_steps: Optimizer steps left out of totals.
        max_grad_norm: Clip gradients to this norm before each optimizer step.
        run_dir: Where rank 0 writes ``record.json`` (default: ``$DTPO_RUN_DIR`` or ``runs/<run-id>``).
        device: Device to compute on (default: ``cuda:<local_rank>`` or the CPU).
        backend: Collective backend (default: ``nccl`` on CUDA, else ``gloo``).
        config: Extra settings to keep in the record (workload, batch size, ...).
        energy: Measure energy (``True``/``False``, or an :class:`EnergyConfig`). GPUs through NVML, CPUs
            through RAPL or, where no counter exists, a model labelled estimated.
        progress: Show progress on rank 0.
        summary: Print the summary table on rank 0 at :meth:`finish` (``dtpo launch`` prints it instead).
        count_flops: Count model FLOPs on the first step, for MFU.
        flush_every: Write this rank's partial record every N steps.
        knobs: GPU power limit / SM clock to hold for the run on this rank's GPU (restored at the end, on a
            signal, or by the next dtpo start after a crash); see :class:`KnobConfig` for dry-run and observe.
    """

    def __init__(self, precision: str = "32-true", strategy: str = "ddp", grad_accum: int = 1,
                 warmup_steps: int = 2, *, max_grad_norm: float | None = None,
                 run_dir: str | os.PathLike[str] | None = None, device: torch.device | str | None = None,
                 backend: str | None = None, config: dict[str, Any] | None = None,
                 energy: bool | EnergyConfig = True, progress: bool = True, summary: bool = True,
                 count_flops: bool = True, flush_every: int = 50, knobs: KnobConfig | None = None) -> None:
        self.config = SessionConfig(precision, strategy, grad_accum, warmup_steps, max_grad_norm,
                                    count_flops, flush_every)
        self.energy_config = energy if isinstance(energy, EnergyConfig) else EnergyConfig(enabled=bool(energy))
        self.knob_config = knobs or KnobConfig()
        self.ctx: DistContext = join(device, backend)
        self.device = self.ctx.device
        self.precision = Precision(precision, self.device)
        self._clock = clock_for(self.device)
        self._comm_hook = TimedCommHook(self._clock.mark)
        self.run_dir = self._agree_on_run_dir(run_dir)
        self._show_progress = progress and self.is_main
        self._print_summary = summary and not os.environ.get("DTPO_LAUNCHED")
        self.record = RunRecord(
            run_id=self.run_dir.name, status="running",
            started_at=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            config={"session": self.config.to_dict(), "energy": self.energy_config.to_dict(),
                    "knobs": self.knob_config.to_dict(),
                    "world_size": self.ctx.world_size, **(config or {})},
            environment=environment(self.ctx))
        peak = peak_flops(self.device, self.precision.compute_dtype) if count_flops else None
        self._rank = RankRecord(self.ctx.rank, self.ctx.local_rank, self.ctx.node, describe_device(self.device),
                                peak_flops=peak.to_dict() if peak else None)
        self._model: nn.Module | None = None
        self._progress: StepProgress | None = None
        self._finished = False
        self._step = 0
        self._micro = 0
        self._energy = self._start_energy()
        self._reset_step_state()
        self._install_sigterm_flush()
        self._knobs = start_knobs(self.knob_config, rank_gpus(
            self._energy.discovery.devices if self._energy is not None else None, self.ctx.local_rank,
            self.device.type == "cuda")) if self.knob_config.requested else None

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

    # -- the training loop ----------------------------------------------------------------------------

    def wrap(self, module: nn.Module) -> nn.Module:
        """Move a model to this rank's device, make it data parallel and apply the precision.

        Returns:
            The module to train: a ``DistributedDataParallel``, an FSDP2-sharded module, or the module
            itself when running alone.
        """
        if self._model is not None:
            raise RuntimeError("Session.wrap() was already called; one Session trains one model")
        hook = self._comm_hook if self.config.strategy == "ddp" else None
        model = wrap_model(module, self.ctx, self.config.strategy, hook)  # type: ignore[arg-type]
        if self.precision.autocast_dtype is not None:
            inner_forward = model.forward
            precision = self.precision

            def forward(self_: nn.Module, *args: Any, **kwargs: Any) -> Any:
                with precision.forward_context():
                    return precision.to_float32(inner_forward(*args, **kwargs))

            model.forward = types.MethodType(forward, model)  # type: ignore[method-assign]
        self._model = model
        return model

    def batches(self, iterable: Iterable[Any], steps: int | None = None) -> Iterator[Any]:
        """Yield micro-batches, on this rank's device, until ``steps`` more optimizer steps are done.

        With ``grad_accum = k`` every k consecutive micro-batches make one optimizer step. The time spent
        getting each batch is the step's data wait. Call :meth:`backward` and :meth:`step` for each one.

        Args:
            iterable: A DataLoader or any iterable of batches (tensors, tuples, dicts of tensors).
            steps: Optimizer steps to run; ``None`` runs until the iterable ends.
        """
        if self._model is None:
            raise RuntimeError("call Session.wrap(model) before Session.batches()")
        if steps is not None and steps < 0:
            raise ConfigError(f"steps must be >= 0, got {steps}")
        target = None if steps is None else self._step + steps
        if self._progress is None:
            self._progress = StepProgress(target, enabled=self._show_progress)
        iterator = iter(iterable)
        while target is None or self._step < target:
            if self._micro == 0 and self._energy is not None:
                self._energy.step_starting(self._step)
            start = self._clock.mark()
            if self._micro == 0:
                self._step_start = start
            try:
                batch = next(iterator)
            except StopIteration:
                return
            batch = _to_device(batch, self.device)
            self._batch_ready = self._clock.mark()
            self._data_marks.append((start, self._batch_ready))
            self._samples += _count_samples(batch)
            self._enter_micro_step()
            yield batch
            if self._batch_ready is not None:
                raise RuntimeError("call session.backward(loss) for every batch from session.batches()")
            if self._backward_done:
                raise RuntimeError("call session.step(optimizer) after session.backward(loss)")

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of a micro-batch's loss, scaled by ``1 / grad_accum`` so k micro-batches equal one
        k-times larger batch, and through the gradient scaler for ``16-mixed``."""
        if self._batch_ready is None:
            raise RuntimeError("session.backward() must follow a batch from session.batches()")
        last = self._micro == self.config.grad_accum - 1
        self._comm_hook.reset()
        try:
            scaled = loss / self.config.grad_accum if self.config.grad_accum > 1 else loss
            self.precision.backward(scaled)
        finally:
            self._exit_micro_step()
        end = self._clock.mark()
        hooked = last and self._comm_hook.buckets > 0
        compute_end = self._comm_hook.last_ready if hooked else end
        self._compute_marks.append((self._batch_ready, compute_end))
        if last:
            self._tail_marks = (compute_end, end)
        self._backward_end = end
        self._loss = loss.detach()
        self._batch_ready = None
        self._backward_done = True

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """End a micro-step; at the end of an accumulation window, step the optimizer and zero gradients.

        Returns:
            True when the optimizer stepped.
        """
        if not self._backward_done:
            raise RuntimeError("session.step() must follow session.backward(loss)")
        self._backward_done = False
        if self._micro < self.config.grad_accum - 1:
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
        return True

    def finish(self, error: BaseException | None = None) -> RunRecord | None:
        """Gather every rank's measurements to rank 0, which writes ``record.json`` and prints a summary.

        After an error only this rank's partial record is written (the others may be gone); the launcher
        merges the partial records of a failed run.

        Returns:
            The run record on rank 0, ``None`` on other ranks.
        """
        if self._finished:
            return None
        self._finished = True
        if self._progress is not None:
            self._progress.close()
        now = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
        self._stop_energy()
        if self._knobs is not None:
            self._knobs.__exit__(None, None, None)  # the GPU's original settings back, before anything else
            self._knobs = None
        if error is not None:
            self._rank.error = f"{type(error).__name__}: {error}"
            self._flush(status="failed")
            return None
        self._flush(status="completed")
        ranks = [self._rank]
        if self.ctx.distributed:
            gathered: list[Any] | None = [None] * self.world_size if self.is_main else None
            dist.gather_object(self._rank, gathered, dst=0)
            # A sender's gather can return before rank 0 has read everything; tearing the group down then
            # can break the connection under rank 0. Leave together.
            dist.barrier()
            ranks = sorted(gathered or [], key=lambda r: r.rank)
        leave(self.ctx)
        if not self.is_main:
            return None
        self.record.ranks = ranks
        self.record.status = "completed"
        self.record.finished_at = now
        finalize(self.record)
        self.record.save(self.run_dir)
        if self._print_summary:
            print_summary(self.record, record_path=str(self.run_dir / RECORD_FILE))
        return self.record

    def __enter__(self) -> Session:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        self.finish(error=exc)

    # -- internals ------------------------------------------------------------------------------------

    def _reset_step_state(self) -> None:
        self._step_start: Any = None
        self._batch_ready: Any = None
        self._backward_end: Any = None
        self._backward_done = False
        self._data_marks: list[tuple[Any, Any]] = []
        self._compute_marks: list[tuple[Any, Any]] = []
        self._tail_marks: tuple[Any, Any] | None = None
        self._samples = 0
        self._loss: torch.Tensor | None = None
        self._flop_mode: FlopCounterMode | None = None
        self._flops = 0
        self._sync_ctx: contextlib.ExitStack | None = None

    def _enter_micro_step(self) -> None:
        """Turn off gradient sync on all but the last micro-step; count FLOPs on the first step."""
        stack = contextlib.ExitStack()
        last = self._micro == self.config.grad_accum - 1
        model = self._model
        if self.ctx.distributed and self.config.grad_accum > 1:
            if self.config.strategy == "ddp" and not last:
                stack.enter_context(model.no_sync())  # type: ignore[union-attr, operator]
            elif self.config.strategy == "fsdp":
                model.set_requires_gradient_sync(last)  # type: ignore[union-attr, operator]
        if self.config.count_flops and self._step == 0:
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
        secs = self._clock.seconds
        data = sum(secs(a, b) for a, b in self._data_marks)
        compute = sum(secs(a, b) for a, b in self._compute_marks)
        tail = secs(*self._tail_marks) if self._tail_marks else 0.0
        if self.ctx.distributed and self.config.strategy == "fsdp":
            tail = None  # FSDP2 offers no per-bucket hook: its collectives stay inside compute_s
        loss = float(self._loss.float().item()) if self._loss is not None else None
        record = StepRecord(
            step=self._step, warmup=self._step < self.config.warmup_steps, samples=self._samples,
            step_s=secs(self._step_start, end), data_wait_s=data, compute_s=compute, tail_s=tail,
            optimizer_s=secs(self._backward_end, end), loss=loss,
            comm_exposed_s=None if self.ctx.distributed else 0.0,
            sync_wait_s=None if self.ctx.distributed else 0.0)
        self._rank.steps.append(record)
        if self._energy is not None:
            self._energy.step_ended(self._step)
        if self._step == 0 and self.config.count_flops:
            self._rank.flops_per_step = float(self._flops)
        self._step += 1
        self._micro = 0
        if self._progress is not None:
            self._progress.update(self._step, record.samples, loss)
        self._reset_step_state()
        if self._step == self.config.warmup_steps + 1 or self._step % self.config.flush_every == 0:
            self._flush(status="running")

    def _start_energy(self) -> StepEnergy | None:
        """Open this rank's power sources; the node's shared ones (CPU, DRAM) on local rank 0 only."""
        cfg = self.energy_config
        if not cfg.enabled:
            return None
        found = discover(local_rank=self.ctx.local_rank, gpus=self.device.type == "cuda",
                         node_shared=self.ctx.local_rank == 0, cpu_tdp_w=cfg.cpu_tdp_w)
        if self.is_main:
            for note in found.notes:
                print(f"dtpo energy: {note}", file=sys.stderr, flush=True)
        return StepEnergy(found, cfg.window_steps, self.config.warmup_steps, cfg.sample_interval_s,
                          on_lost=lambda msg: print(f"dtpo energy (rank {self.rank}): {msg}", file=sys.stderr))

    def _stop_energy(self) -> None:
        """Close the energy windows, keep this rank's energy section and write its power timeline."""
        if self._energy is None:
            return
        self._rank.energy = self._energy.finish(last_step=self._step - 1)
        rows = self._energy.timeline_rows()
        if rows:
            write_power_timeline(rank_record_path(self.run_dir, self.rank).with_name(
                f"power-rank{self.rank:05d}.csv"), rows)
        self._energy = None

    def _flush(self, status: str) -> None:
        """Write this rank's partial record (atomically) so a crash leaves what was measured."""
        partial = RunRecord(self.record.run_id, status, self.record.started_at,
                            config=self.record.config, environment=self.record.environment,
                            ranks=[self._rank], error=self._rank.error)
        write_json_atomic(rank_record_path(self.run_dir, self.rank), partial.to_dict())

    def _agree_on_run_dir(self, run_dir: str | os.PathLike[str] | None) -> Path:
        """All ranks must write into the same run directory: rank 0 decides when nobody said."""
        chosen = run_dir or os.environ.get("DTPO_RUN_DIR")
        if chosen is None:
            name = [new_run_id()]
            if self.ctx.distributed:
                dist.broadcast_object_list(name, src=0)
            chosen = Path("runs") / name[0]
        path = Path(chosen).resolve()
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _install_sigterm_flush(self) -> None:
        """On SIGTERM (torchrun stopping the survivors of a failed run) write the partial record first."""
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return

        def on_term(signum: int, frame: Any) -> None:
            self._rank.error = "terminated by SIGTERM"
            with contextlib.suppress(Exception):
                self._flush(status="failed")
            raise SystemExit(128 + signum)

        signal.signal(signal.SIGTERM, on_term)


def _to_device(batch: Any, device: torch.device) -> Any:
    if device.type == "cpu":
        return batch
    return tree_map(lambda t: t.to(device, non_blocking=True) if isinstance(t, torch.Tensor) else t, batch)


def _count_samples(batch: Any) -> int:
    """The leading dimension of the first tensor in a batch."""
    for leaf in tree_leaves(batch):
        if isinstance(leaf, torch.Tensor) and leaf.dim() > 0:
            return int(leaf.shape[0])
    return 1
