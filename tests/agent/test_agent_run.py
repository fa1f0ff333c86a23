"""An unmodified loop measured and tuned through the agent's producer, and the agent standing aside for a script
that reports its own steps."""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import dtpo
from dtpo.agent.activation import Agent
from dtpo.agent.channel import agent_context
from dtpo.agent.run import AgentRun
from dtpo.agent.torch_hooks import TorchHooks
from dtpo.agent.tracker import StepTracker
from dtpo.core.config import RunConfig
from dtpo.core.launch_contract import LaunchContract
from dtpo.core.record import RunRecord, load_partial_records
from dtpo.core.totals import record_from_partials
from dtpo.devices.base import KnobState
from dtpo.devices.discovery import Discovery
from dtpo.devices.simulated import SimulatedGpu, SimulatedGpuConfig
from dtpo.session.callbacks import builtin as builtin_callbacks
from dtpo.session.stream_run import StreamRun
from dtpo.simulation.tuning import default_setting, oracle, true_cost
from dtpo.tune.cost import parse_cost

GOAL = 1.02  # the choice's true cost within 2 % of the best setting of a noise-free sweep


def _loop(steps: int, batch: int, each_step: object = None) -> int:
    """A plain training loop that knows nothing of dtpo; ``each_step()`` is the test's stand-in for the GPU's
    work. Returns the samples it trained on."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = TensorDataset(torch.randn(steps * batch, 4), torch.randint(0, 2, (steps * batch,)))
    seen = 0
    for x, y in DataLoader(data, batch_size=batch):
        if callable(each_step):
            each_step()
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        seen += len(x)
    return seen


def test_tune_power_limit_on_an_unmodified_loop_with_a_simulated_gpu(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """``dtpo launch --tune power-limit`` on a loop with no dtpo call, as the agent runs it in a worker; the GPU is
    simulated (labelled so in the record), its clock drives the tuner's blocks."""
    monkeypatch.setenv("DTPO_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("DTPO_RUN_DIR", str(tmp_path / "run"))
    gpu = SimulatedGpu(SimulatedGpuConfig("A40", "resnet50", seed=1), tmp_path / "gpu.json")
    monkeypatch.setattr(builtin_callbacks, "discover", lambda **kw: Discovery([gpu], ["gpu: simulated"]))
    config = RunConfig().replace(tune={"knob": "power-limit", "cost": "energy"}, energy={"sample_interval_s": None},
                                 session={"window_steps": 20})
    runs: list[AgentRun] = []

    def open_run(tracker: StepTracker) -> AgentRun:
        runs.append(AgentRun(agent_context(torch.device("cpu")), config, "loop.py", clock=lambda: gpu.now_s))
        return runs[-1]

    def gpu_works() -> None:
        gpu.advance(*gpu.sample_steps(1))

    tracker = StepTracker(open_run)
    hooks = TorchHooks(tracker)
    hooks.install()
    total, batch = 1500, 16
    try:
        samples = _loop(total, batch, gpu_works)
        (run,) = runs
        tuner = next(cb for cb in run.callbacks if isinstance(cb, builtin_callbacks.TuneCallback)).tuner
        assert tuner is not None and tuner.holding and tuner.choice is not None
        held = tuner.choice
        assert gpu.knob_state().power_limit_w == held.power_limit_w  # in force while the loop trains on
    finally:
        hooks.remove()
    run.finish()
    assert gpu.knob_state() == KnobState(default_setting(gpu).power_limit_w, None)  # put back at the end
    cost = parse_cost("energy")
    best, best_cost = oracle(gpu, cost)
    assert true_cost(gpu, held, cost) <= GOAL * best_cost, (held, best)
    record = record_from_partials(tmp_path / "run", "completed", None)
    assert record is not None and record.status == "completed"
    (rank,) = record.ranks
    assert rank.tuning.applied is True and rank.tuning.source == "measured"
    assert len(rank.steps) == total and sum(s.samples for s in rank.steps) == samples == total * batch
    assert record.config["workload"]["name"] == "script:loop.py"
    assert record.energy["energy_j"]["value"] == pytest.approx(rank.energy["run"]["total_j"])
    # labelled as what it is: a simulated GPU's figure is never shown as measured
    assert [d["source"] for d in rank.energy["devices"]] == ["simulated"]
    assert record.energy["energy_j"].source == "estimated" and "simulated" in record.energy["energy_j"].note


@pytest.fixture
def agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Agent]:
    """The agent as a worker wakes it, in this process; everything it touched is put back afterwards."""
    monkeypatch.setattr(StreamRun, "opened", 0)
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    handler = signal.getsignal(signal.SIGTERM)
    woken = Agent(LaunchContract(agent=True, run_dir=tmp_path / "run"), None)
    monkeypatch.setenv("DTPO_RUN_DIR", str(tmp_path / "run"))
    woken.torch_imported(torch)
    try:
        yield woken
    finally:
        if woken.hooks is not None:
            woken.hooks.remove()
        signal.signal(signal.SIGTERM, handler)


def test_the_agent_records_a_plain_loop_and_ends_without_a_collective(agent: Agent, tmp_path: Path) -> None:
    samples = _loop(12, 8)
    agent.finish()
    (partial,) = load_partial_records(tmp_path / "run")
    assert partial.status == "completed"
    assert sum(s.samples for s in partial.ranks[0].steps) == samples
    assert partial.config["user"] == {"script": Path(sys.argv[0]).name, "measured_by": "dtpo launch agent"}


def test_the_scripts_own_error_is_its_own_in_the_record(agent: Agent, tmp_path: Path) -> None:
    _loop(6, 8)
    agent.error = ValueError("bad label 7")  # what the script died of (sys.excepthook saw it)
    agent.finish()
    (partial,) = load_partial_records(tmp_path / "run")
    assert partial.status == "failed" and partial.ranks[0].error == "ValueError: bad label 7"


def test_a_script_that_reports_its_own_steps_is_not_counted_twice(agent: Agent, tmp_path: Path) -> None:
    with dtpo.StepReporter(total_steps=6, run_dir=tmp_path / "own", progress=False, summary=False,
                           energy=False) as steps:
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(6):
            model(torch.randn(8, 4)).sum().backward()
            opt.step()
            steps.step(samples=8)
    assert agent.run is None and agent.tracker.active is False
    agent.finish()
    assert not (tmp_path / "run").exists()
    assert len(RunRecord.load(tmp_path / "own").ranks[0].steps) == 6
