"""What dtpo trusts to load: paths only this user (or root) can change."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dtpo.core.files import default_run_root, untrusted_reason


def test_a_private_folder_is_trusted(tmp_path: Path) -> None:
    folder = tmp_path / "mine"
    folder.mkdir(mode=0o700)
    (folder / "lib.so").write_bytes(b"")
    assert untrusted_reason(folder / "lib.so") is None


def test_writable_by_others_or_the_group_is_not(tmp_path: Path) -> None:
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(0o777)
    assert untrusted_reason(folder) == f"{folder} is writable by others"
    folder.chmod(0o770)
    assert untrusted_reason(folder) == f"{folder} is writable by its group"
    (folder / "lib.so").write_bytes(b"")
    assert untrusted_reason(folder / "lib.so") == f"{folder} is writable by its group"  # its folder is


def test_a_sticky_folder_above_is_allowed_but_not_as_the_path_itself(tmp_path: Path) -> None:
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)  # like /tmp: anyone may create, nobody may swap another's file
    mine = sticky / "mine"
    mine.mkdir(mode=0o700)
    assert untrusted_reason(mine) is None
    assert untrusted_reason(sticky) == f"{sticky} is writable by others"


def test_a_missing_path_says_so(tmp_path: Path) -> None:
    assert "cannot be inspected" in (untrusted_reason(tmp_path / "nowhere") or "")


def test_a_path_of_another_user_is_not(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    try:
        os.chown(theirs, 54321, -1)
    except PermissionError:
        pytest.skip("only root can give a folder to another user")
    assert untrusted_reason(theirs) == f"{theirs} belongs to another user (uid 54321)"


def test_run_directories_go_where_dtpo_run_root_says(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DTPO_RUN_ROOT", str(tmp_path / "elsewhere"))
    assert default_run_root() == tmp_path / "elsewhere"
    monkeypatch.delenv("DTPO_RUN_ROOT")
    assert default_run_root() == Path("runs")  # the working directory's, as before
