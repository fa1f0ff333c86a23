"""The launcher's stall watch: when a rank counts as stalled, which rank is named, what is stopped."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from dtpo.core.errors import LaunchError
from dtpo.distributed.heartbeat import Beat, HeartbeatWriter
from dtpo.distributed.node_beats import SilentNode
from dtpo.distributed.stall import Stall, StallPolicy, StallWatch, find_stall

POLICY = StallPolicy(factor=10.0, floor_s=5.0, beat_stale_s=3.0)


def beat(rank: int, step: int | None = 7, in_step: bool = True, progress_at: float = 0.0, beat_at: float = 100.0,
         median: float | None = 0.1, attempt: int = 0, finished: bool = False) -> Beat:
    return Beat(rank=rank, local_rank=rank, node="node-a", pid=1000 + rank, attempt=attempt, step=step,
                in_step=in_step, progress_at=progress_at, beat_at=beat_at, median_step_s=median, finished=finished)


def test_the_limit_is_a_multiple_of_the_median_step_with_a_floor() -> None:
    assert POLICY.limit_s(0.1) == 5.0
    assert POLICY.limit_s(2.0) == 20.0


def test_no_stall_before_the_limit_or_before_any_step_ended() -> None:
    assert find_stall([beat(0, progress_at=96.0), beat(1, progress_at=95.5)], 100.0, POLICY) is None
    assert find_stall([beat(0, median=None), beat(1, median=None)], 100.0, POLICY) is None
    assert find_stall([beat(0, finished=True), beat(1, finished=True)], 100.0, POLICY) is None
    assert find_stall([], 100.0, POLICY) is None


def test_one_rank_that_still_progresses_means_no_stall() -> None:
    # the job is in step with itself: while any rank of the node progresses, none is stuck for good
    assert find_stall([beat(0, progress_at=99.0), beat(1, progress_at=10.0, beat_at=10.0)], 100.0, POLICY) is None


def test_a_rank_that_stopped_beating_is_named_at_the_step_the_others_wait_in() -> None:
    stopped = beat(1, step=5, in_step=False, progress_at=90.0, beat_at=90.5)  # its last beat lags behind
    stall = find_stall([beat(0, step=6, progress_at=91.0), stopped, beat(2, step=6, progress_at=91.0)], 100.0,
                       POLICY)
    assert stall is not None
    assert stall.ranks == (1,) and stall.pids == (1001,) and stall.why == "silent"
    assert stall.step == 6 and stall.idle_s == pytest.approx(9.0) and stall.limit_s == 5.0
    line = stall.describe()
    assert line.startswith("rank 1 on node node-a stalled at step 6: no progress for 9.0 s")
    assert "stopped beating" in line


def test_a_rank_behind_the_others_is_named_when_all_still_beat() -> None:
    # a hung data loader: rank 2 never began step 8, the others did and wait for it in the collective
    beats = [beat(0, step=8), beat(1, step=8), beat(2, step=7, in_step=False)]
    stall = find_stall(beats, 100.0, POLICY)
    assert stall is not None and stall.ranks == (2,) and stall.why == "behind" and stall.step == 7


def test_when_no_rank_can_be_singled_out_the_node_is_named() -> None:
    stall = find_stall([beat(0), beat(1)], 100.0, POLICY)
    assert stall is not None and stall.ranks == (0, 1) and stall.why == "all"
    assert stall.describe().startswith("ranks 0, 1 on node node-a stalled at step 7")
    assert "another node" in stall.describe()


def test_a_whole_node_that_stopped_beating_is_named_as_stopped() -> None:
    stall = find_stall([beat(0, beat_at=50.0), beat(1, beat_at=50.0)], 100.0, POLICY)
    assert stall is not None and stall.ranks == (0, 1) and stall.why == "silent"


@pytest.mark.parametrize(("factor", "floor", "flag"), [(-1.0, 300.0, "--stall-factor"),
                                                      (float("nan"), 300.0, "--stall-factor"),
                                                      (20.0, 1.0, "--stall-floor"),
                                                      (20.0, float("inf"), "--stall-floor")])
def test_stall_settings_that_cannot_work_are_refused_in_one_line(factor: float, floor: float, flag: str) -> None:
    with pytest.raises(LaunchError, match=flag):
        StallPolicy(factor, floor)


class Watched:
    def __init__(self, tmp_path: Path) -> None:
        self.now = 1000.0
        self.killed: list[int] = []
        self.watch = StallWatch(tmp_path, POLICY, kill=self.killed.append, clock=lambda: self.now)
        self.dir = tmp_path

    def rank(self, rank: int, attempt: int = 0) -> HeartbeatWriter:
        writer = HeartbeatWriter(self.dir, rank=rank, local_rank=rank, attempt=attempt, clock=lambda: self.now)
        writer.step_ended(3, 0.1)
        writer.beat()
        return writer


def test_the_watch_stops_a_stalled_rank_once_per_attempt(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    w = Watched(tmp_path)
    waiting, stopped = w.rank(0), w.rank(1)
    w.now += 4.0
    waiting.beat()
    assert w.watch.check() is None and w.killed == []
    w.now += 2.0
    waiting.beat()
    stall = w.watch.check()
    assert isinstance(stall, Stall) and stall.ranks == (1,)
    assert w.killed == [stopped.current().pid]
    assert "rank 1 on node" in caplog.text and "stopping it" in caplog.text
    w.now += 10.0
    assert w.watch.check() is None and len(w.killed) == 1  # the same attempt is not stopped twice


def test_the_watch_follows_the_newest_attempt(tmp_path: Path) -> None:
    w = Watched(tmp_path)
    w.rank(0), w.rank(1)
    w.now += 6.0
    assert w.watch.check() is not None
    restarted = [w.rank(0, attempt=1), w.rank(1, attempt=1)]
    w.now += 1.0
    assert w.watch.check() is None
    w.now += 6.0
    restarted[0].beat()
    stall = w.watch.check()
    assert stall is not None and stall.attempt == 1 and stall.ranks == (1,)
    assert [s.attempt for s in w.watch.stalls] == [0, 1]


def test_a_watch_that_is_off_starts_no_thread(tmp_path: Path) -> None:
    with StallWatch(tmp_path, StallPolicy(factor=0.0)) as watch:
        assert not watch.running


def test_ranks_waiting_for_a_lost_node_name_that_node() -> None:
    lost = SilentNode("node-b", 6.2)
    stall = find_stall([beat(0), beat(1)], 100.0, POLICY, [lost])
    assert stall is not None and stall.why == "node" and stall.lost == lost and stall.ranks == (0, 1)
    assert stall.describe().startswith("node node-b lost at step 7: its launcher went silent 6.2 s ago, and ranks 0, "
                                       "1 on node node-a made no progress for 100.0 s")


def test_a_node_cut_off_says_it_lost_the_rendezvous_host() -> None:
    stall = find_stall([beat(0)], 100.0, POLICY, [SilentNode("10.0.0.1", 4.5, this_node=True)])
    assert stall is not None
    assert stall.describe().startswith("node node-a lost the rendezvous host 10.0.0.1 at step 7: no answer for 4.5 s")


def test_a_silent_node_does_not_hide_a_local_rank_that_stopped() -> None:
    stall = find_stall([beat(0), beat(1, beat_at=90.0)], 100.0, POLICY, [SilentNode("node-b", 6.0)])
    assert stall is not None and stall.why == "silent" and stall.ranks == (1,) and stall.lost is None


def test_no_rank_is_judged_while_the_ranks_pause_on_purpose() -> None:
    paused = [beat(0, in_step=False), replace(beat(1, in_step=False), paused=True)]
    assert find_stall(paused, 1000.0, POLICY) is None  # a grid pause, however long
    assert find_stall([replace(b, paused=False) for b in paused], 1000.0, POLICY) is not None
