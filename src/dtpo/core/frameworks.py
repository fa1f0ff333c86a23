"""The frameworks a training script may compute with, and the extra that installs each: :data:`FRAMEWORKS`.

PyTorch comes with dtpo; JAX, TensorFlow and Keras 3 are extras (``pip install 'dtpo[jax]'``). Keras is not a
framework of its own at run time: it computes on one of the others (``KERAS_BACKEND``, else Keras's own
``keras.json``, else TensorFlow), and a Keras script is launched as a script of that framework
(:func:`keras_backend`).
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Mapping
from pathlib import Path

from dtpo.core.errors import ConfigError

FRAMEWORKS = ("torch", "jax", "tensorflow", "keras")
"""What ``--framework`` takes (``torch`` by default)."""

EXTRAS = {"torch": None, "jax": "jax", "tensorflow": "tensorflow", "keras": "keras"}
"""The dtpo extra that installs each framework (``None``: installed with dtpo)."""

_MODULES = {"torch": "torch", "jax": "jax", "tensorflow": "tensorflow", "keras": "keras"}
KERAS_BACKENDS = ("tensorflow", "jax", "torch")


def installed(framework: str) -> bool:
    """Whether ``framework``'s package can be imported here (checked without importing it)."""
    return importlib.util.find_spec(_MODULES[framework]) is not None


def require(framework: str) -> None:
    """Check that ``framework`` is one dtpo knows and that it is installed.

    Raises:
        ConfigError: Unknown, or not installed (one line naming the extra to install).
    """
    if framework not in FRAMEWORKS:
        raise ConfigError(f"--framework must be one of {', '.join(FRAMEWORKS)}, got {framework!r}")
    if not installed(framework):
        raise ConfigError(f"--framework {framework}: {_MODULES[framework]} is not installed here; install it with "
                          f"pip install 'dtpo[{EXTRAS[framework]}]'")
    if framework == "keras":
        backend = keras_backend()
        if backend not in KERAS_BACKENDS:
            raise ConfigError(f"KERAS_BACKEND={backend!r}: dtpo measures Keras on {', '.join(KERAS_BACKENDS)}")
        if not installed(backend):
            raise ConfigError(f"--framework keras computes on {backend} (KERAS_BACKEND), which is not installed "
                              f"here; install it with pip install 'dtpo[{EXTRAS[backend] or 'keras'}]' or choose "
                              "another KERAS_BACKEND")


def keras_backend(environ: Mapping[str, str] | None = None) -> str:
    """The backend Keras will compute on, as Keras itself decides: ``KERAS_BACKEND``, else the ``backend`` of
    ``$KERAS_HOME/keras.json`` (default ``~/.keras``), else ``tensorflow``."""
    env = os.environ if environ is None else environ
    named = env.get("KERAS_BACKEND", "").strip()
    if named:
        return named
    home = Path(env.get("KERAS_HOME") or Path(env.get("HOME", "~")).expanduser() / ".keras")
    try:
        backend = json.loads((home / "keras.json").read_text()).get("backend")
    except (OSError, ValueError, AttributeError):
        backend = None
    return backend if isinstance(backend, str) and backend else "tensorflow"


def computes_on(framework: str | None, environ: Mapping[str, str] | None = None) -> str:
    """The framework whose processes run the script: Keras's backend for ``keras``, ``torch`` for ``None``."""
    if framework is None:
        return "torch"
    return keras_backend(environ) if framework == "keras" else framework
