"""Online slack: how long each rank waits for the slowest one, learned once per window, not once per step.

At the end of every full window each rank contributes, for each step of the window, when it became ready
(from leaving the previous collective to its last gradient bucket) and its tail (from then until backward
returned). One all-gather of that small table per window (no collective per step) gives every rank the same
picture: per step, the rank that became ready last (the *critical* rank) and each rank's wait for it, by the
rule the end-of-run breakdown uses (:func:`dtpo.core.totals.sync_waits`). The run's per-step ``sync_wait_s``
is still computed at the end, as before.

What a rank learns is in :attr:`SlackCallback.latest` and :attr:`SlackCallback.history` (per window: every
rank's mean wait per step and share of step time, the critical rank and how often it was critical) and,
summed up, in its record (``ranks[].slack``). Tuners that slow down ranks which only wait (per-rank DVFS)
read it from there.

Only DDP runs with several processes have tails to compare; elsewhere the callback does nothing. The last,
shorter window of a run is not gathered: after an error a peer may be gone, and a collective would hang.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import torch
import torch.distributed as dist

from dtpo.core.callbacks import Callback
from dtpo.core.record import RankRecord
from dtpo.core.record_sections import SlackSection
from dtpo.core.steps import RunView, Window
from dtpo.core.totals import ready_s, sync_waits
from dtpo.core.tuner_status import SlackReading


@dataclass(frozen=True)
class SlackWindow:
    """Every rank's wait for the slowest one over one window (the same on every rank).

    Attributes:
        index: The window's index.
        first_step: Its first optimizer step.
        steps: Steps in it.
        wait_s: Each rank's mean wait per step, by rank.
        wait_share: Each rank's wait as a share of its step time, by rank.
        critical_rank: The rank that became ready last in most steps.
        critical_share: The share of steps in which it was.
        ready_s: Each rank's mean time per step until ready, by rank.
        spread: Each rank's relative step-to-step standard deviation of that time, by rank.
        holdout_s: Each rank's mean time per step until ready over the window's odd-numbered steps only, by rank
            (the straggler policy fits its curve on these and decides on the others).
        clock_mhz: Each rank's SM clock at the end of the window where it was reported (``nan`` otherwise).
        locked: Whether each rank's SM clock was locked.
        energy_j: Each rank's GPU energy per step over the window where it was reported (``nan`` otherwise).
    """

    index: int
    first_step: int
    steps: int
    wait_s: tuple[float, ...]
    wait_share: tuple[float, ...]
    critical_rank: int
    critical_share: float
    ready_s: tuple[float, ...] = ()
    spread: tuple[float, ...] = ()
    holdout_s: tuple[float, ...] = ()
    clock_mhz: tuple[float, ...] = ()
    locked: tuple[bool, ...] = ()
    energy_j: tuple[float, ...] = ()


class SlackCallback(Callback):
    """Learns every rank's slack with one all-gather per window; see the module docs.

    Attributes:
        history: One :class:`SlackWindow` per gathered window.
        gathers: All-gathers issued (one per full window).
    """

    def __init__(self) -> None:
        self.history: list[SlackWindow] = []
        self.gathers = 0
        self._active = False

    @property
    def latest(self) -> SlackWindow | None:
        """The newest window's slack, or ``None`` before the first full window."""
        return self.history[-1] if self.history else None

    def latest_slack(self) -> SlackReading | None:
        """The latest window's waits for :class:`~dtpo.core.tuner_status.SlackStatus`, ``None`` before the first."""
        latest = self.latest
        return None if latest is None else SlackReading(latest.index, latest.wait_s)

    def trend_s(self, rank: int, windows: int = 3) -> float | None:
        """How much ``rank``'s wait per step changed per window over the last ``windows`` windows."""
        recent = self.history[-windows:]
        if len(recent) < 2:
            return None
        return (recent[-1].wait_s[rank] - recent[0].wait_s[rank]) / (len(recent) - 1)

    def on_train_start(self, session: RunView) -> None:
        """Track slack only where there is something to compare: several DDP processes."""
        self._active = session.ctx.distributed and session.world_size > 1 and session.config.strategy == "ddp"

    def on_window_end(self, session: RunView, window: Window) -> None:
        """Gather the window's ready times and tails of every rank, and work out each one's wait."""
        if not self._active or window.steps < session.config.window_steps:
            return
        steps = session.lifecycle.rank.steps
        by_index = {s.step: i for i, s in enumerate(steps)}
        clock, locked, energy = self.own_state(window)
        rows = []
        for step_index in range(window.first_step, window.last_step + 1):
            i = by_index[step_index]
            step = steps[i]
            rows.append([ready_s(step, steps[i - 1] if i > 0 else None),
                         math.nan if step.tail_s is None else step.tail_s, step.step_s, clock, float(locked),
                         energy])
        mine = torch.tensor(rows, dtype=torch.float64, device=session.ctx.collective_device)
        everyone = [torch.empty_like(mine) for _ in range(session.world_size)]
        dist.all_gather(everyone, mine, group=session.ctx.group)
        self.gathers += 1
        table = torch.stack(everyone).cpu()  # (ranks, steps, [ready, tail, step, clock, locked, energy])
        self.history.append(_summarise(window, table))
        self.on_slack(session, self.history[-1])

    def own_state(self, window: Window) -> tuple[float, bool, float]:
        """This rank's SM clock, whether it is locked, and its GPUs' energy per step over ``window``, shared with
        the others (``nan`` where unknown)."""
        return math.nan, False, math.nan

    def on_slack(self, session: RunView, slack: SlackWindow) -> None:
        """Called on every rank with the same picture after each gathered window (for subclasses)."""

    def on_rank_end(self, session: RunView, rank_record: RankRecord) -> None:
        """This rank's slack over the run, with the critical ranks seen, in its record."""
        if not self.history:
            return
        rank = session.rank
        steps = sum(w.steps for w in self.history)
        critical = Counter(w.critical_rank for w in self.history)
        rank_record.slack = SlackSection(
            windows=len(self.history), steps=steps,
            wait_s_per_step=sum(w.wait_s[rank] * w.steps for w in self.history) / steps,
            wait_share=sum(w.wait_share[rank] * w.steps for w in self.history) / steps,
            critical_ranks={str(r): n for r, n in sorted(critical.items())},
            note="learned online, one all-gather per window; the breakdown's sync_wait_s is computed at the end",
        )


