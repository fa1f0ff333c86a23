"""Typed sections of a rank's record: the GPU knobs held, what a tuner did, the rank's slack.

Each section is a dataclass with a ``kind`` (``"knobs"``, ``"power"``, ``"job"``, ``"slack"``, ``"grid"``) and
``to_dict`` / ``from_dict`` that keep ``record.json`` as it always was: the same keys, in the same order, and
records written before these types existed load into them. Readers tell the tuning sections apart by their
type (:class:`PowerTuning` or :class:`JobTuning`); only :func:`tuning_from_dict` reads the file's ``kind`` key,
which job tuning writes and power tuning never did.

What a tuner measured (its settings, history, choice, ...) stays the tuner's own report
(:meth:`dtpo.tune.tuner.PowerTuner.report`), kept whole in ``report`` and written beside the section's fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar


@dataclass
class KnobSection:
    """``ranks[].knobs``: the GPU knobs requested for the run and what became of them on this rank.

    Attributes:
        power_limit_w: The power limit requested, if any.
        sm_clock_mhz: The SM clock requested, if any.
        applied: Whether they were set on this rank's GPUs.
        mode: ``"apply"``, ``"dry-run"`` or ``"observe"``.
        gpus: The GPUs they were set on.
        note: What happened, in words.
    """

    kind: ClassVar[str] = "knobs"
    power_limit_w: float | None = None
    sm_clock_mhz: int | None = None
    applied: bool = False
    mode: str = "apply"
    gpus: list[str] = field(default_factory=list)
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The section as written in ``record.json``."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any], unknown: dict[str, Any] | None = None, where: str = "") -> KnobSection:
        """Inverse of :meth:`to_dict`; keys it does not know go into ``unknown`` under ``where + key``."""
        return cls(**known_fields(cls, data, unknown, where))


@dataclass
class SlackSection:
    """``ranks[].slack``: this rank's wait for the slowest rank, learned online window by window, and, with
    ``--tune stragglers``, the clock changes made on it.

    Attributes:
        windows: Windows gathered.
        steps: Steps they held.
        wait_s_per_step: Mean wait per step.
        wait_share: Share of this rank's step time spent waiting.
        critical_ranks: How many steps each rank (its number as text) was the slowest.
        note: How it was learned.
        mode: Straggler tuning's knob mode (``None`` without straggler tuning, and left out of the file).
        clock_changes: Straggler tuning's clock locks on this rank, in order (each ``step``, ``clock_mhz``, ...).
        tuned: Whether straggler tuning ran on this rank to the end.
        shares: With ``--tune rebalance``: every rank's samples per step at the end (the same on every rank).
        initial_shares: Every rank's samples per step at the start (the even split of the global batch).
        share_changes: The rebalancer's changes, in order (each ``window``, ``step`` (the first step with the new
            shares), ``shares``, ``gain`` (the predicted share of step time saved), ``slow_ranks``).
        recommendations: One-line recommendations to restart without a rank that stays far slower than the rest.
    """

    kind: ClassVar[str] = "slack"
    windows: int
    steps: int
    wait_s_per_step: float
    wait_share: float
    critical_ranks: dict[str, int] = field(default_factory=dict)
    note: str = ""
    mode: str | None = None
    clock_changes: list[dict[str, Any]] | None = None
    tuned: bool | None = None
    shares: list[int] | None = None
    initial_shares: list[int] | None = None
    share_changes: list[dict[str, Any]] | None = None
    recommendations: list[str] | None = None

    _STRAGGLERS: ClassVar[tuple[str, ...]] = ("mode", "clock_changes", "tuned", "shares", "initial_shares",
                                              "share_changes", "recommendations")

    def to_dict(self) -> dict[str, Any]:
        """The section as written in ``record.json`` (straggler tuning's and rebalancing's keys only where they
        ran)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in self._STRAGGLERS or getattr(self, f.name) is not None}

    @classmethod
    def from_dict(cls, data: dict[str, Any], unknown: dict[str, Any] | None = None, where: str = "") -> SlackSection:
        """Inverse of :meth:`to_dict`; keys it does not know go into ``unknown`` under ``where + key``."""
        return cls(**known_fields(cls, data, unknown, where))


