"""``dtpo launch`` through torch.distributed.run: multi-node rendezvous, failures, bad input."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import dtpo_cli, free_port
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from dtpo.core.errors import LaunchError
from dtpo.core.record import RunRecord
from dtpo.distributed.launch import _describe_failures, launch
from dtpo.distributed.launch_args import parse_launch_args

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
    (["--nnodes", "0", "S"], "--nnodes must be N or MIN:MAX with 1 <= MIN <= MAX, got '0'"),
    (["--nnodes", "2:1", "S"], "--nnodes must be N or MIN:MAX with 1 <= MIN <= MAX, got '2:1'"),
    (["--nnodes", "x", "S"], "--nnodes must be"),
    (["--nproc-per-node", "0", "S"], "--nproc-per-node must be"),
    (["--node-rank", "first", "S"], "invalid int value"),
    (["--nnodes", "2", "--node-rank", "5", "S"], "--node-rank must be in 0..1 with --nnodes 2, got 5"),
    (["--node-rank", "-1", "S"], "--node-rank must be in"),
    (["--rdzv-timeout", "-1", "S"], "--rdzv-timeout must be a positive number of seconds"),
    (["--rdzv-timeout", "nan", "S"], "--rdzv-timeout must be a positive number of seconds .*got nan"),
    (["--rdzv-timeout", "inf", "S"], "--rdzv-timeout must be a positive number of seconds .*got inf"),
    (["--monitor-interval", "nan", "S"], "--monitor-interval must be"),
    (["--rdzv-backend", "foo", "--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:29500", "S"],
     "--rdzv-backend must be one of .*c10d.*static.*, got 'foo'"),
    (["--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:notaport", "S"],
     "--rdzv-endpoint must be HOST:PORT with a port in 0-65535, got '127.0.0.1:notaport'"),
    (["--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:99999", "S"], "--rdzv-endpoint must be HOST:PORT"),
    (["--nnodes", "2", "--rdzv-endpoint", ":::", "S"], "--rdzv-endpoint must be HOST:PORT"),
    (["--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:-5", "S"], "--rdzv-endpoint must be HOST:PORT"),
    (["--nnodes", "2", "--rdzv-backend", "c10d", "S"], "--rdzv-endpoint HOST:PORT is needed"),
    (["--master-port", "99999", "S"], "--master-port must be a port number in 1-65535, got 99999"),
    (["--master-port", "0", "S"], "--master-port must be a port number"),
    (["--rdzv-conf", "join_timeout=abc", "S"], "--rdzv-conf join_timeout must be a positive integer, got 'abc'"),
    (["--rdzv-conf", "timeout=-3", "S"], "--rdzv-conf timeout must be a positive integer"),
    (["--rdzv-conf", "is_host=maybe", "S"], "--rdzv-conf is_host must be true or false"),
    (["--rdzv-conf", "=3", "S"], "--rdzv-conf must be KEY=VALUE"),
    (["--standalone", "--nnodes", "2", "S"], "--standalone runs on one node"),
    (["--run-dir", "", "S"], "--run-dir must name a directory"),
    (["--backend", "mpi", "S"], "invalid choice"),
    (["missing_script.py"], "does not exist"),
    (["-m", "no_such_module_dtpo"], "module 'no_such_module_dtpo' \\(-m\\) was not found"),
    (["--nnodes", "2", "--rdzv-endpoint", "no-such-host.invalid:29500", "S"], "cannot resolve"),
])
def test_malformed_launch_arguments_raise_launch_error(script: Path, argv: list[str], message: str,
                                                       tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    before = sorted(tmp_path.iterdir())
    argv = [str(script) if a == "S" else a for a in argv]
    with pytest.raises(LaunchError, match=message) as info:
        parse_launch_args(argv)
    assert "\n" not in str(info.value)
    assert sorted(tmp_path.iterdir()) == before  # nothing created


def test_a_module_that_exists_is_accepted() -> None:
    args = parse_launch_args(["-m", "dtpo.workloads.train", "--steps", "3"])
    assert args.module and args.training_script == "dtpo.workloads.train"


@pytest.mark.slow
@pytest.mark.parametrize("argv, message", [
    (["--nnodes", "0"], "--nnodes must be N or MIN:MAX"),
    (["--rdzv-timeout", "nan"], "--rdzv-timeout must be a positive number of seconds"),
    (["--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:notaport"], "--rdzv-endpoint must be HOST:PORT"),
])
def test_bad_torchrun_values_end_in_one_line_on_the_command_line(script: Path, tmp_path: Path, argv: list[str],
                                                                 message: str) -> None:
    result = subprocess.run(dtpo_cli("launch", *argv, str(script)), capture_output=True, text=True, timeout=120,
                            cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dtpo: error: ") and message in lines[0], result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train_script.py"]  # no run directory left behind


def _failure(exitcode: int, local_rank: int) -> ProcessFailure:
    return ProcessFailure(local_rank=local_rank, pid=1000 + local_rank, exitcode=exitcode, error_file="/nonexistent")


@pytest.mark.parametrize("survivor_code", [-signal.SIGTERM, 128 + signal.SIGTERM])
def test_the_first_real_failure_is_reported_not_the_sigterm_of_the_survivors(survivor_code: int) -> None:
    exc = ChildFailedError("train", {0: _failure(survivor_code, 0), 1: _failure(1, 1), 2: _failure(survivor_code, 2)})
    assert _describe_failures(exc) == "rank 1 exited with code 1 (then 2 other ranks stopped)"


def test_a_rank_killed_by_a_signal_is_named() -> None:
    exc = ChildFailedError("train", {3: _failure(-signal.SIGKILL, 1)})
    assert _describe_failures(exc) == "rank 3 was killed by SIGKILL"


@pytest.mark.slow
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


@pytest.mark.slow
def test_a_run_that_fails_half_way_leaves_a_record(script: Path, tmp_path: Path) -> None:
    result = subprocess.run(dtpo_cli("launch", "--standalone", "--nproc-per-node", "2", "--run-dir",
                                     str(tmp_path / "run"), str(script), "1", "4"),
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 1, result.stderr
    last = result.stderr.splitlines()[-1]
    assert "run failed: rank 1 exited with code 1" in last, result.stderr  # not the SIGTERM rank 0 received
    record = RunRecord.load(tmp_path / "run")
    assert record.status == "failed"
    failed = record.ranks[1]
    assert failed.error and "injected failure" in failed.error
    assert len(failed.steps) == 4  # steps 0..3 were measured before the failure at step 4


@pytest.mark.slow
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
    assert "frame #" not in result.stderr and "c10d" not in result.stderr  # the C++ noise went to launcher.log
    assert len(lines) == 1, result.stderr


@pytest.mark.slow
def test_cli_errors_are_one_line_exit_2(tmp_path: Path) -> None:
    result = subprocess.run(dtpo_cli("launch", str(tmp_path / "nope.py")), capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.strip() == f"dtpo: error: training script {str(tmp_path / 'nope.py')!r} does not exist"


@pytest.mark.slow
def test_launch_help_lists_torchrun_and_dtpo_flags() -> None:
    result = subprocess.run(dtpo_cli("launch", "--help"), capture_output=True, text=True)
    assert result.returncode == 0
    for flag in ("--nnodes", "--nproc-per-node", "--rdzv-endpoint", "--max-restarts", "--run-dir", "--rdzv-timeout"):
        assert flag in result.stdout


PLAIN = textwrap.dedent("""
    import os, pathlib, signal, sys, time
    signal.signal(signal.SIGINT, lambda *_: sys.exit(130))   # quiet workers: the launcher's output is under test
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    mode = sys.argv[1]
    rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    pathlib.Path(sys.argv[2], f"started-{rank}-{attempt}").write_text("")
    if mode == "fail-first-attempt" and rank == 1 and attempt == 0:
        sys.exit(3)
    if mode == "wait":
        time.sleep(120)
