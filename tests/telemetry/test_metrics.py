"""Live metrics: two processes write into one folder, one endpoint serves both; addresses are checked."""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import socket
import urllib.request
from pathlib import Path

import pytest

from dtpo.core.errors import ConfigError
from dtpo.telemetry.metrics import METRICS, RankMetrics, check_metrics_addr, exposed_names
from dtpo.telemetry.metrics_server import (
    ENDPOINT_FILE,
    MetricsServer,
    bind_error,
    collect_text,
    metrics_dir,
    prepare_metrics_dir,
)


def samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Scraped samples by sample name, each with its labels and value."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


def one(found: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    """The value of the only sample of ``name`` whose labels include ``labels``."""
    hits = [v for lab, v in found.get(name, []) if all(lab.get(k) == want for k, want in labels.items())]
    assert len(hits) == 1, (name, labels, found.get(name))
    return hits[0]


def _write_rank(directory: str, rank: int) -> None:
    """One rank's process: a few steps, a window, a GPU, knob and tuner changes."""
    metrics = RankMetrics(Path(directory), rank, "node-a", "run-1")
    for _ in range(3):
        metrics.step(0.1 * (rank + 1), 8)
    metrics.set("dtpo_throughput_samples_per_second", 80.0 / (rank + 1))
    metrics.set("dtpo_step_share", 0.7, "compute")
    metrics.set("dtpo_sync_wait_seconds", 0.01 * rank, "tail")
    metrics.set("dtpo_device_power_watts", 100.0 + rank, f"gpu{rank} (Fake)", "gpu", "nvml-counter")
    metrics.inc("dtpo_device_energy_joules_total", 10.0, f"gpu{rank} (Fake)", "gpu", "nvml-counter")
    metrics.inc("dtpo_device_energy_joules_total", 5.0, f"gpu{rank} (Fake)", "gpu", "nvml-counter")
    metrics.choose("dtpo_knob_choice", ("precision",), ("32-true",))
    metrics.choose("dtpo_knob_choice", ("precision",), ("bf16-mixed",))
    metrics.choose("dtpo_tuner_state", ("power",), ("profile",))
    metrics.gpu(rank, f"GPU-{rank}", "NVIDIA H100 80GB HBM3", 250.0 + rank, 1_000_000.0 + rank, 1410.0, 300.0)
    metrics.close()
    metrics.set("dtpo_step_seconds", 99.0)  # after close: ignored, no error


@pytest.mark.slow
def test_two_processes_are_served_by_one_endpoint(tmp_path: Path) -> None:
    directory = metrics_dir(tmp_path, "node-a")
    prepare_metrics_dir(directory)
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_write_rank, args=(str(directory), rank)) for rank in (0, 1)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
        assert proc.exitcode == 0
    server = MetricsServer(directory)
    url = server.start("127.0.0.1", 0)
    try:
        assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics")
        assert (directory / ENDPOINT_FILE).exists()
        with urllib.request.urlopen(url, timeout=10) as response:
            found = samples(response.read().decode())
    finally:
        server.stop()
    assert not (directory / ENDPOINT_FILE).exists()
    for rank in (0, 1):
        r = str(rank)
        base = {"rank": r, "Hostname": "node-a", "run_id": "run-1"}
        assert one(found, "dtpo_step_seconds", **base) == pytest.approx(0.1 * (rank + 1))
        assert one(found, "dtpo_steps_total", **base) == 3
        assert one(found, "dtpo_samples_total", **base) == 24
        assert one(found, "dtpo_throughput_samples_per_second", **base) == pytest.approx(80.0 / (rank + 1))
        assert one(found, "dtpo_step_share", part="compute", **base) == pytest.approx(0.7)
        assert one(found, "dtpo_sync_wait_seconds", basis="tail", **base) == pytest.approx(0.01 * rank)
        device = {"device": f"gpu{rank} (Fake)", "kind": "gpu", "source": "nvml-counter", **base}
        assert one(found, "dtpo_device_power_watts", **device) == pytest.approx(100.0 + rank)
        assert one(found, "dtpo_device_energy_joules_total", **device) == pytest.approx(15.0)
        assert one(found, "dtpo_knob_choice", knob="precision", value="bf16-mixed", **base) == 1
        assert one(found, "dtpo_knob_choice", knob="precision", value="32-true", **base) == 0
        assert one(found, "dtpo_tuner_state", tuner="power", state="profile", **base) == 1
        gpu = {"gpu": r, "UUID": f"GPU-{rank}", "device": f"nvidia{rank}", "modelName": "NVIDIA H100 80GB HBM3",
               "Hostname": "node-a"}
        assert one(found, "DCGM_FI_DEV_POWER_USAGE", **gpu) == pytest.approx(250.0 + rank)
        assert one(found, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", **gpu) == pytest.approx(1_000_000.0 + rank)
        assert one(found, "DCGM_FI_DEV_SM_CLOCK", **gpu) == 1410
        assert one(found, "DCGM_FI_DEV_POWER_MGMT_LIMIT", **gpu) == 300
    assert all("pid" not in labels for series in found.values() for labels, _ in series)
    assert {name.removesuffix("_created") for name in found} <= exposed_names()


def test_every_metric_is_documented_in_the_module_docstring() -> None:
    import dtpo.telemetry.metrics as module

    assert module.__doc__ is not None
    for spec in METRICS:
        assert f"``{spec.name}``" in module.__doc__, spec.name
        assert spec.kind in ("gauge", "counter")
        assert spec.kind != "counter" or spec.name.endswith("_total")


def test_the_folder_keeps_live_files_and_drops_dead_ones(tmp_path: Path) -> None:
    directory = tmp_path / "metrics" / "node"
    directory.mkdir(parents=True)
    dead = 2**22 + 12345  # above any pid_max default: no such process
    live = os.getpid()
    names = [f"gauge_mostrecent_dtpo-{dead}.db", f"counter_dtpo-{dead}.db", f"gauge_mostrecent_dtpo-{live}.db",
             f"counter_{dead}.db", ENDPOINT_FILE]  # the last two: not dtpo's metric files / rewritten anyway
    for name in names:
        (directory / name).write_bytes(b"")
    removed = prepare_metrics_dir(directory, keep_counters=True)
    assert [p.name for p in removed] == [f"gauge_mostrecent_dtpo-{dead}.db"]
    assert sorted(p.name for p in directory.iterdir()) == sorted(names[1:4])
    prepare_metrics_dir(directory)
    assert sorted(p.name for p in directory.iterdir()) == sorted(names[2:4])


def test_an_empty_folder_serves_an_empty_page(tmp_path: Path) -> None:
    directory = prepare_metrics_dir_path(tmp_path)
    assert collect_text(directory) == ""


def prepare_metrics_dir_path(tmp_path: Path) -> Path:
    directory = metrics_dir(tmp_path, "odd host/name")
    prepare_metrics_dir(directory)
    assert directory.name == "odd_host_name"
    return directory


def test_an_address_in_use_is_one_line_naming_the_flag() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(ConfigError) as caught:
            check_metrics_addr(f"127.0.0.1:{port}")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"--metrics-addr 127.0.0.1:{port}: address already in use")
    assert "--metrics-addr HOST:PORT" in message and "port 0" in message


