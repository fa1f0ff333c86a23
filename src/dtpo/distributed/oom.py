"""Telling a worker that ran out of memory from one that failed otherwise, so that the launcher's line and the
record say "out of memory" with the rank instead of a bare signal or an allocator's message.

A worker ends for memory in two ways:

* **The kernel's OOM killer** sends it ``SIGKILL`` (its memory cgroup reached its limit, or the machine ran out).
  Nothing in the worker can tell; two places outside it can. The kernel log names the process it killed
  (``oom-kill:...,oom_memcg=/job,task_memcg=/job,...,pid=1234`` and ``Killed process 1234 (python)``): read from
  ``/dev/kmsg``, which root may read (others where ``kernel.dmesg_restrict`` is 0). And every memory cgroup counts
  the processes the OOM killer ended in it (``oom_kill`` in ``memory.events`` on cgroup v2, in
  ``memory.oom_control`` on v1): a :class:`MemoryWatch` around the launch notes each worker's cgroup and its count
  while the worker lives, and a count that grew by the time the worker was killed says why.
* **An allocation that fails** (a limit on its address space, ``RLIMIT_AS``; CUDA out of memory): the worker's own
  error says so (:func:`says_out_of_memory`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from dtpo.distributed.periodic import Periodic

log = logging.getLogger(__name__)

OUT_OF_MEMORY = "out of memory"
KMSG = Path("/dev/kmsg")
_KILLED = re.compile(r"Killed process (\d+) \(")
_OOM_KILL = re.compile(r"oom-kill:.*\bpid=(\d+)\b")
_MEMCG = re.compile(r"\boom_memcg=([^,]*)")
_ALLOCATION_FAILED = ("out of memory", "can't allocate memory", "cannot allocate memory", "memoryerror",
                      "outofmemoryerror", "std::bad_alloc")
_POLL_S = 0.5


@dataclass(frozen=True)
class MemoryKill:
    """A process the kernel's OOM killer ended.

    Attributes:
        pid: The process.
        cgroup: The memory cgroup whose limit was reached, as the kernel names it (``"/"``: the whole machine);
            ``None`` when not known.
        source: Where it was read: ``"kernel log"`` or ``"cgroup"`` (the cgroup's OOM-kill count grew).
    """

    pid: int
    cgroup: str | None
    source: str

    def describe(self) -> str:
        """``out of memory (...)``: what the launcher's line says after the signal."""
        if self.cgroup in (None, ""):
            where = ""
        elif self.cgroup == "/":
            where = ": the machine ran out"
        else:
            where = f" at the limit of memory cgroup {self.cgroup}"
        return f"{OUT_OF_MEMORY} (the kernel's OOM killer ended it{where})"


def says_out_of_memory(text: str | None) -> bool:
    """Whether an error's text says an allocation failed (CUDA's and the CPU allocator's messages, Python's
    ``MemoryError``, C++'s ``std::bad_alloc``)."""
    lowered = (text or "").lower()
    return any(words in lowered for words in _ALLOCATION_FAILED)


# --- the kernel log -------------------------------------------------------------------------------------------


def kernel_memory_kills(since_boot_s: float = 0.0, path: Path | None = None) -> dict[int, MemoryKill]:
    """The processes the OOM killer ended since ``since_boot_s`` (seconds since boot, the kernel log's clock), by
    pid, read from ``path`` (default :data:`KMSG`); empty where the kernel log cannot be read."""
    kills: dict[int, MemoryKill] = {}
    for seconds, message in _kernel_log(path or KMSG):
        if seconds < since_boot_s:
            continue
        detail = _OOM_KILL.search(message)
        if detail is not None:
            memcg = _MEMCG.search(message)
            cgroup = memcg.group(1) if memcg else ("/" if "global_oom" in message else None)
            kills[int(detail.group(1))] = MemoryKill(int(detail.group(1)), cgroup, "kernel log")
            continue
        killed = _KILLED.search(message)
        if killed is not None and int(killed.group(1)) not in kills:
            kills[int(killed.group(1))] = MemoryKill(int(killed.group(1)), None, "kernel log")
    return kills


def _kernel_log(path: Path) -> Iterator[tuple[float, str]]:
    """``(seconds since boot, message)`` of every record the kernel log holds now (``/dev/kmsg`` gives one record per
    read, ``prio,seq,usec,flags;message`` and continuation lines that start with a space; a copy in a file gives
    several)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return
    try:
        while True:
            try:
                raw = os.read(fd, 8192)
            except BlockingIOError:  # no more records
                return
            except BrokenPipeError:  # a record was overwritten while reading: go on with the next
                continue
            except OSError:
                return
            if not raw:
                return
            for line in raw.decode("utf-8", "replace").splitlines():
                head, _, message = line.partition(";")
                fields = head.split(",")
                if line.startswith(" ") or len(fields) < 3 or not fields[2].isdigit():
                    continue
                yield int(fields[2]) / 1e6, message
    finally:
        os.close(fd)


def process_start_boot_s(pid: int | str = "self") -> float:
    """When a process started, in seconds since boot (0.0 where ``/proc`` does not say)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


# --- memory cgroups -------------------------------------------------------------------------------------------


def memory_cgroup(pid: int | str = "self") -> Path | None:
    """The folder of a process's memory cgroup (cgroup v2, or v1's memory controller), ``None`` where there is none
    to read (no such process, no memory controller)."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    v2, v1 = _cgroup_mounts()
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, where = parts
        if controllers == "" and v2 is not None:
            folder = v2 / where.lstrip("/")
        elif "memory" in controllers.split(",") and v1 is not None:
            folder = v1 / where.lstrip("/")
        else:
            continue
        if oom_kill_count(folder) is not None:
            return folder
    return None


def oom_kill_count(cgroup: Path) -> int | None:
    """How many processes the OOM killer ended in a memory cgroup (``oom_kill`` of ``memory.events`` on v2, of
    ``memory.oom_control`` on v1); ``None`` where it cannot be read."""
    for name in ("memory.events", "memory.oom_control"):
        try:
            text = (cgroup / name).read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
    return None


def _cgroup_mounts() -> tuple[Path | None, Path | None]:
    """Where the cgroup v2 hierarchy and cgroup v1's memory controller are mounted, if they are."""
    v2 = v1 = None
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None, None
    for line in lines:
        before, _, after = line.partition(" - ")
        fields, kind = before.split(), after.split()
        if len(fields) < 5 or len(kind) < 3:
            continue
        if kind[0] == "cgroup2" and v2 is None:
            v2 = Path(fields[4])
        elif kind[0] == "cgroup" and "memory" in kind[2].split(",") and v1 is None:
            v1 = Path(fields[4])
    return v2, v1


def _children(pid: int) -> set[int]:
    """The processes whose parent is ``pid``: from its threads' ``children`` lists where the kernel keeps them, else
    from every process's ``stat`` in ``/proc``."""
    found: set[int] = set()
    with contextlib.suppress(OSError, ValueError):
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
        if tasks and (tasks[0] / "children").exists():
            for task in tasks:
                with contextlib.suppress(OSError):
                    found.update(int(child) for child in (task / "children").read_text().split())
            return found
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = Path(entry.path, "stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                    found.add(int(entry.name))
    return found


class MemoryWatch:
    """Notes, every ``interval_s`` while it is entered, the memory cgroup of each child of this process (the
    launcher's workers) and that cgroup's OOM-kill count, so that :func:`memory_kill` can tell afterwards whether
    the OOM killer ended a worker that died by ``SIGKILL``. The last watch entered keeps what it noted after it
    exits (the launcher describes its workers' failures once they have ended).

    Args:
        interval_s: Seconds between looks.
    """

    def __init__(self, interval_s: float = _POLL_S) -> None:
        self.interval_s = interval_s
        self.seen: dict[int, tuple[Path, int]] = {}  # pid: (memory cgroup, its OOM-kill count when first seen there)
        self._looking = Periodic("dtpo-memory-watch", interval_s, self._look)

    def poll(self) -> None:
        """Look once: note every child's cgroup, and its count where the child is new or has moved."""
        for pid in _children(os.getpid()):
            folder = memory_cgroup(pid)
            if folder is None or (pid in self.seen and self.seen[pid][0] == folder):
                continue
            count = oom_kill_count(folder)
            if count is not None:
                self.seen[pid] = (folder, count)

    def killed(self, pid: int) -> MemoryKill | None:
        """The OOM kill of ``pid`` if its cgroup counted one since the watch first saw it there."""
        if pid not in self.seen:
            return None
        folder, before = self.seen[pid]
        after = oom_kill_count(folder)
        if after is None or after <= before:
            return None
        return MemoryKill(pid, _cgroup_name(folder), "cgroup")

    def __enter__(self) -> MemoryWatch:
        global _last_watch
        _last_watch = self
        self._looking.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._looking.stop()

    def _look(self) -> bool:
        try:
            self.poll()
        except Exception as exc:  # noqa: BLE001 - a watch that cannot look must not end the launch
            log.debug("memory watch: %s", exc)
            return False  # nor look again
        return True


_last_watch: MemoryWatch | None = None


def _cgroup_name(folder: Path) -> str:
    """A cgroup's folder as the kernel names the cgroup (its path below the hierarchy's mount)."""
    for mount in _cgroup_mounts():
        if mount is not None and folder.is_relative_to(mount):
            return "/" + str(folder.relative_to(mount)).strip(".")
    return str(folder)


def out_of_memory_words(pid: int, exitcode: int, reported: str = "") -> str | None:
    """What the launcher's line adds for a worker that ran out of memory: the OOM killer's ``SIGKILL``
    (:func:`memory_kill`) or an allocation error in what it reported (:func:`says_out_of_memory`); ``None`` when
    neither."""
    if exitcode in (-signal.SIGKILL, 128 + signal.SIGKILL):
        kill = memory_kill(pid)
        return kill.describe() if kill is not None else None
    if says_out_of_memory(reported):
        return f"{OUT_OF_MEMORY} ({reported})"
    return None


def memory_kill(pid: int, since_boot_s: float | None = None) -> MemoryKill | None:
    """Whether the OOM killer ended process ``pid``: from the last :class:`MemoryWatch`, else the kernel log
    (records since ``since_boot_s``; default: since this process started, so a pid the kernel reused cannot
    match an older kill).

    Returns:
        The kill, or ``None`` where neither source says so (or neither can be read).
    """
    if _last_watch is not None:
        kill = _last_watch.killed(pid)
        if kill is not None:
            return kill
    since = process_start_boot_s() if since_boot_s is None else since_boot_s
    return kernel_memory_kills(since).get(pid)
