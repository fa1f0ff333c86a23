"""Wrapping a model for data parallelism: DDP, or FSDP2's ``fully_shard``."""

from __future__ import annotations

from typing import Literal

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from dtpo.core.config import STRATEGIES
from dtpo.core.errors import ConfigError
from dtpo.distributed.comm_timing import GradientComm
from dtpo.distributed.compression import check_compression
from dtpo.distributed.process_group import DistContext

Strategy = Literal["ddp", "fsdp"]


def wrap_model(module: nn.Module, ctx: DistContext, strategy: Strategy,
               comm: GradientComm | None = None, compression: str = "none",
               powersgd_rank: int = 1) -> nn.Module:
    """Move ``module`` to the rank's device and make it data parallel.

    With one process the module is returned unwrapped: a one-rank DDP would only add an all-reduce with
    itself, and the 1-worker baseline of a scaling measurement must be plain training. Nothing is
    communicated then, so ``compression`` has no effect (``comm`` is not attached and records no stamps).

    Args:
        module: The model.
        ctx: This process's place in the run.
        strategy: ``"ddp"`` (replicated parameters, gradients all-reduced in buckets) or ``"fsdp"``
            (FSDP2: parameters sharded per block and at the root).
        comm: For DDP, what stamps gradient readiness and communicates gradients (attached here with
            ``compression``).
        compression: Gradient compression for DDP (see :mod:`dtpo.distributed.compression`); FSDP takes ``none`` only.
        powersgd_rank: PowerSGD's matrix approximation rank.

    Raises:
        ConfigError: An unknown strategy or compression, a compression with FSDP, or one the backend lacks.
    """
    if strategy not in STRATEGIES:
        raise ConfigError(f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    check_compression(compression, None, powersgd_rank)
    if strategy == "fsdp" and compression != "none":
        raise ConfigError(f"compression {compression!r} needs strategy ddp: strategy fsdp (FSDP2) has no "
                          "DDP comm hook to compress with")
    if compression != "none" and comm is None:
        raise ValueError("gradient compression needs a GradientComm passed as comm")
    module = module.to(ctx.device)
    if not ctx.distributed:
        return module
    if strategy == "ddp":
        ddp = DistributedDataParallel(module, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)
        if comm is not None:
            comm.attach(ddp, compression, powersgd_rank)
        return ddp
    from torch.distributed.fsdp import fully_shard

    # Shard each repeated block (the layers of a ModuleList) on its own, then the root, as torchtitan
    # does: parameters of one block are gathered just before that block runs.
    for child in module.modules():
        if isinstance(child, nn.ModuleList):
            for block in child:
                fully_shard(block)
    fully_shard(module)
    return module
