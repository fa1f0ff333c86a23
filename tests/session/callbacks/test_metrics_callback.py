"""--metrics-addr on real Sessions: a 2-rank gloo run's endpoint serves both ranks; GPUs show under DCGM names;
an address taken by someone else costs the endpoint, never the training."""

from __future__ import annotations

import json
import socket
import sys
import types
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from conftest import run_ranks
from fakes import FakeNvml, FakeNvmlGpu
from torch import nn

import dtpo
from dtpo.core.config import RunConfig, SessionConfig, TelemetryConfig
from dtpo.core.record import StepRecord
from dtpo.core.steps import Window
from dtpo.core.tuner_status import ClockLock, SlackReading, SlackStatus, TunerState, TunerStatus
from dtpo.devices.discovery import Discovery
from dtpo.devices.nvml import open_nvml_gpus
from dtpo.session.callbacks.metrics import MetricsCallback
from dtpo.telemetry.dashboard import GPU_ROW, TUNER_SERIES, build_dashboard, metric_names
from dtpo.telemetry.metrics_server import ENDPOINT_FILE, collect_text, metrics_dir

UUID = "GPU-4a4b5c6d-0000-1111-2222-333344445555"


def parse(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


def config(addr: str, window_steps: int = 2) -> RunConfig:
    return RunConfig(session=SessionConfig(warmup_steps=1, window_steps=window_steps, count_flops=False),
                     telemetry=TelemetryConfig(metrics_addr=addr, trace=False, report=False))


def train(session: dtpo.Session, steps: int) -> None:
    torch.manual_seed(0)
    model = session.wrap(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = (torch.randn(4, 8), torch.randint(0, 2, (4,)))
    for x, y in session.batches((batch for _ in range(10**6)), steps=steps):
        session.backward(F.cross_entropy(model(x), y))
        session.step(opt)


def _scrape_while_training(rank: int, world_size: int, out: str) -> None:
    import torch.distributed as dist

    session = dtpo.Session(run_config=config("127.0.0.1:0"), run_dir=Path(out) / "run", progress=False,
                           summary=False)
    train(session, steps=7)
    dist.barrier()  # every rank has written its windows
    if rank == 0:
        directory = metrics_dir(session.run_dir, session.ctx.node)
        endpoint = json.loads((directory / ENDPOINT_FILE).read_text())
        with urllib.request.urlopen(endpoint["url"], timeout=30) as response:
            (Path(out) / "scrape.txt").write_text(response.read().decode())
        (Path(out) / "where.json").write_text(json.dumps({"dir": str(directory), "url": endpoint["url"]}))
    dist.barrier()  # the scrape is done before anyone stops
    session.finish()


@pytest.mark.slow
def test_a_two_rank_run_serves_both_ranks_on_one_endpoint(tmp_path: Path) -> None:
    run_ranks(_scrape_while_training, 2, str(tmp_path))
    found = parse((tmp_path / "scrape.txt").read_text())
    where = json.loads((tmp_path / "where.json").read_text())
    run_id = "run"

    def ranks(name: str, **labels: str) -> dict[str, float]:
        return {lab["rank"]: v for lab, v in found.get(name, [])
                if lab["run_id"] == run_id and all(lab.get(k) == want for k, want in labels.items())}

    assert set(ranks("dtpo_run_info", workload="script", world_size="2", strategy="ddp")) == {"0", "1"}
    assert ranks("dtpo_steps_total") == {"0": 7, "1": 7}
    assert ranks("dtpo_samples_total") == {"0": 28, "1": 28}
    for name in ("dtpo_step_seconds", "dtpo_throughput_samples_per_second"):
        values = ranks(name)
        assert set(values) == {"0", "1"} and all(v > 0 for v in values.values()), name
    for part in ("data_wait", "compute", "tail", "optimizer"):
        values = ranks("dtpo_step_share", part=part)
        assert set(values) == {"0", "1"} and all(0 <= v <= 1 for v in values.values()), part
    assert set(ranks("dtpo_sync_wait_seconds", basis="tail")) == {"0", "1"}  # no slack tracker in this run
    assert ranks("dtpo_knob_setting", knob="grad_accum") == {"0": 1, "1": 1}
    assert ranks("dtpo_knob_choice", knob="precision", value="32-true") == {"0": 1, "1": 1}
    assert ranks("dtpo_tuner_state", tuner="none", state="off") == {"0": 1, "1": 1}
    power = [(lab, v) for lab, v in found.get("dtpo_device_power_watts", []) if lab["run_id"] == run_id]
    assert power and all(lab["rank"] == "0" and lab["kind"] in ("cpu", "dram") for lab, _ in power)  # node-shared
    assert all(lab["source"] in ("rapl", "modelled") and v >= 0 for lab, v in power)
    assert set(ranks("dtpo_device_energy_joules_total")) == {"0"}
    assert set(ranks("dtpo_energy_per_sample_joules")) == {"0"}
    # Every series a panel outside the GPU row reads is there in a CPU-only run (a tuner's own series are read
    # only with a fallback on series that are, and are not here: no tuner in this run).
    scraped = {name.removesuffix("_created") for name in found}
    assert not scraped & TUNER_SERIES
    row = None
    for panel in build_dashboard()["panels"]:
        row = panel["title"] if panel["type"] == "row" else row
        if panel["type"] != "row" and row != GPU_ROW:
            for target in panel["targets"]:
                assert metric_names(target["expr"]) - TUNER_SERIES <= scraped, (panel["title"], target["expr"])
    # After the run: no endpoint, the files still hold the last values.
    assert not (Path(where["dir"]) / ENDPOINT_FILE).exists()
    with pytest.raises(OSError):
        urllib.request.urlopen(where["url"], timeout=5)
    after = parse(collect_text(Path(where["dir"])))
    assert {lab["rank"] for lab, _ in after["dtpo_steps_total"]} == {"0", "1"}


# -- GPUs under DCGM names, with a fake NVML ------------------------------------------------------------------


@pytest.fixture
def gpus(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    fake = FakeNvml([FakeNvmlGpu(UUID, energy_mj=5_000_000, power_mw=275_000, limit_mw=250_000)])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    opened = open_nvml_gpus()
    yield opened
    for gpu in opened:
        gpu.close()


def stub_session(tmp_path: Path, devices: list[Any]) -> Any:
    """Just what the callback reads of a Session: one rank on one GPU, its energy devices, no tuner."""
    ns = types.SimpleNamespace
    switch = ns(value=None)
    return ns(
        ctx=ns(local_rank=0, node="gpu-node"), run_dir=tmp_path / "run", rank=0, world_size=1,
        record=ns(run_id="run", attempt=0), run_config=RunConfig(), config=SessionConfig(),
        energy=ns(discovery=Discovery(devices=devices), windows=[{"time_s": 2.0}]), callbacks=[],
        switches={"precision": ns(value="bf16-mixed"), "grad_accum": ns(value=2), "compression": switch})


def test_gpu_figures_use_dcgm_names(tmp_path: Path, gpus: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))  # restored after the test
    session = stub_session(tmp_path, gpus)
    callback = MetricsCallback("127.0.0.1:0")
    callback.on_train_start(session)
    assert callback.server is not None and callback.server.url is not None
    for step in range(3):
        callback.on_step_end(session, StepRecord(step, step == 0, 8, 0.5, 0.05, 0.35, None, 0.1))
    name = gpus[0].info.name
    gpus[0].energy_j()  # the energy callback's window snapshot reads the counter
    callback.on_window_end(session, Window(0, 1, 2, 1.0, 16, 0.5, energy_j={name: 300.0},
                                           sources={name: "nvml-counter"},
                                           settings={"precision": "bf16-mixed", "grad_accum": 2}))
    with urllib.request.urlopen(callback.server.url, timeout=10) as response:
        found = parse(response.read().decode())
    callback.on_train_end(session, None)
    assert callback.server is None and callback.metrics is None
    labels = {"gpu": "0", "UUID": UUID, "device": "nvidia0", "modelName": "NVIDIA H100 80GB HBM3",
              "Hostname": "gpu-node"}
    for metric, value in (("DCGM_FI_DEV_POWER_USAGE", 275.0), ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 5_000_000.0),
                          ("DCGM_FI_DEV_POWER_MGMT_LIMIT", 250.0)):
        [(got, v)] = found[metric]
        assert {k: got[k] for k in labels} == labels and v == value, metric
    assert "DCGM_FI_DEV_SM_CLOCK" not in found  # this fake NVML cannot tell the clock: nothing is made up
    [(got, watts)] = found["dtpo_device_power_watts"]
    assert got["kind"] == "gpu" and got["source"] == "nvml-counter" and watts == pytest.approx(150.0)  # 300 J / 2 s
    assert dict((lab["knob"], v) for lab, v in found["dtpo_knob_setting"]) == {"grad_accum": 2, "power_limit_w": 250}
    [(got, share)] = [(lab, v) for lab, v in found["dtpo_step_share"] if lab["part"] == "compute"]
    assert share == pytest.approx(0.7)
    assert "tail" not in {lab["part"] for lab, _ in found["dtpo_step_share"]}  # FSDP-like: no tail measured
    assert found["dtpo_energy_per_sample_joules"][0][1] == pytest.approx(300.0 / 16)


# -- tuners found by what they implement, not by their class ------------------------------------------------------


class FakeTuner:
    """Any object with the :class:`TunerStatus` methods: no dtpo class to inherit."""

    def __init__(self, state: TunerState | None, lock: ClockLock | None) -> None:
        self.state, self.lock = state, lock

    def tuner_state(self) -> TunerState | None:
        return self.state

    def clock_lock(self) -> ClockLock | None:
        return self.lock


class FakeSlack:
    def latest_slack(self) -> SlackReading:
        return SlackReading(window=4, wait_s=(0.125, 0.0))


def test_tuners_and_slack_are_read_through_their_protocols(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))  # restored after the test
    session = stub_session(tmp_path, [])
    session.callbacks = [object(), FakeTuner(None, None), FakeTuner(TunerState("power", "hold"), ClockLock(1410.0)),
                         FakeTuner(TunerState("stragglers", "free"), ClockLock(900.0)), FakeSlack()]
    assert isinstance(session.callbacks[1], TunerStatus) and not isinstance(session.callbacks[0], TunerStatus)
    callback = MetricsCallback("127.0.0.1:0")
    callback.on_train_start(session)
    callback.on_window_end(session, Window(0, 1, 2, 1.0, 16, 0.5))
    assert callback.server is not None and callback.server.url is not None
    with urllib.request.urlopen(callback.server.url, timeout=10) as response:
        found = parse(response.read().decode())
    callback.on_train_end(session, None)
    states = {(lab["tuner"], lab["state"]) for lab, v in found["dtpo_tuner_state"] if v == 1}
    assert states == {("power", "hold"), ("stragglers", "free")}
    assert ("none", "off") not in states
    clocks = [v for lab, v in found["dtpo_knob_setting"] if lab["knob"] == "sm_clock_mhz"]
    assert clocks == [1410.0]  # the first callback with a say on the clock
    assert [(lab["basis"], v) for lab, v in found["dtpo_sync_wait_seconds"]] == [("slack", 0.125)]


