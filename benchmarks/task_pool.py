"""Running a benchmark's independent runs in several processes, in the order given, with a progress bar.

The processes are forked once, when the pool is entered, before the progress bar starts its thread; each is set up
by a function of the caller's (``start``) and given a scratch folder. The scratch folder lies in memory
(``/dev/shm``) unless ``TMPDIR`` names another place: simulated GPUs write (and fsync) their state and knob journal
on every change of setting, which on a disk takes a third of a run's time.
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Generic, TypeVar

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

T = TypeVar("T")
R = TypeVar("R")


def scratch_root() -> str | None:
    """``/dev/shm`` where it can be written and ``TMPDIR`` is not set, else ``None`` (the usual temporary folder)."""
    shm = "/dev/shm"
    if "TMPDIR" not in os.environ and os.path.isdir(shm) and os.access(shm, os.W_OK):
        return shm
    return None


class TaskPool(Generic[T, R]):
    """Runs tasks in ``jobs`` processes, or in this one when ``jobs`` is 1; the results are the same either way.

    Args:
        run_one: Runs one task (a module-level function: it is sent to the processes by name).
        start: Sets a process up, called with ``start_args`` and the scratch folder (in this process too).
        start_args: What ``start`` is given before the scratch folder.
        jobs: Processes.
        describe: A result in words, for the progress bar.
        prefix: The scratch folder's name starts so.
    """

    def __init__(self, run_one: Callable[[T], R], start: Callable[..., None], start_args: tuple[Any, ...], jobs: int,
                 describe: Callable[[R], str] = str, prefix: str = "bench-") -> None:
        self.run_one, self.start, self.start_args = run_one, start, start_args
        self.jobs, self.describe, self.prefix = jobs, describe, prefix
        self._pool: Any = None

    @contextmanager
    def running(self) -> Iterator[TaskPool[T, R]]:
        """The pool with its processes and scratch folder for the time of the ``with`` block."""
        with tempfile.TemporaryDirectory(prefix=self.prefix, dir=scratch_root()) as scratch:
            self.start(*self.start_args, scratch)
            if self.jobs > 1:
                methods = multiprocessing.get_all_start_methods()
                context = multiprocessing.get_context("fork" if "fork" in methods else None)
                self._pool = context.Pool(self.jobs, self.start, (*self.start_args, scratch))
            try:
                yield self
            finally:
                if self._pool is not None:
                    self._pool.terminate()
                    self._pool.join()
                    self._pool = None

    def run(self, tasks: Sequence[T], what: str = "running") -> list[R]:
        """Every task's result, in the order of ``tasks``, with a progress bar on stderr."""
        progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            console=Console(stderr=True), transient=True)
        chunk = max(1, min(8, len(tasks) // (8 * self.jobs)))
        results = map(self.run_one, tasks) if self._pool is None else self._pool.imap(self.run_one, tasks, chunk)
        done = []
        with progress:
            bar = progress.add_task(what, total=len(tasks))
            for result in results:
                progress.update(bar, description=f"{what}: {self.describe(result)}", advance=1)
                done.append(result)
        return done
