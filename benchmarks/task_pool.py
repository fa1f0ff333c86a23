"""Running a benchmark's independent runs in several processes, in the order given, with a progress bar.

:class:`TaskPool` runs tasks whose progress counts in whole tasks; :func:`run_rank_steps` runs simulated jobs whose
progress counts in rank-steps, reported from the worker processes as they simulate.

The processes are forked once, when the pool is entered, before the progress bar starts its thread; each is set up
by a function of the caller's (``start``) and given a scratch folder. The scratch folder lies in memory
(``/dev/shm``) unless ``TMPDIR`` names another place: simulated GPUs write (and fsync) their state and knob journal
on every change of setting, which on a disk takes a third of a run's time.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import queue
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from contextlib import contextmanager
from typing import Any, Generic, Protocol, TypeVar

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


class StepTask(Protocol):
    """A simulated run whose progress counts in rank-steps: :func:`run_rank_steps` reads these."""

    @property
    def key(self) -> Any:
        """Where its result goes in the returned dictionary."""

    @property
    def rank_steps(self) -> int:
        """Its GPUs times its steps: its length on the progress bar."""

    @property
    def gpus(self) -> int:
        """Its GPUs: one step it reports is this many rank-steps."""


Simulate = Callable[[Any, Callable[[int], None] | None], dict[str, Any]]
"""Runs one task, reporting the steps it has simulated as it goes (a module-level function: sent by name)."""

_worker_queue: Any = None  # in a worker process: where it reports rank-steps done
_worker_simulate: Simulate | None = None


def use_memory_for_scratch() -> None:
    """Simulated GPUs write (and fsync) their state and knob journal on every clock lock: in ``/dev/shm`` (unless
    ``TMPDIR`` names a place) rather than on a disk."""
    tempfile.tempdir = scratch_root() or tempfile.tempdir


def _start_step_worker(progress_queue: Any, simulate: Simulate, verbose: bool) -> None:
    global _worker_queue, _worker_simulate
    _worker_queue, _worker_simulate = progress_queue, simulate
    use_memory_for_scratch()
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)


def _simulate_in_worker(task: Any) -> dict[str, Any]:
    assert _worker_simulate is not None
    gpus = task.gpus
    return _worker_simulate(task, lambda steps: _worker_queue.put(steps * gpus))


def run_rank_steps(tasks: Sequence[StepTask], simulate: Simulate, jobs: int,
                   verbose: bool) -> dict[Any, dict[str, Any]]:
    """Every task's result by its key, run in ``jobs`` spawned processes (in this one when ``jobs`` is 1), with a
    progress bar of rank-steps on stderr."""
    results: dict[Any, dict[str, Any]] = {}
    total = sum(t.rank_steps for t in tasks)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("rank-steps"),
               TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        progress_id = bar.add_task(f"simulating {len(tasks)} runs", total=total)
        if jobs == 1:
            use_memory_for_scratch()
            for task in tasks:
                results[task.key] = simulate(task, lambda steps, g=task.gpus: bar.advance(progress_id, steps * g))
            return results
        context = multiprocessing.get_context("spawn")
        progress_queue = context.Queue()

        def drain() -> None:
            while True:
                try:
                    bar.advance(progress_id, progress_queue.get_nowait())
                except queue.Empty:
                    return

        with ProcessPoolExecutor(max_workers=min(jobs, len(tasks)), mp_context=context,
                                 initializer=_start_step_worker, initargs=(progress_queue, simulate, verbose)) as pool:
            pending: dict[Future[dict[str, Any]], StepTask] = {pool.submit(_simulate_in_worker, t): t for t in tasks}
            try:
                while pending:
                    done, _ = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                    drain()
                    for future in done:
                        results[pending.pop(future).key] = future.result()
            except BaseException:
                pool.shutdown(wait=False, cancel_futures=True)
                raise
        drain()
        bar.update(progress_id, completed=total)
    return results
