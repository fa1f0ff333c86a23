"""Where this rank sits, as the agent sees it, and the agent's own process group.

The script owns its process group: the agent never adds a collective to it, because a collective the script did
not expect, between its own, can deadlock or corrupt its order (NCCL runs them in issue order on one stream).
What every rank must decide together (the power tuner's figures, straggler slack, the run directory) goes over
a separate gloo group that the agent makes from the default group's store (``new_group`` meets the other ranks
through the store, not through a collective of the script's group). Every rank makes it at the same point, the
end of its first training iteration, so the order of the script's own collectives cannot block it.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import replace
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from dtpo.distributed.process_group import DistContext, join

log = logging.getLogger(__name__)

GROUP_TIMEOUT_S = 1800.0


def agent_context(device: torch.device) -> DistContext:
    """This rank's :class:`DistContext`, with the agent's own group where the script made a process group of
    several ranks; alone (world size 1, no group) where it made none.

    Args:
        device: The device the script computes on (its DDP model's, else the current CUDA device, else the CPU).
    """
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return replace(join(device), group=own_group())  # joins the script's group as it is, never makes one
    env = os.environ
    rank = int(env.get("RANK", 0) or 0)
    world = int(env.get("WORLD_SIZE", 1) or 1)
    if world > 1:
        log.warning("agent: rank %d of %d made no torch.distributed process group; it is measured on its "
                    "own (no shared tuning decisions)", rank, world)
    return DistContext(rank, int(env.get("LOCAL_RANK", 0) or 0), 1, int(env.get("LOCAL_WORLD_SIZE", 1) or 1),
                       socket.gethostname(), device, None, False)


def own_group() -> Any:
    """A gloo group of every rank, for the agent's collectives only (called on every rank at the same point)."""
    return dist.new_group(backend="gloo", timeout=timedelta(seconds=GROUP_TIMEOUT_S))
