"""What a launcher tells its workers, as one typed value: :class:`LaunchContract`.

``dtpo launch`` (and ``dtpo train`` through it) and the Ray engine's driver build a contract and hand it to the
workers as environment variables (:meth:`LaunchContract.to_environ`, the ``DTPO_*`` names in
:data:`ENVIRON_NAMES`); a worker reads it back with :meth:`LaunchContract.from_environ`. Nothing else reads or
writes those variables.

dtpo's user settings (``DTPO_STATE_DIR``, ``DTPO_STORE``, ``DTPO_CACHE_DIR``, ``DTPO_LOG_LEVEL``,
``DTPO_RUN_ROOT``, ``DTPO_VIRTUAL_GPUS``) are not part of the contract: a person sets them, no launcher does, and
each is read where it is used (the knob journal, the run store, the measured-figures cache, logging, the parent of
new run directories, virtual GPUs). The Ray engine passes them on to its workers as they are,
because Ray's workers do not inherit the driver's environment.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dtpo.core.config import BACKENDS
from dtpo.core.errors import ConfigError
from dtpo.core.frameworks import FRAMEWORKS

CONFIG_ENV = "DTPO_CONFIG"
LAUNCHED_ENV = "DTPO_LAUNCHED"
LAUNCHER_ENV = "DTPO_LAUNCHER"
RUN_DIR_ENV = "DTPO_RUN_DIR"
RUN_ROOT_ENV = "DTPO_RUN_ROOT"
RUN_POINTER_ENV = "DTPO_RUN_POINTER"
BACKEND_ENV = "DTPO_BACKEND"
AGENT_ENV = "DTPO_AGENT"
FRAMEWORK_ENV = "DTPO_FRAMEWORK"
COORDINATOR_PORT_ENV = "DTPO_COORDINATOR_PORT"
HEARTBEAT_DIR_ENV = "DTPO_HEARTBEAT_DIR"
_TRUE, _FALSE = ("1", "true", "yes"), ("", "0", "false", "no")


@dataclass(frozen=True, kw_only=True)
class LaunchContract:
    """The launcher-to-worker contract. Every field is optional: a plain ``python train.py`` has none.

    Attributes:
        config: The run's configuration file (``RUN_DIR/config.json``) ``dtpo.workloads.train`` reads.
        launched: Started by a dtpo launcher (``dtpo launch``, ``dtpo train``, the Ray engine): the launcher writes
            the summary and the run's artifacts, and a worker ends with its launcher.
        launcher: The launcher's name where it is not ``dtpo launch`` (``"ray"``: Ray Train), for the record.
        run_dir: The run directory all workers write into (it wins over ``run_root``).
        run_root: Where rank 0 makes the run directory when none is named (several nodes without ``--run-dir``).
        run_pointer: The file local rank 0 writes the agreed run directory into, for its node's launcher.
        backend: The collective backend the workers use (one of ``BACKENDS``) instead of the device's default.
        agent: The in-process agent (:mod:`dtpo.agent`) measures the workers' own training loop: ``dtpo launch``
            puts its ``sitecustomize`` first on their ``PYTHONPATH``, and this flag is what wakes it.
        framework: What the script computes with, where it is not PyTorch (``jax``, ``tensorflow``, ``keras``):
            the same ``sitecustomize`` prepares each worker as that framework needs (:mod:`dtpo.frameworks`).
        coordinator_port: The port of the framework's own coordinator (JAX's, on rank 0's node; TensorFlow's
            workers take this port plus their local rank), where the user chose it; else a free one is taken.
        heartbeat_dir: Where each worker writes its heartbeat for the launcher of its node, which watches for a
            rank that stopped (:mod:`dtpo.distributed.stall`); ``None``: nobody watches.
    """

    config: Path | None = None
    launched: bool = False
    launcher: str | None = None
    run_dir: Path | None = None
    run_root: Path | None = None
    run_pointer: Path | None = None
    backend: str | None = None
    agent: bool = False
    framework: str | None = None
    coordinator_port: int | None = None
    heartbeat_dir: Path | None = None

    def __post_init__(self) -> None:
        if self.framework is not None and self.framework not in FRAMEWORKS:
            raise ConfigError(f"{FRAMEWORK_ENV}={self.framework!r} is not a framework (choose from: "
                              f"{', '.join(FRAMEWORKS)})")
        if self.coordinator_port is not None:
            port = str(self.coordinator_port).strip()
            if not port.isdigit() or not 0 < int(port) < 2**16:
                raise ConfigError(f"{COORDINATOR_PORT_ENV}={self.coordinator_port!r} is not a port number (1-65535)")
            object.__setattr__(self, "coordinator_port", int(port))
        if self.backend is not None and self.backend not in BACKENDS:
            raise ConfigError(f"{BACKEND_ENV}={self.backend!r} is not a backend (choose from: {', '.join(BACKENDS)})")
        if self.launcher is not None and (not self.launcher.strip() or "\n" in self.launcher):
            raise ConfigError(f"{LAUNCHER_ENV}={self.launcher!r} is not a launcher name")
        for name in ("config", "run_dir", "run_root", "run_pointer", "heartbeat_dir"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, Path):
                object.__setattr__(self, name, Path(value))

    def to_environ(self) -> dict[str, str | None]:
        """Every variable of the contract: its value, or ``None`` for one the workers must not see (unset it)."""
        return {name: _text(getattr(self, field)) for field, name in _NAMES.items()}

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> LaunchContract:
        """The contract in ``environ`` (default ``os.environ``); an empty variable counts as unset.

        Raises:
            ConfigError: A variable holds a value the contract does not allow (one line, naming it).
        """
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for field, name in _NAMES.items():
            text = env.get(name, "")
            if field in ("launched", "agent"):
                values[field] = _flag(name, text)
            elif text:
                values[field] = text
        return cls(**values)


_NAMES = {"config": CONFIG_ENV, "launched": LAUNCHED_ENV, "launcher": LAUNCHER_ENV, "run_dir": RUN_DIR_ENV,
          "run_root": RUN_ROOT_ENV, "run_pointer": RUN_POINTER_ENV, "backend": BACKEND_ENV,
          "agent": AGENT_ENV, "framework": FRAMEWORK_ENV, "coordinator_port": COORDINATOR_PORT_ENV,
          "heartbeat_dir": HEARTBEAT_DIR_ENV}
ENVIRON_NAMES: tuple[str, ...] = tuple(_NAMES.values())
"""The variables of the contract, in field order."""


def _text(value: Any) -> str | None:
    if value is None or value is False:
        return None
    return "1" if value is True else str(value)


def _flag(name: str, text: str) -> bool:
    word = text.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise ConfigError(f"{name}={text!r} is not a flag (1 or 0)")
