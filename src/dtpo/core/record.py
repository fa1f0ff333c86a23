"""The run record: what one run measured, written as ``RUN_DIR/record.json``.

The schema is versioned (:data:`SCHEMA`). Writers always write the current one; readers accept every
version in :data:`READABLE_SCHEMAS` and convert older ones on load (``dtpo.run/1`` records have no
``attempt`` or ``restarts``: they load as attempt 0 with no restarts).

In memory every run-level figure is a :class:`~dtpo.core.measurement.Measurement` (``RunRecord.totals``
and the figures of :class:`EnergyTotals`); in the file each is its JSON dict (``value``, ``unit``,
``source``, ``note``), as in ``dtpo.run/1``. A key this dtpo does not know is not dropped: loading logs one
warning naming every such key and keeps them in ``RunRecord.unknown`` (keyed by their path in the file,
e.g. ``ranks[0].steps[3].foo``), which is written back on save.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import logging
import os
import secrets
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, TextIO

from dtpo.core.errors import DtpoError
from dtpo.core.measurement import Measurement, measurement_or_none
from dtpo.core.record_sections import GridSection, KnobSection, SlackSection, Tuning, known_fields, tuning_from_dict

logger = logging.getLogger(__name__)

SCHEMA = "dtpo.run/2"
READABLE_SCHEMAS = ("dtpo.run/1", SCHEMA)
RECORD_FILE = "record.json"
RANK_DIR = "ranks"
STATUSES = ("running", "completed", "failed", "interrupted", "diverged", "stalled")


@dataclass
class StepRecord:
    """Where one rank's time went during one optimizer step (k micro-steps with gradient accumulation).

    The parts partition the step: ``data_wait_s + compute_s + comm_exposed_s + sync_wait_s + optimizer_s``
    equals ``step_s`` up to the few microseconds spent between the marks.

    Attributes:
        step: Optimizer-step index, from 0.
        warmup: True for steps excluded from totals (DDP rebuilds its buckets after the first iteration).
        samples: Samples this rank processed in the step (all micro-batches).
        step_s: Wall time from asking for the first micro-batch to the end of the optimizer step.
        data_wait_s: Time spent waiting for batches.
        compute_s: Forward and backward math, from batch in hand until the last gradient bucket was ready.
        tail_s: Time from the last bucket ready until backward returned (collectives still running, or
            waiting for a slower rank). Split into ``sync_wait_s`` and ``comm_exposed_s`` once all ranks'
            records are together; ``None`` where the engine gives no bucket timing (FSDP).
        comm_exposed_s: Collective time not hidden behind backward.
        sync_wait_s: Time this rank waited for the slowest rank.
        optimizer_s: From backward's return to the end of ``optimizer.step()`` and ``zero_grad()``.
        loss: The mean loss of the step's micro-batches, if the script reported them.
        started_at: Unix time (seconds, this host's clock) when the step asked for its first micro-batch;
            what traces and timelines align ranks on. ``None`` in records written before it existed.
        tokens: Tokens this rank processed in the step, where the producer counts them (left out of the record
            when ``None``).
    """

    step: int
    warmup: bool
    samples: int
    step_s: float
    data_wait_s: float
    compute_s: float
    tail_s: float | None
    optimizer_s: float
    comm_exposed_s: float | None = None
    sync_wait_s: float | None = None
    loss: float | None = None
    started_at: float | None = None
    tokens: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """As written into the record: every field, ``tokens`` only where counted (the fields are plain values:
        a shallow copy, much cheaper than ``dataclasses.asdict`` on records of many steps)."""
        out = dict(vars(self))
        if out["tokens"] is None:
            del out["tokens"]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any], unknown: dict[str, Any] | None = None, where: str = "") -> StepRecord:
        """Inverse of ``dataclasses.asdict``; keys this class does not know go into ``unknown``."""
        return cls(**known_fields(cls, data, unknown, where))


@dataclass
class RankRecord:
    """One rank's measurements.

    Attributes:
        rank: Global rank.
        local_rank: Rank within its node.
        node: Host name of the node.
        device: Device the rank computed on, e.g. ``"cpu"`` or ``"cuda:0 (NVIDIA H100 80GB HBM3)"``.
        flops_per_step: Model FLOPs of one optimizer step on this rank (``torch.utils.flop_counter``).
        peak_flops: Peak FLOP/s of the device for the run's precision, with its source. A
            :class:`Measurement` or its dict (converted to a :class:`Measurement`).
        steps: Per-step breakdown.
        error: The exception that ended this rank early, if any.
        energy: This rank's devices, energy windows and run window (see ``dtpo.session.callbacks.energy``);
            ``None`` when energy was not measured.
        knobs: The GPU knobs requested for this rank and what became of them; ``None`` when none were requested.
        switches: Settings changed between optimizer steps (``step``, ``setting``, ``value``), in order.
        tuning: What the tuner tried and chose: a :class:`~dtpo.core.record_sections.PowerTuning` (GPU knobs) or
            :class:`~dtpo.core.record_sections.JobTuning` (precision, accumulation, compression); ``None`` without
            ``--tune``.
        slack: This rank's wait for the slowest rank, learned online window by window (see
            ``dtpo.session.tuning.slack``); ``None`` when not tracked.

    The three sections may be given as their JSON dicts; they are converted.
        model: What the planner needs of the model: ``parameters`` (trainable, all ranks' shards together),
            ``gradient_bytes`` (of one full gradient as all-reduced), ``matrix_shapes`` (each trainable tensor's
            shape) and ``bucket_cap_bytes`` (DDP's bucket size, ``None`` without DDP).
        checkpoints: The checkpoints this rank took part in (``step``, ``blocked_s``: how long training waited
            for it, ``async``), in order; empty without checkpoints.
        evaluation: The trained model's loss on a fixed evaluation set (``loss``, ``samples``), the same for
            every rank; ``None`` when the script did not evaluate (see :meth:`dtpo.Session.note_evaluation`).
        bookkeeping_s_per_step: dtpo bookkeeping per step: the CPU seconds the Session spent in its own code per
            measured step, the counter's own clock reads taken off (see ``dtpo.session.loop.bookkeeping``); ``None``
            where not counted (records written before it existed, producers other than the Session, runs with no
            counted step).
        grid: The run scheduled against a grid signal (:class:`~dtpo.core.record_sections.GridSection`); ``None``
            (and left out of the file) without ``--grid-signal``.
    """

    rank: int
    local_rank: int
    node: str
    device: str
    flops_per_step: float | None = None
    peak_flops: Measurement | None = None
    steps: list[StepRecord] = field(default_factory=list)
    error: str | None = None
    energy: dict[str, Any] | None = None
    knobs: KnobSection | None = None
    switches: list[dict[str, Any]] = field(default_factory=list)
    tuning: Tuning | None = None
    slack: SlackSection | None = None
    model: dict[str, Any] | None = None
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    evaluation: dict[str, Any] | None = None
    bookkeeping_s_per_step: float | None = None
    grid: GridSection | None = None

    _SECTIONS: ClassVar[tuple[str, ...]] = ("knobs", "tuning", "slack")

    def __post_init__(self) -> None:
        self.peak_flops = measurement_or_none(self.peak_flops)
        self._typed_sections(None, "")

    def _typed_sections(self, unknown: dict[str, Any] | None, where: str) -> None:
        """Sections given as their JSON dicts become their types."""
        if isinstance(self.knobs, dict):
            self.knobs = KnobSection.from_dict(self.knobs, unknown, f"{where}knobs.")
        if isinstance(self.tuning, dict):
            self.tuning = tuning_from_dict(self.tuning)
        if isinstance(self.slack, dict):
            self.slack = SlackSection.from_dict(self.slack, unknown, f"{where}slack.")
        if isinstance(self.grid, dict):
            self.grid = GridSection.from_dict(self.grid, unknown, f"{where}grid.")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("steps", "peak_flops")}
        out["peak_flops"] = self.peak_flops.to_dict() if self.peak_flops is not None else None
        for name in self._SECTIONS:
            section = getattr(self, name)
            out[name] = section.to_dict() if section is not None else None
        out["steps"] = [s.to_dict() for s in self.steps]
        if not self.checkpoints:  # records of runs without checkpoints stay as they were
            del out["checkpoints"]
        if self.evaluation is None:  # nor do those of scripts that do not evaluate
            del out["evaluation"]
        if self.bookkeeping_s_per_step is None:  # nor those of producers that do not count it
            del out["bookkeeping_s_per_step"]
        if self.grid is None:  # nor those of runs without a grid signal
            del out["grid"]
        else:
            out["grid"] = self.grid.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any], unknown: dict[str, Any] | None = None, where: str = "") -> RankRecord:
        """Inverse of :meth:`to_dict`; keys this class does not know go into ``unknown``.

        Without an ``unknown`` dict to collect them, unknown keys are logged (one warning) and dropped.
        """
        collect = unknown if unknown is not None else {}
        data = dict(data)
        data["steps"] = [StepRecord.from_dict(s, collect, f"{where}steps[{i}].")
                         for i, s in enumerate(data.get("steps", []))]
        sections = {name: data.pop(name) for name in cls._SECTIONS if name in data}
        rank = cls(**known_fields(cls, data, collect, where))
        for name, section in sections.items():
            setattr(rank, name, section)
        rank._typed_sections(collect, where)
        if unknown is None:
            _warn_unknown(collect, "rank record")
        return rank


@dataclass
class Restart:
    """One earlier attempt of a run that was restarted (torchrun ``--max-restarts``).

    Attributes:
        attempt: The attempt's number (0 for the first).
        status: How it ended: ``"failed"``, ``"interrupted"``, ``"diverged"`` or ``"stalled"``.
        error: The first real error of that attempt (not the SIGTERM the survivors received), if known.
        steps: Optimizer steps it completed (its furthest rank, when the restart filled ``reached_step``; else
            its slowest rank), if known.
        time_s: Wall time it ran.
        energy_j: Energy it used, with its source.
        started_at: ISO-8601 UTC start time, if known.
        finished_at: ISO-8601 UTC end time, if known.
        reached_step: The optimizer step it had reached when it ended (steps ``0..reached_step-1`` were done),
            if known.
        resumed_from_step: The checkpoint step the next attempt resumed from (``0``: it started over), if known.
        steps_lost: Steps done after that checkpoint, which the next attempt had to do again.
        recovery_s: Wall time the next attempt needed to get back to ``reached_step``: its start (process,
            rendezvous, loading the checkpoint) and the lost steps done again.
        recovery_energy_j: Energy of that recovery (estimated from the next attempt's average power).
    """

    attempt: int
    status: str
    error: str | None = None
    steps: int | None = None
    time_s: Measurement | None = None
    energy_j: Measurement | None = None
    started_at: str | None = None
    finished_at: str | None = None
    reached_step: int | None = None
    resumed_from_step: int | None = None
    steps_lost: int | None = None
    recovery_s: Measurement | None = None
    recovery_energy_j: Measurement | None = None

    _MEASUREMENTS = ("time_s", "energy_j", "recovery_s", "recovery_energy_j")
    _RECOVERY = ("reached_step", "resumed_from_step", "steps_lost", "recovery_s", "recovery_energy_j")

    def __post_init__(self) -> None:
        for name in self._MEASUREMENTS:
            setattr(self, name, measurement_or_none(getattr(self, name)))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for name in self._MEASUREMENTS:
            out[name] = out[name].to_dict() if out[name] is not None else None
        for name in self._RECOVERY:  # written only for runs that resumed from checkpoints
            if out[name] is None:
                del out[name]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any], unknown: dict[str, Any] | None = None, where: str = "") -> Restart:
        """Inverse of :meth:`to_dict`; keys this class does not know go into ``unknown``."""
        return cls(**known_fields(cls, data, unknown, where))


@dataclass
class EnergyTotals:
    """Run-level energy: every figure a :class:`Measurement`, plus where the joules came from.

    For code written against the JSON form, ``energy["energy_j"]``, ``energy["lost"]`` and ``"cost" in
    energy`` work as on the dict.

    Attributes:
        energy_j: Energy of all ranks over what each measured (its run window).
        average_power_w: ``energy_j`` over ``time_s``.
        energy_per_sample_j: Energy over samples, both counted over the same steps (see the note).
        kwh: ``energy_j`` in kWh.
        co2_g: Emissions at the configured grid intensity (always estimated).
        cost: Price of the energy, when a price per kWh was given.
        by_source_j: Joules per energy source (``nvml-counter``, ``rapl``, ``modelled``, ...).
        time_s: Longest rank's energy-measured time, in seconds.
        lost: Devices (``rankN/device``) or ranks whose energy is missing, with why.
    """

    energy_j: Measurement
    average_power_w: Measurement
    energy_per_sample_j: Measurement
    kwh: Measurement
    co2_g: Measurement
    cost: Measurement | None = None
    by_source_j: dict[str, float] = field(default_factory=dict)
    time_s: float = 0.0
    lost: dict[str, str] = field(default_factory=dict)

    _FIGURES = ("energy_j", "average_power_w", "energy_per_sample_j", "kwh", "co2_g", "cost")

    def __post_init__(self) -> None:
        for name in self._FIGURES:
            setattr(self, name, measurement_or_none(getattr(self, name)))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``cost`` left out when there is none, as in ``dtpo.run/1``)."""
        out: dict[str, Any] = {}
        for name in self._FIGURES:
            value = getattr(self, name)
            if value is not None:
                out[name] = value.to_dict()
        out.update(by_source_j=dict(self.by_source_j), time_s=self.time_s, lost=dict(self.lost))
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any], unknown: dict[str, Any] | None = None,
                  where: str = "energy.") -> EnergyTotals:
        """Inverse of :meth:`to_dict`; keys this class does not know go into ``unknown``."""
        collect = unknown if unknown is not None else {}
        known = known_fields(cls, data, collect, where)
        for name in cls._FIGURES:
            if name in known:
                known[name] = _measurement(known[name], collect, f"{where}{name}.")
        return cls(**known)

    def __getitem__(self, key: str) -> Any:
        """The JSON form's keys: ``energy["energy_j"]`` is ``energy.energy_j``."""
        if key not in {f.name for f in fields(self)} or getattr(self, key) is None:
            raise KeyError(key)
        return getattr(self, key)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key in {f.name for f in fields(self)} and getattr(self, key) is not None

    def get(self, key: str, default: Any = None) -> Any:
        """``energy.get("cost")`` as on the JSON form."""
        return self[key] if key in self else default


@dataclass
class RunRecord:
    """Everything one run measured.

    Attributes:
        run_id: Name of the run (its directory name by default).
        status: One of :data:`STATUSES`: ``"completed"``, ``"failed"``, ``"interrupted"`` (SIGINT/SIGTERM),
            ``"diverged"`` (the loss became NaN or infinite), ``"stalled"`` (the launcher stopped a rank that made
            no progress) or ``"running"``.
        started_at: ISO-8601 UTC start time.
        finished_at: ISO-8601 UTC end time, if finished.
        config: The run's configuration (Session and workload settings).
        environment: Software and hardware the run used.
        ranks: Per-rank measurements, ordered by rank.
        totals: Run-level figures by name (``throughput``, ``mfu``, ...), each a :class:`Measurement`
            (JSON dicts given here are converted).
        energy: Run-level energy; ``None`` when energy was not measured (a dict given here is converted).
        error: Why the run failed, if it did.
        attempt: Which attempt of the run this record is (0 for the first; more after restarts).
        restarts: The earlier attempts, oldest first, one :class:`Restart` each.
        resumed: Where this attempt started when it resumed from a checkpoint (``step``, ``checkpoint``,
            ``load_s``, ``started_unix``: when its Session started, ``before``: the time and energy spent up to
            that checkpoint); ``None`` when it started from scratch. Its steps start at ``step``.
        unknown: Keys found when loading that this dtpo does not know, by their path in the file.
        schema: Schema version of this record.
    """

    run_id: str
    status: str
    started_at: str
    finished_at: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    ranks: list[RankRecord] = field(default_factory=list)
    totals: dict[str, Measurement] = field(default_factory=dict)
    energy: EnergyTotals | None = None
    error: str | None = None
    attempt: int = 0
    restarts: list[Restart] = field(default_factory=list)
    resumed: dict[str, Any] | None = None
    unknown: dict[str, Any] = field(default_factory=dict)
    schema: str = SCHEMA

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown run status {self.status!r} (choose from: {', '.join(STATUSES)})")
        self.totals = {k: measurement_or_none(v) for k, v in self.totals.items()}  # type: ignore[misc]
        if isinstance(self.energy, dict):
            self.energy = EnergyTotals.from_dict(self.energy, self.unknown)
        self.restarts = [r if isinstance(r, Restart) else Restart.from_dict(r, self.unknown, f"restarts[{i}].")
                         for i, r in enumerate(self.restarts)]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``unknown`` left out when empty)."""
        out: dict[str, Any] = {
            "schema": self.schema, "run_id": self.run_id, "status": self.status, "attempt": self.attempt,
            "started_at": self.started_at, "finished_at": self.finished_at, "config": self.config,
            "environment": self.environment, "ranks": [r.to_dict() for r in self.ranks],
            "totals": {k: v.to_dict() for k, v in self.totals.items()},
            "energy": self.energy.to_dict() if self.energy is not None else None,
            "error": self.error, "restarts": [r.to_dict() for r in self.restarts],
        }
        if self.resumed is not None:
            out["resumed"] = self.resumed
        if self.unknown:
            out["unknown"] = self.unknown
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "record") -> RunRecord:
        """Build a record from its dict, checking the schema version and converting older ones.

        Args:
            data: The record's JSON form.
            source: What to call it in the warning about unknown keys (e.g. its path).
        """
        schema = data.get("schema")
        if schema not in READABLE_SCHEMAS:
            raise DtpoError(f"unsupported record schema {schema!r} (this dtpo reads "
                            f"{', '.join(READABLE_SCHEMAS)})")
        data = dict(data)
        unknown: dict[str, Any] = dict(data.pop("unknown", None) or {})
        reported = set(unknown)  # found by an earlier load and kept: not news
        try:
            data["ranks"] = [RankRecord.from_dict(r, unknown, f"ranks[{i}].")
                             for i, r in enumerate(data.get("ranks", []))]
            totals = data.get("totals") or {}
            data["totals"] = {k: _measurement(v, unknown, f"totals.{k}.") for k, v in totals.items()}
            if data.get("energy") is not None:
                data["energy"] = EnergyTotals.from_dict(data["energy"], unknown)
            data["restarts"] = [Restart.from_dict(r, unknown, f"restarts[{i}].")
                                for i, r in enumerate(data.get("restarts") or [])]
            if schema != SCHEMA:
                logger.debug("%s: converted from %s to %s", source, schema, SCHEMA)
                data["schema"] = SCHEMA
            record = cls(**known_fields(cls, data, unknown, ""), unknown=unknown)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise DtpoError(f"{source} is not a valid run record ({type(exc).__name__}: {exc})") from None
        _warn_unknown({k: v for k, v in unknown.items() if k not in reported}, source)
        return record

    def save(self, run_dir: str | os.PathLike[str]) -> Path:
        """Write ``record.json`` into ``run_dir`` atomically; returns its path."""
        path = Path(run_dir) / RECORD_FILE
        write_json_atomic(path, self.to_dict())
        return path

    @classmethod
    def load(cls, run_dir_or_file: str | os.PathLike[str]) -> RunRecord:
        """Read a record from a run directory or a ``record.json`` path."""
        path = Path(run_dir_or_file)
        if path.is_dir():
            path = path / RECORD_FILE
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise DtpoError(f"no run record at {path}") from None
        except json.JSONDecodeError as exc:
            raise DtpoError(f"run record {path} is not valid JSON ({exc.msg} at line {exc.lineno})") from None
        if not isinstance(data, dict):
            raise DtpoError(f"run record {path} is not a JSON object")
        return cls.from_dict(data, source=str(path))


def new_run_id() -> str:
    """A sortable, unique run id: UTC time plus a short random suffix."""
    return _dt.datetime.now(_dt.UTC).strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)


def rank_record_path(run_dir: str | os.PathLike[str], rank: int, attempt: int = 0) -> Path:
    """Where rank ``rank`` keeps its own partial record, so a crashed run still leaves data.

    The first attempt's partials live in ``RUN_DIR/ranks/``; after torchrun restarted the workers, attempt N's
    in ``RUN_DIR/ranks/attempt-N/``, so no attempt overwrites another's.
    """
    folder = Path(run_dir) / RANK_DIR
    if attempt:
        folder = folder / f"attempt-{attempt}"
    return folder / f"rank{rank:05d}.json"


def partial_attempts(run_dir: str | os.PathLike[str]) -> list[int]:
    """The attempts that left partial records in a run directory, oldest first."""
    folder = Path(run_dir) / RANK_DIR
    found = {0} if any(folder.glob("rank*.json")) else set()
    for sub in folder.glob("attempt-*"):
        suffix = sub.name.removeprefix("attempt-")
        if suffix.isdigit() and any(sub.glob("rank*.json")):
            found.add(int(suffix))
    return sorted(found)


def current_umask() -> int:
    """The process's file-creation mask, read without changing it where the OS allows."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # no other way to read it: set and put back at once
    os.umask(mask)
    return mask


