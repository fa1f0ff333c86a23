"""Every folder of tests is collected and every folder of code is linted: pytest's default ``norecursedirs`` and
ruff's default ``exclude`` both hold "dist", which silently skipped tests/dist and left src/dtpo/dist unchecked
until pyproject.toml set lists of its own."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path
from typing import Any

from conftest import REPO


def settings() -> dict[str, Any]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]


def folders(top: str) -> list[Path]:
    return [p for p in (REPO / top).rglob("*") if p.is_dir() and p.name != "__pycache__"]


def matching(paths: list[Path], patterns: list[str]) -> list[str]:
    return [str(p.relative_to(REPO)) for p in paths if any(fnmatch.fnmatch(p.name, pat) for pat in patterns)]


def test_no_test_folder_is_skipped_by_norecursedirs() -> None:
    tests = folders("tests")
    assert any(p.name == "dist" for p in tests)
    assert matching(tests, settings()["pytest"]["ini_options"]["norecursedirs"]) == []


def test_no_code_or_test_folder_is_excluded_from_lint() -> None:
    code = folders("src/dtpo") + folders("tests")
    assert any(p.name == "dist" for p in code)
    assert matching(code, settings()["ruff"]["exclude"]) == []
