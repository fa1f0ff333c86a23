"""One rank's run as any producer of the step stream drives it: the record and its lifecycle, the built-in and
the user's callbacks, and the :class:`~dtpo.core.stream.StepStream` that feeds them.

The :class:`~dtpo.session.session.Session` and the plain loop's
:class:`~dtpo.session.step_reporter.StepReporter` both hold a :class:`StreamRun`; what differs between them is
only how they see steps (every mark, or only the ends).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from dtpo.core.callbacks import Callback
from dtpo.core.config import RunConfig
from dtpo.core.launch_contract import LaunchContract
from dtpo.core.record import RECORD_FILE, RankRecord, RunRecord
from dtpo.core.steps import RunView
from dtpo.core.stream import StepStream
from dtpo.distributed.process_group import DistContext, leave
from dtpo.session.callbacks.builtin import builtin_callbacks, closing_callbacks
from dtpo.session.callbacks.energy import EnergyCallback
from dtpo.session.environment import environment
from dtpo.session.lifecycle import RunLifecycle, now_iso
from dtpo.telemetry.summary import print_summary


def new_record(ctx: DistContext, run_dir: Path, run_config: RunConfig, user: dict[str, Any] | None) -> RunRecord:
    """The run's record as it starts: its configuration (with the run directory, the world size and the user's
    extra settings) and the environment."""
    record_config = run_config.to_dict()
    record_config["launch"]["run_dir"] = str(run_dir)
    record_config["world_size"] = ctx.world_size
    if user:
        record_config["user"] = dict(user)
    record = RunRecord(run_id=run_dir.name, status="running", started_at=now_iso(), config=record_config,
                       environment=environment(ctx))
    record.attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0) or 0)
    return record


class StreamRun:
    """The record, lifecycle, callbacks and step stream of one rank's run.

    ``StreamRun.opened`` counts the runs opened in this process: the in-process agent of ``dtpo launch`` stands
    aside when the script drives a producer of its own (a :class:`~dtpo.session.session.Session`), so no step is
    counted twice.

    Args:
        host: The producer (what callbacks read).
        ctx: Where this rank sits.
        run_dir: The run directory all ranks agreed on.
        run_config: The run's configuration.
        record: The run's record as it starts (:func:`new_record`).
        rank: This rank's record.
        callbacks: The user's callbacks (after the built-in ones, before the flushes).
        progress: Show progress on rank 0.
        summary: Print the summary table on rank 0 at the end (never under ``dtpo launch``, which prints it).
        settings: The switchable settings in force, for each window.
        clock: The producer's clock (seconds), for the power tuner's blocks.
    """

    opened = 0

    def __init__(self, host: RunView, ctx: DistContext, run_dir: Path, run_config: RunConfig, record: RunRecord,
                 rank: RankRecord, callbacks: Sequence[Callback], progress: bool, summary: bool = True,
                 settings: Callable[[], dict[str, Any]] | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        StreamRun.opened += 1
        self.ctx = ctx
        self.run_dir = run_dir
        self.summary = summary and not LaunchContract.from_environ().launched  # dtpo launch prints it instead
        self.lifecycle = RunLifecycle(ctx, run_dir, record, rank)
        self.lifecycle.install_signal_handlers()
        self.energy: EnergyCallback | None
        builtins, self.energy = builtin_callbacks(run_config, ctx, progress, clock)
        everything: list[Callback] = builtins + list(callbacks) + closing_callbacks(run_config)
        self.stream = StepStream(host, everything, run_config.session.window_steps, settings)

    def finish(self, error: BaseException | None, alone: bool = False) -> RunRecord | None:
        """End the run on this rank once its last window is closed: the callbacks add to this rank's record, the
        ranks are gathered (rank 0 writes ``record.json``), the process group is left after a normal end, the
        callbacks see the record, and rank 0 prints the summary when asked (and not under ``dtpo launch``).

        Args:
            error: What ended the run, ``None`` for a normal end.
            alone: End without any collective: each rank writes its partial record and the launcher assembles
                the run's record (:meth:`RunLifecycle.finish_alone`).

        Returns:
            The run record on rank 0, ``None`` on other ranks (and always with ``alone``).
        """
        self.stream.rank_end(self.lifecycle.rank)
        if alone:
            self.lifecycle.finish_alone(error)
            self.stream.train_end(None)
            return None
        record = self.lifecycle.finish(error)
        if error is None:
            leave(self.ctx)
        self.stream.train_end(record)
        if record is not None and self.summary:
            print_summary(record, record_path=str(self.run_dir / RECORD_FILE))
        return record


class StreamProducer:
    """What every producer of the step stream answers the same way to its callbacks (part of
    :class:`~dtpo.core.steps.RunView`): where this rank sits, from its process group context, and the run's record
    and callbacks, from its :class:`StreamRun`.

    Args:
        ctx: Where this rank sits (the producer joined or made the process group).
    """

    _run: StreamRun  # the run it drives: made by the producer's constructor, which passes itself as its host

    def __init__(self, ctx: DistContext) -> None:
        self.ctx = ctx

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
    def device(self) -> torch.device:
        """This rank's device."""
        return self.ctx.device

    @property
    def lifecycle(self) -> RunLifecycle:
        """This rank's record, its partial flushes and the end of the run."""
        return self._run.lifecycle

    @property
    def energy(self) -> EnergyCallback | None:
        """The built-in energy callback, ``None`` when energy is not measured."""
        return self._run.energy

    @property
    def record(self) -> RunRecord:
        """The run's record (ranks and totals are filled when the run finishes)."""
        return self._run.lifecycle.record

    @property
    def rank_record(self) -> RankRecord:
        """This rank's measurements so far."""
        return self._run.lifecycle.rank

    @property
    def callbacks(self) -> list[Callback]:
        """Every callback in call order: the built-in ones (knobs, tuner, energy, progress, metrics), yours, then
        the partial-record flushes and artifacts. Changes to the list take effect at the next hook."""
        return self._run.stream.callbacks

    @callbacks.setter
    def callbacks(self, callbacks: list[Callback]) -> None:
        stream = self._run.stream
        stream.callbacks = callbacks
        stream.listened = -1  # a new list: its listeners are found at the next hook, whatever its length