def _summarise(window: Window, table: torch.Tensor) -> SlackWindow:
    ranks, steps, _ = table.shape
    waits = [[0.0] * steps for _ in range(ranks)]
    critical: Counter[int] = Counter()
    for j in range(steps):
        ready = [float(table[r, j, 0]) for r in range(ranks)]
        tails = [None if math.isnan(float(table[r, j, 1])) else float(table[r, j, 1]) for r in range(ranks)]
        for r, wait in enumerate(sync_waits(ready, tails)):
            waits[r][j] = wait or 0.0
        critical[max(range(ranks), key=lambda r: ready[r])] += 1
    step_time = [float(table[r, :, 2].sum()) for r in range(ranks)]
    top, count = critical.most_common(1)[0]
    ready = table[:, :, 0]
    mean = ready.mean(dim=1)
    spread = ready.std(dim=1, correction=0) / mean.clamp_min(1e-12) if steps > 1 else torch.zeros(ranks)
    holdout = ready[:, 1::2].mean(dim=1) if steps > 1 else mean
    return SlackWindow(
        index=window.index, first_step=window.first_step, steps=steps,
        wait_s=tuple(sum(w) / steps for w in waits),
        wait_share=tuple(sum(w) / t if t > 0 else 0.0 for w, t in zip(waits, step_time, strict=True)),
        critical_rank=top, critical_share=count / steps,
        ready_s=tuple(float(v) for v in mean), spread=tuple(float(v) for v in spread),
        holdout_s=tuple(float(v) for v in holdout),
        clock_mhz=tuple(float(table[r, -1, 3]) for r in range(ranks)),
        locked=tuple(bool(table[r, -1, 4] > 0.5) for r in range(ranks)),
        energy_j=tuple(float(table[r, -1, 5]) for r in range(ranks)))
