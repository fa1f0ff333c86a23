"""The checkpoint section of the configuration tree: --checkpoint-every takes steps or a duration."""

from __future__ import annotations

import pytest

from dtpo.core.config import CheckpointConfig, LaunchConfig, RunConfig
from dtpo.core.errors import ConfigError


def test_every_is_steps_or_a_duration() -> None:
    assert CheckpointConfig().interval == (None, None) and not CheckpointConfig().enabled
    assert CheckpointConfig(every="100").interval == (100, None)
    assert CheckpointConfig(every=25).every == "25"  # type: ignore[arg-type]  # a number in a TOML file
    assert CheckpointConfig(every="90s").interval == (None, 90.0)
    assert CheckpointConfig(every="10m").interval == (None, 600.0)
    assert CheckpointConfig(every="1.5h").interval == (None, 5400.0)
    assert CheckpointConfig(resume=True).resume == "latest"  # type: ignore[arg-type]  # resume = true in TOML


@pytest.mark.parametrize("every", ["0", "10x", "m", "-5s", "", "inf s"])
def test_a_bad_interval_names_its_flag(every: str) -> None:
    with pytest.raises(ConfigError, match=r"checkpoint\.every must be .*\(--checkpoint-every\)"):
        CheckpointConfig(every=every)


def test_other_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match=r"--checkpoint-keep"):
        CheckpointConfig(keep=0)
    with pytest.raises(ConfigError, match=r"--resume"):
        CheckpointConfig(resume=" ")
    with pytest.raises(ConfigError, match=r"--max-restarts"):
        LaunchConfig(max_restarts=-1)


def test_old_configuration_files_load_without_the_section() -> None:
    config = RunConfig.from_dict({"session": {"grad_accum": 2}})
    assert config.checkpoint == CheckpointConfig() and config.launch.max_restarts == 0
    again = RunConfig.from_dict(config.replace(checkpoint={"every": "5m", "async_save": True}).to_dict())
    assert again.checkpoint.interval == (None, 300.0) and again.checkpoint.async_save
