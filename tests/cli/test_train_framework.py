"""``dtpo train --framework``: what another framework's built-in workload takes, checked before anything starts."""

from __future__ import annotations

import pytest

from dtpo.cli.train import check_framework
from dtpo.core import frameworks
from dtpo.core.config import RunConfig
from dtpo.core.errors import ConfigError


@pytest.fixture(autouse=True)
def _installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(frameworks, "installed", lambda name: name != "tensorflow")
    monkeypatch.setenv("KERAS_BACKEND", "jax")


def test_another_framework_trains_the_mlp() -> None:
    config = check_framework(RunConfig().replace(workload={"framework": "jax"}))
    assert config.workload.name == "mlp" and config.workload.framework == "jax"
    assert check_framework(RunConfig().replace(workload={"framework": "keras", "name": "mlp"})).workload.name == "mlp"
    torch = RunConfig()
    assert check_framework(torch) is torch  # PyTorch keeps every workload and every Session option


@pytest.mark.parametrize(("change", "message"), [
    ({"workload": {"name": "cnn"}}, "--framework jax trains the built-in mlp only, got --workload cnn"),
    ({"session": {"precision": "bf16-mixed"}}, "--precision bf16-mixed needs dtpo.Session"),
    ({"session": {"grad_accum": 2}}, "--grad-accum 2 needs dtpo.Session"),
    ({"launch": {"engine": "ray"}}, "--engine ray needs dtpo.Session"),
    ({"tune": {"knob": "stragglers"}}, "--tune stragglers needs dtpo.Session"),
])
def test_what_only_the_session_does_is_refused_in_one_line(change: dict[str, dict[str, object]], message: str) -> None:
    config = RunConfig().replace(workload={"framework": "jax"})
    for section, values in change.items():
        config = config.replace(**{section: values})
    with pytest.raises(ConfigError, match=message):
        check_framework(config)


def test_a_framework_not_installed_names_its_extra() -> None:
    with pytest.raises(ConfigError, match=r"pip install 'dtpo\[tensorflow\]'"):
        check_framework(RunConfig().replace(workload={"framework": "tensorflow"}))
    with pytest.raises(ConfigError, match=r"framework must be one of .* \(--framework\)"):
        RunConfig().replace(workload={"framework": "mxnet"})
