"""Telling a collective that failed because another rank went away from this rank's own failure."""

from __future__ import annotations

import pytest

from dtpo.distributed.process_group import lost_a_peer


@pytest.mark.parametrize("message", [
    "[../gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:40358: Connection reset by peer. This is typically "
    "caused by a remote worker hanging",
    "[../gloo/transport/tcp/pair.cc:598] Connection closed by peer [10.0.0.2]:33451",
    "NCCL communicator was aborted on rank 3.",
])
def test_a_collective_broken_by_a_lost_peer_is_recognised(message: str) -> None:
    assert lost_a_peer(RuntimeError(message))


@pytest.mark.parametrize("exc", [RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x8 and 9x3)"),
                                 ValueError("connection reset by peer"),  # not what a collective raises
                                 RuntimeError("DefaultCPUAllocator: can't allocate memory")])
def test_this_ranks_own_errors_are_not_blamed_on_a_peer(exc: BaseException) -> None:
    assert not lost_a_peer(exc)
