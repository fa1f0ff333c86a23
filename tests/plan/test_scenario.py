"""The planner's scenario files: loading, defaults, accumulation per GPU count, one-line errors naming the field."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from dtpo.core.errors import ConfigError
from dtpo.plan.scenario import (
    DEFAULT_GRID_G_CO2_PER_KWH,
    DEFAULT_NODE_OVERHEAD_W,
    KNOWN_LINKS,
    Baseline,
    PowerSection,
    Prices,
    resolve_gpu,
)
from dtpo.plan.scenario_reader import load_scenario, scenario_from_dict

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "plan"

MINIMAL_TOML = """\
gpu = "H100"
gpu_counts = [8, 16, 64]
per_gpu_batch = 32

[model]
parameters = 1_000_000

[baseline]
gpus = 8
throughput = 1000.0
"""

FULL_TOML = """\
gpu = "A100"
gpus_per_node = 4
gpu_counts = [2, 4, 8, 16]
intra_link = "nvlink3"
inter_link = "ib-hdr"
nics_per_node = 2
fabric_efficiency = 0.8
strategy = "ddp"
precision = "16-mixed"
compression = "powersgd"
powersgd_rank = 2
per_gpu_batch = 64
grad_accum = { 2 = 16, 4 = 8, 8 = 4, 16 = 2 }

[model]
gradient_bytes = 680_000_000
flops_per_sample = 2.0e12

[baseline]
compute_s_per_sample = 0.002

[power]
setting = 300
node_overhead_w = 1200.0
pue = 1.3
waiting_power_fraction = 0.3
busy_power_w = 350.0

[prices]
per_gpu_hour = 2.5
per_kwh = 0.2
grid_g_co2_per_kwh = 300.0

