"""Timing DDP's gradient collectives through a comm hook.

DDP calls a comm hook once per gradient bucket, at the moment that bucket's gradients are all computed.
The time of the last call is therefore when this rank's backward math ended; whatever backward spends
after it is collective time not hidden behind compute (or waiting for a slower rank).
"""

# No `from __future__ import annotations` here: DDP checks a hook's annotations against dist.GradBucket
# and torch.futures.Future at registration, and string annotations fail that check.

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

CommHook = Callable[[Any, dist.GradBucket], torch.futures.Future[torch.Tensor]]


class TimedCommHook:
    """A DDP comm hook that stamps bucket-ready times, then hands the bucket to an inner hook.

    Args:
        mark: Returns a timestamp (the session's clock).
        inner: The hook that does the communication; DDP's default all-reduce unless a compression hook
            is given.
    """

    def __init__(self, mark: Callable[[], Any], inner: CommHook = default_hooks.allreduce_hook) -> None:
        self._mark = mark
        self._inner = inner
        self.last_ready: Any = None
        self.buckets = 0

    def reset(self) -> None:
        """Forget the previous backward's stamps."""
        self.last_ready = None
        self.buckets = 0

    def hook(self, state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        """The function to pass to ``DistributedDataParallel.register_comm_hook``."""
        self.last_ready = self._mark()
        self.buckets += 1
        return self._inner(state, bucket)
