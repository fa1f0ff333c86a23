"""``dtpo train --framework``: what another framework's built-in workload takes, checked before anything starts."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest import dtpo_cli
from frameworks.support import needs

from dtpo.cli.train import check_framework
from dtpo.core import frameworks
from dtpo.core.config import RunConfig
from dtpo.core.errors import ConfigError
from dtpo.core.record import RunRecord


@pytest.fixture(autouse=True)
def _installed(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    """Every framework but TensorFlow counts as installed, Keras on JAX (not for the runs of the real ones)."""
    if request.node.get_closest_marker("framework") is not None:
        return
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


@pytest.mark.slow
@pytest.mark.framework
@pytest.mark.parametrize("framework", [
    pytest.param("jax", marks=needs("jax")),
    pytest.param("tensorflow", marks=needs("tensorflow")),
    pytest.param("keras", marks=[needs("keras"), needs("jax")]),
])
def test_dtpo_train_runs_each_frameworks_mlp_on_two_workers(framework: str, tmp_path: Path) -> None:
    env = {**os.environ, "KERAS_BACKEND": "jax", "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "2"}
    result = subprocess.run(dtpo_cli("train", "--framework", framework, "--workers", "2", "--steps", "12",
                                     "--batch-size", "16", "--window-steps", "5", "--run-dir", str(tmp_path / "run")),
                            capture_output=True, text=True, timeout=400, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    record = RunRecord.load(tmp_path / "run")
    assert record.status == "completed" and [rank.rank for rank in record.ranks] == [0, 1]
    assert record.config["workload"]["framework"] == framework and record.config["workload"]["name"] == "mlp"
    assert record.config["session"]["window_steps"] == 5  # the launch's configuration reached the tracker
    for rank in record.ranks:
        assert len(rank.steps) == 12 and {step.samples for step in rank.steps} == {16}, f"rank {rank.rank}"
    assert record.energy["energy_j"].value > 0 and record.energy["energy_j"].source == "estimated"  # modelled CPU
    assert (tmp_path / "run" / "report.html").is_file()


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_the_launch_gets_restarts_backend_and_the_workload_of_each_framework(framework: str, tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import dtpo.distributed.launch as launch_module
    from dtpo.cli.train import launch_training

    seen: dict[str, object] = {}

    def launch(args: object, config: Path | None = None, agent_path: Path | None = None) -> None:
        seen.update(args=args, config=config, agent_path=agent_path)

    monkeypatch.setattr(launch_module, "launch", launch)
    config = RunConfig().replace(workload={"framework": framework, "name": "mlp", "steps": 7, "batch_size": 3},
                                 launch={"max_restarts": 2, "backend": "gloo", "workers": 2})
    launch_training(config, tmp_path)
    args = seen["args"]
    assert (args.max_restarts, args.backend, args.run_dir, args.nproc_per_node) == (2, "gloo", str(tmp_path), "2")
    assert seen["config"] == tmp_path / "config.json"
    if framework == "torch":
        assert (args.training_script, args.no_agent, args.framework) == ("dtpo.workloads.train", True, "torch")
    else:
        assert (args.training_script, args.framework, seen["agent_path"] is not None) == (
            "dtpo.workloads.jax_mlp", "jax", True)
        assert args.training_script_args == ["--steps", "7", "--batch-size", "3", "--seed", "0"]  # its own lr
