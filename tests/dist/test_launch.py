"""``dtpo launch`` through torch.distributed.run: multi-node rendezvous, failures, bad input."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import dtpo_cli, free_port

from dtpo.core.errors import LaunchError
from dtpo.core.record import RunRecord
from dtpo.dist.launch import parse_launch_args

SCRIPT = textwrap.dedent("""
    import sys, pathlib, torch, torch.nn.functional as F
    import dtpo
    fail_rank, fail_step = int(sys.argv[1]), int(sys.argv[2])
    torch.set_num_threads(1)
    session = dtpo.Session(warmup_steps=1, progress=False)
    pathlib.Path(session.run_dir, f"world-{session.rank}.txt").write_text(str(session.world_size))
    torch.manual_seed(0)
    model = session.wrap(torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = ((torch.randn(4, 8), torch.randint(0, 2, (4,))) for _ in iter(int, 1))
    with session:
        for x, y in session.batches(data, steps=6):
            if session.rank == fail_rank and session.step_count == fail_step:
                raise RuntimeError("injected failure")
            session.backward(F.cross_entropy(model(x), y))
            session.step(opt)
""")


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train_script.py"
    path.write_text(SCRIPT)
    return path


def test_torchrun_flags_pass_through_with_dtpo_flags_beside_them(script: Path) -> None:
    args = parse_launch_args(["--nnodes", "1:2", "--nproc-per-node", "3", "--max-restarts", "2", "--run-dir", "r",
                              "--backend", "gloo", str(script), "--lr", "0.1"])
    assert (args.nnodes, args.nproc_per_node, args.max_restarts) == ("1:2", "3", 2)
    assert (args.run_dir, args.backend) == ("r", "gloo")
    assert args.training_script == str(script) and args.training_script_args == ["--lr", "0.1"]


@pytest.mark.parametrize("argv, message", [
    (["--nnodes", "1:2:3", "S"], "--nnodes must be"),
    (["--nproc-per-node", "0", "S"], "--nproc-per-node must be"),
    (["--node-rank", "first", "S"], "invalid int value"),
    (["--rdzv-timeout", "-1", "S"], "--rdzv-timeout must be positive"),
    (["--backend", "mpi", "S"], "invalid choice"),
    (["missing_script.py"], "does not exist"),
    (["--nnodes", "2", "--rdzv-endpoint", "no-such-host.invalid:29500", "S"], "cannot resolve"),
])
def test_malformed_launch_arguments_raise_launch_error(script: Path, argv: list[str], message: str) -> None:
    argv = [str(script) if a == "S" else a for a in argv]
    with pytest.raises(LaunchError, match=message):
        parse_launch_args(argv)


def test_two_launchers_form_one_world_of_four(script: Path, tmp_path: Path) -> None:
    port = free_port()
    procs = []
    for node in (0, 1):
        cmd = dtpo_cli("launch", "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "2",
                       "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-timeout", "60",
                       "--run-dir", str(tmp_path / f"node{node}"), str(script), "-1", "-1")
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = [p.communicate(timeout=180)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    worlds = sorted((tmp_path / f"node{n}" / f"world-{r}.txt").read_text() for n, rs in ((0, (0, 1)), (1, (2, 3)))
                    for r in rs)
    assert worlds == ["4"] * 4
    record = RunRecord.load(tmp_path / "node0")
    assert [r.rank for r in record.ranks] == [0, 1, 2, 3]
    assert record.environment["nnodes"] == 2 and record.environment["world_size"] == 4


def test_a_run_that_fails_half_way_leaves_a_record(script: Path, tmp_path: Path) -> None:
    result = subprocess.run(dtpo_cli("launch", "--standalone", "--nproc-per-node", "2", "--run-dir",
                                     str(tmp_path / "run"), str(script), "1", "4"),
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 1, result.stderr
    assert "run failed" in result.stderr.splitlines()[-1]
    record = RunRecord.load(tmp_path / "run")
    assert record.status == "failed"
    failed = record.ranks[1]
    assert failed.error and "injected failure" in failed.error
    assert len(failed.steps) == 4  # steps 0..3 were measured before the failure at step 4


@pytest.mark.parametrize("backend_flags, message", [
    (["--node-rank", "1"], "could not reach the rendezvous endpoint"),  # static: the master never appears
    (["--rdzv-backend", "c10d"], "did not complete within 3 s"),  # c10d: the second node never joins
])
def test_unreachable_rendezvous_times_out_with_one_line(script: Path, backend_flags: list[str], message: str) -> None:
    start = time.monotonic()
    result = subprocess.run(dtpo_cli("launch", "--nnodes", "2", *backend_flags, "--rdzv-endpoint",
                                     f"127.0.0.1:{free_port()}", "--rdzv-timeout", "3", str(script)),
                            capture_output=True, text=True, timeout=120)
    assert time.monotonic() - start < 60
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert message in lines[-1] and lines[-1].startswith("dtpo: error:")
    assert "Traceback" not in result.stderr


def test_cli_errors_are_one_line_exit_2(tmp_path: Path) -> None:
    result = subprocess.run(dtpo_cli("launch", str(tmp_path / "nope.py")), capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.strip() == f"dtpo: error: training script {str(tmp_path / 'nope.py')!r} does not exist"


def test_launch_help_lists_torchrun_and_dtpo_flags() -> None:
    result = subprocess.run(dtpo_cli("launch", "--help"), capture_output=True, text=True)
    assert result.returncode == 0
    for flag in ("--nnodes", "--nproc-per-node", "--rdzv-endpoint", "--max-restarts", "--run-dir", "--rdzv-timeout"):
        assert flag in result.stdout


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
