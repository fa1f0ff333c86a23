"""A node lost mid-run: two hosts in two network namespaces joined by a veth pair, one ``dtpo launch`` on each
(c10d rendezvous on the first), and the link taken down for 20 s while they train.

Without restarts both launchers end with a ``stalled`` record that names what was lost (node-a: node-b; node-b:
the rendezvous host), well before any collective or rendezvous timeout. With ``--max-restarts`` the group resumes
from the last checkpoint once the link is back and completes.

Needs root (``ip netns``, ``unshare --mount`` to give each namespace its own host name and ``/etc/hosts``).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import dtpo_cli

SCRIPT = textwrap.dedent("""
    import sys, time
    import torch, torch.nn.functional as F
    import dtpo
    from dtpo.core.config import CheckpointConfig

    with dtpo.Session(warmup_steps=1, energy=dtpo.EnergyConfig(sample_interval_s=None, cpu_tdp_w=20.0),
                      window_steps=5, flush_every=5, progress=False,
                      checkpoint=CheckpointConfig(every="20", dir=sys.argv[1])) as session:
        torch.manual_seed(0)
        model = session.wrap(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)))
        opt = torch.optim.SGD(model.parameters(), lr=1e-2)
        session.attach(opt)
        gen = torch.Generator().manual_seed(100 + session.rank)
        data = ((x, (x.sum(1) > 0).long()) for x in (torch.randn(4, 8, generator=gen) for _ in range(10**6)))
        for x, y in session.batches(data, steps=int(sys.argv[2])):
            time.sleep(0.05)  # a step long enough that the outage falls mid-run
            session.backward(F.cross_entropy(model(x), y))
            session.step(opt)
""")
OUTAGE_S = 20.0
RDZV_TIMEOUT_S = 60.0


@dataclass
class Hosts:
    """Two namespaces, ``node-a`` (the rendezvous host) and ``node-b``, and the link between them."""

    names: tuple[str, str]
    links: tuple[str, str]
    addresses: tuple[str, str]
    hosts_file: Path

    def run(self, index: int, argv: list[str], log: Path) -> subprocess.Popen[bytes]:
        """Start ``argv`` on host ``index`` with its own host name and /etc/hosts, output to ``log``."""
        node = ("node-a", "node-b")[index]
        inner = (f"mount --bind {self.hosts_file} /etc/hosts && hostname {node} && "
                 f"GLOO_SOCKET_IFNAME={self.links[index]} exec " + shlex.join(argv))
        with log.open("wb") as out:
            return subprocess.Popen(["ip", "netns", "exec", self.names[index], "unshare", "--uts", "--mount",
                                     "sh", "-c", inner], stdout=out, stderr=subprocess.STDOUT)

    def link(self, up: bool) -> None:
        """Take the link down, or bring it back."""
        subprocess.run(["ip", "-n", self.names[0], "link", "set", self.links[0], "up" if up else "down"], check=True)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[Hosts]:
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("unshare") is None:
        pytest.skip("needs root with iproute2 and unshare (network namespaces)")
    tag = f"{os.getpid() % 10000}"
    names, links = (f"dtpo{tag}a", f"dtpo{tag}b"), (f"dv{tag}a", f"dv{tag}b")
    subnet = 100 + os.getpid() % 100
    addresses = (f"10.{subnet}.7.1", f"10.{subnet}.7.2")
    try:
        for name in names:
            _ip("netns", "add", name)
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"network namespaces cannot be made here: {exc.stderr.decode().strip()}")
    try:
        _ip("link", "add", links[0], "type", "veth", "peer", "name", links[1])
        for name, link, address in zip(names, links, addresses, strict=True):
            _ip("link", "set", link, "netns", name)
            _ip("-n", name, "addr", "add", f"{address}/24", "dev", link)
            _ip("-n", name, "link", "set", link, "up")
            _ip("-n", name, "link", "set", "lo", "up")
        hosts_file = tmp_path / "hosts"
        hosts_file.write_text(f"127.0.0.1 localhost\n{addresses[0]} node-a\n{addresses[1]} node-b\n")
        yield Hosts(names, links, addresses, hosts_file)
    finally:
        for name in names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


def _train(hosts: Hosts, tmp_path: Path, restarts: int) -> tuple[list[int], float]:
    """Train on both hosts, take the link down for ``OUTAGE_S`` once the checkpoint of step 40 is saved;
    the launchers' exit codes, and how long after the outage began the last one ended."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    rdzv_id = f"lost-node-{os.getpid()}-{restarts}"
    procs = []
    for index, node in enumerate(("node-a", "node-b")):
        argv = dtpo_cli("launch", "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                        "--rdzv-endpoint", f"{hosts.addresses[0]}:29511", "--rdzv-id", rdzv_id,
                        "--rdzv-timeout", f"{RDZV_TIMEOUT_S:g}", "--max-restarts", str(restarts),
                        "--stall-floor", "5", "--run-dir", str(tmp_path / node), str(script),
                        str(tmp_path / "checkpoints"), "300")
        procs.append(hosts.run(index, argv, tmp_path / f"{node}.log"))
    log_a = tmp_path / "node-a.log"
    deadline = time.monotonic() + 180
    while b"step-000040 saved" not in log_a.read_bytes():
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            logs = "\n".join(f"--- {node}:\n{(tmp_path / f'{node}.log').read_text()}" for node in ("node-a", "node-b"))
            raise AssertionError(f"the nodes did not reach step 40 (exit codes {[p.poll() for p in procs]}):\n{logs}")
        time.sleep(0.2)
    hosts.link(up=False)
    down_at = time.monotonic()
    time.sleep(OUTAGE_S)
    hosts.link(up=True)
    codes = [p.wait(timeout=240) for p in procs]
    return codes, time.monotonic() - down_at


