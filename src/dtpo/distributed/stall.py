"""The launcher's stall watch: a rank that makes no progress for too long is named and stopped.

Without it, the ranks that wait for a stopped one sit in the collective until its timeout (30 minutes on gloo,
10 on NCCL) with nothing on the screen. The watch reads its node's heartbeats (:mod:`dtpo.distributed.heartbeat`)
twice a second; when a rank has begun or ended no step for ``max(floor_s, factor x the median step time)``, it
says in one line which rank on which node stopped at which step, and kills that rank's process, so torchrun
ends the attempt as for any failed worker: under ``--max-restarts`` it restarts the group, which resumes from the
last checkpoint.

Which rank stalled, when every rank of the node has stopped progressing (the others wait for it):

1. the ranks that no longer beat (stopped by ``SIGSTOP``, or holding the interpreter in a hang): a beat older
   than ``beat_stale_s``, while the waiting ranks' threads still beat;
2. else the ranks that got least far (a hung data loader before its step: the others began theirs and wait);
3. else none can be singled out (every rank beats and stands at the same step, e.g. waiting for a rank on
   another node, or all stuck on their devices): the node's ranks are stopped together, and the line says so. In
   a job of several nodes, the launchers also beat to each other through the rendezvous store
   (:mod:`dtpo.distributed.node_beats`): a node whose launcher went silent is named as lost, and a node cut off
   from the rendezvous host says that instead.

Steps are counted only once a rank ended its first (before it, compiling and warming up have no median to
compare with), and the time between steps counts like any other: a checkpoint or an evaluation between steps
longer than the limit needs a higher floor. A rank that pauses on purpose (``--grid-policy pause``) says so in its
beat, and no rank of the node is judged until it resumes.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dtpo.core.config import MIN_STALL_FLOOR_S, STALL_FACTOR, STALL_FLOOR_S
from dtpo.core.errors import LaunchError
from dtpo.distributed.heartbeat import BEAT_INTERVAL_S, Beat, read_beats
from dtpo.distributed.node_beats import NodeBeats, SilentNode
from dtpo.distributed.periodic import Periodic

log = logging.getLogger(__name__)

assert MIN_STALL_FLOOR_S >= 3 * BEAT_INTERVAL_S, "a rank that beats must be told from one that stopped"
_WATCH_INTERVAL_S = 0.5


@dataclass(frozen=True)
class StallPolicy:
    """When a rank counts as stalled.

    Attributes:
        factor: A rank stalls after this many median step times without progress (0: never watch).
        floor_s: ... and never before this many seconds.
        beat_stale_s: A rank whose last beat is older than this has stopped beating.
    """

    factor: float = STALL_FACTOR
    floor_s: float = STALL_FLOOR_S
    beat_stale_s: float = MIN_STALL_FLOOR_S

    def __post_init__(self) -> None:
        check_stall_flags(self.factor, self.floor_s)

    @property
    def enabled(self) -> bool:
        """Whether the launcher watches at all."""
        return self.factor > 0

    def limit_s(self, median_step_s: float) -> float:
        """Seconds without progress after which a rank stalls, for a job whose steps take ``median_step_s``."""
        return max(self.floor_s, self.factor * median_step_s)


def check_stall_flags(factor: float, floor_s: float) -> None:
    """Raise a one-line :class:`LaunchError` naming the flag of a stall setting that cannot work."""
    if not (math.isfinite(factor) and factor >= 0):
        raise LaunchError(f"--stall-factor must be a number of median step times >= 0 (0: off), got {factor:g}")
    if not (math.isfinite(floor_s) and floor_s >= MIN_STALL_FLOOR_S):
        raise LaunchError(f"--stall-floor must be at least {MIN_STALL_FLOOR_S:g} s (ranks beat every "
                          f"{BEAT_INTERVAL_S:g} s), got {floor_s:g}")


@dataclass(frozen=True)
class Stall:
    """A stall the watch found.

    Attributes:
        ranks: The ranks it stopped (one, unless none could be singled out).
        pids: Their processes.
        node: Their node.
        step: The step they hold up (where the others wait; the last one they began or ended).
        idle_s: Seconds since any rank of the node last progressed, when it was found.
        limit_s: The limit they passed.
        median_step_s: The job's median step time the limit came from.
        attempt: The elastic attempt it happened in.
        why: How the ranks were singled out (:data:`WHY`).
        lost: The node lost when the ranks of this node wait for it (or, ``this_node``, the rendezvous host this
            node lost), as the launchers' own beats show it.
    """

    ranks: tuple[int, ...]
    pids: tuple[int, ...]
    node: str
    step: int | None
    idle_s: float
    limit_s: float
    median_step_s: float
    attempt: int
    why: str
    lost: SilentNode | None = None

    def describe(self) -> str:
        """One line: which rank on which node stopped at which step (or which node was lost), and why."""
        who = (f"rank {self.ranks[0]}" if len(self.ranks) == 1
               else "ranks " + ", ".join(str(rank) for rank in self.ranks))
        at = "before the first step" if self.step is None else f"at step {self.step}"
        limit = f"limit {self.limit_s:.1f} s, median step {self.median_step_s * 1e3:.0f} ms"
        if self.lost is not None and self.lost.this_node:
            return (f"node {self.node} lost the rendezvous host {self.lost.node} {at}: no answer for "
                    f"{self.lost.silent_s:.1f} s, and {who} made no progress for {self.idle_s:.1f} s ({limit})")
        if self.lost is not None:
            return (f"node {self.lost.node} lost {at}: its launcher went silent {self.lost.silent_s:.1f} s ago, "
                    f"and {who} on node {self.node} made no progress for {self.idle_s:.1f} s ({limit})")
        return (f"{who} on node {self.node} stalled {at}: no progress for {self.idle_s:.1f} s ({limit}: "
                f"{WHY[self.why]})")


WHY = {
    "silent": "it stopped beating while the others wait",
    "behind": "the others are ahead and wait for it",
    "all": "every rank of this node stopped together; the cause may be on another node",
    "node": "they wait for a node that was lost",
}
"""How a stall's ranks were singled out, in words."""


