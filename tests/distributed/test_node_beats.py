"""The launchers' beats to each other through the rendezvous store: a silent node, and a node cut off."""

from __future__ import annotations

from dtpo.distributed.node_beats import NodeBeats


class FakeStore:
    """The part of a TCPStore the beats use, shared by the 'nodes' of a test; ``down`` makes it unreachable."""

    def __init__(self) -> None:
        self.values: dict[str, bytes | int] = {}
        self.down = False

    def _check(self) -> None:
        if self.down:
            raise RuntimeError("Socket Timeout")

    def append(self, key: str, value: str) -> None:
        self._check()
        self.values[key] = bytes(self.values.get(key, b"")) + value.encode()

    def add(self, key: str, amount: int) -> int:
        self._check()
        self.values[key] = int(self.values.get(key, 0)) + amount
        return int(self.values[key])

    def get(self, key: str) -> bytes:
        self._check()
        return bytes(self.values[key])


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def node(store: FakeStore, clock: Clock, name: str) -> NodeBeats:
    beats = NodeBeats("10.0.0.1:29400", "job-1", clock=clock, connect=lambda host, port: store)
    beats.node, beats.me = name, f"{name}/1"
    return beats


def test_a_node_whose_launcher_stopped_beating_is_named() -> None:
    store, clock = FakeStore(), Clock()
    a, b = node(store, clock, "node-a"), node(store, clock, "node-b")
    a.beat(), b.beat(), a.beat()
    assert a.silent(3.0) == [] and b.silent(3.0) == []
    for _ in range(5):  # node-b goes quiet; node-a keeps beating
        clock.now += 1.0
        a.beat()
    [lost] = a.silent(3.0)
    assert lost.node == "node-b" and lost.silent_s == 5.0 and not lost.this_node


def test_a_node_cut_off_from_the_store_names_the_rendezvous_host() -> None:
    store, clock = FakeStore(), Clock()
    b = node(store, clock, "node-b")
    b.beat()
    store.down = True
    clock.now += 4.0
    b.beat()  # fails quietly
    [lost] = b.silent(3.0)
    assert lost.this_node and lost.node == "10.0.0.1" and lost.silent_s == 4.0


def test_a_store_never_reached_names_nobody() -> None:
    store, clock = FakeStore(), Clock()
    store.down = True
    b = node(store, clock, "node-b")
    b.beat()
    clock.now += 60.0
    assert b.silent(3.0) == []  # before the rendezvous, not a lost node


def test_jobs_keep_their_beats_apart() -> None:
    store, clock = FakeStore(), Clock()
    a = node(store, clock, "node-a")
    other = NodeBeats("10.0.0.1:29400", "job-2", clock=clock, connect=lambda host, port: store)
    other.node, other.me = "node-z", "node-z/9"
    a.beat(), other.beat()
    clock.now += 10.0
    a.beat()
    assert a.silent(3.0) == []  # node-z beats for another job