def test_good_and_bad_addresses() -> None:
    assert check_metrics_addr("127.0.0.1:0") == ("127.0.0.1", 0)
    assert check_metrics_addr("0") == ("127.0.0.1", 0)
    with pytest.raises(ConfigError, match="--metrics-addr"):
        check_metrics_addr("127.0.0.1:99999")
    with pytest.raises(ConfigError, match="--metrics-addr"):
        check_metrics_addr("127.0.0.1:http")


@pytest.mark.parametrize(("code", "says"), [(errno.EADDRNOTAVAIL, "not an address of this machine"),
                                            (errno.EACCES, "permission denied"), (errno.EIO, "cannot listen there")])
def test_every_bind_failure_is_one_line_naming_the_flag(code: int, says: str) -> None:
    message = bind_error("--metrics-addr 10.9.8.7:80", "10.9.8.7", OSError(code, os.strerror(code)))
    assert message.startswith("--metrics-addr 10.9.8.7:80: ") and says in message and "\n" not in message


def test_a_port_taken_after_the_check_raises_oserror_from_the_server(tmp_path: Path) -> None:
    directory = prepare_metrics_dir_path(tmp_path)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        with pytest.raises(OSError):
            MetricsServer(directory).start("127.0.0.1", holder.getsockname()[1])
    assert not (directory / ENDPOINT_FILE).exists()


def test_the_endpoint_listens_on_loopback_unless_the_flag_names_a_host(tmp_path: Path) -> None:
    from dtpo.core.config import RunConfig

    assert RunConfig().telemetry.metrics_addr is None  # no endpoint at all without --metrics-addr
    directory = prepare_metrics_dir_path(tmp_path)
    for flag, host in (("0", "127.0.0.1"), (":0", "127.0.0.1"), ("0.0.0.0:0", "0.0.0.0")):
        server = MetricsServer(directory)
        url = server.start(*check_metrics_addr(flag))  # the address the socket was bound to
        try:
            assert url.startswith(f"http://{host}:"), flag
            assert json.loads((directory / ENDPOINT_FILE).read_text())["host"] == host
        finally:
            server.stop()