def find_stall(beats: list[Beat], now: float, policy: StallPolicy,
               silent_nodes: list[SilentNode] | None = None) -> Stall | None:
    """The stall among one attempt's beats of one node, if there is one (see the module's rules); where none of
    the node's ranks can be singled out, the first of ``silent_nodes`` is named as lost."""
    live = [beat for beat in beats if not beat.finished]
    if any(beat.paused for beat in live):  # the ranks hold still together on purpose (a grid pause)
        return None
    medians = [beat.median_step_s for beat in live if beat.median_step_s is not None]
    if not live or not medians:
        return None
    median = statistics.median(medians)
    limit = policy.limit_s(median)
    idle = now - max(beat.progress_at for beat in live)  # in step with each other, no rank progressed since
    if idle <= limit:
        return None
    silent = [beat for beat in live if now - beat.beat_at > policy.beat_stale_s]
    beating = [beat for beat in live if beat not in silent]
    if silent:
        # a stopped rank's last beat may be up to a beat old: the step it holds up is where the others wait
        culprits, why = silent, "silent"
        step = min((beat for beat in beating), key=lambda beat: beat.position, default=silent[0]).step
    else:
        least = min(beat.position for beat in live)
        behind = [beat for beat in live if beat.position == least]
        culprits, why = (behind, "behind") if len(behind) < len(live) else (live, "all")
        step = behind[0].step
    lost = (silent_nodes or [None])[0] if why == "all" else None
    first = min(culprits, key=lambda beat: beat.rank)
    return Stall(ranks=tuple(beat.rank for beat in culprits), pids=tuple(beat.pid for beat in culprits),
                 node=first.node, step=step, idle_s=idle, limit_s=limit, median_step_s=median,
                 attempt=first.attempt, why="node" if lost is not None else why, lost=lost)


class StallWatch:
    """A daemon thread of the launcher that watches its node's heartbeats and stops a stalled rank.

    Args:
        directory: The heartbeat directory the workers beat into.
        policy: When a rank counts as stalled.
        kill: Stops a process (default: ``SIGKILL``, which also ends a stopped one).
        clock: Monotonic seconds (the workers' clock).
        nodes: The launchers' beats to each other, in a job of several nodes (``None``: one node).
    """

    def __init__(self, directory: Path, policy: StallPolicy,
                 kill: Callable[[int], None] | None = None, clock: Callable[[], float] = time.monotonic,
                 nodes: NodeBeats | None = None) -> None:
        self.directory = directory
        self.policy = policy
        self.nodes = nodes
        self.kill = kill or _kill
        self.clock = clock
        self.stalls: list[Stall] = []
        self.saw_workers = False  # a worker beat at least once: the rendezvous had completed
        self._watching = Periodic("dtpo-stall-watch", _WATCH_INTERVAL_S, self.check, wait_first=True)

    def __enter__(self) -> StallWatch:
        if self.policy.enabled:
            self._watching.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._watching.stop(timeout_s=5.0)
        if self.nodes is not None:
            self.nodes.__exit__()

    @property
    def running(self) -> bool:
        """Whether the watch looks (it does not when the policy is off)."""
        return self._watching.running

    def check(self) -> Stall | None:
        """Look once: find a stall in the newest attempt not yet acted on, report it and stop its ranks."""
        beats = read_beats(self.directory)
        if beats and not self.saw_workers:
            self.saw_workers = True
            if self.nodes is not None:
                self.nodes.arm()
        handled = max((stall.attempt for stall in self.stalls), default=-1)
        attempt = max((beat.attempt for beat in beats), default=-1)
        if attempt <= handled:
            return None
        silent = self.nodes.silent(self.policy.beat_stale_s) if self.nodes is not None else []
        stall = find_stall([beat for beat in beats if beat.attempt == attempt], self.clock(), self.policy, silent)
        if stall is None:
            return None
        self.stalls.append(stall)
        log.error("%s; stopping %s", stall.describe(), "it" if len(stall.ranks) == 1 else "them")
        for pid in stall.pids:
            self.kill(pid)
        return stall


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