[work]
epochs = 2.5
dataset_samples = 1000
"""


def valid() -> dict[str, Any]:
    """A minimal valid scenario as a dict (a fresh copy each time)."""
    return copy.deepcopy({"gpu": "H100", "gpu_counts": [8, 16, 64], "per_gpu_batch": 32,
                          "model": {"parameters": 1_000_000}, "baseline": {"gpus": 8, "throughput": 1000.0}})


def test_minimal_toml_fills_in_the_defaults(tmp_path: Path) -> None:
    path = tmp_path / "h100.toml"
    path.write_text(MINIMAL_TOML)
    scenario = load_scenario(path)
    assert scenario.gpu == "H100"
    assert scenario.gpu_counts == (8, 16, 64)
    assert scenario.gpus_per_node == 8
    assert (scenario.intra_link, scenario.inter_link, scenario.nics_per_node) == ("nvlink4", "ib-ndr", 8)
    assert scenario.fabric_efficiency is None
    assert (scenario.strategy, scenario.precision, scenario.compression) == ("ddp", "bf16-mixed", "none")
    assert scenario.powersgd_rank == 1
    assert scenario.grad_accum == 1 and scenario.accum_at(64) == 1
    assert scenario.model.gradient_dtype == "fp32"
    assert scenario.model.gradient_size_bytes == 4_000_000
    assert scenario.model.flops_per_sample is None
    assert scenario.baseline == Baseline(gpus=8, throughput=1000.0)
    assert scenario.baseline.kind == "throughput"
    assert scenario.power == PowerSection(setting="max", node_overhead_w=DEFAULT_NODE_OVERHEAD_W, pue=1.0)
    assert scenario.power.power_limit_w is None
    assert scenario.prices == Prices(per_gpu_hour=None, per_kwh=None, grid_g_co2_per_kwh=DEFAULT_GRID_G_CO2_PER_KWH)
    assert scenario.work is None
    assert scenario.source == str(path)
    assert scenario.power_spec is not None and scenario.power_spec.name == "H100-SXM"
    assert scenario.gpu_spec is not None and scenario.gpu_spec.name == "NVIDIA H100 SXM"


def test_full_toml_keeps_every_field(tmp_path: Path) -> None:
    path = tmp_path / "full.toml"
    path.write_text(FULL_TOML)
    scenario = load_scenario(path)
    assert scenario.gpus_per_node == 4 and scenario.gpu_counts == (2, 4, 8, 16)
    assert (scenario.intra_link, scenario.inter_link, scenario.nics_per_node) == ("nvlink3", "ib-hdr", 2)
    assert scenario.fabric_efficiency == 0.8
    assert scenario.jitter_cv is None and scenario.overlap_slowdown is None  # the planner's defaults
    assert (scenario.compression, scenario.powersgd_rank, scenario.precision) == ("powersgd", 2, "16-mixed")
    assert scenario.model.gradient_size_bytes == 680_000_000 and scenario.model.flops_per_sample == 2.0e12
    assert scenario.baseline is not None and scenario.baseline.kind == "compute_s_per_sample"
    assert scenario.power == PowerSection(setting=300.0, node_overhead_w=1200.0, pue=1.3,
                                          waiting_power_fraction=0.3, busy_power_w=350.0)
    assert scenario.power.power_limit_w == 300.0
    assert scenario.prices == Prices(per_gpu_hour=2.5, per_kwh=0.2, grid_g_co2_per_kwh=300.0)
    assert scenario.work is not None and scenario.work.total_samples == 2500


def test_json_scenario_loads_like_toml(tmp_path: Path) -> None:
    data = valid() | {"grad_accum": {"8": 4, "16": 2, "64": 1}, "work": {"samples": 10_000},
                      "model": {"parameters": 10, "gradient_dtype": "bf16"}}
    path = tmp_path / "h100.json"
    path.write_text(json.dumps(data))
    scenario = load_scenario(path)
    assert scenario.grad_accum == ((8, 4), (16, 2), (64, 1))
    assert scenario.model.gradient_size_bytes == 20
    assert scenario.work is not None and scenario.work.total_samples == 10_000
    assert scenario == scenario_from_dict(data, where=str(path))


def test_accumulation_per_gpu_count() -> None:
    scenario = scenario_from_dict(valid() | {"grad_accum": {"8": 8, "16": 4, "64": 1}})
    assert [scenario.accum_at(gpus) for gpus in scenario.gpu_counts] == [8, 4, 1]
    assert [scenario.samples_per_step(gpus) for gpus in scenario.gpu_counts] == [2048, 2048, 2048]
    assert scenario.nodes(16) == 2
    with pytest.raises(ConfigError, match="grad_accum has no entry for 32 GPUs"):
        scenario.accum_at(32)
    fixed = scenario_from_dict(valid() | {"grad_accum": 3})
    assert fixed.accum_at(8) == fixed.accum_at(12345) == 3


def test_python_int_keys_are_accepted_for_accumulation() -> None:
    scenario = scenario_from_dict(valid() | {"grad_accum": {8: 2, 16: 2, 64: 2}})
    assert scenario.accum_at(16) == 2


@pytest.mark.parametrize("name", ["H100", "A100", "V100", "A40", "H100-SXM", "A100-SXM", "MI250X", "L40S",
                                  "NVIDIA H100 PCIe", "h100"])
def test_known_gpus_are_accepted(name: str) -> None:
    assert scenario_from_dict(valid() | {"gpu": name}).gpu == name
    assert resolve_gpu(name) != (None, None)


def test_cpu_needs_a_measured_busy_power() -> None:
    scenario = scenario_from_dict(valid() | {"gpu": "CPU", "power": {"busy_power_w": 65.0}})
    assert scenario.gpu == "cpu" and scenario.is_cpu
    assert resolve_gpu("cpu") == (None, None)
    with pytest.raises(ConfigError, match="power.busy_power_w is required"):
        scenario_from_dict(valid() | {"gpu": "cpu"})


def test_small_counts_need_not_fill_a_node() -> None:
    assert scenario_from_dict(valid() | {"gpu_counts": [64, 1, 2, 4, 8]}).gpu_counts == (1, 2, 4, 8, 64)


def test_every_link_name_is_accepted() -> None:
    for link in KNOWN_LINKS:
        scenario = scenario_from_dict(valid() | {"intra_link": link, "inter_link": link})
        assert scenario.intra_link == scenario.inter_link == link


def test_run_dir_baseline(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "abc"
    run.mkdir(parents=True)
    (run / "record.json").write_text("{}")
    data = valid() | {"baseline": {"run_dir": "runs/abc"}}
    scenario = scenario_from_dict(data, base_dir=tmp_path)
    assert scenario.baseline == Baseline(run_dir=run) and scenario.baseline.kind == "run_dir"
    assert scenario_from_dict(valid() | {"baseline": {"run_dir": str(run)}}).baseline == Baseline(run_dir=run)
    with pytest.raises(ConfigError, match=r"^s.toml: baseline.run_dir: runs/abc has no record.json$"):
        scenario_from_dict(data, where="s.toml", base_dir=tmp_path / "elsewhere")


def test_flops_per_sample_replaces_a_baseline() -> None:
    data = valid()
    del data["baseline"]
    data["model"]["flops_per_sample"] = 1e9
    assert scenario_from_dict(data).baseline is None


def drop(*path: str):
    """A mutation that deletes ``data[path[0]][path[1]]...``."""
    def mutate(data: dict[str, Any]) -> None:
        target = data
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]
    return mutate


def put(value: Any, *path: str):
    """A mutation that sets ``data[path[0]][path[1]]... = value`` (creating tables on the way)."""
    def mutate(data: dict[str, Any]) -> None:
        target = data
        for key in path[:-1]:
            target = target.setdefault(key, {})
        target[path[-1]] = value
    return mutate


BAD = [
    # required fields and unknown keys
    ("missing gpu", drop("gpu"), "missing field 'gpu'"),
    ("missing gpu_counts", drop("gpu_counts"), "missing field 'gpu_counts'"),
    ("missing per_gpu_batch", drop("per_gpu_batch"), "missing field 'per_gpu_batch'"),
    ("missing model", drop("model"), "missing field 'model'"),
    ("unknown top key", put(8, "gpus_per_nod"), "unknown field 'gpus_per_nod' (did you mean 'gpus_per_node'?)"),
    ("unknown model key", put(1, "model", "paramters"), "unknown field 'model.paramters'"),
    ("unknown power key", put(1, "power", "voltage"), "unknown field 'power.voltage'"),
    ("unknown prices key", put(1, "prices", "per_hour"), "unknown field 'prices.per_hour'"),
    ("unknown work key", put(1, "work", "steps"), "unknown field 'work.steps'"),
    ("unknown baseline key", put(1, "baseline", "speed"), "unknown field 'baseline.speed'"),
    # hardware
    ("unknown gpu", put("Z9000", "gpu"), "gpu 'Z9000' is not a GPU model dtpo knows"),
    ("gpu not a string", put(100, "gpu"), "gpu must be a GPU model name, got 100"),
    ("gpus_per_node 0", put(0, "gpus_per_node"), "gpus_per_node must be a positive integer, got 0"),
    ("count not a multiple", put([8, 12], "gpu_counts"), "gpu_counts: 12 is not a multiple of gpus_per_node 8"),
    ("counts empty", put([], "gpu_counts"), "gpu_counts must be a non-empty list of positive integers"),
    ("counts not a list", put(8, "gpu_counts"), "gpu_counts must be a non-empty list"),
    ("count zero", put([8, 0], "gpu_counts"), "gpu_counts[1] must be a positive integer, got 0"),
    ("count twice", put([8, 16, 8], "gpu_counts"), "gpu_counts: 8 is listed twice"),
    ("bad intra link", put("nvlink9", "intra_link"), "intra_link must be one of nvlink3, nvlink4"),
    ("bad inter link", put("ib-xdr", "inter_link"), "inter_link must be one of"),
    ("nics 0", put(0, "nics_per_node"), "nics_per_node must be a positive integer, got 0"),
    ("efficiency 0", put(0, "fabric_efficiency"), "fabric_efficiency must be a number in (0, 1], got 0"),
    ("efficiency 1.5", put(1.5, "fabric_efficiency"), "fabric_efficiency must be a number in (0, 1], got 1.5"),
    ("jitter negative", put(-0.1, "jitter_cv"), "jitter_cv must be a number in [0, 1], got -0.1"),
    ("slowdown text", put("half", "overlap_slowdown"), "overlap_slowdown must be a number in [0, 1], got 'half'"),
    # model
    ("negative parameters", put(-3, "model", "parameters"), "model.parameters must be a positive integer, got -3"),
    ("fractional parameters", put(2.5, "model", "parameters"), "model.parameters must be a positive integer"),
    ("both sizes", put(10, "model", "gradient_bytes"), "model needs exactly one of parameters or gradient_bytes, "
                                                       "not both"),
    ("no size", drop("model", "parameters"), "model needs exactly one of parameters or gradient_bytes"),
    ("gradient_dtype", put("fp8", "model", "gradient_dtype"), "model.gradient_dtype must be one of fp32, bf16, fp16"),
    ("flops negative", put(-1.0, "model", "flops_per_sample"), "model.flops_per_sample must be a positive number"),
    ("model not a table", put(5, "model"), "model must be a table, got int"),
    # job
    ("strategy", put("zero3", "strategy"), "strategy must be one of ddp, fsdp, got 'zero3'"),
    ("precision", put("fp8", "precision"), "precision must be one of 32-true, bf16-mixed, 16-mixed"),
    ("compression", put("int8", "compression"), "compression must be one of none, fp16, bf16, powersgd"),
    ("fsdp compression", lambda d: d.update(strategy="fsdp", compression="fp16"),
     "compression must be none with strategy fsdp"),
    ("powersgd rank", put(5, "powersgd_rank"), "powersgd_rank must be an integer from 1 to 4, got 5"),
    ("batch 0", put(0, "per_gpu_batch"), "per_gpu_batch must be a positive integer, got 0"),
    ("batch bool", put(True, "per_gpu_batch"), "per_gpu_batch must be a positive integer, got True"),
    ("batch missing count", put({"8": 2, "16": 1}, "per_gpu_batch"),
     "per_gpu_batch: no per-GPU batch for 64 GPUs"),
    ("batch bad value", put({"8": 0, "16": 1, "64": 1}, "per_gpu_batch"), "per_gpu_batch.8 must be a positive integer"),
    ("accum 0", put(0, "grad_accum"), "grad_accum must be a positive integer, got 0"),
    ("accum missing count", put({"8": 2, "16": 1}, "grad_accum"), "grad_accum: no accumulation for 64 GPUs"),
    ("accum extra count", put({"8": 2, "16": 1, "64": 1, "32": 1}, "grad_accum"),
     "grad_accum: 32 GPUs is not in gpu_counts"),
    ("accum bad key", put({"eight": 2}, "grad_accum"), "grad_accum: key 'eight' must be a GPU count"),
    ("accum bad value", put({"8": 0, "16": 1, "64": 1}, "grad_accum"), "grad_accum.8 must be a positive integer"),
    # baseline
    ("no way to know compute", drop("baseline"), "needs baseline or model.flops_per_sample"),
    ("baseline without throughput", put({"gpus": 8}, "baseline"), "missing field 'baseline.throughput'"),
    ("baseline without gpus", put({"throughput": 5.0}, "baseline"), "missing field 'baseline.gpus'"),
    ("baseline throughput 0", put(0, "baseline", "throughput"), "baseline.throughput must be a positive number"),
    ("baseline gpus 0", put(0, "baseline", "gpus"), "baseline.gpus must be a positive integer, got 0"),
    ("baseline two forms", put(0.1, "baseline", "compute_s_per_sample"),
     "baseline needs exactly one of: gpus and throughput, run_dir, compute_s_per_sample"),
    ("baseline empty", put({}, "baseline"), "baseline needs exactly one of"),
    ("baseline run_dir", put({"run_dir": "runs/abc"}, "baseline"), "baseline.run_dir: runs/abc has no record.json"),
    ("baseline compute 0", put({"compute_s_per_sample": 0}, "baseline"),
     "baseline.compute_s_per_sample must be a positive number"),
    # power
    ("power setting word", put("low", "power", "setting"), "power.setting must be \"max\" or a power limit in W"),
    ("power limit below range", put(150, "power", "setting"),
     "power.setting 150 W is outside the H100-SXM's power-limit range 200-700 W"),
    ("power limit above range", put(900, "power", "setting"), "power.setting 900 W is outside"),
    ("node overhead negative", put(-1, "power", "node_overhead_w"), "power.node_overhead_w must be a number >= 0"),
    ("pue below 1", put(0.9, "power", "pue"), "power.pue must be a number >= 1, got 0.9"),
    ("untraced workload", put("gpt3/pile", "power", "workload"), "power.workload must be one of bert_base_uncased"),
    ("waiting fraction", put(1.5, "power", "waiting_power_fraction"),
     "power.waiting_power_fraction must be a number in [0, 1], got 1.5"),
    ("busy power 0", put(0, "power", "busy_power_w"), "power.busy_power_w must be a positive number"),
    ("power not a table", put("max", "power"), "power must be a table, got str"),
    # prices and work
    ("negative price", put(-1, "prices", "per_kwh"), "prices.per_kwh must be a number >= 0, got -1"),
    ("price not a number", put("cheap", "prices", "per_gpu_hour"), "prices.per_gpu_hour must be a number >= 0"),
    ("negative grid", put(-5, "prices", "grid_g_co2_per_kwh"), "prices.grid_g_co2_per_kwh must be a number >= 0"),
    ("work empty", put({}, "work"), "work needs samples, or epochs with dataset_samples"),
    ("work samples 0", put({"samples": 0}, "work"), "work.samples must be a positive integer, got 0"),
    ("work epochs alone", put({"epochs": 2}, "work"), "missing field 'work.dataset_samples'"),
    ("work dataset alone", put({"dataset_samples": 2}, "work"), "missing field 'work.epochs'"),
    ("work both forms", put({"samples": 5, "epochs": 2}, "work"), "work needs samples, or epochs with "
                                                                  "dataset_samples, not both"),
    ("work epochs 0", put({"epochs": 0, "dataset_samples": 5}, "work"), "work.epochs must be a positive number"),
]


@pytest.mark.parametrize(("mutate", "message"), [case[1:] for case in BAD], ids=[case[0] for case in BAD])
def test_bad_values_give_one_line_naming_the_field(mutate: Any, message: str, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # a relative run_dir is looked up here (and is not there)
    data = valid()
    mutate(data)
    with pytest.raises(ConfigError) as caught:
        scenario_from_dict(data, where="h100.toml")
    text = str(caught.value)
    assert "\n" not in text
    assert text.startswith("h100.toml: ")
    assert message in text


def test_top_level_must_be_a_table() -> None:
    with pytest.raises(ConfigError, match="the scenario must be a table, got list"):
        scenario_from_dict([1, 2])  # type: ignore[arg-type]


@pytest.mark.parametrize(("name", "text", "message"), [
    ("bad.toml", "gpu = \n", "bad.toml: not valid TOML: "),
    ("bad.json", "{\"gpu\": ", "bad.json: not valid JSON: "),
    ("scenario.yaml", "gpu: H100\n", "scenario.yaml: a scenario file must end in .toml or .json"),
    ("latin.toml", b"gpu = \"\xff\"\n", "latin.toml: not UTF-8 text"),
    ("list.json", "[1, 2]", "list.json: the scenario must be a table"),
])
def test_malformed_files_give_one_line(tmp_path: Path, name: str, text: str | bytes, message: str) -> None:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ConfigError) as caught:
        load_scenario(path)
    assert "\n" not in str(caught.value)
    assert str(caught.value).startswith(str(tmp_path / message.split(":")[0]))
    assert message.split(": ", 1)[1] in str(caught.value)


def test_missing_and_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such scenario file"):
        load_scenario(tmp_path / "absent.toml")
    folder = tmp_path / "folder.toml"
    folder.mkdir()
    with pytest.raises(ConfigError, match="cannot read it"):
        load_scenario(folder)


def test_bert_large_example_loads() -> None:
    scenario = load_scenario(EXAMPLES / "bert_large_dgx_a100.toml")
    assert scenario.gpu == "A100" and scenario.gpu_counts == (8, 16, 32, 64, 128, 256)
    assert (scenario.intra_link, scenario.inter_link, scenario.nics_per_node) == ("nvlink3", "ib-hdr", 8)
    assert {scenario.samples_per_step(gpus) for gpus in scenario.gpu_counts} == {65536}
    assert scenario.baseline == Baseline(gpus=8, throughput=4553.0)
    assert scenario.prices.per_gpu_hour == 2.0 and scenario.prices.per_kwh == 0.15
    assert scenario.model.parameters == 340_000_000


def test_h100_fabric_example_loads_for_both_fabrics(tmp_path: Path) -> None:
    source = EXAMPLES / "h100_ib_ndr_vs_roce.toml"
    scenario = load_scenario(source)
    assert scenario.gpu_counts == (8, 16, 32, 64, 128, 256, 512) and scenario.inter_link == "ib-ndr"
    assert scenario.power_spec is not None and scenario.power_spec.name == "H100-SXM"
    roce = tmp_path / "roce.toml"
    roce.write_text(source.read_text().replace('inter_link = "ib-ndr"', 'inter_link = "roce-100g"'))
    assert load_scenario(roce).inter_link == "roce-100g"
