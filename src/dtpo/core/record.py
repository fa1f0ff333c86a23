"""The run record: what one run measured, written as ``RUN_DIR/record.json``.

The schema is versioned (:data:`SCHEMA`). Readers check the version; writers always write the current one.
Energy fields are reserved (``None``) until an energy monitor fills them, so later layers slot in without a
schema break.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import secrets
import tempfile
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from dtpo.core.errors import DtpoError

SCHEMA = "dtpo.run/1"
RECORD_FILE = "record.json"
RANK_DIR = "ranks"


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
        loss: The loss of the last micro-batch, if the script reported one.
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


@dataclass
class RankRecord:
    """One rank's measurements.

    Attributes:
        rank: Global rank.
        local_rank: Rank within its node.
        node: Host name of the node.
        device: Device the rank computed on, e.g. ``"cpu"`` or ``"cuda:0 (NVIDIA H100 80GB HBM3)"``.
        flops_per_step: Model FLOPs of one optimizer step on this rank (``torch.utils.flop_counter``).
        peak_flops: Peak FLOP/s of the device for the run's precision, with its source.
        steps: Per-step breakdown.
        error: The exception that ended this rank early, if any.
        energy: This rank's devices, energy windows and run window (see ``dtpo.session.step_energy``);
            ``None`` when energy was not measured.
    """

    rank: int
    local_rank: int
    node: str
    device: str
    flops_per_step: float | None = None
    peak_flops: dict[str, Any] | None = None
    steps: list[StepRecord] = field(default_factory=list)
    error: str | None = None
    energy: dict[str, Any] | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RankRecord:
        """Inverse of ``dataclasses.asdict``."""
        data = dict(data)
        data["steps"] = [StepRecord(**s) for s in data.get("steps", [])]
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass
class RunRecord:
    """Everything one run measured.

    Attributes:
        run_id: Name of the run (its directory name by default).
        status: ``"completed"``, ``"failed"`` or ``"running"``.
        started_at: ISO-8601 UTC start time.
        finished_at: ISO-8601 UTC end time, if finished.
        config: The run's configuration (Session and workload settings).
        environment: Software and hardware the run used.
        ranks: Per-rank measurements, ordered by rank.
        totals: Run-level figures, each a :class:`~dtpo.core.measurement.Measurement` dict.
        energy: Run-level energy figures (total, power, per sample, kWh, emissions, cost), each a
            :class:`~dtpo.core.measurement.Measurement` dict; ``None`` when energy was not measured.
        error: Why the run failed, if it did.
        schema: Schema version of this record.
    """

    run_id: str
    status: str
    started_at: str
    finished_at: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    ranks: list[RankRecord] = field(default_factory=list)
    totals: dict[str, Any] = field(default_factory=dict)
    energy: dict[str, Any] | None = None
    error: str | None = None
    schema: str = SCHEMA

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunRecord:
        """Build a record from its dict, checking the schema version."""
        if data.get("schema") != SCHEMA:
            raise DtpoError(f"unsupported record schema {data.get('schema')!r} (this dtpo reads {SCHEMA})")
        data = dict(data)
        data["ranks"] = [RankRecord.from_dict(r) for r in data.get("ranks", [])]
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

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
        return cls.from_dict(data)


def new_run_id() -> str:
    """A sortable, unique run id: UTC time plus a short random suffix."""
    return _dt.datetime.now(_dt.UTC).strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)


def rank_record_path(run_dir: str | os.PathLike[str], rank: int) -> Path:
    """Where rank ``rank`` keeps its own partial record, so a crashed run still leaves data."""
    return Path(run_dir) / RANK_DIR / f"rank{rank:05d}.json"


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON so that a crash leaves either the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=1)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_partial_records(run_dir: str | os.PathLike[str]) -> list[RunRecord]:
    """The per-rank partial records a run left in ``RUN_DIR/ranks/``, ordered by rank (unreadable ones skipped)."""
    found = []
    for path in sorted((Path(run_dir) / RANK_DIR).glob("rank*.json")):
        try:
            found.append(RunRecord.from_dict(json.loads(path.read_text())))
        except (OSError, json.JSONDecodeError, DtpoError, TypeError, KeyError):
            continue
    return found
