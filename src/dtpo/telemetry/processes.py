"""Whether the process that registered a run is still alive (its pid, and its start time against pid reuse)."""

from __future__ import annotations

import os
from pathlib import Path


def process_start(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (``/proc/PID/stat``), or ``None`` if unknown."""
    stat = _proc_stat(pid)
    return None if stat is None else stat[1]


def _proc_stat(pid: int) -> tuple[str, int] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
        fields = text.rsplit(")", 1)[1].split()
        return fields[0], int(fields[19])  # state (field 3) and starttime (field 22)
    except (OSError, IndexError, ValueError):
        return None


def process_alive(pid: int, started: int | None = None) -> bool:
    """Whether process ``pid`` still runs on this host and is the one that started at ``started`` (ticks since
    boot; ``None``: any process of that pid). A zombie counts as ended."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    except OSError:
        return False
    stat = _proc_stat(pid)
    if stat is None:
        return True  # no /proc: the pid exists, trust it
    state, ticks = stat
    if state in ("Z", "X"):
        return False
    return started is None or ticks == started


# -- rows -----------------------------------------------------------------------------------------------------------
