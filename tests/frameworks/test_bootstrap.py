"""``prepare_tensorflow``: the ``TF_CONFIG`` each worker gets, on one node and across nodes, from torchrun's
environment and one all-gather over dtpo's channel (faked here: no process group, no TensorFlow needed)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch.distributed as dist

from dtpo.frameworks import bootstrap


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
            monkeypatch.delenv(bootstrap.TF_CONFIG_ENV, raising=False)
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
    monkeypatch.delenv(bootstrap.TF_CONFIG_ENV)
    monkeypatch.setattr(dist, "all_gather_object", lambda out, mine: pytest.fail("no gather for one worker"))
    bootstrap.prepare_tensorflow(23456)
    assert bootstrap.TF_CONFIG_ENV not in bootstrap.os.environ  # MultiWorkerMirroredStrategy: one local worker
