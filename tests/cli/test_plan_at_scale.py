"""``dtpo plan`` on a scenario with tokens/s, a micro-batch's fixed part and a two-node point: the table says what
is lost to what, and the JSON carries it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_cli

SCENARIO = """
gpu = "A100"
gpu_counts = [8, 16, 64]
intra_link = "nvlink3"
inter_link = "ib-hdr"
precision = "16-mixed"
unit = "tokens/s"
sequence_length = 512
per_gpu_batch = {8 = 32, 16 = 16, 64 = 4}

[model]
parameters = 336000000

[baseline]
gpus = 8
throughput = 800000.0
multi_node_gpus = 16
multi_node_throughput = 1200000.0

[micro_batch]
times_s = {4 = 0.02, 32 = 0.10}
"""


def test_a_plan_in_tokens_with_a_fixed_part_and_a_framework_term(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.toml"
    path.write_text(SCENARIO)
    code, out, err = run_cli(["plan", str(path), "--json", str(tmp_path / "p.json"), "--run-dir", str(tmp_path / "r"),
                              "--store", str(tmp_path / "x.sqlite")], capsys)
    assert code == 0, out + err
    assert "- framework:" in out and "- micro-batch:" in out  # the assumptions say which calibration was used
    data = json.loads((tmp_path / "p.json").read_text())["plans"][0]
    rows = {r["gpus"]: r for r in data["predictions"]}
    assert data["unit"] == "tokens/s" and rows[8]["throughput_in_unit"] == pytest.approx(800000.0, rel=1e-9)
    assert rows[16]["throughput_in_unit"] == pytest.approx(1200000.0, rel=1e-6)  # the two-node point, fitted
    assert rows[64]["framework_s"] > 0 and rows[64]["losses"]["framework"] > 0
    assert rows[64]["losses"]["fixed"] > rows[8]["losses"]["fixed"]  # 4 per GPU pays the fixed part 8x as often
    assert rows[8]["sensitivity"] is None  # measured at two batch sizes: nothing assumed
    assert any(a.startswith("micro-batch:") and "fitted from batch sizes 4, 32" in a for a in data["assumptions"])
