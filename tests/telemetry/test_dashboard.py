"""The Grafana dashboard: every panel has queries on metrics dtpo exports, and the committed copy is current."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dtpo.cli.dashboard import dashboard_command, write_dashboard
from dtpo.core.errors import ConfigError
from dtpo.telemetry.dashboard import (
    GPU_ROW,
    TUNER_SERIES,
    build_dashboard,
    dashboard_json,
    dashboard_queries,
    metric_names,
    resolve_query,
)
from dtpo.telemetry.metrics import exposed_names

COMMITTED = Path(__file__).resolve().parents[2] / "dashboards" / "dtpo.json"


def test_the_committed_dashboard_is_what_build_dashboard_makes() -> None:
    assert COMMITTED.read_text(encoding="utf-8") == dashboard_json(), \
        "dashboards/dtpo.json is stale: regenerate it with `dtpo dashboard --out dashboards/dtpo.json`"


def test_every_panel_has_queries_on_exported_metrics() -> None:
    dashboard = build_dashboard()
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert len(panels) >= 15
    for panel in panels:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            names = metric_names(target["expr"])
            assert names and names <= exposed_names(), (panel["title"], target["expr"])
            assert target["expr"].count("(") == target["expr"].count(")")
            assert target["expr"].count("{") == target["expr"].count("}")
    assert len(dashboard_queries(dashboard)) == sum(len(p["targets"]) for p in panels)
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])


def test_only_the_gpu_row_reads_dcgm_series() -> None:
    """A CPU-only run exports every dtpo_* series, so every panel outside the GPU row has data without a GPU."""
    row = None
    for panel in build_dashboard()["panels"]:
        if panel["type"] == "row":
            row = panel["title"]
            continue
        names = set().union(*(metric_names(t["expr"]) for t in panel["targets"]))
        on_gpu = {n for n in names if n.startswith("DCGM_")}
        if row == GPU_ROW:
            assert on_gpu == names and "GPU panel" in panel["description"], panel["title"]
        else:
            assert not on_gpu, panel["title"]


def test_the_headline_panels_are_there() -> None:
    queries = dict(dashboard_queries(build_dashboard()))
    assert "dtpo_device_power_watts" in queries["Fleet power by node"]
    assert "by (kind, source)" in queries["Fleet power by kind and source"]
    assert "dtpo_device_energy_joules_total" in queries["Energy per run"]
    assert "/" in queries["Throughput per watt"]
    assert "dtpo_step_share" in queries["Step breakdown, rank $rank"]
    assert "dtpo_sync_wait_seconds" in queries["Sync wait per rank"]
    assert "dtpo_knob_setting" in queries["Knob settings"]
    assert "dtpo_tuner_state" in queries["Tuner state"]
    assert queries["GPU power"].startswith("DCGM_FI_DEV_POWER_USAGE")


def test_variables_resolve_for_prometheus() -> None:
    dashboard = build_dashboard()
    names = [v["name"] for v in dashboard["templating"]["list"]]
    assert names == ["datasource", "run_id", "Hostname", "rank"]
    assert dashboard["templating"]["list"][1]["query"]["query"] == "label_values(dtpo_run_info, run_id)"
    for _, expr in dashboard_queries(dashboard):
        resolved = resolve_query(expr)
        assert "$" not in resolved, resolved
    assert resolve_query('x{run_id=~"$run_id"}', {"run_id": "abc"}) == 'x{run_id=~"abc"}'
    assert all(p.get("datasource", {}).get("uid") == "${datasource}" for p in dashboard["panels"]
               if p["type"] != "row")


def test_the_command_writes_the_file_or_stdout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "d.json"
    dashboard_command(out)
    assert json.loads(out.read_text()) == build_dashboard()
    write_dashboard(Path("-"))
    assert capsys.readouterr().out == dashboard_json()


@pytest.mark.parametrize("where", ["dir", "missing/d.json"])
def test_a_bad_out_path_is_one_line(tmp_path: Path, where: str) -> None:
    out = tmp_path if where == "dir" else tmp_path / where
    with pytest.raises(ConfigError, match="^--out ") as caught:
        write_dashboard(out)
    assert "\n" not in str(caught.value)


def test_a_tuners_own_series_is_read_only_with_a_fallback_every_run_has() -> None:
    """``dtpo_batch_share`` exists only under --tune rebalance: its panel falls back on the step counters."""
    queries = dict(dashboard_queries(build_dashboard()))
    share = queries["Batch share per rank"]
    assert share.startswith("dtpo_batch_share{") and " or on (run_id, Hostname, rank) " in share
    assert TUNER_SERIES <= exposed_names()
    for title, expr in queries.items():
        names = metric_names(expr)
        if names & TUNER_SERIES:
            assert " or " in expr and names - TUNER_SERIES, title
            assert not (metric_names(expr.split(" or ", 1)[1]) & TUNER_SERIES), title
    assert {"dtpo_samples_total", "dtpo_steps_total"} <= metric_names(share)
    assert "rate_interval" not in resolve_query(share)
