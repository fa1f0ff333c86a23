"""Debian's Prometheus scrapes a running 2-worker ``dtpo train``; every query of the Grafana dashboard returns data.

On a machine without an NVIDIA GPU the run trains on two virtual GPUs (dtpo's NVML stand-in, read through the real
nvidia-ml-py binding; every figure from them simulated), so the GPU panels (``DCGM_*``) get data too; only where no C
compiler can build the stand-in are they checked for valid PromQL alone."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from conftest import REPO, dtpo_cli, free_port, http_json, require, started, wait_until

from dtpo.telemetry.dashboard import dashboard_queries, metric_names, resolve_query

SCRAPE_S = 1


def _gpu_visible() -> bool:
    """Whether this machine has an NVIDIA GPU dtpo can read (only then can DCGM_* series have data)."""
    from dtpo.devices.base import DeviceError
    from dtpo.devices.nvml import open_nvml_gpus

    try:
        gpus = open_nvml_gpus()
    except DeviceError:
        return False
    for gpu in gpus:
        gpu.close()
    return bool(gpus)


def _query(base: str, expr: str) -> list[dict]:
    answer = http_json(f"{base}/api/v1/query", {"query": expr})
    assert answer["status"] == "success", (expr, answer)
    return answer["data"]["result"]


def test_every_dashboard_query_returns_data_from_a_running_train(tmp_path: Path, artifacts: Path) -> None:
    prometheus = require("prometheus")
    dashboard = json.loads((REPO / "dashboards" / "dtpo.json").read_text())
    queries = dashboard_queries(dashboard)
    assert len(queries) >= 8
    exporter, server = free_port(), free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(f"global:\n  scrape_interval: {SCRAPE_S}s\n  evaluation_interval: {SCRAPE_S}s\n"
                      f"scrape_configs:\n  - job_name: dtpo\n    static_configs:\n"
                      f"      - targets: ['127.0.0.1:{exporter}']\n")
    base = f"http://127.0.0.1:{server}"
    gpu = _gpu_visible()
    env: dict[str, str] = {}
    if not gpu and any(shutil.which(c) for c in ("cc", "gcc", "clang")):
        from dtpo.devices.virtual_nvml.make import create

        env = create(tmp_path / "virtual-gpus", gpu="A40", count=2).environ()  # observe only: no --root
        gpu = True
    train = dtpo_cli("train", "--workload", "mlp", "--workers", "2", "--steps", "100000", "--window-steps", "5",
                     "--metrics-addr", f"127.0.0.1:{exporter}", "--run-dir", str(tmp_path / "run"),
                     "--store", str(tmp_path / "dtpo.sqlite"))
    with started([prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                  f"--web.listen-address=127.0.0.1:{server}"], artifacts / "prometheus.log"), \
            started(train, artifacts / "train-scraped.log", env=env) as run:
        wait_until(lambda: _ready(base), 120, "Prometheus answering")
        wait_until(lambda: run.poll() is None and _query(base, 'up{job="dtpo"} == 1'), 180,
                   "Prometheus scraping dtpo's endpoint")
        # Window figures (power, J/sample) appear after the first window; rate() needs a few scrapes more.
        wait_until(lambda: _query(base, "dtpo_energy_per_sample_joules"), 120, "a window's figures scraped")
        time.sleep(8 * SCRAPE_S)
        empty, skipped = [], []
        for title, expr in queries:
            resolved = resolve_query(expr)
            result = _query(base, resolved)
            if not result:
                if any(name.startswith("DCGM_") for name in metric_names(expr)) and not gpu:
                    skipped.append(title)  # valid PromQL (status success), but no GPU here to have data
                else:
                    empty.append(f"{title}: {resolved}")
        assert run.poll() is None, "the training ended before every query was checked"
    assert not empty, "queries without data:\n" + "\n".join(empty)
    (artifacts / "dashboard-queries.txt").write_text(
        f"{len(queries) - len(skipped)} of {len(queries)} dashboard queries returned data"
        f"{' (GPU panels from virtual GPUs: simulated)' if env else ''}; GPU-only panels without a GPU on this "
        f"machine (checked valid, no data possible): {', '.join(skipped) or 'none'}\n")


def _ready(base: str) -> bool:
    try:
        return http_json(f"{base}/api/v1/status/buildinfo")["status"] == "success"
    except OSError:
        return False