""")


@pytest.fixture
def plain(tmp_path: Path) -> Path:
    path = tmp_path / "plain.py"
    path.write_text(PLAIN)
    (tmp_path / "marks").mkdir()
    return path


@pytest.mark.slow
def test_a_script_without_a_session_says_nothing_was_recorded_and_leaves_no_directory(plain: Path,
                                                                                      tmp_path: Path) -> None:
    result = subprocess.run(dtpo_cli("launch", "--standalone", "--nproc-per-node", "1", "--no-agent", str(plain),
                                     "ok", str(tmp_path / "marks")), capture_output=True, text=True, timeout=120,
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "nothing was recorded" in lines[0] and "dtpo.Session" in lines[0], result.stderr
    assert not (tmp_path / "runs").exists()  # neither the run directory nor the runs/ it would have been in


@pytest.mark.slow
def test_restarts_are_counted_with_the_error_of_each_failed_attempt(plain: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    args = parse_launch_args(["--standalone", "--nproc-per-node", "2", "--max-restarts", "2", "--monitor-interval",
                              "0.2", "--run-dir", str(tmp_path / "run"), str(plain), "fail-first-attempt",
                              str(tmp_path / "marks")])
    outcome = launch(args)
    assert not outcome.failed and outcome.signal is None and not outcome.interrupted
    assert outcome.restarts == 1  # torchrun restarted once; TORCHELASTIC_RESTART_COUNT told the workers
    assert sorted(p.name for p in (tmp_path / "marks").iterdir()) == [
        "started-0-0", "started-0-1", "started-1-0", "started-1-1"]
    assert outcome.attempt_errors == ("local rank 1 exited with code 3",)
    assert not outcome.recorded and not (tmp_path / "run").exists()


def _wait_for(path: Path, count: int, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while len(list(path.iterdir())) < count:
        assert time.monotonic() < deadline, f"workers did not start: {list(path.iterdir())}"
        time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.parametrize("sig, whom, code", [(signal.SIGINT, "group", 130), (signal.SIGTERM, "launcher", 143)])
def test_an_interrupt_ends_the_launch_in_one_line(plain: Path, tmp_path: Path, sig: int, whom: str,
                                                  code: int) -> None:
    proc = subprocess.Popen(dtpo_cli("launch", "--standalone", "--nproc-per-node", "2", "--run-dir",
                                     str(tmp_path / "run"), str(plain), "wait", str(tmp_path / "marks")),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            start_new_session=True)
    try:
        _wait_for(tmp_path / "marks", 2)
        if whom == "group":  # Ctrl-C: the terminal signals the whole foreground process group
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == code, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("dtpo: ")  # "dtpo: " or "dtpo: error: ", as the CLI words exit codes other than 2
    assert lines[0].endswith(f"interrupted by {signal.Signals(sig).name}; nothing was recorded"), lines


NODE_SCRIPT = textwrap.dedent("""
    import torch, torch.nn.functional as F
    import dtpo
    torch.set_num_threads(1)
    session = dtpo.Session(warmup_steps=1, progress=False)
    model = session.wrap(torch.nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = ((torch.randn(2, 4), torch.randint(0, 2, (2,))) for _ in iter(int, 1))
    with session:
        for x, y in session.batches(data, steps=3):
            session.backward(F.cross_entropy(model(x), y))
            session.step(opt)
""")


@pytest.mark.slow
def test_static_multi_node_without_a_run_dir_agrees_on_one_run_id(tmp_path: Path) -> None:
    script = tmp_path / "node_script.py"
    script.write_text(NODE_SCRIPT)
    port, procs = free_port(), []
    for node in (0, 1):
        (tmp_path / f"node{node}").mkdir()
        cmd = dtpo_cli("launch", "--nnodes", "2", "--node-rank", str(node), "--rdzv-backend", "static",
                       "--master-addr", "127.0.0.1", "--master-port", str(port), "--nproc-per-node", "1",
                       "--rdzv-timeout", "60", str(script))
        env = {k: v for k, v in os.environ.items() if k != "DTPO_RUN_ROOT"}  # the default: runs/ in each cwd
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      cwd=tmp_path / f"node{node}", env=env))
    outputs = [p.communicate(timeout=180)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    dirs = [sorted(p.name for p in (tmp_path / f"node{n}" / "runs").iterdir()) for n in (0, 1)]
    assert len(dirs[0]) == 1 and dirs[0] == dirs[1], dirs  # one run id, no orphan directory on node 1
    record = RunRecord.load(tmp_path / "node0" / "runs" / dirs[0][0])
    assert record.run_id == dirs[0][0] and [r.rank for r in record.ranks] == [0, 1]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
