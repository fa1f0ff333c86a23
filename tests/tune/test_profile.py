"""Saved tuning profiles: loaded only from a folder nobody else can change."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from dtpo.tune.profile import JobFingerprint, ProfileStore
from dtpo.tune.setting import GpuSetting
from dtpo.tune.stats import Block, SettingStats

JOB = JobFingerprint("NVIDIA A40", 2, 512, "32-true", 1e9, "power-limit", "25W", "mlp")


def _saved(folder: Path) -> ProfileStore:
    store = ProfileStore(folder)
    stats = [SettingStats(GpuSetting(w), [Block(10, 640, 1.0, 200.0 * w / 300)]) for w in (300.0, 250.0)]
    assert store.save(JOB, stats, "energy", GpuSetting(250.0)) is not None
    return store


def test_a_profile_round_trips_from_a_private_folder(tmp_path: Path) -> None:
    store = _saved(tmp_path / "profiles")
    assert (tmp_path / "profiles").stat().st_mode & 0o777 == 0o700
    loaded = store.load(JOB)
    assert loaded is not None and set(loaded) == {GpuSetting(300.0), GpuSetting(250.0)}


def test_a_profile_others_could_have_planted_is_not_used(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = _saved(tmp_path / "profiles")
    (tmp_path / "profiles").chmod(0o777)
    with caplog.at_level(logging.WARNING):
        assert store.load(JOB) is None
    assert "is writable by others; profiling again" in caplog.text
