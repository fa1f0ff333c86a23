"""link_probe: all-reduce timings on 2 gloo ranks, and its command line's errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist
from conftest import run_ranks

from dtpo.distributed.link_probe import parse_sizes, probe_all_reduce

SIZES = [4096, 65536, 1 << 20]


def _probe(rank: int, world_size: int, out: str) -> None:
    dist.init_process_group("gloo")
    try:
        samples = probe_all_reduce(SIZES, repeats=3, warmup=1)
    finally:
        dist.destroy_process_group()
    if rank == 0:
        Path(out).write_text(json.dumps([[s.n_bytes, s.ranks, s.seconds] for s in samples]))


@pytest.mark.slow
def test_probe_on_two_ranks(tmp_path: Path) -> None:
    out = tmp_path / "samples.json"
    run_ranks(_probe, 2, str(out))
    samples = json.loads(out.read_text())
    assert [n for n, _, _ in samples] == SIZES
    assert all(p == 2 for _, p, _ in samples)
    assert all(t > 0 for _, _, t in samples)


def _probe_cpu(rank: int, world_size: int, out: str) -> None:
    dist.init_process_group("gloo")
    try:
        samples = probe_all_reduce([4096, 1 << 20], repeats=3, warmup=1)
    finally:
        dist.destroy_process_group()
    if rank == 0:
        Path(out).write_text(json.dumps([[s.n_bytes, s.ranks, s.seconds, s.cpu_seconds] for s in samples]))


@pytest.mark.slow
def test_the_probe_also_times_the_host_cpu_each_all_reduce_used(tmp_path: Path) -> None:
    out = tmp_path / "samples.json"
    run_ranks(_probe_cpu, 2, str(out))
    samples = json.loads(out.read_text())
    assert [(n, p) for n, p, _, _ in samples] == [(4096, 2), (1 << 20, 2)]
    assert all(t > 0 and cpu >= 0 for _, _, t, cpu in samples)
    assert samples[1][3] > 0  # a 1 MiB sum over gloo costs some CPU time on any machine


def test_probe_needs_a_process_group() -> None:
    with pytest.raises(RuntimeError, match="process group"):
        probe_all_reduce([4096])


@pytest.mark.parametrize("bad", [{"repeats": 0}, {"warmup": -1}])
def test_probe_refuses_bad_counts(bad: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        probe_all_reduce([4096], **bad)


def test_parse_sizes() -> None:
    assert parse_sizes("4096, 64K,1M") == [4096, 65536, 1 << 20]
    for bad in ("", "abc", "0", "-4", "1.5M"):
        with pytest.raises(ValueError):
            parse_sizes(bad)


@pytest.mark.slow
@pytest.mark.parametrize("argv", [["--sizes", "x", "--out", "o.json"], ["--repeats", "0", "--out", "o.json"],
                                  ["--bogus"], []])
def test_bad_flags_one_line_exit_2(argv: list[str], tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "dtpo.distributed.link_probe", *argv], capture_output=True, text=True,
                          cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "RANK": "0", "WORLD_SIZE": "1"}, timeout=60)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1
    assert "error" in done.stderr
