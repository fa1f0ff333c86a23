"""The frameworks dtpo knows, the extra that installs each, and the backend a Keras script computes on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dtpo.core import frameworks
from dtpo.core.errors import ConfigError
from dtpo.core.frameworks import computes_on, keras_backend, require


def test_keras_computes_on_its_backend_as_keras_decides(tmp_path: Path) -> None:
    home = tmp_path / "keras-home"
    home.mkdir()
    assert keras_backend({"KERAS_BACKEND": "jax", "KERAS_HOME": str(home)}) == "jax"  # the variable first
    assert keras_backend({"KERAS_HOME": str(home)}) == "tensorflow"  # nothing said: Keras's own default
    (home / "keras.json").write_text(json.dumps({"backend": "torch"}))
    assert keras_backend({"KERAS_HOME": str(home)}) == "torch"  # then keras.json
    (home / "keras.json").write_text("{not json")
    assert keras_backend({"KERAS_HOME": str(home)}) == "tensorflow"
    assert computes_on("keras", {"KERAS_BACKEND": "jax"}) == "jax"
    assert computes_on("jax") == "jax" and computes_on(None) == "torch"


def test_an_unknown_framework_or_a_missing_one_names_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="--framework must be one of torch, jax, tensorflow, keras, got 'mxnet'"):
        require("mxnet")
    monkeypatch.setattr(frameworks, "installed", lambda name: name == "torch")
    require("torch")
    with pytest.raises(ConfigError, match=r"jax is not installed here; install it with pip install 'dtpo\[jax\]'"):
        require("jax")
    monkeypatch.setattr(frameworks, "installed", lambda name: name in ("torch", "keras"))
    monkeypatch.setenv("KERAS_BACKEND", "jax")
    with pytest.raises(ConfigError, match=r"computes on jax \(KERAS_BACKEND\), which is not installed"):
        require("keras")
    monkeypatch.setenv("KERAS_BACKEND", "torch")
    require("keras")  # Keras on PyTorch needs nothing more
    monkeypatch.setenv("KERAS_BACKEND", "openvino")
    with pytest.raises(ConfigError, match="KERAS_BACKEND='openvino'"):
        require("keras")
