"""A worker killed mid-run under ``--max-restarts``: torchrun restarts the group, the workers resume from the last
checkpoint, and the run ends with the weights an uninterrupted run ends with, bit for bit."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import dtpo_cli

from dtpo.core.config import RunConfig
from dtpo.core.errors import ConfigError
from dtpo.core.record import RunRecord
from dtpo.distributed.launch import _restarts_possible
from dtpo.distributed.launch_args import parse_launch_args
from dtpo.session.checkpoint.files import MARKER
from dtpo.session.checkpoint.state import model_fingerprint
from dtpo.workloads import get_workload, with_workload_defaults
from dtpo.workloads.train import check_checkpoints

SCRIPT = textwrap.dedent("""
    import os, signal, sys
    import torch, torch.nn.functional as F
    import dtpo
    from dtpo.core.config import CheckpointConfig

    kill_at, out = int(sys.argv[1]), sys.argv[2]
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    with dtpo.Session(warmup_steps=1, energy=dtpo.EnergyConfig(sample_interval_s=None, cpu_tdp_w=20.0),
                      window_steps=2, flush_every=2, progress=False,
                      checkpoint=CheckpointConfig(every="3")) as session:
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.2),
                                  torch.nn.Linear(16, 3))
        model = session.wrap(net)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        session.attach(opt)
        gen = torch.Generator().manual_seed(100 + session.rank)
        data = ((x, (x.sum(1) > 0).long()) for x in (torch.randn(4, 8, generator=gen) for _ in range(10**6)))
        for x, y in session.batches(data, steps=10):
            if attempt == 0 and session.rank == 1 and session.step_count == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)  # after the checkpoint of step 6, before the end
            session.backward(F.cross_entropy(model(x), y))
            session.step(opt)
        if session.rank == 0:
            torch.save(net.state_dict(), out)
