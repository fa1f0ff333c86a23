"""The built-in workloads of ``dtpo train`` and ``dtpo bench`` and the worker that trains them.

Each workload is a model, a stream of batches and a loss. The worker, :mod:`~dtpo.workloads.train` (launched as
``-m dtpo.workloads.train``; under Ray, :mod:`~dtpo.workloads.ray_train`), trains one through ``dtpo.Session``
like any user script, then scores it on a fixed evaluation set (:mod:`~dtpo.workloads.evaluation`).

All data is generated or read from files that ship with Python, so every workload runs offline:

* ``lm``: a small GPT on the bytes of the standard library's source (:class:`~dtpo.workloads.lm.CharLM`).
* ``mlp``: an MLP learning a random teacher's labels (:class:`~dtpo.workloads.mlp.SyntheticMLP`).
* ``cnn``: a conv net on noisy, shifted class patterns (:class:`~dtpo.workloads.cnn.SyntheticCNN`).

The other frameworks' built-in workload is an MLP on synthetic data, one script each, launched by
``dtpo train --framework`` through ``dtpo launch --framework`` (:data:`FRAMEWORK_WORKLOADS`).
"""

from __future__ import annotations

from dtpo.core.config import RunConfig
from dtpo.core.errors import ConfigError
from dtpo.workloads.base import Batch, Workload
from dtpo.workloads.cnn import SyntheticCNN
from dtpo.workloads.lm import CharLM
from dtpo.workloads.mlp import SyntheticMLP

__all__ = ["FRAMEWORK_WORKLOADS", "WORKLOADS", "Batch", "CharLM", "SyntheticCNN", "SyntheticMLP", "Workload",
           "get_workload", "with_workload_defaults"]

WORKLOADS: dict[str, type[Workload]] = {cls.name: cls for cls in (CharLM, SyntheticCNN, SyntheticMLP)}

FRAMEWORK_WORKLOADS: dict[str, str] = {"jax": "dtpo.workloads.jax_mlp", "tensorflow": "dtpo.workloads.tf_mlp",
                                       "keras": "dtpo.workloads.keras_mlp"}
"""The module ``dtpo train --framework NAME`` runs, as ``python -m MODULE --steps --batch-size --lr --seed``."""


def get_workload(name: str) -> Workload:
    """A new instance of the workload registered as ``name``, with its default settings.

    Raises:
        ConfigError: No workload has that name.
    """
    try:
        cls = WORKLOADS[name]
    except KeyError:
        choices = ", ".join(sorted(WORKLOADS))
        raise ConfigError(f"unknown workload {name!r} (choose from: {choices})") from None
    return cls()


def with_workload_defaults(config: RunConfig) -> RunConfig:
    """``config`` with the workload's own steps, batch size and learning rate where it leaves them open.

    Raises:
        ConfigError: No workload has the configured name.
    """
    workload = get_workload(config.workload.name)
    chosen = config.workload
    return config.replace(workload={"steps": chosen.steps or workload.default_steps,
                                    "batch_size": chosen.batch_size or workload.default_batch_size,
                                    "lr": chosen.lr if chosen.lr is not None else workload.default_lr})
