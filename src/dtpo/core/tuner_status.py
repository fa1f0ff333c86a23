"""What callbacks that turn knobs show to live telemetry, without telemetry knowing which callbacks they are.

A callback that holds or tunes GPU or job knobs implements :class:`TunerStatus`; one that learns each rank's wait
for the slowest rank implements :class:`SlackStatus`. The live-metrics callback iterates the Session's callbacks
and reads those that implement them (``isinstance`` on these runtime-checkable protocols is structural: no
callback needs to inherit from them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class TunerState:
    """One tuner's state on the live metrics (``dtpo_tuner_state{tuner, state}``).

    Attributes:
        tuner: Which tuner: ``"power"``, ``"job"``, ``"stragglers"``.
        state: Where it is, e.g. ``"profile"``, ``"hold"``, ``"off"``.
    """

    tuner: str
    state: str


@dataclass(frozen=True)
class ClockLock:
    """The SM clock a callback decides (``dtpo_knob_setting{knob="sm_clock_mhz"}``).

    Attributes:
        mhz: The clock it holds locked and applied (``0.0``: clocks float again), or ``None`` when it decides the
            clock but does not apply it (dry run, observe): no value is shown.
    """

    mhz: float | None


@runtime_checkable
class TunerStatus(Protocol):
    """A callback that holds or tunes knobs, as live telemetry sees it."""

    def tuner_state(self) -> TunerState | None:
        """Its tuner's state now; ``None`` for a callback that holds knobs without tuning them."""
        ...

    def clock_lock(self) -> ClockLock | None:
        """The SM clock it decides now; ``None`` when it has no say on the clock (the next callback is asked)."""
        ...


@dataclass(frozen=True)
class SlackReading:
    """The latest window's wait for the slowest rank, as all ranks agreed on it.

    Attributes:
        window: The window's index (a reading is shown once).
        wait_s: Each rank's mean wait per step over the window, by rank.
    """

    window: int
    wait_s: tuple[float, ...]


@runtime_checkable
class SlackStatus(Protocol):
    """A callback that learns, window by window, how long each rank waits for the slowest one."""

    def latest_slack(self) -> SlackReading | None:
        """The latest gathered window's waits, ``None`` before the first."""
        ...
