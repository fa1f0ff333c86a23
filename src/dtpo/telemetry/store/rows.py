"""One run as the store holds it: the columns of the ``runs`` table and :class:`StoredRun`."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dtpo.telemetry.store.figures import Figure

COLUMNS = ("id", "name", "kind", "status", "started_at", "finished_at", "workload", "workers", "steps", "parent",
           "error", "run_dir", "hostname", "pid", "proc_start", "registered_at", "updated_at")
"""The columns of the ``runs`` table besides ``config`` (JSON text)."""


@dataclass
class StoredRun:
    """One row of the store with its figures.

    Attributes:
        id: The store's id of the run (its run directory's name, made unique).
        name: The run's own name (``record.run_id``, the directory's name).
        kind: One of :data:`~dtpo.telemetry.store.figures.KINDS`.
        status: ``running``, ``completed``, ``failed``, ``interrupted`` or ``diverged``.
        run_dir: Absolute path of its run directory.
        config: Its configuration.
        figures: Its key figures by name.
        started_at: ISO-8601 UTC start.
        finished_at: ISO-8601 UTC end, once it ended.
        workload: Workload name, if any.
        workers: Workers (GPUs) it ran on; the largest count for a bench or a plan.
        steps: Training steps, if any.
        parent: The id of the bench it belongs to, if any.
        error: Why it did not complete.
        hostname: Host of the process that registered it.
        pid: That process's id.
        proc_start: That process's start time (clock ticks since boot), to tell a reused pid.
        registered_at: When the row was first written.
        updated_at: When it was last written.
    """

    id: str
    name: str
    kind: str
    status: str
    run_dir: str
    config: dict[str, Any] = field(default_factory=dict)
    figures: dict[str, Figure] = field(default_factory=dict)
    started_at: str | None = None
    finished_at: str | None = None
    workload: str | None = None
    workers: int | None = None
    steps: int | None = None
    parent: str | None = None
    error: str | None = None
    hostname: str | None = None
    pid: int | None = None
    proc_start: int | None = None
    registered_at: str = ""
    updated_at: str = ""

    @classmethod
    def from_row(cls, row: Mapping[str, Any], figures: dict[str, Figure] | None = None) -> StoredRun:
        """From a ``runs`` row and its figures."""
        try:
            config = json.loads(row["config"] or "{}")
        except json.JSONDecodeError:
            config = {}
        return cls(**{name: row[name] for name in COLUMNS}, config=config if isinstance(config, dict) else {},
                   figures=dict(figures or {}))
