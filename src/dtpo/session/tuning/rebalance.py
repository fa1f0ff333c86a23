"""Uneven per-rank batches on real ranks: each rank's share of the global batch follows its measured speed.

Built on the straggler slowdown (:class:`~dtpo.session.tuning.stragglers.StragglerCallback`), which is built on
the slack all-gather: after every full window each rank has every rank's ready time per step, in the one
all-gather that window already costs. Every rank takes each rank's ready time at its free clock (for a rank whose
clock the straggler policy locked, the policy's own estimate of its time at its free clock) at the share it trained,
and runs the same :class:`~dtpo.tune.rebalance.Rebalancer` decision on the same figures, so every rank arrives at
the same shares with no further collective. The Session hands each rank its share of the next step's global batch
(:class:`~dtpo.session.loop.shares.BatchShares`).

With ``--tune rebalance,stragglers`` the clocks come second in the same window: the shares take what persists,
and the slack that remains (a transient straggler, the rounding of whole samples) goes to the clocks as before.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from dtpo.core.record import RankRecord
from dtpo.core.record_sections import SlackSection
from dtpo.core.steps import RunView
from dtpo.core.tuner_status import ClockLock, TunerState
from dtpo.devices.base import Device
from dtpo.session.tuning.slack import SlackCallback, SlackWindow
from dtpo.session.tuning.stragglers import StragglerCallback
from dtpo.tune.rebalance import RankSpeed, Rebalancer

log = logging.getLogger(__name__)


class RebalanceCallback(StragglerCallback):
    """Moves samples between ranks toward their speeds, and with ``clocks`` slows down what still only waits.

    Args:
        mode: The knob mode for the clocks (``apply``, ``dry-run``, ``observe``).
        gpus: This rank's GPUs with knobs (used only with ``clocks``).
        clocks: Per-rank clock slowdown too (``--tune rebalance,stragglers``).
        max_share: A rank takes at most this many times the even share.
    """

    def __init__(self, mode: str, gpus: list[Device], clocks: bool, max_share: float = 1.5) -> None:
        super().__init__(mode, gpus)
        self.clocks = clocks
        self.max_share = max_share
        self.rebalancer: Rebalancer | None = None
        self.share_changes: list[dict[str, Any]] = []
        self.recommendations: list[str] = []
        self.initial_shares: tuple[int, ...] | None = None
        self._restored: dict[str, Any] | None = None

    def on_train_start(self, session: RunView) -> None:
        """Join the slack tracking (and, with ``clocks``, the clock slowdown where every rank can lock clocks)."""
        if self.clocks:
            super().on_train_start(session)
        else:
            SlackCallback.on_train_start(self, session)
        if not self._active and session.rank == 0:
            log.warning("rebalance: needs DDP on several processes; every rank keeps its even share")

    def on_step_begin(self, session: RunView, step: int) -> None:
        """After a resume, put the shares of the checkpoint back before its first step."""
        shares = _shares_of(session)
        if self._restored is not None and shares is not None:
            shares.set(self._restored["shares"])
            self._restored = None

    def on_slack(self, session: RunView, slack: SlackWindow) -> None:
        """Decide every rank's share from the shared window (then, with ``clocks``, this rank's clock)."""
        shares = _shares_of(session)
        if shares is not None and shares.shares is not None:
            self._rebalance(session, slack, shares)
        if self.clocks:
            super().on_slack(session, slack)

    def _rebalance(self, session: RunView, slack: SlackWindow, shares: Any) -> None:
        if self.rebalancer is None:
            self.initial_shares = shares.shares
            self.rebalancer = Rebalancer(shares.global_batch, session.world_size, max_share=self.max_share,
                                         shares=shares.shares)
        in_force = self.rebalancer.shares
        ready = list(slack.ready_s)
        if self.policy is not None:  # the clocks' policy knows each rank's time at its free clock
            ready = self.policy.free_ready_s(self.rank_windows(slack))
        decision = self.rebalancer.decide([RankSpeed(ready[r], in_force[r], slack.spread[r], slack.steps)
                                           for r in range(session.world_size)])
        if decision.recommendation is not None:
            self.recommendations.append(decision.recommendation)
            if session.rank == 0:
                log.warning("rebalance: %s", decision.recommendation)
        if not decision.changed:
            return
        shares.set(decision.shares)
        step = slack.first_step + slack.steps
        self.share_changes.append({"window": slack.index, "step": step, "shares": list(decision.shares),
                                   "gain": round(decision.gain, 4), "slow_ranks": list(decision.slow_ranks)})
        if session.rank == 0:
            log.info("rebalance: from step %d, samples per rank %s (predicted %.1f%% shorter steps)", step,
                     list(decision.shares), 100 * decision.gain)

    def state_dict(self) -> dict[str, Any]:
        """The clocks' state (:meth:`StragglerCallback.state_dict`) and the rebalancer's."""
        state = super().state_dict()
        state["rebalance"] = None if self.rebalancer is None else {
            "rebalancer": self.rebalancer.state_dict(), "changes": list(self.share_changes),
            "initial": list(self.initial_shares or ()), "recommendations": list(self.recommendations)}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where the checkpoint left off: the clocks' state back, and the shares from the first step."""
        super().load_state_dict(state)
        saved = state.get("rebalance")
        if saved is None or not self._active:
            return
        memory = saved["rebalancer"]
        self.rebalancer = Rebalancer(sum(memory["shares"]), len(memory["shares"]), max_share=self.max_share)
        self.rebalancer.load_state_dict(memory)
        self.share_changes = list(saved["changes"])
        self.initial_shares = tuple(saved["initial"])
        self.recommendations = list(saved["recommendations"])
        self._restored = {"shares": memory["shares"]}

    def tuner_state(self) -> TunerState:
        """``rebalanced`` (shares moved from even), ``even`` or ``off``; the clocks' state where they are tuned."""
        if self.clocks and self.policy is not None and self.lock is not None:
            return TunerState("rebalance", "slowed")
        if self.rebalancer is None:
            return TunerState("rebalance", "off" if not self._active else "even")
        moved = self.rebalancer.shares != self.initial_shares
        return TunerState("rebalance", "rebalanced" if moved else "even")

    def clock_lock(self) -> ClockLock | None:
        """The clock this rank holds, where the clocks are tuned too."""
        return super().clock_lock() if self.clocks else None

    def current_shares(self) -> tuple[int, ...] | None:
        """Every rank's samples per step now (``None`` before the first window)."""
        return None if self.rebalancer is None else self.rebalancer.shares

    def on_rank_end(self, session: RunView, rank_record: RankRecord) -> None:
        """Restore the clocks, then put the shares over the run in this rank's slack record."""
        super().on_rank_end(session, rank_record)
        if self.rebalancer is None:
            return
        if rank_record.slack is None:  # no full window in this attempt (resumed near the end): the shares still count
            rank_record.slack = SlackSection(windows=0, steps=0, wait_s_per_step=0.0, wait_share=0.0,
                                             note="no window gathered in this attempt; shares from its checkpoint")
        rank_record.slack = replace(
            rank_record.slack, shares=list(self.rebalancer.shares), initial_shares=list(self.initial_shares or ()),
            share_changes=list(self.share_changes), recommendations=list(self.recommendations),
            mode=rank_record.slack.mode if self.clocks else None,
            clock_changes=rank_record.slack.clock_changes if self.clocks else None,
            tuned=rank_record.slack.tuned if self.clocks else None)


def _shares_of(session: RunView) -> Any:
    """The producer's :class:`~dtpo.session.loop.shares.BatchShares` (``None`` where it cuts none)."""
    return getattr(session, "batch_shares", None)