class FakeRebalancer(FakeTuner):
    """A tuner that also hands out every rank's share of the global batch, as the rebalancer does."""

    def __init__(self, shares: tuple[int, ...] | None) -> None:
        super().__init__(None, None)
        self.shares = shares

    def tuner_state(self) -> TunerState:
        moved = self.shares is not None and len(set(self.shares)) > 1
        return TunerState("rebalance", "rebalanced" if moved else "even")

    def current_shares(self) -> tuple[int, ...] | None:
        return self.shares


def _scrape(tmp_path: Path, callbacks: list[Any], rank: int = 0, windows: int = 1,
            between: Any = None) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Start the callback on a stub session with ``callbacks``, end ``windows`` windows, scrape, stop."""
    session = stub_session(tmp_path, [])
    session.rank, session.world_size, session.callbacks = rank, 4, callbacks
    callback = MetricsCallback("127.0.0.1:0")
    callback.on_train_start(session)
    for index in range(windows):
        if between is not None:
            between(index)
        callback.on_window_end(session, Window(index, 1, 2, 1.0, 16, 0.5))
    assert callback.server is not None and callback.server.url is not None
    with urllib.request.urlopen(callback.server.url, timeout=10) as response:
        found = parse(response.read().decode())
    callback.on_train_end(session, None)
    return found


def test_the_batch_share_is_this_ranks_share_from_the_rebalancer(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path / "env"))  # restored after the test
    rebalancer = FakeRebalancer(None)
    shares = [(16, 16, 16, 16), (20, 11, 17, 16)]
    found = _scrape(tmp_path / "a", [object(), FakeTuner(TunerState("stragglers", "free"), None), rebalancer],
                    rank=1, windows=2, between=lambda i: setattr(rebalancer, "shares", shares[i]))
    assert [(lab["rank"], v) for lab, v in found["dtpo_batch_share"]] == [("1", 11.0)]  # the latest window's
    states = {(lab["tuner"], lab["state"]) for lab, v in found["dtpo_tuner_state"] if v == 1}
    assert states == {("stragglers", "free"), ("rebalance", "rebalanced")}


def test_no_batch_share_before_the_first_window_or_without_a_rebalancer(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path / "env"))  # restored after the test
    found = _scrape(tmp_path / "a", [FakeRebalancer(None)])
    assert "dtpo_batch_share" not in found
    assert {(lab["tuner"], lab["state"]) for lab, v in found["dtpo_tuner_state"] if v == 1} == {("rebalance", "even")}
    found = _scrape(tmp_path / "b", [FakeTuner(TunerState("power", "hold"), None), FakeSlack()])
    assert "dtpo_batch_share" not in found


# -- an address someone else holds --------------------------------------------------------------------------------


def test_a_taken_port_costs_the_endpoint_not_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capfd: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))  # restored after the test
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        session = dtpo.Session(run_config=config(f"127.0.0.1:{port}", window_steps=3), run_dir=tmp_path / "run",
                               progress=False, summary=False)
        train(session, steps=4)
        record = session.finish()
    assert record is not None and record.status == "completed"
    warnings = [line for line in capfd.readouterr().err.splitlines() if "metrics:" in line]
    assert len(warnings) == 1 and "warning" in warnings[0]
    assert f"--metrics-addr 127.0.0.1:{port}: address already in use" in warnings[0]
    assert "training goes on without the endpoint" in warnings[0]
    directory = metrics_dir(session.run_dir, session.ctx.node)
    assert not (directory / ENDPOINT_FILE).exists()
    found = parse(collect_text(directory))
    assert [v for _, v in found["dtpo_steps_total"]] == [4]


def test_the_builtin_tuners_implement_the_protocols() -> None:
    from dtpo.core.config import KnobConfig, TuneConfig
    from dtpo.session.tuning.gpu_knobs import KnobCallback
    from dtpo.session.tuning.job_knobs import JobTuneCallback
    from dtpo.session.tuning.power import TuneCallback
    from dtpo.session.tuning.slack import SlackCallback
    from dtpo.session.tuning.stragglers import StragglerCallback

    before_start = {
        TuneCallback(TuneConfig(knob="power-limit"), "apply", []): TunerState("power", "off"),
        JobTuneCallback(TuneConfig(knob="precision")): TunerState("job", "wait"),
        StragglerCallback("apply", []): TunerState("stragglers", "off"),
        KnobCallback(KnobConfig(sm_clock_mhz=1200), []): None,
    }
    for callback, state in before_start.items():
        assert isinstance(callback, TunerStatus)
        assert callback.tuner_state() == state and callback.clock_lock() is None  # nothing applied yet
    from dtpo.session.tuning.rebalance import RebalanceCallback

    rebalance = RebalanceCallback("apply", [], clocks=False)
    assert isinstance(rebalance, TunerStatus) and rebalance.tuner_state() == TunerState("rebalance", "off")
    assert rebalance.current_shares() is None  # no share before its first window: no dtpo_batch_share
    assert isinstance(SlackCallback(), SlackStatus) and SlackCallback().latest_slack() is None
    assert not isinstance(SlackCallback(), TunerStatus)
