"""A daemon thread that does one thing every so often until stopped: the heartbeats, the stall watch, the
launchers' node beats and the memory watch all run on one."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class Periodic:
    """Calls ``work`` every ``interval_s`` seconds in a daemon thread, from :meth:`start` to :meth:`stop`.

    A call that raises costs a warning and the next call comes as planned: the caller's own process must never
    end because its watch could not look. ``work`` returning ``False`` ends the thread.

    Args:
        name: The thread's name (and the warning's).
        interval_s: Seconds between two calls.
        work: What to do.
        wait_first: Wait one interval before the first call (default: call at once).
    """

    def __init__(self, name: str, interval_s: float, work: Callable[[], object], *,
                 wait_first: bool = False) -> None:
        self.name = name
        self.interval_s = interval_s
        self.work = work
        self.wait_first = wait_first
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        """Whether the thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Start the thread."""
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float | None = None) -> None:
        """Stop the thread and wait for it (at most ``timeout_s``; ``None``: until it ends)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)

    def _run(self) -> None:
        if self.wait_first and self._stop.wait(self.interval_s):
            return
        while True:
            try:
                go_on = self.work()
            except Exception as exc:
                log.warning("%s: %s", self.name, exc)
                go_on = None
            if go_on is False or self._stop.wait(self.interval_s):
                return
