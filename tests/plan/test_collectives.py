"""Alpha-beta collective costs against hand-computed numbers."""

from __future__ import annotations

import pytest

from dtpo.core.errors import ConfigError
from dtpo.plan.collectives import (
    LinkCost,
    all_gather,
    all_reduce,
    all_reduce_host_cpu,
    fsdp_step_comm,
    hierarchical_all_gather,
    hierarchical_all_reduce,
    hierarchical_reduce_scatter,
    reduce_scatter,
    ring_all_reduce,
    tree_all_reduce,
    wire_bytes,
)
from dtpo.plan.interconnect import find_link


def test_ring_all_reduce_of_100_mb_on_8_gpus() -> None:
    # 2*7*5 us = 70 us; 2*7/8 * 1e8 B / 1e11 B/s = 1.75 ms
    assert ring_all_reduce(100e6, 8, 5e-6, 100e9) == pytest.approx(1.82e-3)


def test_tree_all_reduce_by_hand() -> None:
    # 2*ceil(log2 8)=6 latencies = 30 us; 2 * 1e8 / (0.92 * 1e11) = 2.1739130 ms
    assert tree_all_reduce(100e6, 8, 5e-6, 100e9) == pytest.approx(2.2039130e-3)
    # p = 5: ceil(log2 5) = 3, so still 6 latencies; factor 1 removes NCCL's 0.92
    assert tree_all_reduce(100e6, 5, 5e-6, 100e9, bandwidth_factor=1.0) == pytest.approx(2.03e-3)


def test_reduce_scatter_and_all_gather_by_hand() -> None:
    # 3 * 10 us = 30 us; 3/4 * 1e8 / 5e10 = 1.5 ms
    assert reduce_scatter(100e6, 4, 10e-6, 50e9) == pytest.approx(1.53e-3)
    assert all_gather(100e6, 4, 10e-6, 50e9) == pytest.approx(1.53e-3)


def test_one_participant_costs_nothing() -> None:
    for cost in (ring_all_reduce, tree_all_reduce, reduce_scatter, all_gather):
        assert cost(1e9, 1, 5e-6, 1e9) == 0.0
    intra = LinkCost(5e-6, 1e11)
    assert all_reduce(1e9, 1, 1, intra, algorithm="auto") == 0.0
    assert fsdp_step_comm(1e9, 1e9, 1, 1, intra).total_s == 0.0


def test_hierarchical_on_one_node_is_the_intra_node_ring() -> None:
    intra = LinkCost(2e-6, 200e9)
    ring = ring_all_reduce(1e9, 8, 2e-6, 200e9)
    assert hierarchical_all_reduce(1e9, 8, 1, intra) == pytest.approx(ring, rel=1e-12)
    assert all_reduce(1e9, 8, 1, intra, LinkCost(5e-6, 1e11)) == pytest.approx(ring, rel=1e-12)


def test_hierarchical_all_reduce_over_two_nodes_by_hand() -> None:
    intra, inter = LinkCost(2e-6, 200e9), LinkCost(5e-6, 100e9)
    # in-node reduce-scatter and all-gather: 2 * (7*2 us + 7/8 * 1e9/2e11 = 4.375 ms) = 8.778 ms
    # across nodes: 8 rings of 1.25e8 B at 1e11/8 B/s: 2*1*5 us + 2*1/2 * 1.25e8 / 1.25e10 = 10.01 ms
    assert hierarchical_all_reduce(1e9, 8, 2, intra, inter) == pytest.approx(18.788e-3)
    assert all_reduce(1e9, 8, 2, intra, inter, algorithm="ring") == pytest.approx(18.788e-3)
    # reduce-scatter then across (7*2 us + 4.375 ms, then 5 us + 1/2 * 1e9/1e11 = 5.005 ms)
    assert hierarchical_reduce_scatter(1e9, 8, 2, intra, inter) == pytest.approx(9.394e-3)
    assert hierarchical_all_gather(1e9, 8, 2, intra, inter) == pytest.approx(9.394e-3)
    with pytest.raises(ValueError, match="inter-node"):
        all_reduce(1e9, 8, 2, intra)


def test_tree_wins_for_tiny_messages_and_ring_for_large_ones_at_large_p() -> None:
    a, b = 5e-6, 100e9
    assert tree_all_reduce(1e3, 64, a, b) < ring_all_reduce(1e3, 64, a, b)
    assert ring_all_reduce(10e9, 64, a, b) < tree_all_reduce(10e9, 64, a, b)
    intra, inter = LinkCost(2e-6, 400e9), LinkCost(a, b)
    for n in (1e3, 10e9):
        ring = all_reduce(n, 8, 64, intra, inter, "ring")
        tree = all_reduce(n, 8, 64, intra, inter, "tree")
        assert all_reduce(n, 8, 64, intra, inter, "AUTO") == min(ring, tree)
    assert all_reduce(1e3, 8, 64, intra, inter, "tree") < all_reduce(1e3, 8, 64, intra, inter, "ring")
    with pytest.raises(ConfigError, match="butterfly"):
        all_reduce(1e3, 8, 1, intra, algorithm="butterfly")


