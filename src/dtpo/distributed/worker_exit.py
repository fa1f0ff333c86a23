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
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import NoReturn

logger = logging.getLogger(__name__)


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