@dataclass
class PowerTuning:
    """``ranks[].tuning`` of ``--tune power-limit`` / ``sm-clock``: the GPU-knob tuner on this rank.

    Attributes:
        knob: The knob tuned (``"power-limit"``, ``"sm-clock"``, ...).
        metric: The cost metric's name.
        applied: Whether measured settings were applied to the GPUs.
        note: Why nothing was tuned, or a remark on the tuning.
        mode: The knob mode (``apply``, ``dry-run``, ``observe``); ``None`` when nothing was tuned.
        source: ``"measured"`` or ``"model"`` (a model figure, nothing changed).
        profile: The saved profile used or written (``loaded``, ``path``, ...).
        model: The model figure's choice and settings, where one was made.
        report: The tuner's report (``choice``, ``settings``, ``segments``, ...); ``None`` when no GPU on this rank
            had power knobs, so nothing was tuned.
    """

    kind: ClassVar[str] = "power"
    knob: str
    metric: str
    applied: bool = False
    note: str | None = None
    mode: str | None = None
    source: str | None = None
    profile: dict[str, Any] | None = None
    model: dict[str, Any] | None = None
    report: dict[str, Any] | None = None

    _OWN: ClassVar[tuple[str, ...]] = ("knob", "mode", "source", "note", "applied", "profile", "model")

    def to_dict(self) -> dict[str, Any]:
        """The section as written in ``record.json``: the tuner's report, then the section's fields."""
        if self.report is None:
            return {"knob": self.knob, "metric": self.metric, "applied": self.applied, "note": self.note}
        out = {**self.report, "knob": self.knob, "mode": self.mode, "source": self.source, "note": self.note,
               "applied": self.applied, "profile": self.profile}
        if self.model is not None:
            out["model"] = self.model
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PowerTuning:
        """Inverse of :meth:`to_dict`; keys that are not the section's belong to the tuner's report."""
        report = {k: v for k, v in data.items() if k not in cls._OWN}
        own = {k: v for k, v in data.items() if k in cls._OWN}
        return cls(metric=data["metric"], **own, report=report if set(report) - {"metric"} else None)


@dataclass
class JobTuning:
    """``ranks[].tuning`` of ``--tune precision,grad-accum,compression``: the job-knob tuner on this rank.

    Attributes:
        knob: The knobs tuned, as given (``"precision,grad-accum"``).
        metric: The cost metric's name.
        applied: Always ``True``: job knobs change the training itself.
        screened: Knobs left out of the search before it began, with why.
        note: Why nothing was tuned (training ended before the first measured step).
        report: The tuner's report with the guard's verdicts (``choice``, ``settings``, ``rejected``,
            ``trajectory``, ...); ``None`` when nothing was tuned.
    """

    kind: ClassVar[str] = "job"
    knob: str
    metric: str
    applied: bool = True
    screened: dict[str, str] = field(default_factory=dict)
    note: str | None = None
    report: dict[str, Any] | None = None

    _OWN: ClassVar[tuple[str, ...]] = ("knob", "kind", "metric", "applied", "screened", "note")

    def __post_init__(self) -> None:
        if self.report is not None:  # the section's own keys are its fields, not the report's
            self.report = {k: v for k, v in self.report.items() if k not in self._OWN}

    def to_dict(self) -> dict[str, Any]:
        """The section as written in ``record.json``, with ``"kind": "job"``."""
        out = {"knob": self.knob, "kind": self.kind, "metric": self.metric, "applied": self.applied,
               "screened": self.screened}
        if self.note is not None:
            out["note"] = self.note
        return {**out, **(self.report or {})}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobTuning:
        """Inverse of :meth:`to_dict`; keys that are not the section's belong to the tuner's report."""
        report = {k: v for k, v in data.items() if k not in cls._OWN}
        own = {k: v for k, v in data.items() if k in cls._OWN and k != "kind"}
        return cls(**own, report=report or None)


