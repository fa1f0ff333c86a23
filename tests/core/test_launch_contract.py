"""The launcher-to-worker contract: every field survives the environment, bad values are one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from dtpo.core.errors import ConfigError
from dtpo.core.launch_contract import ENVIRON_NAMES, LaunchContract


def _environ(contract: LaunchContract) -> dict[str, str]:
    """What a worker sees: the variables set, the unset ones absent."""
    return {key: value for key, value in contract.to_environ().items() if value is not None}


@pytest.mark.parametrize("contract", [
    LaunchContract(),
    LaunchContract(config=Path("/r/config.json"), launched=True, run_dir=Path("/r"), backend="gloo"),
    LaunchContract(launched=True, launcher="ray", run_root=Path("runs"), run_pointer=Path("/tmp/p"), backend="nccl"),
])
def test_round_trip(contract: LaunchContract) -> None:
    assert LaunchContract.from_environ(_environ(contract)) == contract


def test_every_variable_is_named_and_unset_ones_are_none() -> None:
    environ = LaunchContract(launched=True, run_dir=Path("/r")).to_environ()
    assert tuple(environ) == ENVIRON_NAMES
    assert environ["DTPO_LAUNCHED"] == "1" and environ["DTPO_RUN_DIR"] == "/r"
    assert environ["DTPO_RUN_ROOT"] is None and environ["DTPO_CONFIG"] is None
    assert "DTPO_RUN_ID" not in environ


def test_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENVIRON_NAMES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DTPO_RUN_DIR", "somewhere")
    monkeypatch.setenv("DTPO_LAUNCHED", "")  # empty: unset
    contract = LaunchContract.from_environ()
    assert contract.run_dir == Path("somewhere") and not contract.launched and contract.config is None


def test_strings_become_paths() -> None:
    assert LaunchContract(run_dir="x", config="c.json").run_dir == Path("x")  # type: ignore[arg-type]


@pytest.mark.parametrize(("environ", "words"), [
    ({"DTPO_LAUNCHED": "maybe"}, ("DTPO_LAUNCHED", "'maybe'", "not a flag")),
    ({"DTPO_BACKEND": "mpi"}, ("DTPO_BACKEND", "'mpi'", "gloo")),
    ({"DTPO_LAUNCHER": " "}, ("DTPO_LAUNCHER", "not a launcher name")),
])
def test_bad_values_are_one_line_errors(environ: dict[str, str], words: tuple[str, ...]) -> None:
    with pytest.raises(ConfigError) as info:
        LaunchContract.from_environ(environ)
    message = str(info.value)
    assert "\n" not in message
    for word in words:
        assert word in message
