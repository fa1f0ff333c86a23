"""Alpha-beta (Hockney) cost of the collectives data-parallel training runs.

Design note
-----------
A collective that sends ``m`` messages in sequence and puts ``w`` bytes through each participant's link
takes ``time = alpha * m + w / B``: ``alpha`` is the per-message latency, ``B`` the bandwidth one
participant reaches (bytes/s, per direction; use a link's *effective* bandwidth, see
:mod:`dtpo.plan.interconnect`). Sizes are in bytes, times in seconds, ``p`` is the number of participants,
and ``n`` is always the size of the **full** tensor (the all-reduced gradient, the gathered parameters).

* Ring all-reduce (reduce-scatter then all-gather around a ring): ``2(p-1)`` steps each moving ``n/p``.
* Tree all-reduce (NCCL's double binary tree): a reduce up and a broadcast down the tree, ``2 ceil(log2 p)``
  latency terms; pipelined in chunks, each rank's traffic approaches ``2n`` (it is an inner node in one of
  the two trees and a leaf in the other), so the bandwidth term is ``2n / (f B)`` with ``f =``
  :data:`TREE_BANDWIDTH_FACTOR`, the 0.92 NCCL's own tuner (``src/graph/tuning.cc``) applies to tree
  bandwidth. The chunk pipeline's fill time is ignored, and NCCL builds chains rather than trees inside a
  node: the tree model is meant for the inter-node stage.
* Hierarchical all-reduce over ``nodes`` nodes of ``g`` GPUs: reduce-scatter inside each node (ring over the
  intra-node link), then each GPU all-reduces its ``n/g`` shard with the GPUs of the same local rank on the
  other nodes, then all-gather inside the node. The ``g`` inter-node all-reduces run at once and share the
  node's NICs, so each gets ``B_node / g``: the inter-node stage costs ``2(N-1) alpha + 2(N-1)/N * n / B_node``
  for a ring, i.e. every node puts (almost) twice the full gradient through its NICs. The three stages are
  added up (NCCL pipelines them, so this is slightly pessimistic for large messages).
* FSDP (ZeRO-3) per step: all-gather of the parameters in forward, again in backward (they were freed after
  forward), and a reduce-scatter of the gradients.

Not modelled: link contention with other jobs, NCCL protocol switches (LL/LL128/Simple) and channel counts,
in-network reduction (SHARP, NVLS), and congestion at scale; calibrate alpha and bandwidth with
:mod:`dtpo.plan.link_fit` where timings exist.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dtpo.core.errors import ConfigError
from dtpo.plan.interconnect import Link, node_bandwidth

TREE_BANDWIDTH_FACTOR = 0.92  # NCCL tuning.cc: tree busBw = min(busBw * .92, ...)
ALGORITHMS: tuple[str, ...] = ("ring", "tree", "auto")
COMPRESSIONS: tuple[str, ...] = ("none", "fp16", "bf16", "powersgd")
FP32_BYTES = 4


def _size(n_bytes: float, what: str = "n_bytes") -> float:
    """``n_bytes`` as a float, checked to be a finite size >= 0."""
    value = float(n_bytes)
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{what} must be a finite number of bytes >= 0, not {n_bytes!r}")
    return value


def _count(p: int, what: str = "p") -> int:
    """``p`` as an int, checked to be an integer >= 1."""
    try:
        value = operator.index(p)
    except TypeError:
        raise ValueError(f"{what} must be an integer >= 1, not {p!r}") from None
    if isinstance(p, bool) or value < 1:
        raise ValueError(f"{what} must be an integer >= 1, not {p!r}")
    return value


def _alpha_bandwidth(alpha_s: float, bandwidth_Bps: float) -> tuple[float, float]:
    """``(alpha_s, bandwidth_Bps)`` checked: latency finite and >= 0, bandwidth > 0."""
    alpha, bandwidth = float(alpha_s), float(bandwidth_Bps)
    if not (math.isfinite(alpha) and alpha >= 0):
        raise ValueError(f"alpha_s must be a finite latency >= 0 s, not {alpha_s!r}")
    if not bandwidth > 0:
        raise ValueError(f"bandwidth_Bps must be > 0 bytes/s, not {bandwidth_Bps!r}")
    return alpha, bandwidth


def ring_all_reduce(n_bytes: float, p: int, alpha_s: float, bandwidth_Bps: float) -> float:
    """Ring all-reduce of ``n_bytes`` over ``p`` participants: ``2(p-1) alpha + 2(p-1)/p * n / B``; 0 for p == 1."""
    n, p = _size(n_bytes), _count(p)
    alpha, bandwidth = _alpha_bandwidth(alpha_s, bandwidth_Bps)
    if p == 1:
        return 0.0
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * n / bandwidth


def tree_all_reduce(n_bytes: float, p: int, alpha_s: float, bandwidth_Bps: float, *,
                    bandwidth_factor: float = TREE_BANDWIDTH_FACTOR) -> float:
    """Double-binary-tree all-reduce: ``2 ceil(log2 p) alpha + 2n / (f B)``; 0 for p == 1.

    ``f`` is ``bandwidth_factor`` (default :data:`TREE_BANDWIDTH_FACTOR`, NCCL's 0.92). The latency term is a
    reduce up and a broadcast down a tree of depth ``ceil(log2 p)``; the bandwidth term is the limit a
    pipelined double binary tree approaches (each rank sends and receives about ``2n``).
    """
    n, p = _size(n_bytes), _count(p)
    alpha, bandwidth = _alpha_bandwidth(alpha_s, bandwidth_Bps)
    if not 0 < bandwidth_factor <= 1:
        raise ValueError(f"bandwidth_factor must be in (0, 1], not {bandwidth_factor!r}")
    if p == 1:
        return 0.0
    return 2 * math.ceil(math.log2(p)) * alpha + 2 * n / (bandwidth_factor * bandwidth)


def reduce_scatter(n_bytes: float, p: int, alpha_s: float, bandwidth_Bps: float) -> float:
    """Ring reduce-scatter of a tensor of ``n_bytes`` (each rank keeps ``n/p``): ``(p-1) alpha + (p-1)/p * n / B``."""
    n, p = _size(n_bytes), _count(p)
    alpha, bandwidth = _alpha_bandwidth(alpha_s, bandwidth_Bps)
    return (p - 1) * alpha + (p - 1) / p * n / bandwidth


def all_gather(n_bytes: float, p: int, alpha_s: float, bandwidth_Bps: float) -> float:
    """Ring all-gather into a tensor of ``n_bytes`` (each rank holds ``n/p``): ``(p-1) alpha + (p-1)/p * n / B``."""
    n, p = _size(n_bytes), _count(p)
    alpha, bandwidth = _alpha_bandwidth(alpha_s, bandwidth_Bps)
    return (p - 1) * alpha + (p - 1) / p * n / bandwidth


@dataclass(frozen=True)
class LinkCost:
    """Alpha and bandwidth of one link as the cost models use them.

    Attributes:
        alpha_s: Per-message latency, seconds.
        bandwidth_Bps: Achieved bandwidth, bytes/s: per GPU for an intra-node link, per node (all its NICs)
            for an inter-node link.
        cpu_s_per_byte: Host CPU seconds per byte a rank moves over the link (measured by
            ``dtpo.distributed.link_probe``; 0 when unknown, and for GPU collectives, which DMA engines and NICs run).
    """

    alpha_s: float
    bandwidth_Bps: float
    cpu_s_per_byte: float = 0.0

    def __post_init__(self) -> None:
        _alpha_bandwidth(self.alpha_s, self.bandwidth_Bps)

    @classmethod
    def from_link(cls, link: Link, nics: int = 1) -> LinkCost:
        """The cost of a catalogue link: its latency and effective bandwidth x ``nics`` (inter-node links).

        Raises:
            ConfigError: ``nics`` is not a positive integer, or is not 1 for an intra-node link.
        """
        return cls(link.latency_s, node_bandwidth(link, nics, effective=True))


Collective = Callable[[float, int, float, float], float]


def _across_nodes(collective: Collective, n: float, gpus_per_node: int, nodes: int, inter: LinkCost) -> float:
    """``gpus_per_node`` concurrent collectives of ``n / gpus_per_node`` over ``nodes``, sharing the node's NICs."""
    share = inter.bandwidth_Bps / gpus_per_node
    return collective(n / gpus_per_node, nodes, inter.alpha_s, share)


def _inter_needed(nodes: int, inter: LinkCost | None) -> LinkCost | None:
    """``inter``, checked to be given when there is more than one node."""
    if nodes > 1 and inter is None:
        raise ValueError(f"an inter-node LinkCost is needed for {nodes} nodes")
    return inter


def _tree(n: float, p: int, alpha_s: float, bandwidth_Bps: float) -> float:
    """:func:`tree_all_reduce` with the default bandwidth factor (a :data:`Collective`)."""
    return tree_all_reduce(n, p, alpha_s, bandwidth_Bps)


_ALL_REDUCES: dict[str, Collective] = {"ring": ring_all_reduce, "tree": _tree}


def _algorithm(algorithm: str) -> str:
    """``algorithm`` lower-cased, checked to be one of :data:`ALGORITHMS`."""
    key = str(algorithm).strip().lower()
    if key not in ALGORITHMS:
        raise ConfigError(f"unknown all-reduce algorithm {algorithm!r}; known: {', '.join(ALGORITHMS)}")
    return key


def hierarchical_reduce_scatter(n_bytes: float, gpus_per_node: int, nodes: int, intra: LinkCost,
                                inter: LinkCost | None = None) -> float:
    """Reduce-scatter over ``nodes x gpus_per_node`` GPUs: inside the node, then across nodes.

    ``reduce_scatter(n, g, intra) + (N-1) alpha_inter + (N-1)/N * n / B_node`` (the second term is ``g``
    concurrent reduce-scatters of ``n/g`` sharing the node's NICs).
    """
    n, g, nodes = _size(n_bytes), _count(gpus_per_node, "gpus_per_node"), _count(nodes, "nodes")
    inside = reduce_scatter(n, g, intra.alpha_s, intra.bandwidth_Bps)
    inter = _inter_needed(nodes, inter)
    return inside if inter is None or nodes == 1 else inside + _across_nodes(reduce_scatter, n, g, nodes, inter)


def hierarchical_all_gather(n_bytes: float, gpus_per_node: int, nodes: int, intra: LinkCost,
                            inter: LinkCost | None = None) -> float:
    """All-gather over ``nodes x gpus_per_node`` GPUs: across nodes, then inside the node.

    ``(N-1) alpha_inter + (N-1)/N * n / B_node + all_gather(n, g, intra)``.
    """
    n, g, nodes = _size(n_bytes), _count(gpus_per_node, "gpus_per_node"), _count(nodes, "nodes")
    inside = all_gather(n, g, intra.alpha_s, intra.bandwidth_Bps)
    inter = _inter_needed(nodes, inter)
    return inside if inter is None or nodes == 1 else inside + _across_nodes(all_gather, n, g, nodes, inter)


def hierarchical_all_reduce(n_bytes: float, gpus_per_node: int, nodes: int, intra: LinkCost,
                            inter: LinkCost | None = None, *, inter_algorithm: str = "ring") -> float:
    """Reduce-scatter in the node, all-reduce of the ``n/g`` shards across nodes, all-gather in the node.

    ``reduce_scatter(n, g, intra) + X + all_gather(n, g, intra)`` where ``X`` is ``g`` concurrent all-reduces
    of ``n/g`` over ``N`` nodes, each with ``B_node / g``: for a ring ``2(N-1) alpha_inter + 2(N-1)/N * n /
    B_node``, for a tree ``2 ceil(log2 N) alpha_inter + 2n / (0.92 B_node)``; ``inter_algorithm="auto"`` takes
    the cheaper. On one node this is exactly the intra-node ring all-reduce.
    """
    n, g, nodes = _size(n_bytes), _count(gpus_per_node, "gpus_per_node"), _count(nodes, "nodes")
    algorithm = _algorithm(inter_algorithm)
    inter = _inter_needed(nodes, inter)
    inside = reduce_scatter(n, g, intra.alpha_s, intra.bandwidth_Bps) + all_gather(n, g, intra.alpha_s,
                                                                                 intra.bandwidth_Bps)
    if inter is None or nodes == 1:
        return inside
    names = ("ring", "tree") if algorithm == "auto" else (algorithm,)
    return inside + min(_across_nodes(_ALL_REDUCES[name], n, g, nodes, inter) for name in names)


def all_reduce(n_bytes: float, gpus_per_node: int, nodes: int, intra: LinkCost, inter: LinkCost | None = None,
               algorithm: str = "ring") -> float:
    """All-reduce of ``n_bytes`` over ``nodes x gpus_per_node`` GPUs.

    One node: ``ring_all_reduce`` or ``tree_all_reduce`` over ``g`` GPUs on ``intra``. More nodes:
    :func:`hierarchical_all_reduce` with ``algorithm`` for the inter-node stage. ``"auto"`` takes the cheaper
    of ring and tree, which is what NCCL's tuner approximates.

    Raises:
        ConfigError: Unknown ``algorithm``.
        ValueError: Bad sizes or counts, or ``inter`` missing with more than one node.
    """
    n, g, nodes = _size(n_bytes), _count(gpus_per_node, "gpus_per_node"), _count(nodes, "nodes")
    key = _algorithm(algorithm)
    if nodes > 1:
        return hierarchical_all_reduce(n, g, nodes, intra, inter, inter_algorithm=key)
    names = ("ring", "tree") if key == "auto" else (key,)
    return min(_ALL_REDUCES[name](n, g, intra.alpha_s, intra.bandwidth_Bps) for name in names)


def all_reduce_host_cpu(n_bytes: float, gpus_per_node: int, nodes: int, intra: LinkCost,
                        inter: LinkCost | None = None) -> float:
    """Host CPU seconds one rank spends in an all-reduce of ``n_bytes`` (the bytes it moves on each link times
    that link's ``cpu_s_per_byte``): ``2(g-1)/g * n`` inside the node, ``2(N-1)/N * n/g`` across nodes, as
    the ring and hierarchical algorithms move them. 0 for links without a measured CPU cost.
    """
    n, g, nodes = _size(n_bytes), _count(gpus_per_node, "gpus_per_node"), _count(nodes, "nodes")
    inter = _inter_needed(nodes, inter)
    inside = 2 * (g - 1) / g * n * intra.cpu_s_per_byte
    if inter is None or nodes == 1:
        return inside
    return inside + 2 * (nodes - 1) / nodes * n / g * inter.cpu_s_per_byte


@dataclass(frozen=True)
class FsdpStepComm:
    """Communication of one FSDP training step, seconds (not overlapped with compute).

    Attributes:
        forward_all_gather_s: All-gather of the parameters before forward.
        backward_all_gather_s: All-gather of the parameters again before backward (0 without resharding).
        reduce_scatter_s: Reduce-scatter of the gradients.
    """

    forward_all_gather_s: float
    backward_all_gather_s: float
    reduce_scatter_s: float

    @property
    def total_s(self) -> float:
        """All three collectives, back to back."""
        return self.forward_all_gather_s + self.backward_all_gather_s + self.reduce_scatter_s


def fsdp_step_comm(param_bytes: float, grad_bytes: float, gpus_per_node: int, nodes: int, intra: LinkCost,
                   inter: LinkCost | None = None, *, reshard_after_forward: bool = True) -> FsdpStepComm:
    """FSDP (ZeRO-3) communication per step: ``2 x all_gather(params) + reduce_scatter(grads)``.

    Parameters are sharded; forward all-gathers them, frees them after use, and backward all-gathers them again;
    gradients are reduce-scattered so each rank keeps its shard. ``reshard_after_forward=False`` (ZeRO-2,
    ``SHARD_GRAD_OP``) drops the backward all-gather. Collectives are :func:`hierarchical_all_gather` and
    :func:`hierarchical_reduce_scatter` (plain rings on one node); sizes are the full (unsharded) tensors
    in the dtype they travel in. Prefetching overlaps these with compute; that is the caller's to model.
    """
    params, grads = _size(param_bytes, "param_bytes"), _size(grad_bytes, "grad_bytes")
    gather = hierarchical_all_gather(params, gpus_per_node, nodes, intra, inter)
    scatter = hierarchical_reduce_scatter(grads, gpus_per_node, nodes, intra, inter)
    return FsdpStepComm(gather, gather if reshard_after_forward else 0.0, scatter)


def _shape(shape: Sequence[int]) -> tuple[int, ...]:
    """A tensor shape checked to be non-negative integers."""
    try:
        dims = tuple(operator.index(d) for d in shape)
    except TypeError:
        raise ValueError(f"a tensor shape must be a sequence of integers, not {shape!r}") from None
    if any(d < 0 for d in dims):
        raise ValueError(f"a tensor shape cannot have negative dimensions: {shape!r}")
    return dims


def wire_bytes(grad_bytes_fp32: float, compression: str, powersgd_rank: int = 1,
               matrix_shapes: Sequence[Sequence[int]] | None = None, *, min_compression_rate: float = 2.0) -> float:
    """Bytes one all-reduce puts on the wire for fp32 gradients of ``grad_bytes_fp32`` (4 bytes per element).

    * ``"none"``: ``grad_bytes_fp32``.
    * ``"fp16"`` / ``"bf16"``: half of it (PyTorch's ``fp16_compress_hook`` / ``bf16_compress_hook``).
    * ``"powersgd"``: for every gradient tensor in ``matrix_shapes`` (all of them, so that their fp32 sizes add
      up to ``grad_bytes_fp32``): a tensor of two or more dimensions is viewed as an ``(m, n)`` matrix with
      ``m = shape[0]`` and sends ``r (m + n)`` fp32 values (P and Q) with ``r = min(rank, m, n)``; 1-D tensors,
      and matrices where ``r (m + n) * min_compression_rate >= m n``, go uncompressed, as in PyTorch's
      ``powerSGD_hook`` (whose ``min_compression_rate`` defaults to 2). The hook's warm-up steps
      (``start_powerSGD_iter``) send everything uncompressed; this is the steady state.

    Raises:
        ConfigError: Unknown ``compression``.
        ValueError: ``powersgd`` without ``matrix_shapes``, shapes that do not add up to ``grad_bytes_fp32``,
            bad sizes or rank.
    """
    total = _size(grad_bytes_fp32, "grad_bytes_fp32")
    key = str(compression).strip().lower()
    if key not in COMPRESSIONS:
        raise ConfigError(f"unknown gradient compression {compression!r}; known: {', '.join(COMPRESSIONS)}")
    if key == "none":
        return total
    if key in ("fp16", "bf16"):
        return total / 2
    rank = _count(powersgd_rank, "powersgd_rank")
    if matrix_shapes is None:
        raise ValueError("powersgd wire bytes need matrix_shapes: the shape of every gradient tensor")
    if not min_compression_rate >= 1:
        raise ValueError(f"min_compression_rate must be >= 1, not {min_compression_rate!r}")
    values = 0
    elements = 0
    for shape in matrix_shapes:
        dims = _shape(shape)
        size = math.prod(dims)
        elements += size
        if len(dims) < 2 or size == 0:
            values += size
            continue
        m, cols = dims[0], size // dims[0]
        compressed = min(rank, m, cols) * (m + cols)
        values += compressed if compressed * min_compression_rate < size else size
    if abs(elements * FP32_BYTES - total) > 0.5:
        raise ValueError(f"matrix_shapes hold {elements * FP32_BYTES} bytes of fp32 gradients, "
                         f"but grad_bytes_fp32 is {total:g}")
    return float(values * FP32_BYTES)
