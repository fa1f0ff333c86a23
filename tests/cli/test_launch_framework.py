"""``dtpo launch --framework`` and ``--coordinator-port``: what is refused before any worker starts, and how."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest
from conftest import dtpo_cli

from dtpo.core import frameworks
from dtpo.core.errors import LaunchError
from dtpo.core.launch_contract import LaunchContract
from dtpo.distributed.launch_args import parse_launch_args


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text("print('hello')\n")
    return path


@pytest.fixture
def everything_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(frameworks, "installed", lambda name: True)
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.delenv("KERAS_BACKEND", raising=False)


def test_the_framework_and_its_port_reach_the_workers_contract(script: Path, everything_installed: None) -> None:
    args = parse_launch_args(["--framework", "jax", str(script)])
    assert args.framework == "jax" and args.coordinator_port is None
    contract = LaunchContract(framework="jax", coordinator_port=29731)
    assert LaunchContract.from_environ({k: v for k, v in contract.to_environ().items() if v}) == contract
    assert parse_launch_args([str(script)]).framework == "torch"


@pytest.mark.parametrize(("argv", "message"), [
    (["--framework", "mxnet"], "--framework must be one of torch, jax, tensorflow, keras, got 'mxnet'"),
    (["--coordinator-port", "70000", "--framework", "jax"], "--coordinator-port must be a port number"),
    (["--coordinator-port", "29500"], "--coordinator-port is for --framework jax or tensorflow"),
])
def test_bad_framework_flags_are_one_line_errors(script: Path, everything_installed: None, argv: list[str],
                                                 message: str) -> None:
    with pytest.raises(LaunchError, match=message):
        parse_launch_args([*argv, str(script)])


def test_a_framework_not_installed_names_its_extra(script: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(frameworks, "installed", lambda name: name == "torch")
    with pytest.raises(LaunchError, match=r"tensorflow is not installed here; install it with pip install "
                                          r"'dtpo\[tensorflow\]'"):
        parse_launch_args(["--framework", "tensorflow", str(script)])


def test_a_tf_config_of_the_users_is_refused_not_replaced(script: Path, everything_installed: None,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0}}')
    with pytest.raises(LaunchError, match="TF_CONFIG is already set"):
        parse_launch_args(["--framework", "tensorflow", str(script)])
    monkeypatch.setenv("KERAS_BACKEND", "tensorflow")  # Keras on TensorFlow reads TF_CONFIG just the same
    with pytest.raises(LaunchError, match="TF_CONFIG is already set"):
        parse_launch_args(["--framework", "keras", str(script)])
    parse_launch_args(["--framework", "jax", str(script)])  # JAX does not read it


def test_a_coordinator_port_in_use_is_refused(script: Path, everything_installed: None) -> None:
    with socket.socket() as held:
        held.bind(("", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(LaunchError, match=f"port {port} is in use on this machine"):
            parse_launch_args(["--framework", "jax", "--coordinator-port", str(port), str(script)])
        # TensorFlow's workers take PORT + local rank: the second worker's port is the one held
        with pytest.raises(LaunchError, match=f"port {port} is in use"):
            parse_launch_args(["--framework", "tensorflow", "--nproc-per-node", "2", "--coordinator-port",
                               str(port - 1), str(script)])
        # JAX's coordinator runs beside rank 0: another node does not check its own port
        parse_launch_args(["--framework", "jax", "--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint",
                           "localhost:29400", "--rdzv-backend", "c10d", "--coordinator-port", str(port), str(script)])


@pytest.mark.slow
def test_on_the_command_line_an_unknown_framework_is_one_line_exit_2(script: Path, tmp_path: Path) -> None:
    result = subprocess.run(dtpo_cli("launch", "--framework", "mxnet", str(script)), capture_output=True, text=True,
                            cwd=tmp_path, timeout=120)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "--framework must be one of" in result.stderr
    assert not (tmp_path / "runs").exists()
