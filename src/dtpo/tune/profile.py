"""Saved tuning profiles: what each setting measured, kept under a fingerprint of the job.

A later run of the same job (same model FLOPs per step, batch, precision, GPU model and count, knob and
grid) finds the profile and starts at its optimum with no profiling. The profile keeps the measurements, not
the choice, so a run with another cost metric chooses again from the same figures. Zeus's ``profile_path``
does this by file name only: here the job identifies itself.

Files are ``<folder>/<fingerprint>.json`` (default folder ``$DTPO_STATE_DIR/profiles``). A file that cannot
be read or does not hold a profile is ignored with one warning, and the job profiles again (and overwrites
it).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dtpo.core.files import untrusted_reason
from dtpo.core.record import write_json_atomic
from dtpo.devices.journal import state_dir
from dtpo.tune.setting import GpuSetting
from dtpo.tune.stats import SettingStats

PROFILE_SCHEMA = "dtpo.tune-profile/1"

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobFingerprint:
    """What makes two runs the same job for tuning.

    Attributes:
        gpu: GPU model name.
        gpus: GPUs in the job.
        batch_size: Samples per optimizer step over all GPUs.
        precision: Training precision (e.g. ``bf16-mixed``).
        flops_per_step: Model FLOPs of one step on one rank, to 3 significant digits (0 when not counted).
        knob: ``power-limit``, ``sm-clock`` or ``both``.
        grid: The candidate grid, e.g. ``"25W"``.
        workload: Free text naming the workload (a simulated model, a script), part of the identity.
    """

    gpu: str
    gpus: int
    batch_size: int
    precision: str
    flops_per_step: float
    knob: str
    grid: str
    workload: str = ""

    @property
    def key(self) -> str:
        """A short stable hash of the fingerprint (the profile's file name)."""
        fields = asdict(self)
        fields["flops_per_step"] = float(f"{self.flops_per_step:.3g}")
        text = json.dumps(fields, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


class ProfileStore:
    """Profiles in one folder.

    Args:
        folder: Where the profiles live (default ``state_dir()/profiles``).
    """

    def __init__(self, folder: Path | str | None = None) -> None:
        self.folder = Path(folder) if folder is not None else state_dir() / "profiles"

    def path(self, fingerprint: JobFingerprint) -> Path:
        """The file of a job's profile."""
        return self.folder / f"{fingerprint.key}.json"

    def load(self, fingerprint: JobFingerprint) -> dict[GpuSetting, SettingStats] | None:
        """The measured settings of a saved profile, or ``None`` when there is none (or it is unusable)."""
        path = self.path(fingerprint)
        if not path.exists():
            return None
        why = untrusted_reason(path)
        if why is not None:  # a planted profile would make the tuner hold a setting it never measured
            logger.warning("tuning profile %s is not used: %s; profiling again (chmod go-w the folder, or set "
                           "DTPO_STATE_DIR to a folder of your own)", path, why)
            return None
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(data, dict) or data.get("schema") != PROFILE_SCHEMA:
                raise ValueError(f"not a {PROFILE_SCHEMA} file")
            if data.get("fingerprint") != asdict(fingerprint):
                raise ValueError("it belongs to another job")
            measured: dict[GpuSetting, SettingStats] = {}
            for row in data["settings"]:
                stats = SettingStats.from_row(row)
                measured[stats.setting] = stats
            if not measured:
                raise ValueError("it holds no settings")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError,
                IndexError) as exc:
            logger.warning("tuning profile %s is unusable (%s); ignoring it and profiling again", path,
                           str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            return None
        return measured

    def save(self, fingerprint: JobFingerprint, stats: list[SettingStats], metric: str,
             choice: GpuSetting | None) -> Path | None:
        """Keep the measured settings of a finished search; returns the file (``None`` when it cannot be written,
        which is logged and does not stop training)."""
        path = self.path(fingerprint)
        rows: list[dict[str, Any]] = [s.as_row() for s in stats if s.measured]
        saved_at = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
        data = {"schema": PROFILE_SCHEMA, "saved_at": saved_at, "fingerprint": asdict(fingerprint),
                "metric": metric, "choice": None if choice is None else choice.as_dict(), "settings": rows}
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            write_json_atomic(path, data)
        except OSError as exc:
            logger.warning("cannot save the tuning profile to %s (%s)", path, exc.strerror or exc)
            return None
        return path
