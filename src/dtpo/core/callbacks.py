"""Callbacks: how energy windows, progress, knobs, tuners and telemetry consume the step stream.

The words are Lightning's and Zeus's. A :class:`Callback` overrides the hooks it needs; the producer (the
Session, a plain loop's step reporter) calls them in list order on every rank, through
:class:`~dtpo.core.stream.StepStream`:

* ``on_train_start(session)``: once, before the first batch is requested.
* ``on_step_begin(session, step)``: before the first micro-batch of optimizer step ``step`` is requested.
* ``on_step_end(session, step_record)``: after the optimizer stepped; ``step_record`` is the step's
  :class:`~dtpo.core.record.StepRecord` (its breakdown on this rank). A callback that only reads the records
  (sums, step-time statistics, a display) sets :attr:`Callback.live_step_end` to ``False``: while every
  ``on_step_end`` callback of a run does, a producer may hand them a window's measured records together, in step
  order, as the window closes (before ``on_window_end``), and save building each record with cold caches.
* Either per-step hook may return ``True`` when it need not run again (a callback that acts on one step only, such
  as the first measured one): the stream then stops calling that hook of that callback, until its list of callbacks
  changes (then each is called again, and may say so again). Every step saves a call.
* ``on_window_end(session, window)``: after every ``window_steps`` measured optimizer steps (and once more
  for a last, shorter window at the end). The built-in energy callback comes first and fills
  ``window.energy_j``, so later callbacks (tuners) see time, samples and energy together.
* ``on_rank_end(session, rank_record)``: on every rank when training stops, before ranks are gathered:
  restore what was changed, add to this rank's record.
* ``on_train_end(session, record)``: last; ``record`` is the run's
  :class:`~dtpo.core.record.RunRecord` on rank 0 and ``None`` elsewhere.

Any producer of the step stream drives them, not only the Session (see :mod:`dtpo.core.steps`): the hooks'
``session`` is what the callback may read of its host, a :class:`~dtpo.core.steps.RunView`, so that layers
below the Session (tuners, telemetry) can define callbacks without importing it. Knobs a callback may turn
between optimizer steps, where the host has them (a :class:`~dtpo.core.steps.TunableRun`, the Session):
``session.set_precision(name)``, ``session.set_grad_accum(k)``, ``session.set_compression(name)`` (see
``session.switches``).
"""

from __future__ import annotations

from dtpo.core.record import RankRecord, RunRecord, StepRecord
from dtpo.core.steps import RunView, Window

__all__ = ["Callback"]


class Callback:
    """Base class of step-stream callbacks: every hook does nothing; override the ones you need.

    Attributes:
        live_step_end: Whether :meth:`on_step_end` must run as each step ends (a tuner that acts between
            steps). ``False``: a window's measured records may come together as it closes, in step order.
    """

    live_step_end = True

    def on_train_start(self, session: RunView) -> None:
        """Before the first batch is requested."""

    def on_step_begin(self, session: RunView, step: int) -> bool | None:
        """Before the first micro-batch of optimizer step ``step`` is requested (``True``: call it no more)."""

    def on_step_end(self, session: RunView, step_record: StepRecord) -> bool | None:
        """After the optimizer stepped, with the step's breakdown (``True``: call it no more)."""

    def on_window_end(self, session: RunView, window: Window) -> None:
        """After a window of measured steps."""

    def on_rank_end(self, session: RunView, rank_record: RankRecord) -> None:
        """When training stops, on every rank, before the ranks are gathered."""

    def on_train_end(self, session: RunView, record: RunRecord | None) -> None:
        """Last: the run's record on rank 0, ``None`` on the other ranks."""
