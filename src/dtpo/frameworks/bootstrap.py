"""Preparing a worker of ``dtpo launch --framework jax|tensorflow|keras`` before its script runs.

torchrun gives every worker its rank, the world size and the rendezvous store; a JAX or TensorFlow script needs
those in its framework's own terms. Run from the agent's ``sitecustomize`` (also with ``--no-agent``), this
opens dtpo's gloo channel (:mod:`~dtpo.frameworks.channel`) and, over it:

* **JAX**: rank 0 takes the coordinator's port (``--coordinator-port``, else a free one) and tells every rank
  the address, set as ``JAX_COORDINATOR_ADDRESS``; ``jax.distributed.initialize()`` called without arguments
  then gets the process count and id from torchrun's ``WORLD_SIZE`` and ``RANK`` (its missing arguments are
  filled in once ``import jax`` finishes), CPU collectives across processes go over gloo, and each process of a
  node takes the GPU of its local rank (``JAX_LOCAL_DEVICE_IDS``), unless ``CUDA_VISIBLE_DEVICES`` says otherwise.
* **TensorFlow**: every rank takes a port (``--coordinator-port`` + local rank, else a free one) and the ranks
  gather each other's ``host:port`` into the ``TF_CONFIG`` that ``MultiWorkerMirroredStrategy`` reads; with
  several workers on a node, each sees only the GPU of its local rank (``CUDA_VISIBLE_DEVICES``), unless the
  user set ``CUDA_VISIBLE_DEVICES``.
* **Keras**: as the framework its ``KERAS_BACKEND`` names (on PyTorch: nothing to prepare).

At exit, a worker whose script reported no step to dtpo says so in one line, instead of leaving an empty run.
"""

from __future__ import annotations

import atexit
import functools
import json
import logging
import os
import socket
from types import ModuleType
from typing import Any

from dtpo.core.frameworks import computes_on
from dtpo.core.launch_contract import LaunchContract

log = logging.getLogger(__name__)

JAX_COORDINATOR_ENV = "JAX_COORDINATOR_ADDRESS"
JAX_COLLECTIVES_ENV = "JAX_CPU_COLLECTIVES_IMPLEMENTATION"
JAX_DEVICES_ENV = "JAX_LOCAL_DEVICE_IDS"
TF_CONFIG_ENV = "TF_CONFIG"
_TRACKERS = {"jax": "dtpo.jax.Tracker", "tensorflow": "dtpo.tensorflow.Tracker"}


def prepare(contract: LaunchContract) -> str:
    """Prepare this worker for the contract's framework.

    Returns:
        The framework the script computes on (``"torch"`` for a Keras script on the torch backend).
    """
    runs_on = computes_on(contract.framework)
    if runs_on == "torch":
        return runs_on
    from dtpo.frameworks.channel import open_channel

    open_channel()
    if runs_on == "jax":
        prepare_jax(contract.coordinator_port)
    elif runs_on == "tensorflow":
        prepare_tensorflow(contract.coordinator_port)
    if contract.agent:
        atexit.register(say_if_unmeasured, contract.framework or runs_on)
    return runs_on


def prepare_jax(port: int | None) -> None:
    """Tell every rank JAX's coordinator address; fill ``jax.distributed.initialize``'s missing arguments."""
    from dtpo.core.post_import import when_imported

    rank, world = _rank_world()
    if world > 1:
        address = [f"{_host()}:{port or free_port()}"] if rank == 0 else [None]
        _broadcast(address)
        os.environ.setdefault(JAX_COORDINATOR_ENV, str(address[0]))
    os.environ.setdefault(JAX_COLLECTIVES_ENV, "gloo")
    if int(os.environ.get("LOCAL_WORLD_SIZE", 1) or 1) > 1 and "CUDA_VISIBLE_DEVICES" not in os.environ:
        # one GPU per process, the one dtpo measures (cuda:LOCAL_RANK); no effect on CPU
        os.environ.setdefault(JAX_DEVICES_ENV, os.environ.get("LOCAL_RANK", "0"))
    when_imported("jax", fill_initialize)


def fill_initialize(jax: ModuleType) -> None:
    """Wrap ``jax.distributed.initialize`` so that a call without arguments joins this launch's processes."""
    distributed = getattr(jax, "distributed", None)
    if distributed is None:
        import jax.distributed as distributed  # noqa: PLC0415 - the submodule, once jax itself has loaded
    original = distributed.initialize
    if getattr(original, "__dtpo_filled__", False):
        return

    @functools.wraps(original)
    def initialize(*args: Any, **kwargs: Any) -> Any:
        if not args:
            rank, world = _rank_world()
            kwargs.setdefault("coordinator_address", os.environ.get(JAX_COORDINATOR_ENV) or None)
            kwargs.setdefault("num_processes", world)
            kwargs.setdefault("process_id", rank)
        return original(*args, **kwargs)

    initialize.__dtpo_filled__ = True  # type: ignore[attr-defined]
    distributed.initialize = initialize


def prepare_tensorflow(port: int | None) -> None:
    """Write this rank's ``TF_CONFIG``: every worker's ``host:port`` in rank order, and this rank's index."""
    rank, world = _rank_world()
    if world <= 1:
        return
    import torch.distributed as dist

    local_rank = int(os.environ.get("LOCAL_RANK", 0) or 0)
    if int(os.environ.get("LOCAL_WORLD_SIZE", 1) or 1) > 1 and "CUDA_VISIBLE_DEVICES" not in os.environ:
        # one GPU per worker, the one dtpo measures: TensorFlow would take (and fill) every GPU in each worker
        os.environ["CUDA_VISIBLE_DEVICES"] = str(local_rank)
    mine = f"{_host()}:{port + local_rank if port else free_port()}"
    workers: list[Any] = [None] * world
    dist.all_gather_object(workers, mine)
    os.environ[TF_CONFIG_ENV] = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": rank}})


def say_if_unmeasured(framework: str) -> None:
    """At exit: one line where the script never reported a step (no record, rather than an empty one)."""
    from dtpo.session.stream_run import StreamRun

    if StreamRun.opened:
        return
    rank, _ = _rank_world()
    if rank == 0:
        tracker = _TRACKERS.get(computes_on(framework), "dtpo.StepReporter")
        log.warning("dtpo: this %s script reported no training step, so no record was written: report each step "
                    "with %s (Keras's Model.fit is measured on its own)", framework, tracker)


def free_port() -> int:
    """A TCP port free on this machine now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def _host() -> str:
    """How the other ranks reach this one: on one node the loopback; across nodes the address of the interface
    that reaches the rendezvous host (a host name may resolve to 127.0.1.1 in Debian's ``/etc/hosts``), else the
    host name."""
    if int(os.environ.get("GROUP_WORLD_SIZE", 1) or 1) <= 1:
        return "127.0.0.1"
    master = os.environ.get("MASTER_ADDR")
    if master:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.connect((master, int(os.environ.get("MASTER_PORT", 29500) or 29500)))  # sends nothing
                address = probe.getsockname()[0]
            if not address.startswith("127."):
                return str(address)
        except (OSError, ValueError):
            pass
    return socket.gethostname()


def _rank_world() -> tuple[int, int]:
    return int(os.environ.get("RANK", 0) or 0), int(os.environ.get("WORLD_SIZE", 1) or 1)


def _broadcast(values: list[Any]) -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.broadcast_object_list(values, src=0)
