"""The launchers of a multi-node job beat to each other through the rendezvous store, so that a node cut off
from the others (its link down, its host gone) is named, not only the ranks that wait for it.

Each node's launcher adds 1 to its own counter in torchelastic's rendezvous store (a ``TCPStore`` client of its
own, beside the elastic agent's) every ``interval_s`` and reads the others' counters: a node whose counter has not
moved for a while, by this node's clock, has gone silent. A launcher whose store operations fail is itself cut
off from the rendezvous host. No clock is compared across nodes: only whether a counter moved.
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dtpo.distributed.periodic import Periodic

log = logging.getLogger(__name__)

NODE_BEAT_INTERVAL_S = 1.0
_STORE_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class SilentNode:
    """A node whose launcher stopped beating, as this node sees it.

    Attributes:
        node: Its host name (or, when this node is the one cut off, the rendezvous host).
        silent_s: Seconds since its beat last moved.
        this_node: True when it is this node that lost the rendezvous store (so, every other node).
    """

    node: str
    silent_s: float
    this_node: bool = False


def _tcp_store(host: str, port: int) -> Any:
    from torch.distributed import TCPStore

    return TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=_STORE_TIMEOUT_S),
                    wait_for_workers=False)


class NodeBeats:
    """This node's launcher's beat into the rendezvous store, and what it reads of the others'.

    Args:
        endpoint: The rendezvous store, ``host:port``.
        job: The job's rendezvous id (keys are kept apart per job).
        interval_s: Seconds between beats.
        clock: Monotonic seconds.
        connect: Opens a store client on ``(host, port)`` (default: a ``TCPStore`` client).
    """

    def __init__(self, endpoint: str, job: str, interval_s: float = NODE_BEAT_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic,
                 connect: Callable[[str, int], Any] | None = None) -> None:
        host, _, port = endpoint.rpartition(":")
        self.host, self.port = host.strip("[]"), int(port)
        self.node = socket.gethostname()
        self.me = f"{self.node}/{os.getpid()}"
        self.prefix = f"dtpo/{job}"
        self.interval_s = interval_s
        self.clock = clock
        self.connect = connect or _tcp_store
        self._store: Any = None
        self._joined = False
        self._seen: dict[str, tuple[int, float]] = {}  # member -> (its counter, when it last moved)
        self._answered_at: float | None = None  # when the store last answered (None: never yet)
        self._lock = threading.Lock()
        self._beating = Periodic("dtpo-node-beats", interval_s, self.beat)

    def __enter__(self) -> NodeBeats:
        return self

    def __exit__(self, *exc: object) -> None:
        self._beating.stop(timeout_s=2 * _STORE_TIMEOUT_S + self.interval_s)

    def beat(self) -> None:
        """Beat once and read the others' beats (a failure only leaves the store unanswered)."""
        try:
            if self._store is None:
                self._store = self.connect(self.host, self.port)
            if not self._joined:
                self._store.append(f"{self.prefix}/nodes", f"{self.me}\n")
                self._joined = True
            self._store.add(f"{self.prefix}/beat/{self.me}", 1)
            members = self._store.get(f"{self.prefix}/nodes").decode().split()
            counts = {member: int(self._store.add(f"{self.prefix}/beat/{member}", 0)) for member in members}
        except Exception as exc:  # a store that cannot be reached: this node is cut off while it lasts
            log.debug("rendezvous store %s:%d did not answer: %s", self.host, self.port, exc)
            return
        now = self.clock()
        with self._lock:
            self._answered_at = now
            for member, count in counts.items():
                previous = self._seen.get(member)
                if previous is None or previous[0] != count:
                    self._seen[member] = (count, now)

    def silent(self, after_s: float) -> list[SilentNode]:
        """The nodes silent for more than ``after_s``: the others whose beat stopped moving, or, when this node
        lost the store itself, the rendezvous host (``this_node``)."""
        now = self.clock()
        with self._lock:
            if self._answered_at is not None and now - self._answered_at > after_s:
                return [SilentNode(self.host, now - self._answered_at, this_node=True)]
            return [SilentNode(member.rsplit("/", 1)[0], now - moved)
                    for member, (_, moved) in sorted(self._seen.items())
                    if member != self.me and now - moved > after_s]

    def arm(self) -> None:
        """Start beating: the workers run, so the rendezvous store is up (before it, connecting would only fill
        the terminal with c10d's connection warnings)."""
        if not self._beating.running:
            self._beating.start()
