"""Checkpoints of a Session through ``torch.distributed.checkpoint`` (DCP), and resuming from them.

What a checkpoint holds:

* the model and the optimizers, through DCP's ``get_state_dict`` / ``set_state_dict`` (a :class:`TrainState`
  ``Stateful``): replicated DDP parameters are written once, FSDP2's DTensor shards each by their owner;
* for every rank (under its own key ``rankN``, so no rank reads another's): the data position (loader batches
  consumed by the current ``Session.batches`` call, or the iterable's own ``state_dict`` where it has one, as
  torchdata's ``StatefulDataLoader`` does), the RNG states (torch CPU and CUDA, Python's ``random``, NumPy),
  the gradient scaler, the Session's switches (precision, accumulation, compression) with PowerSGD's error
  feedback, the state of every callback that has ``state_dict`` / ``load_state_dict`` (the power tuner's and the
  job-knob tuner's measurements once they hold a choice, the straggler policy's memory and this rank's clock
  lock), the objects given to :meth:`~dtpo.session.session.Session.attach`, and the progress so far (step, time,
  energy).

On disk, ``CKPT_DIR/step-000120/`` is DCP's folder plus a ``COMPLETE`` marker (JSON: step, world size, the
model's fingerprint, the size of every file, dtpo and torch versions, time). Every rank writes into
``step-000120.tmp/``; once all have written (DCP gathers their results on rank 0 before it returns), rank 0
writes the marker and renames the folder. A folder without a marker, with a file missing or of another size
than the marker says, is never resumed from; one DCP cannot read is skipped for the previous complete one
with a warning. Older complete checkpoints are removed beyond ``keep``, each renamed away before it is
deleted, so an interrupt at any moment leaves the newest complete checkpoint usable. A save that fails (a full
disk) is removed at once; the previous complete checkpoint stays the newest, each rank's record notes the error
under its ``checkpoints``, and training goes on with a warning or, with ``--on-checkpoint-error stop``, ends
with :class:`CheckpointError`.

Resuming (``--resume``, or a restarted worker under ``--max-restarts``) happens when the first
``Session.batches`` call starts: the chosen checkpoint is checked against this run (same model fingerprint,
same world size: the data split depends on it) before anything is loaded, then loaded; the data are replayed
to the saved position before the RNG states are put back.

With several nodes the checkpoint directory must be one shared file system: a rank may read what another
wrote (DCP writes replicated tensors once), and rank 0 completes the folder.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.stateful import Stateful

from dtpo.core.checkpoint_config import ON_ERROR_STOP, CheckpointConfig
from dtpo.core.errors import ConfigError, DtpoError, first_line
from dtpo.core.record import write_json_atomic
from dtpo.core.steps import RunView
from dtpo.distributed.process_group import DistContext
from dtpo.session.checkpoint.files import (
    MARKER,
    MARKER_SCHEMA,
    TMP_SUFFIX,
    CheckpointInfo,
    check_checkpoint_dir,
    checkpoint_path,
    checkpoint_root,
    choose_checkpoints,
    complete_checkpoints,
    prune,
    remove_checkpoint,
)
from dtpo.session.checkpoint.state import (
    DataPosition,
    RankState,
    TrainState,
    model_fingerprint,
    rng_state,
    set_rng_state,
)


class Checkpointed(RunView, Protocol):
    """What checkpoints read of the Session they save and restore: the step stream's host, its model, how many
    optimizer steps it did, and its own state (``state_dict`` / ``load_state_dict``)."""

    @property
    def model(self) -> nn.Module | None:
        """The wrapped model (``None`` before ``wrap``)."""

    @property
    def step_count(self) -> int:
        """Optimizer steps done so far."""

    def state_dict(self) -> dict[str, Any]:
        """Step, switches, scaler and data position."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""

    def settle_steps(self) -> None:
        """Bring this rank's step records up to date (steps whose records wait for their window's end)."""

log = logging.getLogger(__name__)

_CLOSE_WAIT_S = 5.0  # how long a run that failed waits for a background save to end
_ESTIMATE_AFTER = 3  # steps after the start before a --checkpoint-every duration is turned into steps


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("dtpo")
    except Exception:  # noqa: BLE001 - a source checkout without metadata
        return "unknown"


