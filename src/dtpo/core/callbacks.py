"""Callbacks: how energy windows, progress, knobs, tuners and telemetry plug into a training Session.

The words are Lightning's and Zeus's. A :class:`Callback` overrides the hooks it needs; the Session calls
them in list order on every rank:

* ``on_train_start(session)``: once, before the first batch is requested.
* ``on_step_begin(session, step)``: before the first micro-batch of optimizer step ``step`` is requested.
* ``on_step_end(session, step_record)``: after the optimizer stepped; ``step_record`` is the step's
  :class:`~dtpo.core.record.StepRecord` (its breakdown on this rank).
* ``on_window_end(session, window)``: after every ``window_steps`` measured optimizer steps (and once more
  for a last, shorter window at the end). The built-in energy callback comes first and fills
  ``window.energy_j``, so later callbacks (tuners) see time, samples and energy together.
* ``on_rank_end(session, rank_record)``: on every rank when training stops, before ranks are gathered:
  restore what was changed, add to this rank's record.
* ``on_train_end(session, record)``: last; ``record`` is the run's
  :class:`~dtpo.core.record.RunRecord` on rank 0 and ``None`` elsewhere.

The Session is passed as ``Any`` so that layers below it (tuners, telemetry) can define callbacks without
importing it. Knobs a callback may turn between optimizer steps: ``session.set_precision(name)``,
``session.set_grad_accum(k)``, ``session.set_compression(name)`` (see ``session.switches``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Window:
    """A span of consecutive measured optimizer steps on one rank.

    Attributes:
        index: Windows counted from 0 (the first starts at the first measured step).
        first_step: First optimizer step in the window.
        last_step: Last optimizer step in the window (inclusive).
        time_s: Wall time from the start of ``first_step`` to the end of ``last_step``.
        samples: Samples this rank processed in the window.
        step_time_s: Median optimizer-step time in the window.
        energy_j: Joules per device over the window (empty when energy is not measured).
        sources: Energy source per device (``nvml-counter``, ``rapl``, ``modelled``, ...).
        estimated: True when any device's energy is modelled rather than read from a counter.
        settings: The switchable settings in force during the window (precision, accumulation, compression).
    """

    index: int
    first_step: int
    last_step: int
    time_s: float
    samples: int
    step_time_s: float
    energy_j: dict[str, float] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    estimated: bool = False
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def steps(self) -> int:
        """Optimizer steps in the window."""
        return self.last_step - self.first_step + 1

    @property
    def total_j(self) -> float | None:
        """Joules over all devices, or ``None`` when energy was not measured."""
        return sum(self.energy_j.values()) if self.energy_j else None

    @property
    def throughput(self) -> float:
        """Samples per second on this rank."""
        return self.samples / self.time_s if self.time_s > 0 else 0.0

    @property
    def joules_per_sample(self) -> float | None:
        """Energy per sample on this rank, or ``None`` when energy was not measured."""
        total = self.total_j
        return total / self.samples if total is not None and self.samples else None


class Callback:
    """Base class of Session callbacks: every hook does nothing; override the ones you need."""

    def on_train_start(self, session: Any) -> None:
        """Before the first batch is requested."""

    def on_step_begin(self, session: Any, step: int) -> None:
        """Before the first micro-batch of optimizer step ``step`` is requested."""

    def on_step_end(self, session: Any, step_record: Any) -> None:
        """After the optimizer stepped, with the step's breakdown."""

    def on_window_end(self, session: Any, window: Window) -> None:
        """After a window of measured steps."""

    def on_rank_end(self, session: Any, rank_record: Any) -> None:
        """When training stops, on every rank, before the ranks are gathered."""

    def on_train_end(self, session: Any, record: Any) -> None:
        """Last: the run's record on rank 0, ``None`` on the other ranks."""