def _record(tmp_path: Path, node: str) -> dict:
    return json.loads((tmp_path / node / "record.json").read_text())


def test_without_restarts_each_node_names_what_it_lost_and_ends(hosts: Hosts, tmp_path: Path) -> None:
    codes, ended_after_s = _train(hosts, tmp_path, restarts=0)
    logs = {node: (tmp_path / f"{node}.log").read_text() for node in ("node-a", "node-b")}
    assert codes == [1, 1], logs
    assert ended_after_s < OUTAGE_S + RDZV_TIMEOUT_S, logs  # no hang past the rendezvous timeout
    a, b = _record(tmp_path, "node-a"), _record(tmp_path, "node-b")
    assert a["status"] == "stalled" and a["error"].startswith("node node-b lost at step "), a["error"]
    assert b["status"] == "stalled", b["error"]
    assert b["error"].startswith(f"node node-b lost the rendezvous host {hosts.addresses[0]} at step "), b["error"]
    assert "dtpo: run stalled: node node-b lost at step" in logs["node-a"]
    assert [rank["error"] for rank in a["ranks"]] == [
        f"waited at step {a['error'].split('at step ')[1].split(':')[0]} for node node-b, which was lost; "
        "stopped by the launcher"]


def test_with_restarts_the_job_resumes_from_the_last_checkpoint_once_the_link_is_back(hosts: Hosts,
                                                                                        tmp_path: Path) -> None:
    codes, _ = _train(hosts, tmp_path, restarts=2)
    logs = {node: (tmp_path / f"{node}.log").read_text() for node in ("node-a", "node-b")}
    assert codes == [0, 0], logs
    record = _record(tmp_path, "node-a")
    assert record["status"] == "completed" and record["attempt"] >= 1
    assert record["resumed"]["step"] >= 40 and record["resumed"]["step"] % 20 == 0
    first = record["restarts"][0]
    assert first["status"] == "stalled" and first["error"].startswith("node node-b lost at step "), first