class Checkpoints:
    """A Session's checkpoints: when to save, what, and resuming (the Session calls it from ``wrap``,
    ``batches``, ``step`` and ``finish``).

    Args:
        config: The checkpoint settings.
        ctx: Where this process sits in the run.
        run_dir: The run directory (default checkpoint directory: ``RUN_DIR/checkpoints``).
        attempt: Which attempt of the run this is (``TORCHELASTIC_RESTART_COUNT``): a restarted attempt resumes
            from the newest complete checkpoint by itself.

    Raises:
        ConfigError: The checkpoint directory cannot be written (checked on rank 0, raised on every rank).
    """

    def __init__(self, config: CheckpointConfig, ctx: DistContext, run_dir: Path, attempt: int = 0) -> None:
        self.config = config
        self.ctx = ctx
        self.root = checkpoint_root(config, run_dir)
        assert self.root is not None
        self.attempt = attempt
        self.enabled = config.enabled
        self.periodic = config.every is not None  # whether after_step() may save: without, it has nothing to do
        self.fingerprint: str | None = None
        self.optimizers: tuple[torch.optim.Optimizer, ...] = ()
        self.extra: dict[str, Any] = {}
        self.resumed: CheckpointInfo | None = None
        self.saved: CheckpointInfo | None = None  # the newest checkpoint this run completed (rank 0 knows)
        self.data = DataPosition()  # where the current Session.batches call stands in its iterable
        self.started = time.time()
        self._started_clock = time.perf_counter()
        self._resume_done = False
        self._rng: dict[str, Any] | None = None
        self._callback_states: dict[str, Any] = {}
        self._before = {"time_s": 0.0, "energy_j": 0.0}
        self._energy_start: Any = None
        self._next_save: int | None = None
        self._mark = (0, time.perf_counter())  # (step, clock) the step-time estimate counts from
        self._paced = False
        self._pending: tuple[Any, Path, int, dict[str, Any]] | None = None  # future, folder, step, record entry
        self._group: Any = None
        if config.every is None:
            return
        problem = None
        if ctx.rank == 0:
            try:
                check_checkpoint_dir(self.root)
            except ConfigError as exc:
                problem = str(exc)
        self._agree(problem)
        if config.async_save and ctx.distributed:
            self._group = dist.new_group(backend="gloo")  # async writes gather on a thread: not on training's group

    # -- what the Session tells it --------------------------------------------------------------------------

    def wrapped(self, module: nn.Module) -> None:
        """Remember the fingerprint of the model about to be wrapped."""
        self.fingerprint = model_fingerprint(module)

    def attach(self, optimizers: tuple[torch.optim.Optimizer, ...], extra: dict[str, Any]) -> None:
        """The optimizers and other ``state_dict`` / ``load_state_dict`` objects to save and restore."""
        for name, obj in extra.items():
            if not (callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))):
                raise TypeError(f"Session.attach({name}=...) needs an object with state_dict() and load_state_dict()")
        self.optimizers = tuple(dict.fromkeys((*self.optimizers, *optimizers)))
        self.extra.update(extra)

    # -- resuming ------------------------------------------------------------------------------------------

    def resume(self, session: Checkpointed) -> int | None:
        """Load the checkpoint to resume from, if any (once; every rank together).

        Returns:
            The step training resumes at, or ``None`` when it starts from the beginning.

        Raises:
            ConfigError: ``--resume`` names nothing complete, or a checkpoint of another model or world size, or
                none of the candidates could be loaded.
        """
        if self._resume_done:
            return self.resumed.step if self.resumed is not None else None
        self._resume_done = True
        self._mark = (session.step_count, time.perf_counter())
        if not self.enabled:
            return None
        if session.energy is not None:
            self._energy_start = session.energy.monitor.snapshot()
        if session.model is None:
            raise RuntimeError("call Session.wrap(model) before resuming from a checkpoint")
        if not self.optimizers:
            raise RuntimeError("checkpoints need the optimizer: call session.attach(optimizer) before "
                               "session.batches()")
        candidates, problem = self._candidates()
        candidates, problem = self._shared((candidates, problem))
        if problem is not None:
            raise ConfigError(problem)
        if not candidates:
            return None
        errors = []
        for info in candidates:
            started = time.perf_counter()
            rank_state: dict[str, Any] | None = None
            why = "another rank could not load it"
            try:
                rank_state = self._load(session, info)
            except (Exception, CheckpointException) as exc:  # noqa: BLE001 - DCP's is a BaseException
                _raise_interrupt(exc)
                why = describe_failure(exc)
            # DCP raises on every rank alike; anything else one rank met must send every rank to the same fallback
            if bool(self._gather([float(rank_state is not None)])[:, 0].min()):
                assert rank_state is not None
                self._restore(session, info, rank_state, time.perf_counter() - started)
                return info.step
            errors.append(f"{info.path.name}: {why}")
            log.warning("cannot load checkpoint %s (%s); trying the previous complete one", info.path, why)
        raise ConfigError(f"no checkpoint could be loaded ({'; '.join(errors)})")

    def _candidates(self) -> tuple[list[CheckpointInfo], str | None]:
        """Rank 0's choice: the checkpoints to try, best first, or why none may be used."""
        if self.ctx.rank != 0:
            return [], None
        try:
            found = choose_checkpoints(self.config, self.root, self.ctx.world_size, self.fingerprint, self.attempt)
        except ConfigError as exc:
            return [], str(exc)
        if not found and self.attempt > 0 and self.config.every is not None:
            log.warning("restarted before the first complete checkpoint: training starts over")
        return found, None

    def _load(self, session: Checkpointed, info: CheckpointInfo) -> dict[str, Any]:
        """Load one checkpoint into the model and optimizers; returns this rank's own state."""
        assert session.model is not None
        own = RankState()
        state: dict[str, Stateful] = {"train": TrainState(session.model, self.optimizers), f"rank{self.ctx.rank}": own}
        with _single_process_quiet():
            dcp.load(state, checkpoint_id=str(info.path), process_group=self._group,
                     no_dist=not self.ctx.distributed)
        value = own.value
        if not isinstance(value, dict) or value.get("step") != info.step:
            raise RuntimeError(f"rank {self.ctx.rank}'s own state is missing or of another step")
        return value

    def _restore(self, session: Checkpointed, info: CheckpointInfo, state: dict[str, Any], load_s: float) -> None:
        """Everything but the data position, RNG and callbacks (those come once training starts)."""
        self.resumed = info
        # a rank's state on disk (format dtpo.checkpoint/1) keeps the Session's switches under "session"
        session.load_state_dict({"step": state["step"], "switches": state["session"], "scaler": state.get("scaler"),
                                 "data": state["data"]})
        for name, obj in self.extra.items():
            if name in state["extra"]:
                obj.load_state_dict(state["extra"][name])
        self._rng = state["rng"]
        self._callback_states = state["callbacks"]
        self._before = dict(state["progress"])
        self._mark = (info.step, time.perf_counter())
        session.record.resumed = {"step": info.step, "checkpoint": str(info.path), "load_s": load_s,
                                  "started_unix": self.started, "before": dict(self._before)}
        if session.is_main:
            log.info("resumed from %s (step %d, loaded in %.2f s)", info.path, info.step, load_s)

    def restore_callbacks(self, session: Checkpointed) -> None:
        """Give every callback with ``load_state_dict`` its saved state (after ``on_train_start`` built it)."""
        states, self._callback_states = self._callback_states, {}
        for key, callback in _stateful_callbacks(session):
            if key in states:
                try:
                    callback.load_state_dict(states[key])
                except Exception as exc:  # noqa: BLE001 - a callback that cannot restore starts afresh
                    log.warning("callback %s could not restore its checkpointed state (%s); it starts afresh",
                                key, exc)

    def iterate(self, iterable: Iterable[Any]) -> Iterator[Any]:
        """The iterator ``Session.batches`` draws from: counted, and on the first call after a resume moved to the
        saved position (replayed, or through the iterable's own ``load_state_dict``) before the RNG states are
        put back."""
        if self.resumed is None:
            return self.data.iterate(iterable)
        iterator = self.data.iterate(iterable, before=f"checkpoint step {self.resumed.step}")
        if self._rng is not None:
            set_rng_state(self._rng)
            self._rng = None
        return iterator

    # -- saving --------------------------------------------------------------------------------------------

    def after_step(self, session: Checkpointed) -> None:
        """At the end of every optimizer step: complete a background save that is done, and save when due.

        ``--checkpoint-every N`` saves after every multiple of N steps. A duration is turned into steps at the
        slowest rank's pace (one all-gather a few steps after the start, then at every save), so every rank
        saves at the same step without a collective per step.
        """
        if not self.periodic:
            return
        self._poll()
        step = session.step_count
        every, seconds = self.config.interval
        if self._next_save is None:
            self._next_save = ((session.start_step // every + 1) * every if every is not None
                               else session.start_step + _ESTIMATE_AFTER)
        if step < self._next_save:
            return
        if seconds is not None and not self._paced:
            self._paced = True
            since_step, since = self._mark
            mean = (time.perf_counter() - since) / max(step - since_step, 1)
            self._next_save = since_step + self._steps_per(seconds, float(self._gather([mean])[:, 0].max()))
            if step < self._next_save:
                return
        self.save(session)

    @staticmethod
    def _steps_per(seconds: float, step_s: float) -> int:
        return max(1, round(seconds / max(step_s, 1e-6)))

    def save(self, session: Checkpointed) -> None:
        """Save a checkpoint of the current step now (every rank together, between optimizer steps).

        A save that fails (a full disk: ``ENOSPC``) leaves the previous complete checkpoint as the newest: the
        partial folder is removed, the rank's record notes the error, and training goes on with a warning, or
        stops with :class:`CheckpointError` under ``--on-checkpoint-error stop``.
        """
        assert session.model is not None and self.root is not None
        session.settle_steps()  # every step's record in, its loss checked, before the state is taken
        started = time.perf_counter()
        self._poll(block=True)  # one save at a time
        step = session.step_count
        tmp = self.root / f"step-{step:06d}{TMP_SUFFIX}"
        if self.ctx.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)  # what a killed attempt left at this step
            self.root.mkdir(parents=True, exist_ok=True)
        since_step, since = self._mark
        mean_step_s = (time.perf_counter() - since) / max(step - since_step, 1)
        figures = self._gather([self._energy_so_far(session), time.perf_counter() - self._started_clock, mean_step_s])
        progress = {"step": step, "energy_j": self._before["energy_j"] + float(figures[:, 0].sum()),
                    "time_s": self._before["time_s"] + float(figures[:, 1].max())}
        state: dict[str, Stateful] = {"train": TrainState(session.model, self.optimizers),
                                      f"rank{self.ctx.rank}": RankState(self._rank_state(session, progress))}
        entry: dict[str, Any] = {"step": step, "blocked_s": 0.0, "async": self.config.async_save}
        session.rank_record.checkpoints.append(entry)
        problem = None
        try:
            if self.config.async_save:
                with _single_process_quiet():
                    response = dcp.async_save(state, checkpoint_id=str(tmp), process_group=self._group,
                                              no_dist=not self.ctx.distributed)
                self._pending = (getattr(response, "upload_completion", response), tmp, step, entry)
            else:
                with _single_process_quiet():
                    dcp.save(state, checkpoint_id=str(tmp), no_dist=not self.ctx.distributed)
                self._complete(tmp, step)
        except (Exception, CheckpointException) as exc:  # noqa: BLE001 - DCP raises on every rank alike
            _raise_interrupt(exc)
            problem = self._describe(exc)
        if not self.config.async_save:  # completing is rank 0's: every rank learns how the save ended
            problem = self._first_problem(problem)
        every, seconds = self.config.interval
        self._mark = (step, time.perf_counter())
        if seconds is not None:
            self._paced = True
            self._next_save = step + self._steps_per(seconds, float(figures[:, 2].max()))
        elif every is not None:
            self._next_save = (step // every + 1) * every
        entry["blocked_s"] = time.perf_counter() - started
        if problem is not None:
            self._failed(tmp, entry, problem, stop=self.config.on_error == ON_ERROR_STOP)

    def _rank_state(self, session: Checkpointed, progress: dict[str, Any]) -> dict[str, Any]:
        own = session.state_dict()
        return {
            "step": own["step"],
            "data": own["data"],
            "rng": rng_state(),
            "scaler": own["scaler"],
            "session": own["switches"],
            "callbacks": {key: cb.state_dict() for key, cb in _stateful_callbacks(session)},
            "extra": {name: obj.state_dict() for name, obj in self.extra.items()},
            "progress": progress,
        }

    def _complete(self, tmp: Path, step: int) -> None:
        """Rank 0, once every rank has written: the marker, the rename, the pruning."""
        if self.ctx.rank != 0:
            return
        assert self.root is not None
        files = {str(p.relative_to(tmp)): p.stat().st_size for p in sorted(tmp.rglob("*")) if p.is_file()}
        final = checkpoint_path(self.root, step)
        info = CheckpointInfo(final, step, self.ctx.world_size, self.fingerprint or "", files,
                              time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                              {"dtpo": _version(), "torch": torch.__version__})
        write_json_atomic(tmp / MARKER, {"schema": MARKER_SCHEMA, "step": step, "world_size": info.world_size,
                                         "fingerprint": info.fingerprint, "files": files, "saved_at": info.saved_at,
                                         "versions": info.versions})
        if final.exists():  # an older save of this step (a resume from before it): replaced, never half of it
            remove_checkpoint(final)
        os.replace(tmp, final)
        self.saved = info
        log.info("checkpoint %s saved", final)
        prune(self.root, self.config.keep)

    def _poll(self, block: bool = False) -> None:
        """Complete the background save if it is done (or, with ``block``, once it is)."""
        if self._pending is None or not (block or self._pending[0].done()):
            return
        _, tmp, _, entry = self._pending
        try:
            self._wait()
        except (Exception, CheckpointException) as exc:  # noqa: BLE001
            _raise_interrupt(exc)
            self._failed(tmp, entry, self._describe(exc), stop=self.config.on_error == ON_ERROR_STOP)

    def _wait(self, timeout: float | None = None) -> None:
        """Wait for the background save under way (at most ``timeout`` seconds), then complete it."""
        if self._pending is None:
            return
        future, tmp, step, _ = self._pending
        self._pending = None
        future.result(timeout=timeout)
        self._complete(tmp, step)

    def close(self, error: BaseException | None = None) -> None:
        """At the end of the run, complete a background save. After an error, give it a few seconds only: a
        peer may be gone, and the save's last gather would never end. A save that fails is only a warning here,
        whatever ``--on-checkpoint-error`` says (the run has ended; the previous complete checkpoint stays the
        newest, and the rank's record notes the error)."""
        if self._pending is None:
            return
        _, tmp, _, entry = self._pending
        try:
            self._wait(timeout=None if error is None else _CLOSE_WAIT_S)
        except (Exception, CheckpointException) as exc:  # noqa: BLE001
            self._failed(tmp, entry, self._describe(exc), stop=False)
        self._pending = None

    def _newest(self) -> CheckpointInfo | None:
        """The newest complete checkpoint: the one this run completed last, else the newest on disk."""
        assert self.root is not None
        return self.saved or next(iter(complete_checkpoints(self.root, warn=False)), None)

    def _describe(self, exc: BaseException) -> str:
        """One line for a failed save, saying where the disk is full (read before the partial folder is removed:
        torch's writer reports a full disk as ``unexpected pos ...``, not as ``ENOSPC``)."""
        assert self.root is not None
        return describe_failure(exc) + _full_disk_note(self.root, self._newest())

    def _failed(self, tmp: Path, entry: dict[str, Any], problem: str, stop: bool) -> None:
        """A save that did not complete: rank 0 removes its partial folder, the record notes the error and the
        checkpoint that stays the newest (``entry``'s ``error`` and ``kept``), then a warning, or with ``stop``
        :class:`CheckpointError`."""
        if self.ctx.rank == 0 and tmp.exists():
            remove_checkpoint(tmp)
        newest = self._newest()
        kept = newest.path.name if newest is not None else None
        entry.update(error=problem, kept=kept)
        message = (f"checkpoint of step {entry['step']} failed ({problem}); its partial folder was removed and "
                   + (f"{kept} stays the newest complete checkpoint" if kept is not None
                      else "there is no complete checkpoint yet"))
        if stop:
            raise CheckpointError(f"{message}; training stops (--on-checkpoint-error stop)")
        if self.ctx.rank == 0:
            log.warning("%s; training goes on (--on-checkpoint-error stop ends the run instead)", message)

    # -- helpers -------------------------------------------------------------------------------------------

    def _energy_so_far(self, session: Checkpointed) -> float:
        energy = session.energy
        if energy is None or self._energy_start is None:
            return 0.0
        monitor = energy.monitor
        return monitor.measure("so-far", self._energy_start, monitor.snapshot()).total_j

    def _gather(self, values: list[float]) -> torch.Tensor:
        """Every rank's ``values`` as rows of a tensor (one all-gather; also a barrier)."""
        mine = torch.tensor(values, dtype=torch.float64, device=self.ctx.device)
        if not self.ctx.distributed:
            return mine.unsqueeze(0).cpu()
        rows = [torch.empty_like(mine) for _ in range(self.ctx.world_size)]
        dist.all_gather(rows, mine)
        return torch.stack(rows).cpu()

    def _shared(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank."""
        if not self.ctx.distributed:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def _first_problem(self, problem: str | None) -> str | None:
        """The first rank's ``problem`` of those that met one (``None`` when none did), on every rank."""
        if not self.ctx.distributed:
            return problem
        problems: list[str | None] = [None] * self.ctx.world_size
        dist.all_gather_object(problems, problem)
        return next((p for p in problems if p is not None), None)

    def _agree(self, problem: str | None) -> None:
        problem = self._shared(problem)
        if problem is not None:
            raise ConfigError(problem)


class CheckpointError(DtpoError):
    """A checkpoint could not be written and ``--on-checkpoint-error stop`` ends the run (exit code 1)."""

    exit_code = 1


def describe_failure(exc: BaseException) -> str:
    """One line for a failed save or load: for DCP's ``CheckpointException``, the first rank's own error."""
    if isinstance(exc, CheckpointException) and exc.failures:
        rank, (inner, _) = min(exc.failures.items())
        return f"rank {rank}: {type(inner).__name__}: {first_line(str(inner))}"
    return f"{type(exc).__name__}: {first_line(str(exc))}"


def _full_disk_note(root: Path, newest: CheckpointInfo | None) -> str:
    """``"; the disk is full (...)"`` when the file system of ``root`` has less room left than the newest complete
    checkpoint takes, else ``""``."""
    if newest is None:
        return ""
    try:
        free = shutil.disk_usage(root).free
    except OSError:
        return ""
    size = sum(newest.files.values())
    if free >= size:
        return ""
    return f"; the disk is full ({free / 2**20:.1f} MiB free in {root}, a checkpoint takes {size / 2**20:.1f} MiB)"


def _raise_interrupt(exc: BaseException) -> None:
    """DCP wraps whatever a rank raised, an interrupt too (SIGTERM's ``Interrupted``, Ctrl-C): raise that."""
    if isinstance(exc, CheckpointException):
        for inner, _ in exc.failures.values():
            if not isinstance(inner, Exception):
                raise inner


@contextlib.contextmanager
def _single_process_quiet() -> Iterator[None]:
    """DCP warns at every call without a process group that it assumes one process: that is what is meant."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is .*assuming the intent", category=UserWarning)
        yield


def _stateful_callbacks(session: Checkpointed) -> list[tuple[str, Any]]:
    """The Session's callbacks that keep state across a resume, each with a stable key (class name, and its
    position among callbacks of that class)."""
    out = []
    seen: dict[str, int] = {}
    for callback in session.callbacks:
        if callable(getattr(callback, "state_dict", None)) and callable(getattr(callback, "load_state_dict", None)):
            name = type(callback).__qualname__
            index = seen.get(name, 0)
            seen[name] = index + 1
            out.append((f"{name}#{index}", callback))
    return out
