"""Every folder of tests is collected: pytest's default ``norecursedirs`` holds "dist", which silently skipped
tests/dist (the tests of dtpo.dist) until pyproject.toml set its own list."""

from __future__ import annotations

import fnmatch
import tomllib

from conftest import REPO


def test_no_test_folder_is_skipped_by_norecursedirs() -> None:
    options = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    patterns = options["norecursedirs"]
    folders = [p for p in (REPO / "tests").rglob("*") if p.is_dir() and p.name != "__pycache__"]
    assert any(p.name == "dist" for p in folders)
    skipped = [str(p.relative_to(REPO)) for p in folders if any(fnmatch.fnmatch(p.name, pat) for pat in patterns)]
    assert skipped == []
