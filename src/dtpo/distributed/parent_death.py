"""Workers that end with their launcher: a launcher killed outright (SIGKILL, the OOM killer) cannot stop them.

torchrun starts each worker in a session of its own, so a signal to the launcher's process group does not
reach them, and a launcher that dies without running its handlers leaves them training with nobody to
collect their record. On Linux a worker can ask the kernel for a signal when its parent dies
(``prctl(PR_SET_PDEATHSIG)``): dtpo asks for SIGTERM, which the Session turns into an ``interrupted`` partial
record, as for any other stop.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import signal
import sys

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1


def end_with_parent(signum: int = signal.SIGTERM) -> bool:
    """Ask for ``signum`` when the parent process dies (Linux only; elsewhere nothing happens).

    Returns:
        True when the request is in place. If the parent already died before it was made, ``signum`` is sent
        to this process at once.
    """
    if not sys.platform.startswith("linux"):
        return False
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) != 0:
            log.debug("prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno())
            return False
    except (OSError, AttributeError) as exc:
        log.debug("prctl is not available (%s)", exc)
        return False
    if os.getppid() != parent:  # the parent died between the two calls: the kernel will not tell us
        os.kill(os.getpid(), signum)
    return True
