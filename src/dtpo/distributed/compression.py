"""Gradient compression for DDP's all-reduce: which exist, which change numerics, which a backend can do.

| name       | what is all-reduced                                   | numerics                               |
|------------|-------------------------------------------------------|----------------------------------------|
| `none`     | the float32 gradient bucket (DDP's own C++ all-reduce) | unchanged                              |
| `fp16`     | the bucket cast to float16, divided by the world size | changed: the mean is rounded to fp16   |
| `bf16`     | the bucket cast to bfloat16, divided by the world size | changed: the mean is rounded to bf16   |
| `powersgd` | rank-r factors P, Q of each gradient matrix (PowerSGD) | changed: low-rank mean, error feedback |

PowerSGD (Vogels et al., NeurIPS 2019) keeps each rank's compression error and adds it to the next step's
gradient (error feedback), so what is lost in one step is sent later; 1-D tensors (biases) and matrices that
a rank-r factorisation would not shrink are all-reduced uncompressed. It starts once DDP has settled its
buckets (from the model's second synced step); before that, buckets are all-reduced exactly. Off NCCL it
finishes each bucket before the next (see :func:`inner_hook`), so its communication no longer overlaps
backward there.

Backends: gloo all-reduces float16 and bfloat16 (verified with torch 2.13); NCCL needs 2.10 or newer for
bfloat16; MPI's process group has no 16-bit float types. A backend not listed is left to try.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

from dtpo.core.config import COMPRESSIONS
from dtpo.core.errors import ConfigError

__all__ = ["COMPRESSIONS", "POWERSGD_RANKS", "InnerHook", "PowerSGDHook", "changes_numerics", "check_compression",
           "inner_hook"]

POWERSGD_RANKS: tuple[int, ...] = (1, 2, 3, 4)
"""Matrix approximation ranks offered for PowerSGD (higher: closer to the exact mean, more traffic)."""

InnerHook = Callable[[dist.GradBucket], torch.futures.Future[torch.Tensor]]
"""A comm hook with its state bound: takes a bucket, returns the future of the averaged bucket."""


def changes_numerics(compression: str) -> bool:
    """Whether the all-reduced gradient can differ from the exact mean (every compression but ``none``)."""
    _check_name(compression)
    return compression != "none"


def _check_name(compression: str) -> None:
    if compression not in COMPRESSIONS:
        raise ConfigError(f"compression must be one of {', '.join(COMPRESSIONS)}, got {compression!r}")


def _backend_lacks(backend: str, dtype: torch.dtype) -> str | None:
    """Why ``backend`` cannot all-reduce ``dtype``, or ``None`` when it can (or is not known to fail)."""
    if backend == "mpi":
        return "MPI's process group has no 16-bit float types"
    if backend == "nccl" and dtype == torch.bfloat16:
        version = torch.cuda.nccl.version() if torch.cuda.is_available() else None
        if version is not None and tuple(version) < (2, 10):
            return f"NCCL {'.'.join(map(str, version))} is older than 2.10"
    return None


def check_compression(compression: str, backend: str | None = None, powersgd_rank: int = 1) -> None:
    """Raise :class:`ConfigError` (one line, naming the setting) unless ``compression`` can run on ``backend``.

    Args:
        compression: One of :data:`COMPRESSIONS`.
        backend: The process group's backend (``gloo``, ``nccl``, ...); ``None`` checks the name only.
        powersgd_rank: PowerSGD's matrix approximation rank, one of :data:`POWERSGD_RANKS`.
    """
    _check_name(compression)
    if compression == "powersgd" and (isinstance(powersgd_rank, bool) or powersgd_rank not in POWERSGD_RANKS):
        raise ConfigError(f"powersgd_rank must be one of {', '.join(map(str, POWERSGD_RANKS))}, "
                          f"got {powersgd_rank!r}")
    if backend is None:
        return
    if compression not in ("fp16", "bf16"):
        return
    why = _backend_lacks(backend, torch.float16 if compression == "fp16" else torch.bfloat16)
    if why is not None:
        raise ConfigError(f"compression {compression!r} is not available on backend {backend!r}: {why}")


def inner_hook(compression: str, process_group: Any, powersgd_rank: int = 1, backend: str | None = None,
               error_feedback: bool = True) -> InnerHook:
    """The communication for one compression, state bound, for a Python comm hook to call per bucket.

    Args:
        compression: One of :data:`COMPRESSIONS` (``none`` is DDP's all-reduce written in Python, used only
            once a Python hook had to be registered for an earlier compression).
        process_group: The DDP model's process group.
        powersgd_rank: PowerSGD's matrix approximation rank.
        backend: The process group's backend (PowerSGD runs bucket by bucket except on ``nccl``).
        error_feedback: PowerSGD's error feedback (off only to test that a guard catches the damage).
    """
    if compression == "none":
        return lambda bucket: default_hooks.allreduce_hook(process_group, bucket)
    if compression == "fp16":
        return lambda bucket: default_hooks.fp16_compress_hook(process_group, bucket)
    if compression == "bf16":
        return lambda bucket: default_hooks.bf16_compress_hook(process_group, bucket)
    if compression == "powersgd":
        return PowerSGDHook(process_group, powersgd_rank, in_order=backend != "nccl", error_feedback=error_feedback)
    _check_name(compression)
    raise AssertionError(compression)  # unreachable: every name in COMPRESSIONS is handled above


class PowerSGDHook:
    """PowerSGD for one DDP model (a callable :data:`InnerHook`), with its state (error feedback, warm-start
    factors) readable and restorable for checkpoints.

    Args:
        process_group: The DDP model's process group.
        powersgd_rank: The matrix approximation rank.
        in_order: Finish each bucket before the next (every backend but NCCL; see :meth:`__call__`).
        error_feedback: Keep each rank's compression error for the next step.
    """

    KEPT = ("error_dict", "p_memory_dict", "q_memory_dict", "iter", "rng", "total_numel_before_compression",
            "total_numel_after_compression")
    """The parts of ``PowerSGDState`` that change as training goes (the rest is configuration)."""

    def __init__(self, process_group: Any, powersgd_rank: int, in_order: bool, error_feedback: bool = True) -> None:
        # PowerSGD refuses to start before the second iteration because DDP rebuilds its buckets after the
        # first one, which would change the shapes error feedback is kept for. The caller only reaches this
        # hook once the buckets are final (see GradientComm), so it starts at once.
        self.state = powerSGD_hook.PowerSGDState(process_group=process_group,
                                                 matrix_approximation_rank=powersgd_rank, start_powerSGD_iter=2,
                                                 use_error_feedback=error_feedback, warm_start=True)
        self.state.iter = self.state.start_powerSGD_iter
        self.in_order = in_order

    def __call__(self, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        """Compress and all-reduce one bucket."""
        fut = powerSGD_hook.powerSGD_hook(self.state, bucket)
        if self.in_order:
            # PowerSGD issues its second and third all-reduce from callbacks of the first. A gloo future
            # completes on a gloo thread, so with several buckets in flight the ranks could issue collectives
            # in different orders (gloo aborts: "Received data size doesn't match expected size"). Finishing
            # each bucket before DDP hands over the next keeps the order; it gives up overlapping PowerSGD's
            # communication with the rest of backward. (NCCL runs the callbacks as the work is enqueued.)
            fut.wait()
        return fut

    def state_dict(self) -> dict[str, Any]:
        """This rank's error feedback and warm-start factors (per bucket index, on the CPU), the iteration and
        the random state that draws new factors."""
        def cpu(value: Any) -> Any:
            if isinstance(value, dict):
                return {k: v.detach().cpu().clone() for k, v in value.items()}
            return value

        return {name: cpu(getattr(self.state, name)) for name in self.KEPT}

    def load_state_dict(self, saved: dict[str, Any], device: torch.device) -> None:
        """Put back what :meth:`state_dict` returned (tensors onto ``device``). The bucket indices must be those of
        the same model's settled buckets, which DDP lays out alike in every run of it."""
        for name in self.KEPT:
            value = saved[name]
            if isinstance(value, dict):
                value = {k: v.to(device) for k, v in value.items()}
            setattr(self.state, name, value)
