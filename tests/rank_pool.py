"""Worlds of gloo ranks that outlive one test: the processes are started once and run many tests' functions.

Starting a rank (a fresh interpreter importing torch and dtpo) costs seconds; the functions the multi-rank tests
run on each rank mostly take less. A :class:`RankPool` keeps ``world_size`` spawned processes and hands each of
them one task at a time: the function, its arguments, and what a freshly spawned child would have inherited
from the test (environment, working directory, import path), with a new rendezvous port per task. Each task
forms and ends its own process group as it would in fresh processes; what a process's exit used to clean up
(a process group left initialised, signal handlers a Session installed, the count of runs a Session opened) is
reset after each task.

A task that fails on any rank, or a rank that dies, ends the whole pool (the other ranks may wait in a
collective forever) and raises :class:`RankFailed` with the rank's traceback; the next task starts a new pool.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import Any

_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


class RankFailed(AssertionError):
    """A rank of a pooled world raised or died while running a test's function."""


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _serve(rank: int, world_size: int, conn: Connection) -> None:
    """A pooled rank's loop: run each task received on ``conn`` and answer ``None`` or the traceback."""
    import torch
    import torch.distributed as dist

    from dtpo.distributed.worker_exit import exit_now
    from dtpo.session.stream_run import StreamRun

    handlers = {sig: signal.getsignal(sig) for sig in _SIGNALS}
    while True:
        try:
            task = conn.recv()
        except EOFError:  # the test session is gone
            break
        if task is None:
            break
        fn, args, port, environ, cwd, path = task
        os.environ.clear()
        os.environ.update(environ)
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                          WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size))
        os.chdir(cwd)
        sys.path[:] = path
        torch.set_num_threads(1)
        error = None
        try:
            fn(rank, world_size, *args)
        except BaseException:  # noqa: BLE001 - every failure goes back to the test, as mp.spawn reports it
            error = traceback.format_exc()
        if dist.is_initialized():  # a fresh process would have ended with its group
            dist.destroy_process_group()
        StreamRun.opened = 0  # nor would it have opened a run (dtpo launch's agent stands aside after a Session's)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        sys.stdout.flush()
        sys.stderr.flush()
        conn.send(error)
    exit_now(0)  # as dtpo's own workers end: see dtpo.distributed.worker_exit


class RankPool:
    """``world_size`` spawned processes that run test functions as the ranks of one gloo world."""

    def __init__(self, world_size: int) -> None:
        context = mp.get_context("spawn")
        self.world_size = world_size
        self.conns: list[Connection] = []
        self.procs: list[Any] = []
        for rank in range(world_size):
            mine, theirs = context.Pipe()
            proc = context.Process(target=_serve, args=(rank, world_size, theirs), name=f"rank-pool-{rank}")
            proc.start()
            theirs.close()
            self.conns.append(mine)
            self.procs.append(proc)

    def run(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        """Run ``fn(rank, world_size, *args)`` on every rank; raise :class:`RankFailed` (after ending the pool)
        when a rank raises or dies."""
        task = (fn, args, free_port(), dict(os.environ), os.getcwd(), list(sys.path))
        for conn in self.conns:
            conn.send(task)
        pending = set(range(self.world_size))
        while pending:
            ready = wait([self.conns[r] for r in pending] + [self.procs[r].sentinel for r in pending])
            for rank in sorted(pending):
                conn, proc = self.conns[rank], self.procs[rank]
                if conn in ready or conn.poll():
                    try:
                        error = conn.recv()
                    except EOFError:
                        proc.join(timeout=5)
                        error = f"ended without an answer (exit code {proc.exitcode})"
                    if error is not None:
                        errors = {rank: error, **self._other_errors(pending - {rank})}
                        self.close(force=True)
                        raise RankFailed("".join(f"\n\n-- Process {r} terminated with the following error:\n{e}"
                                                 for r, e in sorted(errors.items())))
                    pending.discard(rank)
                elif proc.sentinel in ready:
                    proc.join()
                    self.close(force=True)
                    raise RankFailed(f"process {rank} terminated with exit code {proc.exitcode}")

    def _other_errors(self, ranks: set[int], grace_s: float = 1.0) -> dict[int, str]:
        """The errors other ranks report within ``grace_s`` of a first one: a rank that raised breaks its peers'
        collectives too, and which of them answers first is a race, so every rank's traceback is shown."""
        deadline = time.monotonic() + grace_s
        errors: dict[int, str] = {}
        for rank in sorted(ranks):
            conn = self.conns[rank]
            try:
                if conn.poll(max(0.0, deadline - time.monotonic())):
                    error = conn.recv()
                    if error is not None:
                        errors[rank] = error
            except (EOFError, OSError):
                continue
        return errors

    @property
    def alive(self) -> bool:
        """Whether every rank is still there to take a task."""
        return all(proc.is_alive() for proc in self.procs)

    def close(self, force: bool = False) -> None:
        """End the ranks: ask them to exit (``force``: kill them), and reap them."""
        for conn, proc in zip(self.conns, self.procs, strict=True):
            if force:
                proc.kill()
            else:
                try:
                    conn.send(None)
                except OSError:
                    proc.kill()
        for proc in self.procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for conn in self.conns:
            conn.close()


_pools: dict[int, RankPool] = {}


def run_pooled(fn: Callable[..., Any], world_size: int, args: tuple[Any, ...]) -> None:
    """Run ``fn`` on the pooled world of ``world_size`` ranks, starting the pool if there is none (or the last
    one ended)."""
    pool = _pools.get(world_size)
    if pool is None or not pool.alive:
        pool = _pools[world_size] = RankPool(world_size)
    try:
        pool.run(fn, args)
    except BaseException:
        _pools.pop(world_size, None)
        if pool.alive:
            pool.close(force=True)
        raise


def close_pools() -> None:
    """End every pooled world (at the end of the test session)."""
    while _pools:
        _, pool = _pools.popitem()
        pool.close()
