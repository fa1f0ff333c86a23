"""Time ``all_reduce`` at several message sizes: the samples :func:`dtpo.plan.link_fit.fit_alpha_beta` fits.

On an initialised process group, :func:`probe_all_reduce` all-reduces a float32 tensor of each size a few
times to warm up (gloo connects lazily and allocates its buffers on first use), then times ``repeats`` more,
each after a barrier so every rank starts together, and keeps the median. As a script it joins the world a
launcher describes (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) over gloo::

    dtpo launch --standalone --nproc-per-node 2 -m dtpo.distributed.link_probe --sizes 4096,1048576 --out probe.json

and rank 0 writes ``{"samples": [[n_bytes, world_size, median_seconds], ...], "cpu_samples": [[n_bytes,
world_size, median_cpu_seconds], ...], ...}``. ``cpu_samples`` is the host CPU time (user and system, every
thread of rank 0's process: gloo's copies, sums and socket calls) of one all-reduce: on a CPU job that work
runs on the cores that compute, so it slows a backward pass the all-reduce overlaps
(:func:`dtpo.plan.link_fit.fit_link_probe`). A bad flag ends with one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from dtpo.core.errors import first_line

__all__ = ["DEFAULT_SIZES", "ProbeSample", "main", "parse_sizes", "probe_all_reduce"]

log = logging.getLogger(__name__)

FLOAT32_BYTES = 4
DEFAULT_SIZES: tuple[int, ...] = (4096, 65536, 1 << 20, 4 << 20, 16 << 20)
"""4 KiB to 16 MiB: the small sizes pin the latency, the large ones the bandwidth."""


@dataclass(frozen=True)
class ProbeSample:
    """One message size's timing.

    Attributes:
        n_bytes: Message size (whole float32 elements).
        ranks: Ranks in the all-reduce.
        seconds: Median wall time of one all-reduce.
        cpu_seconds: Median host CPU time (user + system, all threads of this process) of one all-reduce.
    """

    n_bytes: int
    ranks: int
    seconds: float
    cpu_seconds: float


def probe_all_reduce(sizes_bytes: Sequence[int], repeats: int = 5, warmup: int = 2,
                     group: dist.ProcessGroup | None = None) -> list[ProbeSample]:
    """Median wall and host CPU time of one ``all_reduce`` (sum) of a float32 tensor of each size, on every rank
    of ``group``.

    Every rank of the group must call this with the same arguments. A size that is not a multiple of 4 bytes
    is rounded down to whole float32 elements (at least one), and the rounded size is what is returned.

    Args:
        sizes_bytes: Message sizes in bytes.
        repeats: Timed all-reduces per size (the median is kept).
        warmup: Untimed all-reduces per size before the timed ones.
        group: The process group (default: the world).

    Returns:
        One :class:`ProbeSample` per size, in the order given.

    Raises:
        ValueError: A size < 1 byte, ``repeats < 1`` or ``warmup < 0``.
        RuntimeError: No initialised process group.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, not {repeats!r}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, not {warmup!r}")
    if any(int(size) < 1 for size in sizes_bytes):
        raise ValueError(f"message sizes must be >= 1 byte: {list(sizes_bytes)}")
    if not dist.is_initialized():
        raise RuntimeError("probe_all_reduce needs an initialised torch.distributed process group")
    world = dist.get_world_size(group)
    samples: list[ProbeSample] = []
    for size in sizes_bytes:
        elements = max(1, int(size) // FLOAT32_BYTES)
        tensor = torch.ones(elements, dtype=torch.float32)
        for _ in range(warmup):
            dist.all_reduce(tensor, group=group)
        times, cpu_times = [], []
        for _ in range(repeats):
            dist.barrier(group=group)
            cpu_start, start = time.process_time(), time.perf_counter()
            dist.all_reduce(tensor, group=group)
            times.append(time.perf_counter() - start)
            cpu_times.append(time.process_time() - cpu_start)
        sample = ProbeSample(elements * FLOAT32_BYTES, world, statistics.median(times), statistics.median(cpu_times))
        samples.append(sample)
        log.debug("all_reduce of %d bytes over %d ranks: median %.6f s, %.6f CPU s", sample.n_bytes, world,
                  sample.seconds, sample.cpu_seconds)
    return samples


def parse_sizes(text: str) -> list[int]:
    """``"4096,65536,1M"`` as byte counts; suffixes K, M, G (powers of 1024) are accepted.

    Raises:
        ValueError: An empty list, a part that is not a positive integer size.
    """
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    sizes: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        scale = units.get(part[-1].upper(), 1)
        digits = part[:-1] if scale > 1 else part
        if not digits.isdigit() or int(digits) * scale < 1:
            raise ValueError(f"--sizes: {part!r} is not a positive number of bytes")
        sizes.append(int(digits) * scale)
    if not sizes:
        raise ValueError("--sizes names no message size")
    return sizes


class _OneLineParser(argparse.ArgumentParser):
    """Errors are one line on stderr and exit code 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {first_line(message)}\n")
        raise SystemExit(2)


def _parser() -> _OneLineParser:
    parser = _OneLineParser(prog="python -m dtpo.distributed.link_probe",
                            description="Time all_reduce at several message sizes on a gloo world (run it under "
                                        "torchrun or dtpo launch); rank 0 writes the samples as JSON.")
    parser.add_argument("--sizes", default=",".join(str(s) for s in DEFAULT_SIZES),
                        help="comma-separated message sizes in bytes (K, M, G suffixes allowed)")
    parser.add_argument("--repeats", type=int, default=5, help="timed all-reduces per size (median kept)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed all-reduces per size first")
    parser.add_argument("--out", required=True, help="JSON file rank 0 writes")
    return parser


def _env_int(name: str) -> int:
    value = os.environ.get(name, "")
    if not value.isdigit():
        raise ValueError(f"${name} must be set to a non-negative integer (run under torchrun or dtpo launch), "
                         f"got {value!r}")
    return int(value)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: probe the world the launcher set up; rank 0 writes ``--out``. Returns the exit code."""
    parser = _parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        sizes = parse_sizes(args.sizes)
        if args.repeats < 1:
            raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
        if args.warmup < 0:
            raise ValueError(f"--warmup must be >= 0, got {args.warmup}")
        rank, world = _env_int("RANK"), _env_int("WORLD_SIZE")
    except ValueError as exc:
        parser.error(str(exc))
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        samples = probe_all_reduce(sizes, repeats=args.repeats, warmup=args.warmup)
        if rank == 0:
            out = Path(args.out)
            out.parent.mkdir(parents=True, exist_ok=True)
            doc: dict[str, Any] = {"samples": [[s.n_bytes, s.ranks, s.seconds] for s in samples],
                                   "cpu_samples": [[s.n_bytes, s.ranks, s.cpu_seconds] for s in samples],
                                   "repeats": args.repeats, "warmup": args.warmup, "backend": "gloo"}
            tmp = out.with_name(out.name + ".tmp")
            tmp.write_text(json.dumps(doc, indent=1))
            tmp.replace(out)
            for sample in samples:
                log.info("%12d bytes x %d ranks: %.3f ms (%.3f ms CPU)", sample.n_bytes, sample.ranks,
                         sample.seconds * 1e3, sample.cpu_seconds * 1e3)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    from dtpo.distributed.worker_exit import run_then_exit

    run_then_exit(lambda: sys.exit(main()))
