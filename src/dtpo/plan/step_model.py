"""One data-parallel optimizer step at a given GPU count: compute, communication, what stays exposed.

The step of a data-parallel job with ``k`` micro-batches per optimizer step (gradient accumulation)::

    step_s = k x t_micro + exposed_comm_s + optimizer_s

* ``t_micro`` is one micro-batch's forward and backward on one GPU (calibrated, see
  :mod:`dtpo.plan.calibration`); :data:`BACKWARD_SHARE` of it is backward.
* **DDP** all-reduces once per optimizer step, bucket by bucket while the *last* micro-batch's backward still
  runs (the earlier micro-batches run under ``no_sync``). Buckets follow DDP's sizes
  (:func:`~dtpo.plan.overlap.ddp_bucket_sizes`), become ready evenly over that backward, and are sent one after
  another (:func:`~dtpo.plan.overlap.exposed_comm`); what is still on the wire when backward ends is exposed.
  With the tensors' shapes (from a dtpo run's record) buckets are packed tensor by tensor as DDP does
  (:func:`~dtpo.plan.overlap.ddp_tensor_buckets`). Each bucket is an all-reduce of its own, hierarchical across
  nodes (:func:`~dtpo.plan.collectives.all_reduce`, ring or tree, whichever is faster for that bucket's size, as
  NCCL's tuner picks per call), so every bucket pays the collective's latency terms; sizes are the bytes the
  compression leaves (:func:`~dtpo.plan.collectives.wire_bytes`). Without overlap (``overlap = false``) the
  gradient goes as one flattened all-reduce after backward, as apex's post-accumulation all-reduce sends it.
* **FSDP** gathers the parameters before each micro-batch's forward and again before its backward, and
  reduce-scatters the gradients after the last one; with prefetching, a micro-batch's gathers overlap its own
  compute, so only what exceeds it is exposed (:func:`~dtpo.plan.collectives.fsdp_step_comm`).
* **Compute on the host's cores** (``JobShape.compute_on_host``: a CPU job over gloo): the all-reduce's own
  CPU work (copies, sums, the socket stack; the links' measured ``cpu_s_per_byte``) runs on the cores that
  compute, so the part of it done while backward runs delays backward by as much
  (``StepTime.interference_s``, counted in ``compute_s``): ``min(hidden, cpu_work * hidden / comm)``, the CPU
  work of the hidden share of the communication. GPUs compute on their own silicon: the term is 0 there.
* ``optimizer_s``: measured in a calibration run, else modelled as :data:`OPTIMIZER_BYTES_PER_PARAM` bytes of
  memory traffic per parameter held (AdamW in float32: parameter, gradient and two moments, each read and
  written) at the GPU's peak memory bandwidth. It does not shrink with more GPUs under DDP, which is why a
  fixed global batch with less accumulation per GPU loses efficiency.

* **Contention on GPUs** (``JobShape.overlap_slowdown``): communication hidden behind backward is not free.
  NCCL's kernels take SMs and memory bandwidth from the backward kernels they run beside, so backward is
  delayed by ``overlap_slowdown`` times the hidden communication (``StepTime.interference_s`` too).
* **Synchronisation with stragglers** (``JobShape.jitter_cv``): every GPU's compute time varies from step to
  step (data, allocator, clocks, the host); a synchronous step waits for the slowest of ``n`` GPUs. With one
  micro-batch's time varying by ``jitter_cv`` (relative standard deviation), independently across GPUs and
  micro-batches, the ``k`` micro-batches between two synchronisations vary by ``jitter_cv x t_micro x sqrt(k)``
  and the step waits :func:`expected_max_normal` ``(n)`` of those standard deviations for the slowest
  (``StepTime.sync_wait_s``). DDP synchronises once per optimizer step, FSDP at every micro-batch.

Not modelled: data loading, congestion with other jobs, and NCCL's pipelining of the hierarchical stages (the
stages are added up).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from statistics import NormalDist

from dtpo.plan.collectives import LinkCost, all_reduce, all_reduce_host_cpu, fsdp_step_comm, wire_bytes
from dtpo.plan.interconnect import Link
from dtpo.plan.overlap import ddp_bucket_sizes, ddp_tensor_buckets, exposed_comm, uniform_buckets

BACKWARD_SHARE = 2.0 / 3.0
"""Share of a micro-batch's forward+backward spent in backward (backward does twice forward's FLOPs)."""

OPTIMIZER_BYTES_PER_PARAM = 32.0
"""Memory traffic of one AdamW step per float32 parameter: parameter, gradient, two moments, read and written."""

DEFAULT_JITTER_CV = 0.02
"""Relative standard deviation of one micro-batch's compute time assumed where nothing measured it (a dtpo run
measures it: :func:`dtpo.plan.calibration.from_run`). Real input pipelines, Python and host noise give 1-5 %;
synthetic data on a quiet node less."""

DEFAULT_OVERLAP_SLOWDOWN = 0.5
"""Share of the communication hidden behind backward that still delays it on GPUs (NCCL's kernels share the SMs
and memory bandwidth with backward's), assumed where nothing measured it."""


@functools.lru_cache(maxsize=256)
def expected_max_normal(n: int) -> float:
    """Expected maximum of ``n`` independent standard normal variables, ``integral of x n phi(x) Phi(x)^(n-1)``
    (midpoint rule over +-10 standard deviations, 4,000 points: exact to 1e-6); 0 for one."""
    if n <= 1:
        return 0.0
    normal, points, width = NormalDist(), 4000, 20.0
    dx = width / points
    total = 0.0
    for i in range(points):
        x = -width / 2 + (i + 0.5) * dx
        total += x * n * normal.pdf(x) * normal.cdf(x) ** (n - 1)
    return total * dx


@dataclass(frozen=True)
class Fabric:
    """The links a job's collectives run on.

    Attributes:
        intra: Link between the GPUs of one node.
        inter: Link between nodes (one NIC's figures).
        nics_per_node: NICs per node (the inter-node bandwidth of a node is their sum).
        intra_cost: Alpha-beta cost of the intra-node link (its latency and effective bandwidth).
        inter_cost: Alpha-beta cost of a node's inter-node link (all its NICs together).
    """

    intra: Link
    inter: Link
    nics_per_node: int
    intra_cost: LinkCost
    inter_cost: LinkCost

    @classmethod
    def of(cls, intra: Link, inter: Link, nics_per_node: int, efficiency: float | None = None) -> Fabric:
        """The fabric of two catalogue links; ``efficiency`` overrides both links' fabric efficiency."""
        if efficiency is not None:
            intra, inter = intra.with_efficiency(efficiency), inter.with_efficiency(efficiency)
        return cls(intra, inter, nics_per_node, LinkCost.from_link(intra), LinkCost.from_link(inter, nics_per_node))


@dataclass(frozen=True)
class JobShape:
    """What the step model needs of the job, independent of the GPU count.

    Attributes:
        gradient_bytes: One full gradient as all-reduced without compression (its dtype's bytes).
        parameters: Trainable parameters.
        strategy: ``ddp`` or ``fsdp``.
        compression: Gradient compression on the wire (DDP).
        powersgd_rank: PowerSGD's rank.
        matrix_shapes: Shapes of the trainable tensors (PowerSGD needs them).
        bucket_cap_bytes: DDP's bucket size.
        param_bytes: Bytes of the parameters FSDP gathers (their compute dtype).
        overlap: Whether DDP's all-reduce overlaps the last backward (``False``: it starts after backward).
        compute_on_host: The job computes on the host's CPU cores, which also run the collectives' CPU work.
        jitter_cv: Relative standard deviation of one micro-batch's compute time on one GPU (stragglers).
        overlap_slowdown: Share of the hidden communication that still delays backward (GPU contention).
    """

    gradient_bytes: float
    parameters: float
    strategy: str = "ddp"
    compression: str = "none"
    powersgd_rank: int = 1
    matrix_shapes: tuple[tuple[int, ...], ...] | None = None
    bucket_cap_bytes: int = 25 * 1024 * 1024
    param_bytes: float | None = None
    overlap: bool = True
    compute_on_host: bool = False
    jitter_cv: float = 0.0
    overlap_slowdown: float = 0.0


@dataclass(frozen=True)
class StepTime:
    """One predicted optimizer step.

    Attributes:
        gpus: GPUs in the job.
        nodes: Nodes they occupy.
        grad_accum: Micro-batches per optimizer step.
        compute_s: Forward and backward of all micro-batches, ``interference_s`` included.
        comm_s: Communication of the step, hidden or not.
        exposed_comm_s: Communication not hidden behind compute.
        optimizer_s: The optimizer step.
        interference_s: Backward delayed by the collectives sharing what computes: their CPU work on a CPU job's
            cores, their kernels' share of a GPU (counted in ``compute_s``).
        sync_wait_s: Waiting for the slowest GPU at the step's synchronisations (stragglers).
        fixed_s: The part of ``compute_s`` its micro-batches pay whatever their size (kernel launches, framework
            work per micro-batch; see :mod:`dtpo.plan.batch_fit`).
        framework_s: Per-step cost a framework adds once the job spans nodes (fitted from a multi-node
            measurement; added by the planner, not by :func:`step_time`).
    """

    gpus: int
    nodes: int
    grad_accum: int
    compute_s: float
    comm_s: float
    exposed_comm_s: float
    optimizer_s: float
    interference_s: float = 0.0
    sync_wait_s: float = 0.0
    fixed_s: float = 0.0
    framework_s: float = 0.0

    @property
    def step_s(self) -> float:
        """Wall time of the step."""
        return self.compute_s + self.exposed_comm_s + self.optimizer_s + self.sync_wait_s + self.framework_s


def optimizer_seconds(parameters: float, memory_bandwidth_Bps: float | None, shards: int = 1) -> float:
    """Modelled AdamW step: :data:`OPTIMIZER_BYTES_PER_PARAM` bytes per parameter this GPU holds (a ``1/shards``
    share under FSDP) at the memory bandwidth; 0 when the bandwidth is unknown."""
    if not memory_bandwidth_Bps:
        return 0.0
    return OPTIMIZER_BYTES_PER_PARAM * parameters / shards / memory_bandwidth_Bps


def _buckets(job: JobShape, on_wire: float) -> list[int]:
    """DDP's buckets: packed tensor by tensor when the tensors' shapes are known (from a run record), else split
    evenly at the caps; scaled to the bytes on the wire (compression shrinks every bucket alike)."""
    if job.matrix_shapes:
        per_element = job.gradient_bytes / max(sum(math.prod(s) for s in job.matrix_shapes), 1)
        tensors = [int(math.prod(s) * per_element) for s in reversed(job.matrix_shapes)]
        sizes = ddp_tensor_buckets(tensors, cap_bytes=job.bucket_cap_bytes)
        scale = on_wire / max(sum(sizes), 1)
        return [max(int(b * scale), 1) for b in sizes]
    return ddp_bucket_sizes(max(int(on_wire), 1), cap_bytes=job.bucket_cap_bytes)


def step_time(gpus: int, gpus_per_node: int, t_micro_s: float, grad_accum: int, optimizer_s: float, job: JobShape,
              fabric: Fabric) -> StepTime:
    """Predict one optimizer step of ``gpus`` GPUs (see the module docs)."""
    per_node = min(gpus, gpus_per_node)
    nodes = math.ceil(gpus / gpus_per_node)
    compute = grad_accum * t_micro_s
    if gpus == 1:
        return StepTime(gpus, nodes, grad_accum, compute, 0.0, 0.0, optimizer_s)
    inter = fabric.inter_cost if nodes > 1 else None
    slowest = job.jitter_cv * t_micro_s * expected_max_normal(gpus)
    if job.strategy == "fsdp":
        params = job.param_bytes if job.param_bytes is not None else job.gradient_bytes
        parts = fsdp_step_comm(params, job.gradient_bytes, per_node, nodes, fabric.intra_cost, inter)
        per_micro = parts.forward_all_gather_s + parts.backward_all_gather_s
        comm = grad_accum * per_micro + parts.reduce_scatter_s
        exposed = grad_accum * max(0.0, per_micro - t_micro_s) + parts.reduce_scatter_s * (1.0 - BACKWARD_SHARE)
        interference = _contention(job, comm - exposed)
        return StepTime(gpus, nodes, grad_accum, compute + interference, comm, exposed, optimizer_s, interference,
                        grad_accum * slowest)  # FSDP's gathers synchronise every micro-batch
    sync_wait = slowest * math.sqrt(grad_accum)  # DDP synchronises once, after k micro-batches of their own
    on_wire = wire_bytes(job.gradient_bytes, job.compression, job.powersgd_rank,
                         job.matrix_shapes if job.compression == "powersgd" else None)
    if not job.overlap:  # one flattened all-reduce after backward (apex's post-accumulation all-reduce)
        comm = all_reduce(on_wire, per_node, nodes, fabric.intra_cost, inter, algorithm="auto")
        return StepTime(gpus, nodes, grad_accum, compute, comm, comm, optimizer_s, sync_wait_s=sync_wait)
    sizes = _buckets(job, on_wire)
    # every bucket is an all-reduce of its own (one NCCL call each), so each pays the collective's latency terms
    per_bucket = [all_reduce(size, per_node, nodes, fabric.intra_cost, inter, algorithm="auto") for size in sizes]
    backward = BACKWARD_SHARE * t_micro_s
    ready, _ = uniform_buckets(backward, len(sizes), 0.0, bucket_bytes=sizes)
    exposed = exposed_comm(ready, per_bucket, backward_end_s=backward)
    comm = sum(per_bucket)
    hidden = comm - exposed
    interference = _contention(job, hidden)
    if job.compute_on_host and hidden > 0:  # a CPU job pays its collectives' measured CPU work instead
        cpu = sum(all_reduce_host_cpu(size, per_node, nodes, fabric.intra_cost, inter) for size in sizes)
        interference = min(hidden, cpu * hidden / comm)
    return StepTime(gpus, nodes, grad_accum, compute + interference, comm, exposed, optimizer_s, interference,
                    sync_wait)


def _contention(job: JobShape, hidden_s: float) -> float:
    """How long communication hidden behind compute delays that compute on GPUs (``JobShape.overlap_slowdown``);
    a CPU job's delay is its collectives' measured CPU work instead."""
    return 0.0 if job.compute_on_host else job.overlap_slowdown * max(hidden_s, 0.0)
