"""How much of DDP's gradient all-reduce hides behind the backward pass.

Design note
-----------
DDP groups gradients into buckets and all-reduces a bucket as soon as all its gradients exist, while backward
goes on. The model: bucket ``i`` becomes ready at ``r_i`` (``r_1 <= r_2 <= ... <= r_k``; backward ends at
``T_bwd = r_k`` unless told otherwise); the all-reduces run one after another on one channel (NCCL's
stream), bucket ``i`` starting at ``max(r_i, end of bucket i-1)`` and taking ``c_i``. The optimizer step waits
for the last one, so the step pays ``exposed = max(0, end of last bucket - T_bwd)`` on top of compute.

Assumptions, to be kept in mind wherever results are shown:

* a bucket's all-reduce takes as long overlapped as alone: the SMs and memory bandwidth NCCL takes from
  backward (and backward's slowdown) are not modelled;
* :func:`uniform_buckets` assumes gradients are produced at a uniform rate over backward, so a bucket is ready
  when the fraction of gradient bytes up to and including it has been produced. DDP fills buckets in reverse
  layer order (the last layers' gradients come first), and :func:`ddp_bucket_sizes` follows its defaults:
  a 1 MiB first bucket, then 25 MiB buckets (``bucket_cap_mb=25``). Real layers differ in compute per byte of
  gradient (convolutions vs. embeddings), which moves ready times;
* gradient accumulation: with ``no_sync()`` on all micro-batches but the last, only the last micro-batch's
  backward overlaps the (single) all-reduce. Pass the **last micro-batch's** backward time, not the step's;
  the earlier micro-batches hide nothing.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence

MiB = 1 << 20
DDP_BUCKET_CAP_BYTES = 25 * MiB  # torch DistributedDataParallel(bucket_cap_mb=25)
DDP_FIRST_BUCKET_BYTES = 1 * MiB  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES


def bucket_timeline(ready_s: Sequence[float], comm_s: Sequence[float]) -> list[tuple[float, float]]:
    """``(start, end)`` of each bucket's all-reduce: ``start_i = max(r_i, end_{i-1})``, ``end_i = start_i + c_i``.

    Raises:
        ValueError: Lengths differ, ready times decrease or are negative, or a comm time is negative.
    """
    ready, comm = [float(r) for r in ready_s], [float(c) for c in comm_s]
    if len(ready) != len(comm):
        raise ValueError(f"{len(ready)} ready times but {len(comm)} comm times: give one of each per bucket")
    if any(not (math.isfinite(r) and r >= 0) for r in ready):
        raise ValueError(f"ready times must be finite and >= 0 s: {ready}")
    if any(later < earlier for earlier, later in zip(ready, ready[1:], strict=False)):
        raise ValueError(f"ready times must not decrease (buckets in the order they become ready): {ready}")
    if any(not (math.isfinite(c) and c >= 0) for c in comm):
        raise ValueError(f"comm times must be finite and >= 0 s: {comm}")
    timeline: list[tuple[float, float]] = []
    end = 0.0
    for r, c in zip(ready, comm, strict=True):
        start = max(r, end)
        end = start + c
        timeline.append((start, end))
    return timeline


def exposed_comm(ready_s: Sequence[float], comm_s: Sequence[float], backward_end_s: float | None = None) -> float:
    """Communication not hidden by backward: ``max(0, end of last bucket - T_bwd)`` seconds (0 for no buckets).

    ``T_bwd`` is ``backward_end_s``, by default the last ready time.

    Raises:
        ValueError: As :func:`bucket_timeline`, or ``backward_end_s`` before the last ready time.
    """
    timeline = bucket_timeline(ready_s, comm_s)
    if not timeline:
        return 0.0
    last_ready = float(ready_s[-1])
    end_of_backward = last_ready if backward_end_s is None else float(backward_end_s)
    if not end_of_backward >= last_ready:
        raise ValueError(f"backward cannot end ({backward_end_s!r} s) before its last bucket is ready ({last_ready} s)")
    return max(0.0, timeline[-1][1] - end_of_backward)


def uniform_buckets(backward_s: float, n_buckets: int, total_comm_s: float, first_ready_fraction: float | None = None,
                    bucket_bytes: Sequence[float] | None = None) -> tuple[list[float], list[float]]:
    """Ready and comm times of ``n_buckets`` buckets: ``exposed_comm(*uniform_buckets(...))``.

    Comm time is split in proportion to ``bucket_bytes`` (equal buckets if ``None``). Ready times assume
    uniform gradient production: bucket ``i`` is ready at ``T * f + T * (1 - f) * (B_i - B_1) / (B - B_1)``, with
    ``B_i`` the bytes of buckets 1..i, ``B`` all bytes and ``f = first_ready_fraction``; by default
    ``f = B_1 / B`` and this is simply ``T * B_i / B`` (``T * i / k`` for equal buckets). The last bucket is
    ready when backward ends.

    Raises:
        ValueError: Negative times, ``n_buckets < 1``, ``first_ready_fraction`` outside (0, 1], or
            ``bucket_bytes`` of the wrong length, negative, or all zero.
    """
    backward, comm = float(backward_s), float(total_comm_s)
    if not (math.isfinite(backward) and backward >= 0):
        raise ValueError(f"backward_s must be finite and >= 0, not {backward_s!r}")
    if not (math.isfinite(comm) and comm >= 0):
        raise ValueError(f"total_comm_s must be finite and >= 0, not {total_comm_s!r}")
    try:
        k = operator.index(n_buckets)
    except TypeError:
        k = 0
    if isinstance(n_buckets, bool) or k < 1:
        raise ValueError(f"n_buckets must be an integer >= 1, not {n_buckets!r}")
    sizes = [1.0] * k if bucket_bytes is None else [float(b) for b in bucket_bytes]
    if len(sizes) != k:
        raise ValueError(f"bucket_bytes has {len(sizes)} entries for {k} buckets")
    if any(not (math.isfinite(b) and b >= 0) for b in sizes) or not sum(sizes) > 0:
        raise ValueError(f"bucket_bytes must be finite, >= 0, and not all zero: {sizes}")
    total = sum(sizes)
    cumulative: list[float] = []
    running = 0.0
    for size in sizes:
        running += size
        cumulative.append(running)
    first = cumulative[0] / total if first_ready_fraction is None else float(first_ready_fraction)
    if not 0 < first <= 1:
        raise ValueError(f"first_ready_fraction must be in (0, 1], not {first_ready_fraction!r}")
    rest = total - cumulative[0]
    if rest > 0:
        ready = [backward * (first + (1 - first) * (c - cumulative[0]) / rest) for c in cumulative]
    else:  # all bytes in the first bucket(s): they are ready when backward ends
        ready = [backward] * k
    ready[-1] = backward
    return ready, [comm * size / total for size in sizes]


def ddp_bucket_sizes(total_bytes: int, cap_bytes: int = DDP_BUCKET_CAP_BYTES,
                     first_cap_bytes: int = DDP_FIRST_BUCKET_BYTES) -> list[int]:
    """DDP's bucket sizes for ``total_bytes`` of gradients, in the order the buckets become ready.

    The first bucket holds at most ``first_cap_bytes`` (1 MiB), the others ``cap_bytes`` (25 MiB), the last
    what remains. DDP packs whole parameters, so a real bucket can exceed its cap by one tensor; this split
    ignores tensor boundaries. An empty list for 0 bytes.

    Raises:
        ValueError: Negative ``total_bytes`` or a cap < 1.
    """
    total, cap, first_cap = (operator.index(v) for v in (total_bytes, cap_bytes, first_cap_bytes))
    if total < 0:
        raise ValueError(f"total_bytes must be >= 0, not {total_bytes!r}")
    if cap < 1 or first_cap < 1:
        raise ValueError(f"bucket caps must be >= 1 byte, not {cap_bytes!r} and {first_cap_bytes!r}")
    if total == 0:
        return []
    sizes = [min(total, first_cap)]
    left = total - sizes[0]
    while left > 0:
        sizes.append(min(left, cap))
        left -= sizes[-1]
    return sizes


def ddp_tensor_buckets(tensor_bytes: Sequence[int], cap_bytes: int = DDP_BUCKET_CAP_BYTES,
                       first_cap_bytes: int = DDP_FIRST_BUCKET_BYTES) -> list[int]:
    """DDP's bucket sizes for gradients of these sizes, given in the order backward produces them (the reverse
    of ``model.parameters()``), packing whole tensors as DDP does (``compute_bucket_assignment_by_size``): a
    bucket takes tensors until it reaches its cap (``first_cap_bytes`` for the first, ``cap_bytes`` after), so a
    tensor larger than the cap makes a bucket of its own.

    Raises:
        ValueError: A negative size or a cap < 1.
    """
    if cap_bytes < 1 or first_cap_bytes < 1:
        raise ValueError(f"bucket caps must be >= 1 byte, not {cap_bytes!r} and {first_cap_bytes!r}")
    sizes: list[int] = []
    current, limit = 0, first_cap_bytes
    for size in tensor_bytes:
        if size < 0:
            raise ValueError(f"a tensor cannot have {size} bytes")
        current += int(size)
        if current >= limit:
            sizes.append(current)
            current, limit = 0, cap_bytes
    if current:
        sizes.append(current)
    return sizes
