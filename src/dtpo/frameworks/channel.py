"""Where a rank of a JAX, TensorFlow or Keras script sits, and dtpo's own channel between the ranks.

Such a script never uses torch.distributed, so dtpo makes the default torch process group itself (gloo, from
the environment torchrun gives every worker) and sends only its own collectives over it: the run directory,
the tuner's figures, the records gathered at the end. The framework's collectives go over its own transport.
Nothing here touches the GPU through torch: the device is named for NVML (energy, the knobs) only.
"""

from __future__ import annotations

import logging
import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist

from dtpo.distributed.process_group import DistContext

log = logging.getLogger(__name__)

CHANNEL_TIMEOUT_S = 1800.0


def open_channel() -> bool:
    """Join dtpo's gloo group of every rank where torchrun's environment names several, once per process.

    Returns:
        Whether this call made the group (``False``: made already, or one rank alone).
    """
    if dist.is_initialized() or int(os.environ.get("WORLD_SIZE", 1) or 1) <= 1 or "MASTER_ADDR" not in os.environ:
        return False
    dist.init_process_group("gloo", timeout=timedelta(seconds=CHANNEL_TIMEOUT_S))
    return True


def framework_context(gpu: bool = False) -> DistContext:
    """This rank's :class:`DistContext` for a script of another framework.

    Args:
        gpu: The framework computes on a GPU: this rank's is ``cuda:<local rank>`` for NVML (energy, knobs),
            never initialised through torch.

    Returns:
        The context, with dtpo's own collectives on the CPU over the gloo group (``group`` is that group).
    """
    env = os.environ
    local_rank = int(env.get("LOCAL_RANK", 0) or 0)
    local_world = int(env.get("LOCAL_WORLD_SIZE", 1) or 1)
    device = torch.device("cuda", local_rank) if gpu else torch.device("cpu")
    made = open_channel()
    node = socket.gethostname()
    if not dist.is_initialized() or dist.get_world_size() <= 1:
        return DistContext(0, 0, 1, 1, node, device, None, False)
    return DistContext(dist.get_rank(), local_rank, dist.get_world_size(), local_world, node, device,
                       dist.get_backend(), made, group=dist.group.WORLD)
