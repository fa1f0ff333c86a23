"""A function runs once a module has been imported, not before, and not twice."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import pytest

from dtpo.core.post_import import forget, when_imported


def test_the_callback_runs_after_the_module_ran(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "dtpo_watched_mod.py").write_text("VALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen: list[int] = []
    when_imported("dtpo_watched_mod", lambda module: seen.append(module.VALUE))
    try:
        assert seen == []  # nothing imported yet
        module = importlib.import_module("dtpo_watched_mod")
        assert seen == [42]
        assert module.__spec__ is not None and type(module.__spec__.loader).__name__ != "_Loader"
        importlib.reload(module)
        assert seen == [42]  # once
    finally:
        forget("dtpo_watched_mod")
        sys.modules.pop("dtpo_watched_mod", None)


def test_a_module_already_imported_gets_its_callback_at_once() -> None:
    seen: list[ModuleType] = []
    when_imported("json", seen.append)
    assert seen == [sys.modules["json"]]


def test_a_module_that_does_not_exist_still_fails_as_usual() -> None:
    when_imported("dtpo_no_such_module", lambda module: None)
    try:
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module("dtpo_no_such_module")
    finally:
        forget("dtpo_no_such_module")
