"""Wrapping a model for data parallelism: DDP, or FSDP2's ``fully_shard``."""

from __future__ import annotations

from typing import Literal

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from dtpo.dist.comm_timing import TimedCommHook
from dtpo.dist.process_group import DistContext

Strategy = Literal["ddp", "fsdp"]
STRATEGIES: tuple[str, ...] = ("ddp", "fsdp")


def wrap_model(module: nn.Module, ctx: DistContext, strategy: Strategy,
               comm_hook: TimedCommHook | None = None) -> nn.Module:
    """Move ``module`` to the rank's device and make it data parallel.

    With one process the module is returned unwrapped: a one-rank DDP would only add an all-reduce with
    itself, and the 1-worker baseline of a scaling measurement must be plain training.

    Args:
        module: The model.
        ctx: This process's place in the run.
        strategy: ``"ddp"`` (replicated parameters, gradients all-reduced in buckets) or ``"fsdp"``
            (FSDP2: parameters sharded per block and at the root).
        comm_hook: For DDP, the hook that times (and performs) gradient communication.
    """
    module = module.to(ctx.device)
    if not ctx.distributed:
        return module
    if strategy == "ddp":
        ddp = DistributedDataParallel(module, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)
        if comm_hook is not None:
            ddp.register_comm_hook(None, comm_hook.hook)
        return ddp
    if strategy == "fsdp":
        from torch.distributed.fsdp import fully_shard

        # Shard each repeated block (the layers of a ModuleList) on its own, then the root, as torchtitan
        # does: parameters of one block are gathered just before that block runs.
        for child in module.modules():
            if isinstance(child, nn.ModuleList):
                for block in child:
                    fully_shard(block)
        fully_shard(module)
        return module
    raise ValueError(f"unknown strategy {strategy!r}")
