"""A worker killed for memory: the launcher's line and the record name the rank and "out of memory", not a bare
signal number or an allocator's message.

The OOM killer is real where this process may make a memory cgroup with a small limit (root, cgroup v1's memory
controller or v2 with it delegated); an allocation that fails is real everywhere (``RLIMIT_AS``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import dtpo_cli
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from dtpo.cli.conclude import memory_errors
from dtpo.distributed import oom
from dtpo.distributed.launch import _describe_failures
from dtpo.distributed.oom import (
    OUT_OF_MEMORY,
    MemoryWatch,
    kernel_memory_kills,
    memory_cgroup,
    oom_kill_count,
    process_start_boot_s,
    says_out_of_memory,
)

LIMIT = 96 * 2**20  # the small cgroup's memory limit
ALLOCATE = 512  # MiB a worker touches inside it


def _kmsg_copy(path: Path, pid: int, at_s: float, memcg: str) -> Path:
    """What the kernel logs when its OOM killer ends ``pid`` in ``memcg`` (copied from a real log)."""
    usec = int(at_s * 1e6)
    path.write_text(
        f"4,340,{usec},-;python3 invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0\n"
        f"6,416,{usec + 1},-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,"
        f"oom_memcg={memcg},task_memcg={memcg},task=python3,pid={pid},uid=0\n"
        f"3,417,{usec + 2},-;Memory cgroup out of memory: Killed process {pid} (python3) total-vm:323768kB, "
        "anon-rss:72192kB, file-rss:6664kB, shmem-rss:0kB, UID:0 pgtables:208kB oom_score_adj:0\n"
        f" SUBSYSTEM=memory\n")
    return path


def _failure(exitcode: int, pid: int) -> ProcessFailure:
    return ProcessFailure(local_rank=1, pid=pid, exitcode=exitcode, error_file="/nonexistent")


def test_the_kernel_logs_oom_kill_names_the_rank_and_its_cgroup(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    since = process_start_boot_s()
    monkeypatch.setattr(oom, "_last_watch", None)
    monkeypatch.setattr(oom, "KMSG", _kmsg_copy(tmp_path / "kmsg", 4242, since + 5, "/job/dtpo-small"))
    line = _describe_failures(ChildFailedError("train", {1: _failure(-signal.SIGKILL, 4242)}))
    assert line == ("rank 1 was killed by SIGKILL: out of memory (the kernel's OOM killer ended it at the limit of "
                    "memory cgroup /job/dtpo-small)")
    # another process's SIGKILL, and an OOM kill from before this process started, are only signals
    assert _describe_failures(ChildFailedError("train", {1: _failure(-signal.SIGKILL, 4243)})) == \
        "rank 1 was killed by SIGKILL"
    assert kernel_memory_kills(since + 6, tmp_path / "kmsg") == {}
    assert memory_errors({0: "interrupted by SIGTERM", 1: None}, line + " (then 1 other rank stopped)") == {
        1: "out of memory (the kernel's OOM killer ended it at the limit of memory cgroup /job/dtpo-small)"}


def test_an_allocation_error_says_out_of_memory() -> None:
    assert says_out_of_memory("RuntimeError: DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 "
                              "bytes. Error code 12 (Cannot allocate memory)")
    assert says_out_of_memory("OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    assert says_out_of_memory("MemoryError") and not says_out_of_memory("ValueError: bad label 7")
    errors = {0: "RuntimeError: DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes",
              1: "ValueError: bad label 7"}
    assert memory_errors(errors, "rank 0 exited with code 1") == {0: f"{OUT_OF_MEMORY}: {errors[0]}"}


# -- a real OOM kill ----------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _small_memory_cgroup(limit: int = LIMIT) -> Iterator[Path]:
    """A child of this process's memory cgroup (v2: of the hierarchy's root) with a ``limit`` in bytes; the test is
    skipped, saying why, where none can be made."""
    here = memory_cgroup()
    if here is None:
        pytest.skip("no memory cgroup to read here (no cgroup v2 memory controller, no v1 memory hierarchy): only the "
                    "simulated OOM kill runs")
    v1 = (here / "memory.oom_control").exists() and not (here / "memory.events").exists()
    parent = here
    if not v1:  # v2: a cgroup with processes cannot have children with controllers; its root can
        parent = next((p for p in (here, *here.parents) if (p / "cgroup.subtree_control").exists()
                       and "memory" in (p / "cgroup.subtree_control").read_text().split()), here)
    folder = parent / f"dtpo-oom-test-{os.getpid()}"
    try:
        folder.mkdir()
        (folder / ("memory.limit_in_bytes" if v1 else "memory.max")).write_text(str(limit))
        for swap in ("memory.memsw.limit_in_bytes", "memory.swap.max"):  # no swap to escape to
            with contextlib.suppress(OSError):
                (folder / swap).write_text(str(limit) if swap.endswith("in_bytes") else "0")
    except OSError as exc:
        with contextlib.suppress(OSError):
            folder.rmdir()
        pytest.skip(f"cannot make a memory cgroup with a limit under {parent} ({exc.strerror or exc}): only the "
                    "simulated OOM kill runs")
    try:
        yield folder
    finally:
        with contextlib.suppress(OSError):
            folder.rmdir()


HOG = textwrap.dedent(f"""
    import sys
    sys.stdin.readline()  # moved into the small cgroup meanwhile
    block = bytearray({ALLOCATE} * 2**20)
    for i in range(0, len(block), 4096):
        block[i] = 1
