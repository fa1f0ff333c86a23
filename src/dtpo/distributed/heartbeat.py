"""Each rank's heartbeat to the launcher of its node: its progress, seen out of band rather than through a
collective, so that a rank that stops (``SIGSTOP``, a hung data loader, a GPU stuck in a kernel) can be named
while the others wait for it inside the collective.

A worker's :class:`HeartbeatWriter` keeps the last step event its producer reported (which step, whether it is
inside it, when) and a daemon thread writes them, with the time of the beat itself, to ``DIR/rank-N.json``
every ``interval_s`` (an atomic rename; the directory is the launcher's own, on the node's local disk). The
training thread only sets a few attributes per step; the file is written by the thread. A stopped process stops
beating too, which is how the launcher tells "stopped" from "waiting" (:mod:`dtpo.distributed.stall`).

Times are ``time.monotonic()``: one clock for every process of the node (Linux's ``CLOCK_MONOTONIC``), which a
change of the wall clock does not move.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dtpo.distributed.periodic import Periodic

log = logging.getLogger(__name__)

BEAT_INTERVAL_S = 1.0
"""Seconds between two beats of a rank."""
_RECENT_STEPS = 32  # step times the median is taken over


@dataclass(frozen=True)
class Beat:
    """One rank's last heartbeat.

    Attributes:
        rank: Global rank.
        local_rank: Rank on its node.
        node: The host name of its node.
        pid: Its process id.
        attempt: The elastic attempt it belongs to (0, then 1 after a restart, ...).
        step: The last optimizer step it began or ended (``None`` before the first).
        in_step: True between the beginning and the end of ``step``.
        progress_at: When it last began or ended a step (or started training).
        beat_at: When this beat was written.
        median_step_s: The median time of its recent steps (``None`` before the first ended).
        finished: It stopped training (normally or not): no more steps are coming.
        paused: It holds still on purpose between steps (a grid pause): no progress is expected until it resumes.
    """

    rank: int
    local_rank: int
    node: str
    pid: int
    attempt: int
    step: int | None
    in_step: bool
    progress_at: float
    beat_at: float
    median_step_s: float | None
    finished: bool = False
    paused: bool = False

    @property
    def position(self) -> tuple[int, int]:
        """How far it got, for comparing ranks: a rank inside step N is behind one that ended it."""
        return (-1 if self.step is None else self.step, 0 if self.in_step else 1)

    def to_dict(self) -> dict[str, Any]:
        """The beat as written to its file."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Beat:
        """A beat read back (``KeyError`` / ``TypeError`` / ``ValueError`` for a malformed one)."""
        return cls(rank=int(data["rank"]), local_rank=int(data["local_rank"]), node=str(data["node"]),
                   pid=int(data["pid"]), attempt=int(data["attempt"]),
                   step=None if data["step"] is None else int(data["step"]), in_step=bool(data["in_step"]),
                   progress_at=float(data["progress_at"]), beat_at=float(data["beat_at"]),
                   median_step_s=None if data["median_step_s"] is None else float(data["median_step_s"]),
                   finished=bool(data.get("finished", False)), paused=bool(data.get("paused", False)))


def beat_path(directory: Path, rank: int) -> Path:
    """The file rank ``rank`` beats into."""
    return directory / f"rank-{rank}.json"


def read_beats(directory: Path) -> list[Beat]:
    """Every rank's last beat in ``directory``, by rank; a file caught half-written or malformed is skipped."""
    beats: list[Beat] = []
    for path in sorted(directory.glob("rank-*.json")):
        try:
            beats.append(Beat.from_dict(json.loads(path.read_text())))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return sorted(beats, key=lambda beat: beat.rank)


class HeartbeatWriter:
    """A rank's heartbeat: the training thread reports step events, a daemon thread writes them.

    Args:
        directory: The launcher's heartbeat directory.
        rank: Global rank.
        local_rank: Rank on this node.
        attempt: The elastic attempt (``TORCHELASTIC_RESTART_COUNT``).
        interval_s: Seconds between beats.
        clock: Monotonic seconds.
    """

    def __init__(self, directory: Path, rank: int, local_rank: int, attempt: int,
                 interval_s: float = BEAT_INTERVAL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.directory = Path(directory)
        self.rank = rank
        self.local_rank = local_rank
        self.attempt = attempt
        self.interval_s = interval_s
        self.clock = clock
        self.node = socket.gethostname()
        self.step: int | None = None
        self.in_step = False
        self.progress_at = clock()
        self.finished = False
        self.paused = False
        self._recent: list[float] = []  # a ring of recent step times (read by the beating thread)
        self._next = 0
        self._beating = Periodic("dtpo-heartbeat", interval_s, self.beat, wait_first=True)

    def start(self) -> None:
        """Write the first beat now and keep beating in a daemon thread."""
        self.beat()
        self._beating.start()

    def step_begun(self, step: int) -> None:
        """Step ``step`` began."""
        self.step, self.in_step, self.progress_at = step, True, self.clock()

    def step_ended(self, step: int, step_s: float) -> None:
        """Step ``step`` ended after ``step_s`` seconds."""
        self.step, self.in_step, self.progress_at = step, False, self.clock()
        self.step_timed(step_s)

    def step_timed(self, step_s: float) -> None:
        """An earlier step took ``step_s`` seconds (for the median step time; no progress)."""
        if len(self._recent) < _RECENT_STEPS:
            self._recent.append(step_s)
        else:
            self._recent[self._next] = step_s
            self._next = (self._next + 1) % _RECENT_STEPS

    def pause(self) -> None:
        """The rank holds still on purpose (a grid pause): the launcher expects no progress until :meth:`resume`."""
        self.paused = True
        self.beat()

    def resume(self) -> None:
        """The pause ended: progress is expected again, counted from now."""
        self.paused, self.progress_at = False, self.clock()
        self.beat()

    def stop(self) -> None:
        """Training stopped on this rank: one last beat says so, and the thread ends."""
        self.finished = True
        self._beating.stop(timeout_s=2 * self.interval_s)
        self.beat()

    def current(self) -> Beat:
        """The beat as of now."""
        recent = [t for t in list(self._recent) if t >= 0]
        return Beat(rank=self.rank, local_rank=self.local_rank, node=self.node, pid=os.getpid(),
                    attempt=self.attempt, step=self.step, in_step=self.in_step, progress_at=self.progress_at,
                    beat_at=self.clock(), median_step_s=statistics.median(recent) if recent else None,
                    finished=self.finished, paused=self.paused)

    def beat(self) -> None:
        """Write the current beat (atomically: a reader sees the old file or the new one)."""
        path = beat_path(self.directory, self.rank)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(self.current().to_dict()))
            os.replace(tmp, path)
        except OSError as exc:  # the launcher's directory went away: it no longer watches
            log.debug("heartbeat of rank %d not written: %s", self.rank, exc)
