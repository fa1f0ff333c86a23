"""A run's lifecycle on one rank: the run directory, the record, partial flushes, signals, gather and save.

Every rank keeps its own partial record in ``RUN_DIR/ranks/`` (written atomically at the first measured
step, every ``flush_every`` steps, and when the rank stops for any reason), so a crash, a kill or an
interrupt never loses what was measured. At a normal end rank 0 gathers every rank's record and writes
``RUN_DIR/record.json``; otherwise the launcher merges the partials.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import logging
import os
import signal
import tempfile
import threading
from pathlib import Path
from typing import Any

import torch.distributed as dist

from dtpo.core.errors import ConfigError, signal_name
from dtpo.core.files import default_run_root, is_writable_dir
from dtpo.core.launch_contract import LaunchContract
from dtpo.core.partial_text import PartialRecordText
from dtpo.core.record import RECORD_FILE, RankRecord, RunRecord, new_run_id, rank_record_path, write_text_atomic
from dtpo.core.totals import finalize
from dtpo.distributed.parent_death import end_with_parent
from dtpo.distributed.process_group import DistContext
from dtpo.session.loop.divergence import DivergedError

log = logging.getLogger(__name__)

STATUSES = ("running", "completed", "failed", "interrupted", "diverged", "stalled")


class Interrupted(BaseException):  # noqa: N818 - a signal, not an error
    """Raised in the training loop when the process receives SIGTERM (SIGINT raises KeyboardInterrupt)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by {signal_name(signum)}")
        self.signum = signum


def now_iso() -> str:
    """The current UTC time, ISO-8601, to the second."""
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def status_for(error: BaseException | None) -> str:
    """The record status an exception ends a run with."""
    if error is None:
        return "completed"
    if isinstance(error, Interrupted | KeyboardInterrupt):
        return "interrupted"
    if isinstance(error, SystemExit) and error.code in (130, 143):
        return "interrupted"
    if isinstance(error, DivergedError):
        return "diverged"
    return "failed"


def describe(error: BaseException) -> str:
    """One line for the record: the exception's type and first line."""
    if isinstance(error, Interrupted):
        return str(error)
    if isinstance(error, KeyboardInterrupt):
        return "interrupted by SIGINT"
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


def agree_on_run_dir(ctx: DistContext, run_dir: str | os.PathLike[str] | None) -> Path:
    """The run directory every rank writes into: the one given, the launch contract's ``run_dir``, else rank 0's
    choice under its ``run_root`` (or ``runs/``), broadcast to all ranks."""
    contract = LaunchContract.from_environ()
    chosen = run_dir or contract.run_dir
    if chosen is None:
        name = [new_run_id()]
        if ctx.distributed:
            dist.broadcast_object_list(name, src=0, group=ctx.group)
        chosen = (contract.run_root or default_run_root()) / name[0]
    path = Path(chosen).resolve()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create the run directory {path}: {exc.strerror or exc}") from None
    if not is_writable_dir(path):
        raise ConfigError(f"the run directory {path} is not writable")
    pointer = contract.run_pointer
    if pointer and ctx.local_rank == 0:  # tells this node's launcher which directory the ranks agreed on
        with contextlib.suppress(OSError):
            Path(pointer).write_text(str(path))
    return path


