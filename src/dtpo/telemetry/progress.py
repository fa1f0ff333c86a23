"""A progress display for training: a live bar on a terminal, a few plain lines in a log."""

from __future__ import annotations

import sys
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn


class StepProgress:
    """Shows optimizer steps done, the loss and the throughput.

    Args:
        total: Steps expected, or ``None`` when unknown.
        enabled: Show anything at all (only rank 0 should).
        lines: In a log (not a terminal), how many plain progress lines to print over the run.
    """

    def __init__(self, total: int | None, enabled: bool = True, lines: int = 10) -> None:
        self.total = total
        self.enabled = enabled
        self._bar: Progress | None = None
        self._task = None
        self._every = max(1, (total or 100) // lines)
        self._started = time.perf_counter()
        self._samples = 0
        if enabled and sys.stdout.isatty():
            self._bar = Progress(TextColumn("[bold]training"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[info]}"), TimeRemainingColumn(),
                                 console=Console(), transient=True)
            self._bar.start()
            self._task = self._bar.add_task("train", total=total, info="")

    def advance(self, done: int) -> None:
        """Show ``done`` steps finished, before their figures come in through :meth:`update` (a bar only)."""
        if self.enabled and self._bar is not None:
            self._bar.update(self._task, completed=done)

    def update(self, step: int, samples: int, loss: float | None) -> None:
        """Report that ``step`` (counted from 1) finished having processed ``samples`` on this rank."""
        if not self.enabled:
            return
        self._samples += samples
        elapsed = time.perf_counter() - self._started
        info = f"loss {loss:.4f}" if loss is not None else ""
        info += f"  {self._samples / elapsed:,.0f} samples/s/rank" if elapsed > 0 else ""
        if self._bar is not None:
            self._bar.update(self._task, completed=step, info=info)
        elif step % self._every == 0 or step == self.total:
            of = f"/{self.total}" if self.total else ""
            print(f"step {step}{of}  {info}", flush=True)

    def close(self) -> None:
        """Remove the bar."""
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