@dataclass
class GridSection:
    """``ranks[].grid``: the run scheduled against a grid signal (``--grid-signal``; the same on every rank).

    Attributes:
        policy: The policy (``"throttle"`` or ``"pause"``).
        signal: The signal: ``source``, ``unit``, ``kind``, ``interval_s``, ``decided_on`` (forecast or actual),
            ``replay`` (signal seconds per wall second, ``None``: the clock), ``start`` (the run's start in the
            signal's time), ``values`` (the accounted values of the intervals the run spanned) and ``values_from``
            (the start of the first value's interval).
        deadline_h: Hours from the start by which the run had to finish (signal time).
        settings: Each power limit measured at the start: ``power_limit_w``, ``time_per_sample_s`` (signal time),
            ``energy_per_sample_j`` (all GPUs) and ``steps`` measured.
        source: Where the per-setting figures come from: ``measured`` (the run's own GPU energy counters) or
            ``simulated`` (virtual GPUs).
        intervals: The setting over time: ``interval`` (the signal's index), ``start``, ``phase`` (``sweep`` /
            ``throttle``; ``measure`` / ``run`` / ``paused`` / ``resumed`` for a pause), ``signal``,
            ``power_limit_w`` (``None`` for a pause), ``from_step``, ``seconds`` (signal time), ``energy_j`` (the
            energy spent in it: GPU counters for throttle, the run's devices for a pause, idle during one) and the
            ``decision`` that opened it.
        outcome: ``finished_h``, ``deadline_met``, ``energy_j``, ``cost`` (energy x signal, as measured; a pause's
            own energy included), for a pause ``pauses``, ``paused_h`` and ``paused_energy_j``, and, estimated by
            replaying the measured per-setting figures on the signal, ``estimated`` (``cost``, ``blind_cost``,
            ``saving``, ``blind_finished_h``).
        note: What happened, in words (why nothing was scheduled, a deadline that could not be met, ...).
        job: The job the policy scheduled: ``samples`` (all ranks), ``deadline_s`` and ``interval_s``, in seconds
            from the start of the signal interval the run started in (``None`` before the sweep ended).
    """

    kind: ClassVar[str] = "grid"
    policy: str
    signal: dict[str, Any] = field(default_factory=dict)
    deadline_h: float | None = None
    settings: list[dict[str, Any]] = field(default_factory=list)
    source: str = "measured"
    intervals: list[dict[str, Any]] = field(default_factory=list)
    outcome: dict[str, Any] | None = None
    note: str = ""
    job: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The section as written in ``record.json``."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any], unknown: dict[str, Any] | None = None, where: str = "") -> GridSection:
        """Inverse of :meth:`to_dict`; keys it does not know go into ``unknown`` under ``where + key``."""
        return cls(**known_fields(cls, data, unknown, where))


Tuning = PowerTuning | JobTuning
"""What ``ranks[].tuning`` holds."""
TUNING_KINDS: dict[str, type[PowerTuning] | type[JobTuning]] = {"power": PowerTuning, "job": JobTuning}


def tuning_from_dict(data: dict[str, Any]) -> Tuning:
    """The tuning section a record's ``ranks[].tuning`` holds: job tuning says ``"kind": "job"``, power tuning
    (written before kinds existed) says nothing."""
    kind = data.get("kind", PowerTuning.kind)
    if kind not in TUNING_KINDS:
        raise ValueError(f"unknown tuning kind {kind!r} (known: {', '.join(TUNING_KINDS)})")
    return TUNING_KINDS[kind].from_dict(data)


def known_fields(cls: type, data: dict[str, Any], unknown: dict[str, Any] | None, where: str) -> dict[str, Any]:
    """The items of ``data`` that are fields of ``cls``; the others go into ``unknown`` under ``where + key``."""
    names = {f.name for f in fields(cls)}
    out = {}
    for key, value in data.items():
        if key in names:
            out[key] = value
        elif unknown is not None:
            unknown[f"{where}{key}"] = value
    return out
