"""Session settings are validated where they are declared."""

from __future__ import annotations

import pytest

from dtpo.core.errors import ConfigError
from dtpo.session.config import SessionConfig


@pytest.mark.parametrize("kwargs, message", [
    ({"precision": "fp8"}, "unknown precision"),
    ({"strategy": "zero"}, "unknown strategy"),
    ({"grad_accum": 0}, "grad_accum"),
    ({"warmup_steps": -1}, "warmup_steps"),
    ({"max_grad_norm": 0.0}, "max_grad_norm"),
    ({"flush_every": 0}, "flush_every"),
])
def test_bad_settings_raise_config_error(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SessionConfig(**kwargs)


def test_defaults_are_valid_and_serialisable() -> None:
    assert SessionConfig().to_dict()["precision"] == "32-true"