def write_json_atomic(path: Path, data: Any, compact: bool = False) -> None:
    """Write JSON so that a crash leaves either the old file or the new one, never half of one.

    The file gets the mode an ordinary ``open()`` would give it (``0o666`` less the umask), not the
    ``0o600`` of a temporary file, so teammates can read a shared run directory. ``compact`` writes it on one
    line with the C encoder (several times faster than the indented form: partial records rewritten while
    training); the indented form is streamed to the file, not built in memory first.
    """
    with _replacing(path, durable=True) as fh:
        if compact:
            fh.write(json.dumps(data, separators=(",", ":")))
        else:
            json.dump(data, fh, indent=1)


def write_text_atomic(path: Path, text: str, durable: bool = True) -> None:
    """Write ``text`` as :func:`write_json_atomic` writes JSON: the old file or the new one after a crash, with the
    mode an ordinary ``open()`` gives.

    Args:
        path: The file.
        text: Its new content.
        durable: Flush the content to the disk before the rename (``fsync``), so that even a crash of the
            machine leaves one whole file; without it a killed process still does, and the writer does not wait
            for the disk (half a millisecond on a local disk here, far more on a shared file system).
    """
    with _replacing(path, durable) as fh:
        fh.write(text)


@contextlib.contextmanager
def _replacing(path: Path, durable: bool) -> Iterator[TextIO]:
    """A temporary file beside ``path`` to write, renamed over ``path`` once written (removed after an error)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
        with os.fdopen(fd, "w") as fh:
            yield fh
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_partial_records(run_dir: str | os.PathLike[str], attempt: int | None = None) -> list[RunRecord]:
    """The per-rank partial records one attempt left (default: the latest), ordered by rank (unreadable ones
    skipped)."""
    if attempt is None:
        attempt = max(partial_attempts(run_dir), default=0)
    found = []
    for path in sorted(rank_record_path(run_dir, 0, attempt).parent.glob("rank*.json")):
        try:
            found.append(RunRecord.from_dict(json.loads(path.read_text()), source=str(path)))
        except (OSError, json.JSONDecodeError, DtpoError, TypeError, KeyError, ValueError, AttributeError):
            logger.warning("partial record %s is unreadable; skipped", path)
            continue
    return found


def _measurement(data: Any, unknown: dict[str, Any], where: str) -> Measurement | None:
    """A measurement from its JSON form; keys beyond value/unit/source/note go into ``unknown``."""
    if data is None:
        return None
    if not isinstance(data, dict):
        raise DtpoError(f"record field {where.rstrip('.')} is not a measurement: {data!r}")
    for key, value in data.items():
        if key not in ("value", "unit", "source", "note"):
            unknown[f"{where}{key}"] = value
    return Measurement.from_dict(data)


def _warn_unknown(unknown: dict[str, Any], source: str) -> None:
    if unknown:
        logger.warning("%s has fields this dtpo does not know, kept under 'unknown': %s", source,
                       ", ".join(sorted(unknown)))
