"""Checkpoints on disk: the folder layout, the ``COMPLETE`` marker, which checkpoint a run resumes from, and pruning.

``CKPT_DIR/step-000120/`` is DCP's folder plus a ``COMPLETE`` marker (JSON: step, world size, the model's
fingerprint, the size of every file, dtpo and torch versions, time). Saves go to ``step-000120.tmp/`` and are
renamed once complete; a folder without a marker, with a file missing or of another size than the marker says,
is never resumed from. What goes into a checkpoint and how it is loaded is :mod:`dtpo.session.checkpoint`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import shutil
from pathlib import Path

from dtpo.core.checkpoint_config import CheckpointConfig
from dtpo.core.errors import ConfigError
from dtpo.core.files import is_writable_dir

log = logging.getLogger(__name__)

CHECKPOINTS_DIR = "checkpoints"
MARKER = "COMPLETE"
MARKER_SCHEMA = "dtpo.checkpoint/1"
LATEST = "latest"
_FINAL = re.compile(r"^step-(\d+)$")
TMP_SUFFIX = ".tmp"
_DOOMED = ".deleting-"


def checkpoint_path(root: Path, step: int) -> Path:
    """The folder of the checkpoint taken after ``step`` optimizer steps."""
    return root / f"step-{step:06d}"


@dataclasses.dataclass(frozen=True)
class CheckpointInfo:
    """What a checkpoint's ``COMPLETE`` marker says.

    Attributes:
        path: The checkpoint's folder.
        step: Optimizer steps done when it was taken (training resumes at this step).
        world_size: Processes of the run that wrote it.
        fingerprint: The model's fingerprint (:func:`model_fingerprint`).
        files: Size in bytes of every file in the folder, by relative path.
        saved_at: ISO-8601 UTC time it was completed.
        versions: dtpo's and torch's versions that wrote it.
    """

    path: Path
    step: int
    world_size: int
    fingerprint: str
    files: dict[str, int]
    saved_at: str = ""
    versions: dict[str, str] = dataclasses.field(default_factory=dict)

    def problem(self) -> str | None:
        """Why the folder cannot be trusted (a file missing or of another size than written), else ``None``."""
        for name, size in self.files.items():
            try:
                actual = (self.path / name).stat().st_size
            except OSError:
                return f"{name} is missing"
            if actual != size:
                return f"{name} is {actual} bytes, {size} were written (truncated?)"
        return None


def read_marker(path: Path) -> CheckpointInfo | None:
    """The marker of a checkpoint folder, or ``None`` where there is none or it is unreadable."""
    try:
        data = json.loads((path / MARKER).read_text())
        if data.get("schema") != MARKER_SCHEMA:
            return None
        return CheckpointInfo(path, int(data["step"]), int(data["world_size"]), str(data["fingerprint"]),
                              {str(k): int(v) for k, v in data["files"].items()}, str(data.get("saved_at", "")),
                              dict(data.get("versions") or {}))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def complete_checkpoints(root: Path, warn: bool = True) -> list[CheckpointInfo]:
    """The complete checkpoints in ``root``, newest first; incomplete or damaged ones are skipped (with a
    warning when ``warn``)."""
    found = []
    try:
        children = list(root.iterdir())
    except OSError:
        return []
    for child in children:
        match = _FINAL.match(child.name)
        if match is None or not child.is_dir():
            continue
        info = read_marker(child)
        problem = "it has no readable COMPLETE marker" if info is None else info.problem()
        if problem is not None or info is None:
            if warn:
                log.warning("checkpoint %s is not complete (%s); skipped", child, problem)
            continue
        found.append(info)
    return sorted(found, key=lambda info: info.step, reverse=True)


def newest_complete(root: Path) -> CheckpointInfo | None:
    """The newest complete checkpoint in ``root``, if any."""
    found = complete_checkpoints(root)
    return found[0] if found else None


def resume_candidates(spec: str, default_root: Path) -> list[CheckpointInfo]:
    """The checkpoints ``--resume spec`` may load, best first: ``latest`` (the complete ones in ``default_root``),
    a checkpoint folder (that one), or a directory of them (its complete ones).

    Raises:
        ConfigError: Nothing complete to resume from.
    """
    if spec == LATEST:
        found = complete_checkpoints(default_root)
        if not found:
            raise ConfigError(f"--resume latest: no complete checkpoint in {default_root} (--checkpoint-dir)")
        return found
    path = Path(spec).expanduser().absolute()
    if (path / MARKER).exists() or _FINAL.match(path.name):
        info = read_marker(path)
        problem = "it has no readable COMPLETE marker" if info is None else info.problem()
        if info is None or problem is not None:
            raise ConfigError(f"--resume {spec}: not a complete checkpoint ({problem})")
        return [info]
    if not path.is_dir():
        raise ConfigError(f"--resume {spec}: no such checkpoint or directory")
    found = complete_checkpoints(path)
    if not found:
        raise ConfigError(f"--resume {spec}: no complete checkpoint in that directory")
    return found


def check_compatible(info: CheckpointInfo, world_size: int, fingerprint: str | None) -> None:
    """Refuse a checkpoint of another model or another world size (read from its marker, nothing loaded).

    Raises:
        ConfigError: One line naming what differs.
    """
    if fingerprint is not None and info.fingerprint != fingerprint:
        raise ConfigError(f"checkpoint {info.path} is of another model (its parameter names and shapes differ "
                          "from this one's)")
    if info.world_size != world_size:
        raise ConfigError(f"checkpoint {info.path} was written by {info.world_size} processes, this run has "
                          f"{world_size}: the data each rank sees would differ; resume with "
                          f"{info.world_size} workers")


def check_checkpoint_dir(path: Path, create: bool = True) -> None:
    """Make sure checkpoints can be written to ``path``: it is created (with ``create``; else its nearest
    existing parent is checked, and nothing is created) and writable.

    Raises:
        ConfigError: It is a file, cannot be created or is not writable.
    """
    if path.exists() and not path.is_dir():
        raise ConfigError(f"--checkpoint-dir {path} is a file, not a directory")
    if not create:
        existing = next((p for p in (path, *path.parents) if p.exists()), None)
        if existing is None or not existing.is_dir() or not is_writable_dir(existing):
            raise ConfigError(f"--checkpoint-dir {path} is not writable")
        return
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--checkpoint-dir {path}: cannot create it ({exc.strerror or exc})") from None
    if not is_writable_dir(path):
        raise ConfigError(f"--checkpoint-dir {path} is not writable")


def checkpoint_root(config: CheckpointConfig, run_dir: Path | None) -> Path | None:
    """Where checkpoints go: ``--checkpoint-dir``, else ``RUN_DIR/checkpoints`` (``None``: no run dir yet)."""
    if config.dir is not None:
        return Path(config.dir).expanduser().absolute()
    return Path(run_dir) / CHECKPOINTS_DIR if run_dir is not None else None


def choose_checkpoints(config: CheckpointConfig, root: Path | None, world_size: int, fingerprint: str | None,
                       attempt: int = 0) -> list[CheckpointInfo]:
    """The checkpoints a run may resume from, best first (empty: it starts from the beginning).

    A restarted attempt takes the newest complete ones of its own directory, else what ``--resume`` names. A
    directory that already holds checkpoints is never written into by a run that does not resume from it.

    Raises:
        ConfigError: ``--resume`` names nothing complete; the newest candidate is of another model or world
            size; or the directory holds another run's checkpoints.
    """
    own = complete_checkpoints(root) if root is not None and root.is_dir() else []
    if attempt > 0 and own:
        found = own
    elif config.resume is not None:
        if config.resume == LATEST and root is None:
            raise ConfigError("--resume latest needs --checkpoint-dir (or --run-dir of the run to resume)")
        found = resume_candidates(config.resume, root or Path.cwd())
        if own and config.every is not None and found[0].path.parent != root:
            raise ConfigError(f"--checkpoint-dir {root} already holds checkpoints of another run "
                              f"({own[0].path.name}); choose an empty one, or resume from them")
    else:
        if own and config.every is not None:
            raise ConfigError(f"--checkpoint-dir {root} already holds checkpoints ({own[0].path.name}): resume "
                              "from them (--resume latest) or choose an empty directory; they are not overwritten")
        return []
    check_compatible(found[0], world_size, fingerprint)
    return [info for info in found if info.world_size == world_size
            and (fingerprint is None or info.fingerprint == fingerprint)]


def check_checkpoint_config(config: CheckpointConfig, run_dir: Path | None, world_size: int,
                            fingerprint: str | None = None) -> None:
    """What can be checked before any worker starts (what ``dtpo train`` calls before launching): the directory
    can be written (nothing is created), and :func:`choose_checkpoints` has no objection.

    Raises:
        ConfigError: One line.
    """
    root = checkpoint_root(config, run_dir)
    if config.every is not None and root is not None:
        check_checkpoint_dir(root, create=False)
    if config.enabled:
        choose_checkpoints(config, root, world_size, fingerprint)




def prune(root: Path, keep: int) -> list[Path]:
    """Remove complete checkpoints beyond the newest ``keep`` and folders of saves that never completed.

    Each is renamed away before it is deleted, so a crash mid-way never leaves a damaged folder that still
    looks complete. Returns the removed folders.
    """
    complete = complete_checkpoints(root, warn=False)
    doomed = [info.path for info in complete[keep:]]
    try:
        doomed += [p for p in root.iterdir() if p.name.endswith(TMP_SUFFIX) or _DOOMED in p.name]
    except OSError:
        pass
    for path in doomed:
        remove_checkpoint(path)
    return doomed


def remove_checkpoint(path: Path) -> None:
    """Rename ``path`` away, then delete it (a crash mid-way never leaves a folder that looks complete)."""
    target = path
    if _DOOMED not in path.name:
        target = path.with_name(f"{path.name}{_DOOMED}{os.getpid()}")
        try:
            os.replace(path, target)
        except OSError as exc:
            log.warning("cannot remove old checkpoint %s: %s", path, exc.strerror or exc)
            return
    shutil.rmtree(target, ignore_errors=True)
