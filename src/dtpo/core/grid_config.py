"""The ``grid`` section of the run's configuration (:class:`GridConfig`): the grid signal (carbon intensity or
price over time) a run's power limit follows, the policy and the deadline."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from dtpo.core.config_section import Section, flag
from dtpo.core.errors import ConfigError

GRID_RUN_POLICIES: tuple[str, ...] = ("throttle", "pause")  # --grid-policy of dtpo train
MAX_DEADLINE_H = 24 * 366.0
MAX_GRID_REPLAY = 1e6


@dataclass(kw_only=True)
class GridConfig(Section):
    """Scheduling the run against a grid signal: in each of the signal's intervals the GPUs hold the power limit a
    policy chooses from the run's own measurements (``dtpo.session.tuning.grid``), or the run pauses while the
    signal is high (``dtpo.session.tuning.grid_pause``)."""

    SECTION: ClassVar[str] = "grid"

    signal: str | None = field(default=None, metadata=flag("--grid-signal"))
    """Carbon-intensity or price trace (a time,value CSV, WattTime v3, Electricity Maps v3 or UK carbon-intensity
    JSON) the GPUs' power limit follows, by --deadline; default: signal-blind."""
    policy: str = field(default="throttle", metadata=flag("--grid-policy"))
    """throttle: in each signal interval, the measured power limit of least signal x energy that still finishes
    by --deadline; pause: checkpoint and hold still while the forecast is above a threshold chosen from it and the
    slack left, resume when it falls (no GPU knob is touched)."""
    deadline_h: float | None = field(default=None, metadata=flag("--deadline"))
    """With --grid-signal: hours from the start (in the signal's time) by which the run must finish."""
    replay: float | None = field(default=None, metadata=flag("--grid-replay"))
    """With --grid-signal: replay the signal from its first interval, SPEEDUP signal seconds per wall second
    (a short demonstration or test), instead of following the clock."""

    def __post_init__(self) -> None:
        self._check_type("signal", str, True)
        if self.signal is not None and not self.signal.strip():
            raise self._fail("signal", "must name a file, got an empty string")
        self._choice("policy", GRID_RUN_POLICIES)
        self._float("deadline_h", positive=True, maximum=MAX_DEADLINE_H, optional=True)
        self._float("replay", positive=True, maximum=MAX_GRID_REPLAY, optional=True)
        if self.signal is None:
            given = [name for name, value in (("--deadline", self.deadline_h), ("--grid-replay", self.replay),
                                              ("--grid-policy", None if self.policy == "throttle" else self.policy))
                     if value is not None]
            if given:
                raise ConfigError(f"{given[0]} schedules the run against a grid signal: add --grid-signal FILE")
            return
        if self.deadline_h is None:
            raise self._fail("deadline_h", "is needed with --grid-signal: the hours by which the run must finish")

    @property
    def enabled(self) -> bool:
        """Whether the run follows a grid signal."""
        return self.signal is not None
