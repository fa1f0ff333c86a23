"""A tuning run killed with SIGKILL mid-profiling leaves its GPU changed, and the knob journal puts it back."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dtpo.devices.base import KnobState
from dtpo.devices.journal import KnobJournal, restore_pending, state_dir
from dtpo.devices.simulated import SimulatedGpu, SimulatedGpuConfig, reopen_simulated

CONFIG = SimulatedGpuConfig("A40", "resnet50", seed=3)

# argv: state file, journal folder ("" for the machine journal), steps after which to die
TUNE_AND_DIE = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from dtpo.devices.journal import state_dir
    from dtpo.devices.simulated import SimulatedGpu, SimulatedGpuConfig
    from dtpo.simulation.tuning import tune_on_simulated
    from dtpo.tune.cost import Energy

    state, journal_dir, die_after = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    gpu = SimulatedGpu(SimulatedGpuConfig("A40", "resnet50", seed=3), state)
    steps = 0

    def progress(n):
        global steps
        steps += n
        if steps >= die_after and state.exists():  # at least one power-limit change is in force
            print(f"killed after {steps} steps at {gpu.knob_state().power_limit_w:g} W", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    tune_on_simulated(gpu, Energy(), journal_dir=Path(journal_dir) if journal_dir else state_dir(),
                      progress=progress)
    print("finished without being killed", flush=True)
    sys.exit(3)
""")


@pytest.fixture(autouse=True)
def _state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DTPO_STATE_DIR", str(tmp_path / "state"))


def tune_and_die(state: Path, journal_dir: Path | None, die_after: int = 20) -> str:
    proc = subprocess.run([sys.executable, "-c", TUNE_AND_DIE, str(state), str(journal_dir or ""), str(die_after)],
                          capture_output=True, text=True, timeout=120, env=os.environ.copy())
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stdout, proc.stderr)
    return proc.stdout


@pytest.mark.slow
@pytest.mark.parametrize("where", ["own journal", "machine journal"])
def test_a_run_killed_mid_profiling_is_restored_from_the_journal(where: str, tmp_path: Path) -> None:
    state = tmp_path / "gpu0.json"
    journal = KnobJournal(tmp_path / "journal" / "knobs-journal.json") if where == "own journal" else KnobJournal()
    assert journal.path.parent == (tmp_path / "journal" if where == "own journal" else state_dir())
    out = tune_and_die(state, journal.path.parent if where == "own journal" else None)
    killed = re.fullmatch(r"killed after (\d+) steps at (\d+) W\n", out)
    assert killed is not None and int(killed[1]) >= 20, out

    # the GPU was left at a lower limit, and the journal knows its original settings
    assert state.exists()
    left = reopen_simulated(state).knob_state()
    assert left.power_limit_w < 300.0 and left.power_limit_w == float(killed[2])
    key = f"sim:{state}"
    assert set(journal.entries()) == {key}
    assert journal.original(key) == KnobState(300.0, None)

    lines = restore_pending(journal)
    assert len(lines) == 1 and lines[0].startswith("restored sim0") and "power limit 300 W" in lines[0]
    assert not state.exists()  # back at the defaults: the file has gone
    assert journal.entries() == {} and not journal.path.exists()
    assert SimulatedGpu(CONFIG, state).knob_state() == KnobState(300.0, None)
    assert restore_pending(journal) == []  # nothing left to do


# argv: journal folder, steps after which to die once a clock is locked
STRAGGLERS_AND_DIE = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from dtpo.devices.journal import KnobJournal
    from dtpo.simulation.job import JobConfig
    from dtpo.simulation.stragglers import run_job

    journal_dir, die_after = Path(sys.argv[1]), int(sys.argv[2])
    journal = KnobJournal(journal_dir / "knobs-journal.json")
    steps = 0

    def progress(n):
        global steps
        steps += n
        if steps >= die_after and journal.entries():  # some rank's clock is locked
            print(f"killed after {steps} steps with {len(journal.entries())} ranks locked", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    run_job(JobConfig("A40", "resnet50", gpus=4, steps=400, stragglers=((1, 1.3),)), True, journal_dir, progress)
    print("finished without being killed", flush=True)
    sys.exit(3)
""")


@pytest.mark.slow
def test_a_straggler_job_killed_with_locked_clocks_is_restored_from_the_journal(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", STRAGGLERS_AND_DIE, str(tmp_path), "60"], capture_output=True,
                          text=True, timeout=120, env=os.environ.copy())
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stdout, proc.stderr)
    killed = re.fullmatch(r"killed after \d+ steps with (\d) ranks locked\n", proc.stdout)
    assert killed is not None and int(killed[1]) >= 1, proc.stdout
    journal = KnobJournal(tmp_path / "knobs-journal.json")
    states = [Path(key.removeprefix("sim:")) for key in journal.entries()]
    assert states and all(path.exists() for path in states)  # each locked rank's GPU was left locked
    assert all(reopen_simulated(path).knob_state().locked_sm_clocks_mhz is not None for path in states)

    lines = restore_pending(journal)
    assert len(lines) == len(states)
    assert not any(path.exists() for path in states) and journal.entries() == {}