""")


def _launch(tmp_path: Path, name: str, kill_at: int, restarts: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(dtpo_cli("launch", "--standalone", "--nproc-per-node", "2", "--max-restarts", str(restarts),
                                   "--run-dir", str(tmp_path / name), str(tmp_path / "train.py"), str(kill_at),
                                   str(tmp_path / f"{name}.pt")),
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_a_killed_worker_is_restarted_and_the_run_ends_bit_identical(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    reference = _launch(tmp_path, "uninterrupted", -1, 0)
    assert reference.returncode == 0, reference.stderr
    result = _launch(tmp_path, "killed", 8, 1)
    assert result.returncode == 0, result.stderr
    assert "restarted the workers 1 time" in result.stderr
    expected, got = torch.load(tmp_path / "uninterrupted.pt"), torch.load(tmp_path / "killed.pt")
    assert expected.keys() == got.keys() and all(torch.equal(expected[k], got[k]) for k in expected)

    record = RunRecord.load(tmp_path / "killed")
    assert record.status == "completed" and record.attempt == 1
    assert record.resumed is not None and record.resumed["step"] == 6
    assert all([s.step for s in r.steps] == list(range(6, 10)) for r in record.ranks)
    [earlier] = record.restarts
    assert earlier.attempt == 0 and earlier.status == "failed" and "rank 1" in (earlier.error or "")
    assert earlier.reached_step == 8 and earlier.resumed_from_step == 6 and earlier.steps_lost == 2
    assert earlier.recovery_s is not None and earlier.recovery_s.value > 0
    assert earlier.recovery_energy_j is not None and earlier.recovery_energy_j.value > 0
    assert sorted(p.name for p in (tmp_path / "killed" / "checkpoints").iterdir()) == ["step-000006", "step-000009"]


# -- what dtpo train checks before launching --------------------------------------------------------------------


def _config(tmp_path: Path, **checkpoint: object) -> RunConfig:
    return with_workload_defaults(RunConfig().replace(workload={"name": "mlp"}, launch={"workers": 2},
                                                      checkpoint=checkpoint))


def _fake_checkpoint(root: Path, step: int, world_size: int, fingerprint: str) -> None:
    path = root / f"step-{step:06d}"
    path.mkdir(parents=True)
    (path / MARKER).write_text(json.dumps({"schema": "dtpo.checkpoint/1", "step": step, "world_size": world_size,
                                           "fingerprint": fingerprint, "files": {}}))


def test_bad_checkpoint_requests_stop_before_launch(tmp_path: Path) -> None:
    config = _config(tmp_path, resume="latest")
    with pytest.raises(ConfigError, match="--resume latest needs --checkpoint-dir"):
        check_checkpoints(config)
    with pytest.raises(ConfigError, match="no complete checkpoint in"):
        check_checkpoints(config, run_dir=tmp_path / "run")
    torch.manual_seed(0)
    mlp = model_fingerprint(get_workload("mlp").build_model())
    _fake_checkpoint(tmp_path / "four", 10, 4, mlp)
    with pytest.raises(ConfigError, match="written by 4 processes, this run has 2"):
        check_checkpoints(_config(tmp_path, resume=str(tmp_path / "four")))
    _fake_checkpoint(tmp_path / "cnn", 10, 2, model_fingerprint(get_workload("cnn").build_model()))
    with pytest.raises(ConfigError, match="of another model"):
        check_checkpoints(_config(tmp_path, resume=str(tmp_path / "cnn" / "step-000010")))
    _fake_checkpoint(tmp_path / "mine", 10, 2, mlp)
    check_checkpoints(_config(tmp_path, resume=str(tmp_path / "mine")))  # fine
    with pytest.raises(ConfigError, match="already holds checkpoints"):  # never overwritten
        check_checkpoints(_config(tmp_path, every="5", dir=str(tmp_path / "mine")))
    with pytest.raises(ConfigError, match="is a file"):
        (tmp_path / "file").write_text("")
        check_checkpoints(_config(tmp_path, every="5", dir=str(tmp_path / "file")))
    assert not (tmp_path / "run").exists()  # nothing was created


def test_the_launcher_gives_restarted_workers_a_fresh_store() -> None:
    args = parse_launch_args(["--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "-m", "json"])
    assert _restarts_possible(args)
    assert not _restarts_possible(parse_launch_args(["--standalone", "--nproc-per-node", "2", "-m", "json"]))


def _model_weights(checkpoint: Path, out: Path) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(checkpoint, out)
    return torch.load(out, weights_only=False)["train"]["model"]


@pytest.mark.slow
def test_the_builtin_workload_resumed_equals_one_never_stopped(tmp_path: Path) -> None:
    """``dtpo.workloads.train`` (what ``dtpo train`` runs), FSDP2: 3 steps, then 3 more resumed from its checkpoint,
    against 6 steps in one go."""
    strategy = "fsdp"

    def train(name: str, steps: int, **checkpoint: object) -> None:
        config = RunConfig().replace(workload={"name": "lm", "steps": steps, "batch_size": 2},
                                     session={"strategy": strategy, "warmup_steps": 1},
                                     energy={"enabled": False}, telemetry={"trace": False, "report": False},
                                     checkpoint={"every": "3", **checkpoint})
        path = config.save(tmp_path / f"{name}.json")
        result = subprocess.run(dtpo_cli("launch", "--standalone", "--nproc-per-node", "2", "--run-dir",
                                         str(tmp_path / name), "-m", "dtpo.workloads.train", str(path)),
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr

    train("first-half", 3)
    train("second-half", 6, resume=str(tmp_path / "first-half" / "checkpoints"))
    train("whole", 6)
    assert RunRecord.load(tmp_path / "second-half").resumed["step"] == 3  # type: ignore[index]
    resumed = _model_weights(tmp_path / "second-half" / "checkpoints" / "step-000006", tmp_path / "a.pt")
    whole = _model_weights(tmp_path / "whole" / "checkpoints" / "step-000006", tmp_path / "b.pt")
    assert resumed and resumed.keys() == whole.keys()
    assert all(torch.equal(resumed[k], whole[k]) for k in whole)


def _worker_pids(run_dir: Path) -> list[int]:
    """The processes whose environment names ``run_dir`` and that run the built-in training script."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if str(run_dir).encode() in (proc / "environ").read_bytes() and \
                    b"dtpo.workloads.train" in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
        except OSError:
            continue
    return found


@pytest.mark.slow
def test_dtpo_train_restarts_a_killed_worker_and_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    import os
    import signal
    import time

    run_dir = tmp_path / "run"
    proc = subprocess.Popen(dtpo_cli("train", "--workload", "mlp", "--workers", "2", "--steps", "400",
                                     "--warmup-steps", "1", "--checkpoint-every", "5", "--max-restarts", "1",
                                     "--run-dir", str(run_dir)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.monotonic() + 240
        while not list((run_dir / "checkpoints").glob(f"*/{MARKER}")):  # a complete checkpoint, then the kill
            assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint was written"
            time.sleep(0.2)
        workers = _worker_pids(run_dir)
        assert len(workers) == 2
        os.kill(max(workers), signal.SIGKILL)
        _, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    record = RunRecord.load(run_dir)
    assert record.status == "completed" and record.attempt == 1
    [earlier] = record.restarts
    assert earlier.status == "failed" and earlier.resumed_from_step is not None
    assert record.ranks[0].steps[-1].step == 399  # the run ended where an uninterrupted one does
