"""Per-rank slowdown on real GPUs: each rank that only waits for a straggler locks its own SM clock lower.

Built on :class:`~dtpo.session.tuning.slack.SlackCallback`: after every full window the ranks share, in the one
all-gather that window already costs, each rank's ready times, its SM clock and whether it is locked. Every
rank then runs the same :class:`~dtpo.tune.straggler.StragglerSlowdown` decision on the same figures and
applies only its own part, to its own GPUs, through the journaled
:class:`~dtpo.devices.knobs.KnobController` (apply, dry-run or observe; restored at the end, on a signal, or
by the next dtpo start after a crash). The critical rank runs free; a rank that becomes critical is unlocked
in the next window.

Every rank must have GPUs with lockable SM clocks, or none does anything (a rank without them says so once,
and training goes on at full speed).
"""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist

from dtpo.core.record import RankRecord
from dtpo.core.steps import RunView
from dtpo.core.tuner_status import ClockLock, TunerState
from dtpo.devices.base import Device, DeviceError, KnobError
from dtpo.devices.knobs import KnobController, log_knob_action
from dtpo.session.tuning.slack import SlackCallback, SlackWindow
from dtpo.tune.straggler import RankWindow, StragglerSlowdown

log = logging.getLogger(__name__)


class StragglerCallback(SlackCallback):
    """Locks this rank's SM clock lower while it only waits for a straggler; see the module docs.

    Args:
        mode: The knob mode (``apply``, ``dry-run``, ``observe``).
        gpus: This rank's GPUs with knobs.
        margin: A slowed rank aims to be ready this share of the critical rank's time early.
    """

    def __init__(self, mode: str, gpus: list[Device], margin: float = 0.03) -> None:
        super().__init__()
        self.mode = mode
        self.gpus = gpus
        self.margin = margin
        self.policy: StragglerSlowdown | None = None
        self.controller: KnobController | None = None
        self.lock: float | None = None
        self.changes: list[dict[str, Any]] = []
        self._energy_mark: float | None = None

    def on_train_start(self, session: RunView) -> None:
        """Join the slack tracking; tune only if every rank has lockable clocks."""
        super().on_train_start(session)
        limits = self.gpus[0].knob_limits() if self.gpus else None
        clocks = tuple(limits.sm_clocks_mhz) if limits is not None else ()
        if not self._active or not _everyone(session, bool(clocks)):
            if session.rank == 0:
                log.warning("stragglers: not every rank has a GPU with lockable SM clocks (or this is not a "
                            "multi-process DDP run): ranks keep their clocks")
            self.gpus = []
            return
        self.policy = StragglerSlowdown(clocks, margin=self.margin)
        self.controller = KnobController(self.mode, log=log_knob_action)
        self.controller.__enter__()

    def own_state(self, window: Any) -> tuple[float, bool, float]:
        """This rank's SM clock (the GPU's own reading, else the lock, else ``nan``), whether it is locked, and
        its GPUs' energy per step since the last window (read from their counters)."""
        if not self.gpus:
            return math.nan, False, math.nan
        clock = self.gpus[0].sm_clock_mhz()
        if clock is None:
            clock = self.lock if self.lock is not None else math.nan
        energy = math.nan
        try:
            now = sum(gpu.energy_j() for gpu in self.gpus)
        except DeviceError:
            now = None
        if now is not None and self._energy_mark is not None and window.steps > 0:
            energy = (now - self._energy_mark) / window.steps
        self._energy_mark = now
        return float(clock), self.lock is not None, energy

    def on_slack(self, session: RunView, slack: SlackWindow) -> None:
        """Decide every rank's lock from the shared window; apply this rank's."""
        if self.policy is None or self.controller is None:
            return
        wanted = self.policy.decide(self.rank_windows(slack))[session.rank]
        if wanted == self.lock or not self._set_lock(wanted):
            return
        self.changes.append({"window": slack.index, "step": slack.first_step + slack.steps,
                             "clock_mhz": wanted, "critical_rank": slack.critical_rank})

    def rank_windows(self, slack: SlackWindow) -> list[RankWindow]:
        """The shared window as the clock policy reads it, one :class:`RankWindow` per rank (a clock not reported
        counts as the top one)."""
        assert self.policy is not None
        top = self.policy.clocks_mhz[-1]
        return [RankWindow(slack.ready_s[r], slack.clock_mhz[r] if math.isfinite(slack.clock_mhz[r]) else top,
                           slack.locked[r], slack.spread[r],
                           slack.energy_j[r] if math.isfinite(slack.energy_j[r]) else None, slack.steps,
                           slack.holdout_s[r] if slack.holdout_s else None)
                for r in range(len(slack.ready_s))]

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps (:mod:`dtpo.session.checkpoint`): the policy's memory, this rank's lock and its
        changes so far."""
        if self.policy is None:
            return {"policy": None}
        return {"policy": self.policy.state_dict(), "lock": self.lock, "changes": list(self.changes)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where the checkpoint left off (after :meth:`on_train_start`): the policy's memory back, and this
        rank's lock applied again through the journaled knob controller."""
        if state.get("policy") is None or self.policy is None or self.controller is None:
            return
        self.policy.load_state_dict(state["policy"])
        self.changes = list(state["changes"])
        if state["lock"] is not None:
            self._set_lock(state["lock"])

    def _set_lock(self, clock: float | None) -> bool:
        """Lock this rank's GPUs at ``clock`` (``None``: unlock) through the knob controller; a GPU that refuses
        turns the tuning off on this rank. Returns whether the lock is in place."""
        assert self.controller is not None
        try:
            for gpu in self.gpus:
                if clock is None:
                    self.controller.unlock_sm_clocks(gpu)
                else:
                    self.controller.lock_sm_clock(gpu, int(clock))
        except KnobError as exc:
            log.warning("stragglers: %s; this rank keeps its clock", exc)
            self.policy = None
            return False
        self.lock = clock
        return True

    def tuner_state(self) -> TunerState:
        """``off`` (not tuning on this rank), ``slowed`` (its clock locked lower) or ``free``."""
        if self.policy is None:
            return TunerState("stragglers", "off")
        return TunerState("stragglers", "slowed" if self.lock is not None else "free")

    def clock_lock(self) -> ClockLock | None:
        """While tuning, the clock this rank holds (0: free), shown only when applied."""
        if self.policy is None:
            return None
        applying = self.controller is not None and self.controller.mode == "apply"
        return ClockLock(float(self.lock or 0.0) if applying else None)

    def on_rank_end(self, session: RunView, rank_record: RankRecord) -> None:
        """Restore the clocks, then add what was changed to this rank's slack record."""
        if self.controller is not None:
            self.controller.__exit__(None, None, None)
            self.controller = None
        super().on_rank_end(session, rank_record)
        if rank_record.slack is not None:
            rank_record.slack = replace(rank_record.slack, mode=self.mode, clock_changes=self.changes,
                                        tuned=self.policy is not None)


def _everyone(session: RunView, mine: bool) -> bool:
    """Whether ``mine`` holds on every rank (one all-reduce)."""
    flag = torch.tensor([1.0 if mine else 0.0], dtype=torch.float64, device=session.ctx.collective_device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=session.ctx.group)
    return bool(flag.item() == 1.0)
