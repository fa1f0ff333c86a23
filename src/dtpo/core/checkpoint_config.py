"""The ``checkpoint`` section of the run's configuration (:class:`CheckpointConfig`): when checkpoints are saved
through torch.distributed.checkpoint, where, how many are kept, what a save that fails does, and resuming."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

from dtpo.core.config_section import Section, flag

ON_ERROR_STOP = "stop"
CHECKPOINT_ERROR_ACTIONS: tuple[str, ...] = ("warn", ON_ERROR_STOP)  # what a checkpoint that cannot be written does
MAX_EVERY_STEPS = 10**9  # the most optimizer steps between two checkpoints
MAX_EVERY_S = 365 * 24 * 3600.0
_DURATION_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


@dataclass(kw_only=True)
class CheckpointConfig(Section):
    """Checkpoints through torch.distributed.checkpoint, and resuming from them (see dtpo.session.checkpoint)."""

    SECTION: ClassVar[str] = "checkpoint"

    every: str | None = field(default=None, metadata=flag("--checkpoint-every"))
    """Save a checkpoint every N optimizer steps (e.g. 100) or every duration (90s, 10m, 2h): model, optimizer,
    gradient scaler, data position, RNG states and dtpo's own state; default: no checkpoints."""
    dir: str | None = field(default=None, metadata=flag("--checkpoint-dir"))
    """Directory of the checkpoints (default: RUN_DIR/checkpoints)."""
    keep: int = field(default=2, metadata=flag("--checkpoint-keep"))
    """Complete checkpoints kept; older ones are removed once a newer one is complete."""
    async_save: bool = field(default=False, metadata=flag("--checkpoint-async"))
    """Write checkpoints in the background (torch.distributed.checkpoint.async_save): training waits only while
    the state is copied."""
    on_error: str = field(default="warn", metadata=flag("--on-checkpoint-error"))
    """What a checkpoint that cannot be written (a full disk) does: warn (its partial folder is removed, the
    previous complete checkpoint stays the newest, training goes on) or stop (the run ends with one line)."""
    resume: str | None = field(default=None, metadata=flag("--resume"))
    """Resume from a checkpoint: latest (the newest complete one in --checkpoint-dir), a checkpoint folder
    (.../step-000120) or a directory of them (its newest complete one). Restarted workers (--max-restarts)
    resume from the newest complete checkpoint by themselves."""

    def __post_init__(self) -> None:
        if isinstance(self.every, int) and not isinstance(self.every, bool):
            self.every = str(self.every)  # a TOML or JSON number of steps
        self._check_type("every", str, True)
        if self.every is not None:
            self.every = self.every.strip()
            if parse_every(self.every) is None:
                raise self._fail("every", f"must be a number of steps (100) or a duration (90s, 10m, 2h), "
                                          f"got {self.every!r}")
        self._check_type("dir", str, True)
        if self.dir is not None and not self.dir.strip():
            raise self._fail("dir", "must name a directory, got an empty string")
        self._int("keep", 1, 10_000)
        self._bool("async_save")
        self._choice("on_error", CHECKPOINT_ERROR_ACTIONS)
        if self.resume is True:  # type: ignore[comparison-overlap]  # resume = true in a TOML file
            self.resume = "latest"
        self._check_type("resume", str, True)
        if self.resume is not None and not self.resume.strip():
            raise self._fail("resume", "must be latest or a checkpoint path, got an empty string")

    @property
    def interval(self) -> tuple[int | None, float | None]:
        """``(steps, None)`` or ``(None, seconds)`` between checkpoints; ``(None, None)`` without checkpoints."""
        parsed = parse_every(self.every) if self.every is not None else None
        return parsed if parsed is not None else (None, None)

    @property
    def enabled(self) -> bool:
        """Whether checkpoints are in use: saved every so often, resumed from, or given a directory (for saves
        the script asks for, ``Session.save_checkpoint``)."""
        return self.every is not None or self.resume is not None or self.dir is not None


def parse_every(text: str) -> tuple[int | None, float | None] | None:
    """``"100"`` as ``(100, None)`` (steps), ``"90s"``/``"10m"``/``"1.5h"`` as ``(None, seconds)``; ``None`` when
    it is neither (or not positive)."""
    text = text.strip().lower()
    if text.isdigit():
        return (int(text), None) if 0 < int(text) <= MAX_EVERY_STEPS else None
    number, unit = text[:-1], text[-1:]
    if unit not in _DURATION_UNITS:
        return None
    try:
        seconds = float(number) * _DURATION_UNITS[unit]
    except ValueError:
        return None
    return (None, seconds) if math.isfinite(seconds) and 0 < seconds <= MAX_EVERY_S else None
