"""DDP bucket overlap: scripted timelines, uniform buckets and DDP's bucket sizes."""

from __future__ import annotations

import pytest

from dtpo.plan.overlap import MiB, bucket_timeline, ddp_bucket_sizes, exposed_comm, uniform_buckets


def test_a_hand_worked_timeline_exposes_three_ms() -> None:
    ready, comm = [2.0e-3, 4.0e-3, 6.0e-3, 8.0e-3], [3.0e-3, 3.0e-3, 1.0e-3, 2.0e-3]
    # bucket 1: 2-5 ms; bucket 2 waits for it: 5-8; bucket 3: 8-9; bucket 4 (ready at 8): 9-11 -> 11 - 8 = 3 ms
    flat = [t for span in bucket_timeline(ready, comm) for t in span]
    assert flat == pytest.approx([2e-3, 5e-3, 5e-3, 8e-3, 8e-3, 9e-3, 9e-3, 11e-3])
    assert exposed_comm(ready, comm) == pytest.approx(3.0e-3)


def test_fully_hidden_communication_exposes_nothing() -> None:
    # every all-reduce ends before backward does (backward goes on 2 ms after its last bucket is ready)
    assert exposed_comm([1.0, 2.0, 3.0, 4.0], [0.5, 0.5, 0.5, 0.5], backward_end_s=6.0) == 0.0
    assert exposed_comm([1.0, 2.0, 3.0], [0.5, 0.5, 0.0]) == 0.0
    assert exposed_comm([], []) == 0.0


def test_communication_that_starts_at_the_end_is_all_exposed() -> None:
    assert exposed_comm([8.0, 8.0, 8.0], [1.0, 2.0, 3.0]) == pytest.approx(6.0)


def test_bad_timelines_raise() -> None:
    with pytest.raises(ValueError, match="decrease"):
        exposed_comm([2.0, 1.0], [1.0, 1.0])
    with pytest.raises(ValueError, match="one of each"):
        exposed_comm([1.0], [1.0, 1.0])
    with pytest.raises(ValueError):
        exposed_comm([1.0], [-1.0])
    with pytest.raises(ValueError, match="before its last bucket"):
        exposed_comm([1.0, 2.0], [1.0, 1.0], backward_end_s=1.5)


def test_uniform_buckets_spread_ready_times_and_split_comm() -> None:
    ready, comm = uniform_buckets(10.0, 4, 8.0)
    assert ready == pytest.approx([2.5, 5.0, 7.5, 10.0])
    assert comm == pytest.approx([2.0, 2.0, 2.0, 2.0])
    # 2.5-4.5, 5-7, 7.5-9.5, 10-12: 2 s exposed
    assert exposed_comm(ready, comm) == pytest.approx(2.0)


def test_uniform_buckets_follow_bucket_bytes_and_a_first_ready_fraction() -> None:
    ready, comm = uniform_buckets(8.0, 3, 16.0, bucket_bytes=[1, 3, 4])
    assert ready == pytest.approx([1.0, 4.0, 8.0])
    assert comm == pytest.approx([2.0, 6.0, 8.0])
    ready, _ = uniform_buckets(10.0, 3, 1.0, first_ready_fraction=0.5)
    assert ready == pytest.approx([5.0, 7.5, 10.0])
    assert uniform_buckets(3.0, 1, 1.0) == ([3.0], [1.0])
    with pytest.raises(ValueError):
        uniform_buckets(1.0, 0, 1.0)
    with pytest.raises(ValueError):
        uniform_buckets(1.0, 2, 1.0, bucket_bytes=[1.0])
    with pytest.raises(ValueError):
        uniform_buckets(1.0, 2, 1.0, first_ready_fraction=0.0)


def test_ddp_bucket_sizes_sum_to_the_total_with_a_small_first_bucket() -> None:
    sizes = ddp_bucket_sizes(100 * MiB)
    assert sizes == [MiB, 25 * MiB, 25 * MiB, 25 * MiB, 24 * MiB]
    for total in (1, MiB // 2, MiB, MiB + 1, 97_654_321):
        sizes = ddp_bucket_sizes(total)
        assert sum(sizes) == total
        assert sizes[0] <= MiB and all(s <= 25 * MiB for s in sizes)
    assert ddp_bucket_sizes(0) == []
    assert ddp_bucket_sizes(10, cap_bytes=4, first_cap_bytes=1) == [1, 4, 4, 1]
    with pytest.raises(ValueError):
        ddp_bucket_sizes(-1)


def test_ddp_buckets_feed_the_overlap_model() -> None:
    sizes = ddp_bucket_sizes(100 * MiB)
    ready, comm = uniform_buckets(0.1, len(sizes), 0.05, bucket_bytes=sizes)
    assert ready[0] == pytest.approx(0.1 / 100) and ready[-1] == 0.1
    assert sum(comm) == pytest.approx(0.05)
    assert 0 < exposed_comm(ready, comm) < 0.05


def test_ddp_packs_whole_tensors_into_its_buckets() -> None:
    from dtpo.plan.overlap import ddp_tensor_buckets

    mib = 1024 * 1024
    # backward order: a 4 MiB weight closes the 1 MiB first bucket alone; the rest fill 25 MiB buckets
    assert ddp_tensor_buckets([4 * mib, 4096, 10 * mib, 20 * mib, 8 * mib]) == [4 * mib, 4096 + 30 * mib, 8 * mib]
    assert ddp_tensor_buckets([100, 200]) == [300]
    assert ddp_tensor_buckets([]) == []
    with pytest.raises(ValueError, match="bytes"):
        ddp_tensor_buckets([-1])