class RunLifecycle:
    """This rank's record, its partial flushes, the final gather and save.

    Args:
        ctx: Where this process sits in the run.
        run_dir: The run directory all ranks agreed on.
        record: The run's record (config and environment filled, no ranks yet).
        rank: This rank's record.
    """

    def __init__(self, ctx: DistContext, run_dir: Path, record: RunRecord, rank: RankRecord) -> None:
        self.ctx = ctx
        self.run_dir = run_dir
        self.record = record
        self.rank = rank
        self.finished = False
        self._write_failed = False
        self._stopping = False
        self._partial_text = PartialRecordText()  # encodes each step once, however often the record is written

    @property
    def partial_path(self) -> Path:
        """Where this rank's partial record lives."""
        return rank_record_path(self.run_dir, self.ctx.rank, self.record.attempt)

    def flush(self, status: str = "running") -> None:
        """Write this rank's partial record (atomically; its steps encoded once, :mod:`dtpo.core.partial_text`). A run
        dir that became unwritable costs a warning, not the training run.

        While the rank trains (``running``) the file is not synced to the disk: the rename keeps it whole when the
        process is killed, and training does not wait for a shared file system; the flush that ends the rank syncs.
        """
        partial = RunRecord(self.record.run_id, status, self.record.started_at, config=self.record.config,
                            environment=self.record.environment, ranks=[self.rank], error=self.rank.error)
        partial.attempt = self.record.attempt
        partial.resumed = self.record.resumed
        try:
            write_text_atomic(self.partial_path, self._partial_text.encode(partial), durable=status != "running")
            self._write_failed = False
        except OSError as exc:
            if not self._write_failed:
                log.warning("cannot write the partial record %s (%s); training goes on", self.partial_path,
                            exc.strerror or exc)
            self._write_failed = True

    def install_signal_handlers(self) -> None:
        """On SIGTERM (torchrun stopping the workers, a scheduler's preemption, the dtpo launcher's death) raise
        :class:`Interrupted` in the training loop, so the Session ends the run as ``interrupted`` with its
        record written."""
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return

        def on_term(signum: int, frame: Any) -> None:
            if self._stopping:
                return  # already ending the run: let the record be written
            self._stopping = True
            raise Interrupted(signum)

        signal.signal(signal.SIGTERM, on_term)
        if LaunchContract.from_environ().launched:  # a launcher killed outright sends this worker SIGTERM, not silence
            end_with_parent(signal.SIGTERM)

    def finish(self, error: BaseException | None) -> RunRecord | None:
        """End the run on this rank: flush, and on a normal end gather every rank's record to rank 0, which
        finalises and saves ``record.json``.

        Returns:
            The run record on rank 0 of a completed run, else ``None``.
        """
        if self.finished:
            return None
        self.finished = True
        self._stopping = True
        status = status_for(error)
        if error is not None:
            self.rank.error = describe(error)
            self.flush(status=status)
            return None
        self.flush(status="completed")
        ranks = [self.rank]
        if self.ctx.distributed:
            gathered: list[Any] | None = [None] * self.ctx.world_size if self.ctx.rank == 0 else None
            dist.gather_object(self.rank, gathered, dst=0, group=self.ctx.group)
            # A sender's gather can return before rank 0 has read everything; tearing the group down then
            # can break the connection under rank 0. Leave together.
            dist.barrier(group=self.ctx.group)
            ranks = sorted(gathered or [], key=lambda r: r.rank)
        if self.ctx.rank != 0:
            return None
        self.record.ranks = ranks
        self.record.status = "completed"
        self.record.finished_at = now_iso()
        finalize(self.record)
        self.save()
        return self.record

    def finish_alone(self, error: BaseException | None) -> None:
        """End the run on this rank without a collective: write this rank's partial record with how it ended
        (``completed``, or the error's status). Whoever launched the ranks assembles ``record.json`` from the
        partial records (:func:`dtpo.core.totals.record_from_partials`): the in-process agent ends this way, at
        the exit of a script whose process group may already be gone."""
        if self.finished:
            return
        self.finished = True
        self._stopping = True
        if error is not None:
            self.rank.error = describe(error)
        self.flush(status=status_for(error))

    def save(self) -> Path:
        """Write ``record.json``; where the run directory cannot take it, into a temporary directory."""
        try:
            return self.record.save(self.run_dir)
        except OSError as exc:
            fallback = Path(tempfile.mkdtemp(prefix=f"dtpo-{self.record.run_id}-"))
            path = self.record.save(fallback)
            log.warning("cannot write %s (%s); the record went to %s", self.run_dir / RECORD_FILE,
                        exc.strerror or exc, path)
            return path