def test_link_cost_from_the_catalogue_uses_effective_bandwidth_and_nics() -> None:
    cost = LinkCost.from_link(find_link("ib-ndr"), nics=8)
    assert cost.alpha_s == find_link("ib-ndr").latency_s
    assert cost.bandwidth_Bps == pytest.approx(8 * 50e9 * 0.85)
    assert LinkCost.from_link(find_link("pcie4")).bandwidth_Bps == pytest.approx(25e9)


def test_fsdp_gathers_twice_and_scatters_once() -> None:
    intra = LinkCost(0.0, 100e9)
    comm = fsdp_step_comm(1e9, 1e9, 8, 1, intra)
    # each: 7/8 * 1e9 / 1e11 = 8.75 ms
    assert comm.forward_all_gather_s == pytest.approx(8.75e-3)
    assert comm.backward_all_gather_s == pytest.approx(8.75e-3)
    assert comm.reduce_scatter_s == pytest.approx(8.75e-3)
    assert comm.total_s == pytest.approx(26.25e-3)
    assert fsdp_step_comm(1e9, 1e9, 8, 1, intra, reshard_after_forward=False).total_s == pytest.approx(17.5e-3)


@pytest.mark.parametrize("call", [
    lambda: ring_all_reduce(-1, 8, 1e-6, 1e9),
    lambda: ring_all_reduce(1e6, 0, 1e-6, 1e9),
    lambda: ring_all_reduce(1e6, 2.5, 1e-6, 1e9),
    lambda: reduce_scatter(1e6, 4, -1e-6, 1e9),
    lambda: all_gather(1e6, 4, 1e-6, 0.0),
    lambda: tree_all_reduce(float("nan"), 4, 1e-6, 1e9),
    lambda: LinkCost(1e-6, -5.0),
    lambda: all_reduce(1e6, 0, 1, LinkCost(1e-6, 1e9)),
])
def test_bad_inputs_raise_value_error(call) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError):
        call()


def test_wire_bytes_for_each_compression() -> None:
    assert wire_bytes(4e8, "none") == 4e8
    assert wire_bytes(4e8, "fp16") == 2e8
    assert wire_bytes(4e8, "BF16") == 2e8
    shapes = [(1024, 1024), (1024,), (64, 3, 3, 3), (4, 4)]
    total = (1024 * 1024 + 1024 + 64 * 27 + 16) * 4
    # rank 4: 4*(1024+1024) = 8192; bias 1024 as is; conv viewed as 64x27: 4*(64+27) = 364;
    # 4x4: 4*(4+4) = 32 is not < 16/2, so it goes uncompressed: 16.  (8192+1024+364+16) * 4 B = 38384
    assert wire_bytes(total, "powersgd", powersgd_rank=4, matrix_shapes=shapes) == 38384
    # rank 1: 2048 + 1024 + 91 + 16 (4x4 at rank 1: 8*2 = 16 is not < 16, so uncompressed) = 3179 * 4
    assert wire_bytes(total, "powersgd", matrix_shapes=shapes) == 12716


def test_powersgd_needs_the_shapes_and_they_must_add_up() -> None:
    with pytest.raises(ValueError, match="matrix_shapes"):
        wire_bytes(4e8, "powersgd")
    with pytest.raises(ValueError, match="grad_bytes_fp32"):
        wire_bytes(4e8, "powersgd", matrix_shapes=[(10, 10)])
    with pytest.raises(ValueError):
        wire_bytes(400, "powersgd", powersgd_rank=0, matrix_shapes=[(10, 10)])
    with pytest.raises(ConfigError, match="zip"):
        wire_bytes(4e8, "zip")
    with pytest.raises(ValueError):
        wire_bytes(-4, "none")


def test_host_cpu_of_an_all_reduce_by_hand() -> None:
    intra = LinkCost(0.0, 100e9, cpu_s_per_byte=1e-9)
    inter = LinkCost(0.0, 10e9, cpu_s_per_byte=2e-9)
    # one node of 4: a rank moves 2 x 3/4 x 8 MB = 12 MB inside it, at 1 ns a byte
    assert all_reduce_host_cpu(8e6, 4, 1, intra) == pytest.approx(12e6 * 1e-9)
    # 2 nodes of 4: the same inside, plus 2 x 1/2 x 8 MB / 4 = 2 MB between nodes, at 2 ns a byte
    assert all_reduce_host_cpu(8e6, 4, 2, intra, inter) == pytest.approx(12e6 * 1e-9 + 2e6 * 2e-9)
    assert all_reduce_host_cpu(8e6, 4, 2, LinkCost(0.0, 1e9), LinkCost(0.0, 1e9)) == 0
