"""What a run ran on: software versions, processor, device, world layout."""

from __future__ import annotations

import os
import platform
import sys
from typing import Any

import torch

from dtpo.core.launch_contract import LaunchContract
from dtpo.distributed.process_group import DistContext
from dtpo.session.loop.mfu import cpu_model


def describe_device(device: torch.device) -> str:
    """A readable device name, e.g. ``"cpu"`` or ``"cuda:0 (NVIDIA H100 80GB HBM3)"`` (without the name where torch
    has not initialised CUDA: another framework computes on it, and asking would make torch a CUDA context)."""
    if device.type == "cuda" and torch.cuda.is_initialized():
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return str(device)


def environment(ctx: DistContext) -> dict[str, Any]:
    """The run's environment as seen from this rank."""
    contract = LaunchContract.from_environ()
    env: dict[str, Any] = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": describe_device(ctx.device),
        "backend": ctx.backend,
        "world_size": ctx.world_size,
        "local_world_size": ctx.local_world_size,
        "nnodes": int(os.environ.get("GROUP_WORLD_SIZE", 1)) if ctx.distributed else 1,
        "launcher": contract.launcher or ("dtpo launch" if contract.launched else (
            "torchrun" if "TORCHELASTIC_RUN_ID" in os.environ else "python")),  # "ray": Ray Train
    }
    if ctx.device.type == "cuda":
        env["cuda"] = torch.version.cuda
    return env
