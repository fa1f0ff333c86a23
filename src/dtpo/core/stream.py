"""The driver of the step stream: step events in, windows and callback hooks out, whatever the producer.

A producer (see :mod:`dtpo.core.steps`) tells a :class:`StepStream` when training starts, when each step
begins and ends, and when the rank stops; the stream cuts the measured (post-warm-up) steps into windows of
``window_steps`` and calls each callback's hooks in list order, with the producer as the host they read.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from dtpo.core.callbacks import Callback
from dtpo.core.record import RankRecord, RunRecord, StepRecord
from dtpo.core.steps import RunView, Window

log = logging.getLogger(__name__)

HOOKS = ("on_train_start", "on_step_begin", "on_step_end", "on_window_end", "on_rank_end", "on_train_end")


class StepStream:
    """One rank's step stream: windows of measured steps and the callbacks that consume them.

    Args:
        host: The producer, passed to every hook.
        callbacks: The callbacks in call order (the list is kept, not copied: a host may add to it).
        window_steps: Measured steps per window.
        settings: The switchable settings in force, for each window (default: none).

    Attributes:
        open_steps: Measured steps waiting in the open window.
        begin_listeners: The callbacks' ``on_step_begin`` methods still called.
        listened: The callback list's length when the listeners were last found. :meth:`step_begin` calls nothing
            while ``begin_listeners`` is empty and the list keeps that length: a host may skip the call then (the
            Session does, at every step's start, where a call costs with the caches cold).
    """

    def __init__(self, host: RunView, callbacks: list[Callback], window_steps: int,
                 settings: Callable[[], dict[str, Any]] | None = None) -> None:
        self.host = host
        self.callbacks = callbacks
        self.window_steps = window_steps
        self.settings = settings or dict
        self.windows = 0  # windows closed so far
        self._open: list[StepRecord] = []  # measured steps of the open window
        # how many: a plain attribute, since a producer reads it at every step's end, where a property's call costs
        # with the caches cold
        self.open_steps = 0
        self._listeners: dict[str, list[Any]] = {}
        self._listeners_of: list[Callback] | None = None
        self.listened = 0  # the list's length when its listeners were found (a change makes them be found again)
        # the per-step hooks' listeners, read without a lookup by name (they run at every step)
        self.begin_listeners: list[Any] = []
        self._step_end: list[Any] = []
        # whether some on_step_end callback wants each record as its step ends (Callback.live_step_end); if not, the
        # producer may hand a window's records over as it closes (read after step_begin, which keeps it current)
        self.live_step_end = True

    @property
    def window_open(self) -> bool:
        """Whether measured steps wait for their window to close."""
        return bool(self._open)

    def train_start(self) -> None:
        """Training starts (before the first step begins)."""
        self.dispatch("on_train_start")

    def step_begin(self, step: int) -> None:
        """Step ``step`` begins."""
        callbacks = self.callbacks
        if callbacks is not self._listeners_of or len(callbacks) != self.listened:
            self._refresh()
        host = self.host
        for method in self.begin_listeners:
            if method(host, step):  # done with this hook: not called again (see Callback.on_step_begin)
                self.begin_listeners = [m for m in self.begin_listeners if m != method]

    def step_end(self, record: StepRecord) -> None:
        """A step ended: tell the callbacks, and close the window when it is full."""
        self.step_ends((record,))

    def step_ends(self, records: Sequence[StepRecord], measured: bool = False) -> None:
        """Steps ended, in step order: the same hooks, in the same order, as one :meth:`step_end` per record (a
        producer hands a window's records over together as it closes), for one call.

        Args:
            records: The steps' records.
            measured: None of them is a warm-up step (the producer knows it): while no callback wants each step's
                record, they join the open window a window's worth at a time, none looked at on its own.
        """
        host = self.host
        i, n = 0, len(records)
        while i < n:
            callbacks = self.callbacks
            if callbacks is not self._listeners_of or len(callbacks) != self.listened:
                self._refresh()
            steps = self._open
            if measured and not self._step_end:  # up to the window's end at once
                j = i + self.window_steps - len(steps)
                steps.extend(records[i:j])
                i = j
            else:
                record = records[i]
                i += 1
                for method in self._step_end:
                    if method(host, record):  # done with this hook: not called again (see Callback.on_step_end)
                        self._step_end = [m for m in self._step_end if m != method]
                if record.warmup:
                    continue
                steps.append(record)
            self.open_steps = open_steps = len(steps)
            if open_steps >= self.window_steps:
                self.close_window()

    def close_window(self) -> None:
        """Close the open window now (nothing happens when no measured step is waiting)."""
        steps, self._open = self._open, []
        self.open_steps = 0
        if not steps:
            return
        times = sorted([s.step_s for s in steps])
        window = Window(index=self.windows, first_step=steps[0].step, last_step=steps[-1].step,
                        time_s=sum(times), samples=sum([s.samples for s in steps]),
                        step_time_s=times[len(times) // 2], settings=self.settings())
        self.windows += 1
        self.dispatch("on_window_end", window)

    def rank_end(self, rank_record: RankRecord) -> None:
        """The rank stops: every callback adds to its record; one that fails costs a warning, not the record."""
        for callback in self.callbacks:
            try:
                callback.on_rank_end(self.host, rank_record)
            except Exception as exc:  # one broken callback must not cost the record
                log.warning("callback %s failed at the end of the run: %s", type(callback).__name__, exc)

    def train_end(self, record: RunRecord | None) -> None:
        """Last: the run's record on rank 0, ``None`` elsewhere."""
        self.dispatch("on_train_end", record)

    def dispatch(self, hook: str, *args: Any) -> None:
        """Call ``hook`` on the callbacks that implement it, in list order."""
        listeners = self._listeners.get(hook)
        if listeners is None or self._listeners_of is not self.callbacks or len(self.callbacks) != self.listened:
            listeners = self._refresh()[hook]
        for method in listeners:
            method(self.host, *args)

    def _refresh(self) -> dict[str, list[Any]]:
        """Find again which callbacks implement each hook (the list, or its length, changed)."""
        callbacks = self.callbacks
        self._listeners = {name: [getattr(cb, name) for cb in callbacks
                                  if getattr(type(cb), name, None) is not getattr(Callback, name)]
                           for name in HOOKS}
        self._listeners_of, self.listened = callbacks, len(callbacks)
        self.begin_listeners, self._step_end = self._listeners["on_step_begin"], self._listeners["on_step_end"]
        self.live_step_end = any(getattr(cb, "live_step_end", True) for cb in callbacks
                                  if getattr(type(cb), "on_step_end", None) is not Callback.on_step_end)
        return self._listeners
