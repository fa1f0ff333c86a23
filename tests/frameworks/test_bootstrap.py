"""What ``dtpo launch --framework`` prepares in each worker: the ``TF_CONFIG`` each TensorFlow worker gets, on
one node and across nodes, from torchrun's environment and one all-gather over dtpo's channel; JAX's coordinator
and the arguments ``jax.distributed.initialize()`` is given (faked here: no process group, no framework needed)."""

from __future__ import annotations

import json
import os
import types
from collections.abc import Iterator
from typing import Any

import pytest
import torch.distributed as dist

from dtpo.frameworks import bootstrap


@pytest.fixture(autouse=True)
def _environment_restored() -> Iterator[None]:
    """The preparation writes ``os.environ`` as a worker's would: put it back after each test."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def prepare_every_rank(monkeypatch: pytest.MonkeyPatch, nodes: int, per_node: int,
                       port: int | None) -> list[dict[str, Any]]:
    """Run ``prepare_tensorflow`` as each rank of ``nodes`` x ``per_node`` workers would (torchrun's ranks: node
    by node), each rank's all-gather answered with what every rank offers: each rank's ``TF_CONFIG``."""
    world = nodes * per_node
    offered: list[str | None] = [None] * world
    configs: list[dict[str, Any]] = []
    for phase in ("offer", "read"):  # every rank offers its address, then every rank reads the gathered list
        for rank in range(world):
            node, local = divmod(rank, per_node)
            monkeypatch.setenv("RANK", str(rank))
            monkeypatch.setenv("WORLD_SIZE", str(world))
            monkeypatch.setenv("LOCAL_RANK", str(local))
            monkeypatch.setenv("GROUP_WORLD_SIZE", str(nodes))
            monkeypatch.setattr(bootstrap.socket, "gethostname", lambda node=node: f"node{node}")

            def gather(out: list[Any], mine: Any, rank: int = rank, phase: str = phase) -> None:
                if phase == "offer":
                    offered[rank] = mine
                else:
                    assert mine == offered[rank]  # the same address, asked again
                out[:] = offered

            monkeypatch.setattr(dist, "all_gather_object", gather)
            os.environ.pop(bootstrap.TF_CONFIG_ENV, None)  # each rank its own environment (restored after)
            if port is None:  # the kernel's free port, a different one on each rank
                monkeypatch.setattr(bootstrap, "free_port", lambda rank=rank: 40000 + rank)
            bootstrap.prepare_tensorflow(port)
            if phase == "read":
                configs.append(json.loads(bootstrap.os.environ[bootstrap.TF_CONFIG_ENV]))
    return configs


def test_two_nodes_get_one_cluster_in_rank_order_with_each_rank_its_own_index(monkeypatch: pytest.MonkeyPatch) -> None:
    configs = prepare_every_rank(monkeypatch, nodes=2, per_node=2, port=23456)
    cluster = ["node0:23456", "node0:23457", "node1:23456", "node1:23457"]  # host name, PORT + local rank
    assert configs == [{"cluster": {"worker": cluster}, "task": {"type": "worker", "index": rank}}
                       for rank in range(4)]


def test_without_a_port_each_rank_offers_a_free_one(monkeypatch: pytest.MonkeyPatch) -> None:
    configs = prepare_every_rank(monkeypatch, nodes=2, per_node=1, port=None)
    assert [config["cluster"]["worker"] for config in configs] == [["node0:40000", "node1:40001"]] * 2
    assert [config["task"]["index"] for config in configs] == [0, 1]


def test_one_node_uses_the_loopback_and_one_worker_gets_no_tf_config(monkeypatch: pytest.MonkeyPatch) -> None:
    configs = prepare_every_rank(monkeypatch, nodes=1, per_node=2, port=23456)
    assert configs[1] == {"cluster": {"worker": ["127.0.0.1:23456", "127.0.0.1:23457"]},
                          "task": {"type": "worker", "index": 1}}
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    os.environ.pop(bootstrap.TF_CONFIG_ENV)
    monkeypatch.setattr(dist, "all_gather_object", lambda out, mine: pytest.fail("no gather for one worker"))
    bootstrap.prepare_tensorflow(23456)
    assert bootstrap.TF_CONFIG_ENV not in bootstrap.os.environ  # MultiWorkerMirroredStrategy: one local worker


def test_several_workers_on_a_node_each_see_the_gpu_of_their_local_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in (("RANK", "1"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "1"), ("LOCAL_WORLD_SIZE", "2")):
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(dist, "all_gather_object", lambda out, mine: out.__setitem__(slice(None), ["a:1", mine]))
    bootstrap.prepare_tensorflow(23456)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "1"
    assert json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"] == ["a:1", "127.0.0.1:23457"]
    os.environ["CUDA_VISIBLE_DEVICES"] = "3,5"  # the user's own choice stays
    bootstrap.prepare_tensorflow(23456)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "3,5"


def test_across_nodes_a_worker_offers_the_address_that_reaches_the_rendezvous(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GROUP_WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")  # only the loopback reaches it here: the host name instead
    monkeypatch.setattr(bootstrap.socket, "gethostname", lambda: "node7")
    assert bootstrap._host() == "node7"
    monkeypatch.setenv("GROUP_WORLD_SIZE", "1")
    assert bootstrap._host() == "127.0.0.1"


def test_jax_gets_rank_zeros_coordinator_and_initialize_fills_its_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("JAX_COORDINATOR_ADDRESS", "JAX_LOCAL_DEVICE_IDS", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setattr(dist, "is_initialized", lambda: True)

    def broadcast(values: list[Any], src: int) -> None:  # rank 0 said where its coordinator listens
        assert src == 0 and values == [None]
        values[0] = "127.0.0.1:45678"

    monkeypatch.setattr(dist, "broadcast_object_list", broadcast)
    hooked: list[Any] = []
    monkeypatch.setattr("dtpo.core.post_import.when_imported", lambda name, callback: hooked.append((name, callback)))
    bootstrap.prepare_jax(None)
    assert os.environ["JAX_COORDINATOR_ADDRESS"] == "127.0.0.1:45678"
    assert os.environ["JAX_LOCAL_DEVICE_IDS"] == "1" and os.environ["JAX_CPU_COLLECTIVES_IMPLEMENTATION"] == "gloo"
    ((name, fill),) = hooked
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    fake_jax = types.SimpleNamespace(distributed=types.SimpleNamespace(
        initialize=lambda *args, **kwargs: calls.append((args, kwargs))))
    fill(fake_jax)
    fill(fake_jax)  # once only
    fake_jax.distributed.initialize()
    fake_jax.distributed.initialize(num_processes=2, process_id=1, coordinator_address="elsewhere:1")
    fake_jax.distributed.initialize("given:2", 2, 1)
    assert name == "jax"
    assert calls == [((), {"coordinator_address": "127.0.0.1:45678", "num_processes": 2, "process_id": 1}),
                     ((), {"num_processes": 2, "process_id": 1, "coordinator_address": "elsewhere:1"}),
                     (("given:2", 2, 1), {})]
