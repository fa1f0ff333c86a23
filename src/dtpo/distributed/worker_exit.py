"""Ending a training worker without the interpreter's teardown, where torch's gloo teardown can abort.

A 2-rank gloo worker that had finished training, written its record and destroyed its process group was
sometimes killed by SIGABRT ("terminate called without an active exception") while Python finalised, with no
Python frame left on the main thread: C++ objects of torch's that outlive the process group (DDP's reducer and
its comm hook's futures, gloo's worker threads) are torn down then, and touching the interpreter from a thread
at that point aborts. Seen about once in a few hundred 2-rank runs with gradient compression on this machine,
often enough to fail a CI run; torch's own fix (registering ``destroy_process_group`` with ``atexit``,
pytorch/pytorch#179291) was abandoned, and dtpo already destroys its group before exit.

torchrun counts such a worker as failed, so a finished run was reported as failed. A worker whose ``main`` has
returned (or called ``sys.exit``) therefore ends here the way Python would end it, minus the finalisation:
non-daemon threads are joined, ``atexit`` handlers run (logging's flush among them), output is flushed, and the
process exits with ``os._exit``. An exception escaping ``main`` is left to Python as before (its traceback and
torchrun's error file are unchanged).

A script dtpo does not own (``dtpo launch``'s agent measures it) ends through Python's own exit, since its exit code
cannot be known before then (``raise SystemExit(3)`` reaches no hook). A core dump of such a worker showed the
abort exactly: a gloo worker thread (``ProcessGroupGloo::runLoop``) dropped its last reference to a finished
all-reduce after the script had returned; the work's saved thread-local state holds a Python object, so the
thread took the GIL, found the interpreter finalising, and ``pthread_exit`` unwound through a ``noexcept``
destructor. A plain 2-rank DDP script under ``torchrun``, without dtpo, died so in 2 of 13 runs on this 2-core
machine. :func:`settle_native_threads` (an ``atexit`` handler the agent registers first, so it runs last) waits,
with the GIL released, until no other thread of the process is runnable: the pending destructor then runs while
Python is still whole.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import NoReturn

logger = logging.getLogger(__name__)

SETTLE_CAP_S = 1.0  # the longest the exit waits for other threads to go quiet
SETTLE_SLICE_S = 0.002  # how often it looks


def run_then_exit(main: Callable[[], object]) -> NoReturn:
    """Run a worker's ``main``; when it returns or raises ``SystemExit``, end the process with its exit code
    through :func:`exit_now`."""
    try:
        main()
        code = 0
    except SystemExit as ended:
        code = exit_code(ended.code)
    exit_now(code)


def exit_code(code: object) -> int:
    """The process exit code Python gives ``SystemExit(code)``: ``None`` is 0, an integer itself, anything else
    is logged as an error (Python writes it to stderr) and gives 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    logger.error("%s", code)
    return 1


def exit_now(code: int) -> NoReturn:
    """End the process with ``code`` after what a normal exit does while Python is still whole (non-daemon
    threads joined, ``atexit`` handlers run, stdout and stderr flushed), skipping the interpreter's finalisation
    and C++ static destructors."""
    _join_threads()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or broken pipe: nothing more can be written anyway
            pass
    os._exit(code)


def _join_threads() -> None:
    """Wait for non-daemon threads as Python's exit does: ``threading._shutdown`` first runs the callbacks that
    stop idle executor workers (a ``ThreadPoolExecutor`` never shut down would otherwise be waited for forever),
    then joins. It is private, but it is what the interpreter itself calls; where it is missing, join directly."""
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None and threading.current_thread() is threading.main_thread():
        shutdown()
        return
    current = threading.current_thread()
    for thread in threading.enumerate():
        if thread is not current and not thread.daemon and thread.is_alive():
            thread.join()


def settle_native_threads(cap_s: float = SETTLE_CAP_S, slice_s: float = SETTLE_SLICE_S,
                          states: Callable[[], list[str]] | None = None) -> bool:
    """Wait, releasing the GIL, until no other thread of this process is runnable on two looks in a row (at most
    ``cap_s``), so that native threads finish what they still do with Python objects (a gloo worker dropping a
    finished work) before the interpreter finalises; see the module docs. Does nothing unless
    ``torch.distributed`` was imported.

    Args:
        cap_s: The longest wait.
        slice_s: Seconds between looks.
        states: The other threads' scheduler states (tests); default: read from ``/proc/self/task``.

    Returns:
        Whether the threads went quiet within ``cap_s`` (``True`` too where there was nothing to wait for).
    """
    if "torch.distributed" not in sys.modules:
        return True
    look = states or _other_thread_states
    deadline = time.monotonic() + cap_s
    quiet = 0
    while quiet < 2:
        if time.monotonic() >= deadline:
            logger.debug("exit: threads still runnable after %.1f s", cap_s)
            return False
        time.sleep(slice_s)
        quiet = 0 if "R" in look() else quiet + 1
    return True


def _other_thread_states() -> list[str]:
    """The scheduler state letter (``R`` runnable, ``S`` sleeping, ...) of every other thread of this process, read
    from ``/proc/self/task/*/stat``; empty where there is no ``/proc`` (the wait then ends at once)."""
    me = threading.get_native_id()
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return []
    out: list[str] = []
    for task in tasks:
        if task == str(me):
            continue
        try:
            with open(f"/proc/self/task/{task}/stat", encoding="ascii", errors="replace") as stat:
                out.append(stat.read().rsplit(")", 1)[1].split()[0])
        except (OSError, IndexError):  # the thread ended meanwhile
            continue
    return out
