"""Joining the process group that torchrun (or Ray) set up, or running as one plain process."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from dtpo.core.config import BACKENDS
from dtpo.core.errors import ConfigError
from dtpo.core.launch_contract import LaunchContract


def default_backend(device: torch.device) -> str:
    """The collective backend for a device: ``nccl`` on CUDA, ``gloo`` on CPU; the launch contract's ``backend``
    overrides."""
    chosen = LaunchContract.from_environ().backend or ("nccl" if device.type == "cuda" else "gloo")
    if chosen not in BACKENDS:
        raise ConfigError(f"unknown backend {chosen!r} (choose from: {', '.join(BACKENDS)})")
    return chosen


def default_device(local_rank: int) -> torch.device:
    """``cuda:<local_rank>`` where CUDA is present, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


@dataclass(frozen=True)
class DistContext:
    """Where this process sits in the run.

    Attributes:
        rank: Global rank.
        local_rank: Rank within this node.
        world_size: Number of processes in the run.
        local_world_size: Number of processes on this node.
        node: This node's host name.
        device: The device this rank computes on.
        backend: Collective backend (``None`` when running as a single plain process).
        owns_group: True when dtpo created the process group and so must destroy it.
        group: The process group dtpo's own collectives (the tuners' agreements, the run directory) go over:
            ``None`` for the default group, or a separate one so that dtpo never adds a collective to a group
            the user's script drives (the in-process agent of ``dtpo launch``, :mod:`dtpo.agent`).
    """

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node: str
    device: torch.device
    backend: str | None
    owns_group: bool
    group: Any = None

    @property
    def distributed(self) -> bool:
        """Whether more than one process takes part."""
        return self.world_size > 1

    @property
    def collective_device(self) -> torch.device:
        """Where the tensors of dtpo's own collectives live: this rank's device on the default group, the CPU
        on a separate (gloo) group."""
        return self.device if self.group is None else torch.device("cpu")


def join(device: torch.device | str | None = None, backend: str | None = None,
         timeout_s: float = 1800.0) -> DistContext:
    """Join the process group described by torchrun's environment, or run alone.

    Args:
        device: Device to compute on; defaults to ``cuda:<local_rank>`` or the CPU.
        backend: ``"gloo"`` or ``"nccl"``; defaults to :func:`default_backend`.
        timeout_s: Collective timeout.

    Returns:
        The process's :class:`DistContext`.
    """
    env = os.environ
    local_rank = int(env.get("LOCAL_RANK", 0))
    dev = torch.device(device) if device is not None else default_device(local_rank)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    node = socket.gethostname()
    if dist.is_available() and dist.is_initialized():
        return DistContext(dist.get_rank(), local_rank, dist.get_world_size(),
                           int(env.get("LOCAL_WORLD_SIZE", 1)), node, dev, dist.get_backend(), False)
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return DistContext(0, 0, 1, 1, node, dev, None, False)
    chosen = backend or default_backend(dev)
    if chosen not in BACKENDS:
        raise ConfigError(f"unknown backend {chosen!r} (choose from: {', '.join(BACKENDS)})")
    dist.init_process_group(chosen, timeout=timedelta(seconds=timeout_s),
                            device_id=dev if dev.type == "cuda" else None)
    return DistContext(dist.get_rank(), local_rank, dist.get_world_size(),
                       int(env.get("LOCAL_WORLD_SIZE", 1)), node, dev, chosen, True)


def leave(ctx: DistContext) -> None:
    """Destroy the process group if dtpo created it, after a barrier: a rank that tore its group down (rank 0
    hosts the rendezvous store) while another was still inside its last collective made that one abort at
    exit with "terminate called without an active exception" (seen on gloo, about 1 run in 10)."""
    if ctx.owns_group and dist.is_initialized():
        if ctx.world_size > 1:
            dist.barrier()
        dist.destroy_process_group()


# What gloo and NCCL say when a collective fails because another rank's process or link went away.
_PEER_LOST = ("connection reset by peer", "connection closed by peer", "broken pipe", "connection refused",
              "communicator was aborted", "remote process exited", "socket timeout")


def lost_a_peer(exc: BaseException) -> bool:
    """Whether a collective failed because another rank stopped (killed, stalled, its node lost): a
    consequence, which the launcher names, rather than this rank's own failure."""
    text = str(exc).lower()
    return isinstance(exc, RuntimeError | ConnectionError) and any(words in text for words in _PEER_LOST)
