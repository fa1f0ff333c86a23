"""The rank's heartbeat to its launcher as a step-stream callback: every producer under ``dtpo launch`` (the
Session, a step reporter, the agent) beats, so the launcher can name a rank that stops
(:mod:`dtpo.distributed.stall`)."""

from __future__ import annotations

from dtpo.core.callbacks import Callback
from dtpo.core.record import RankRecord, StepRecord
from dtpo.core.steps import RunView
from dtpo.distributed.heartbeat import HeartbeatWriter


class HeartbeatCallback(Callback):
    """Reports each step's beginning and end to a :class:`~dtpo.distributed.heartbeat.HeartbeatWriter`, which
    beats from the start of training to the rank's end.

    Args:
        writer: This rank's heartbeat (not started yet).
    """

    live_step_end = False  # progress is the step's beginning; the records only give step times, late or not

    def __init__(self, writer: HeartbeatWriter) -> None:
        self.writer = writer

    def on_train_start(self, session: RunView) -> None:
        """Start beating."""
        self.writer.start()

    def on_step_begin(self, session: RunView, step: int) -> None:
        """A step began: progress."""
        self.writer.step_begun(step)

    def on_step_end(self, session: RunView, step_record: StepRecord) -> None:
        """A step ended: its time for the median, and progress when it is the step in hand (a record handed over
        as its window closes is not: later steps began since)."""
        writer = self.writer
        if step_record.step == writer.step:
            writer.step_ended(step_record.step, step_record.step_s)
        else:
            writer.step_timed(step_record.step_s)

    def on_rank_end(self, session: RunView, rank_record: RankRecord) -> None:
        """Training stopped on this rank: the last beat says so."""
        self.writer.stop()