""")


@pytest.mark.slow
def test_the_watch_tells_an_oom_kill_from_its_cgroups_count() -> None:
    with _small_memory_cgroup() as cgroup:
        watch = MemoryWatch()
        child = subprocess.Popen([sys.executable, "-c", HOG], stdin=subprocess.PIPE)
        try:
            (cgroup / "cgroup.procs").write_text(str(child.pid))
            watch.poll()  # what the watch's thread does every half second
            assert watch.seen[child.pid] == (cgroup, oom_kill_count(cgroup))
            assert child.stdin is not None
            child.stdin.write(b"go\n")
            child.stdin.close()
            assert child.wait(timeout=120) == -signal.SIGKILL
        finally:
            child.kill()
            child.wait()
        kill = watch.killed(child.pid)
        assert kill is not None and kill.source == "cgroup" and kill.cgroup is not None
        assert kill.cgroup.endswith(cgroup.name) and kill.describe().startswith(OUT_OF_MEMORY)
        if os.access(oom.KMSG, os.R_OK):  # the kernel log names it too
            assert kernel_memory_kills(process_start_boot_s())[child.pid].cgroup.endswith(cgroup.name)


WORKER = textwrap.dedent(f"""
    import os, resource, sys, time
    import torch, torch.nn.functional as F
    import dtpo
    how = sys.argv[1]
    torch.set_num_threads(1)
    session = dtpo.Session(warmup_steps=1, progress=False, energy=False, flush_every=1)
    torch.manual_seed(0)
    model = session.wrap(torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = ((torch.randn(4, 8), torch.randint(0, 2, (4,))) for _ in iter(int, 1))
    with session:
        for x, y in session.batches(data, steps=1000):
            if session.rank == 1 and session.step_count == 3:
                if how == "cgroup":
                    with open(os.path.join(os.environ["SMALL_CGROUP"], "cgroup.procs"), "w") as procs:
                        procs.write(str(os.getpid()))
                    time.sleep(1.0)  # a watch around the launch looks every 0.5 s
                else:
                    with open("/proc/self/status") as status:
                        size = next(int(l.split()[1]) for l in status if l.startswith("VmSize:")) * 1024
                    resource.setrlimit(resource.RLIMIT_AS, (size + 2**28, size + 2**28))
                torch.ones({ALLOCATE} * 2**20, dtype=torch.uint8)
            session.backward(F.cross_entropy(model(x), y))
            session.step(opt)
""")


def _launch(tmp_path: Path, how: str, env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], dict]:
    (tmp_path / "worker.py").write_text(WORKER)
    run_dir = tmp_path / "run"
    result = subprocess.run(dtpo_cli("launch", "--standalone", "--nproc-per-node", "2", "--run-dir", str(run_dir),
                                     str(tmp_path / "worker.py"), how),
                            capture_output=True, text=True, timeout=300, env={**os.environ, **env})
    return result, json.loads((run_dir / "record.json").read_text())


@pytest.mark.slow
def test_a_worker_the_oom_killer_ends_is_named_out_of_memory(tmp_path: Path) -> None:
    if not os.access(oom.KMSG, os.R_OK):
        pytest.skip(f"{oom.KMSG} is not readable here, and `dtpo launch` does not run a MemoryWatch yet: the OOM "
                    "kill would read as a bare SIGKILL")
    with _small_memory_cgroup() as cgroup:
        result, record = _launch(tmp_path, "cgroup", {"SMALL_CGROUP": str(cgroup)})
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 1, result.stderr
    assert last.startswith("dtpo: run failed: rank 1 was killed by SIGKILL: out of memory (the kernel's OOM "
                           "killer ended it at the limit of memory cgroup "), last
    assert record["status"] == "failed" and record["error"].startswith("rank 1 was killed by SIGKILL: out of memory")
    rank1 = next(r for r in record["ranks"] if r["rank"] == 1)
    assert rank1["error"].startswith("out of memory (the kernel's OOM killer ended it")
    assert cgroup.name in rank1["error"]


@pytest.mark.slow
def test_a_worker_whose_allocation_fails_is_named_out_of_memory(tmp_path: Path) -> None:
    result, record = _launch(tmp_path, "rlimit", {})
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 1, result.stderr
    assert last.startswith("dtpo: run failed: rank 1: out of memory: RuntimeError: ") and \
        "can't allocate memory" in last, last
    assert record["status"] == "failed" and record["error"].startswith("rank 1: out of memory: RuntimeError: ")
    rank1 = next(r for r in record["ranks"] if r["rank"] == 1)
    assert rank1["error"].startswith("out of memory: RuntimeError: ") and "can't allocate memory" in rank1["error"]
