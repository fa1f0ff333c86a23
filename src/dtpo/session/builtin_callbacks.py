"""The Session's own callbacks besides energy and knobs: progress display, partial-record flushes and the
run's artifacts (traces, report) when no launcher writes them."""

from __future__ import annotations

import logging
import time
from typing import Any

from dtpo.core.callbacks import Callback
from dtpo.core.record import StepRecord
from dtpo.telemetry.artifacts import write_artifacts
from dtpo.telemetry.progress import StepProgress

log = logging.getLogger(__name__)


class ProgressCallback(Callback):
    """A live bar on a terminal (plain lines in a log) on rank 0: steps, loss, samples/s."""

    def __init__(self) -> None:
        self.progress: StepProgress | None = None

    def on_train_start(self, session: Any) -> None:
        """Open the display (the target is known once ``batches(steps=...)`` was called)."""
        self.progress = StepProgress(session.target_steps, enabled=session.is_main)

    def on_step_end(self, session: Any, step_record: StepRecord) -> None:
        """Advance the display."""
        if self.progress is not None:
            self.progress.update(step_record.step + 1, step_record.samples, step_record.loss)

    def on_rank_end(self, session: Any, rank_record: Any) -> None:
        """Remove the bar."""
        if self.progress is not None:
            self.progress.close()
            self.progress = None


class FlushCallback(Callback):
    """Writes this rank's partial record after the first measured step, then at the first window end after
    every ``every`` steps or ``every_s`` seconds, so a partial record's steps and energy windows agree.

    Args:
        every: Steps between flushes at least.
        warmup_steps: Steps before the first measured one.
        every_s: Seconds after which the next window end flushes even if fewer steps passed.
    """

    def __init__(self, every: int, warmup_steps: int, every_s: float = 30.0) -> None:
        self.every = every
        self.warmup_steps = warmup_steps
        self.every_s = every_s
        self._last_step = 0
        self._last_time = time.monotonic()

    def on_step_end(self, session: Any, step_record: StepRecord) -> None:
        """Flush after the first measured step (so even an early crash leaves a record)."""
        if step_record.step == getattr(session, "start_step", 0) + self.warmup_steps:
            self._flush(session, step_record.step + 1)

    def on_window_end(self, session: Any, window: Any) -> None:
        """Flush when due."""
        done = window.last_step + 1
        if done - self._last_step >= self.every or time.monotonic() - self._last_time >= self.every_s:
            self._flush(session, done)

    def _flush(self, session: Any, done: int) -> None:
        session.lifecycle.flush(status="running")
        self._last_step = done
        self._last_time = time.monotonic()



class ArtifactsCallback(Callback):
    """On rank 0 of a completed run started without ``dtpo launch`` (plain torchrun, or one process): write
    the run's traces and report next to its record (as its telemetry configuration says). Under ``dtpo launch``
    the launcher writes them once the record is final (restarts included), so they are not written twice.
    """

    def on_train_end(self, session: Any, record: Any) -> None:
        """Write the artifacts of the finished record."""
        if record is not None:
            write_artifacts(record, session.run_dir)
