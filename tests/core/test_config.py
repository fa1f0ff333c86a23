"""The configuration tree: validated where declared, documented under every field, round-trips as data."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from dtpo.core.config import (
    SECTIONS,
    EnergyConfig,
    KnobConfig,
    LaunchConfig,
    RunConfig,
    SessionConfig,
    TuneConfig,
    WorkloadConfig,
    config_fields,
    field_docs,
)
from dtpo.core.errors import ConfigError


@pytest.mark.parametrize("make, message", [
    (lambda: SessionConfig(grad_accum=0), r"^session\.grad_accum must be >= 1, got 0 \(--grad-accum\)$"),
    (lambda: SessionConfig(precision="fp8"), r"^session\.precision must be one of 32-true, bf16-mixed, 16-mixed"),
    (lambda: SessionConfig(strategy="zero"), r"session\.strategy must be one of ddp, fsdp"),
    (lambda: SessionConfig(warmup_steps=-1), r"session\.warmup_steps must be >= 0"),
    (lambda: SessionConfig(max_grad_norm=0.0), r"session\.max_grad_norm must be positive"),
    (lambda: SessionConfig(flush_every=0), r"session\.flush_every"),
    (lambda: SessionConfig(powersgd_rank=5), r"session\.powersgd_rank must be <= 4"),
    (lambda: SessionConfig(strategy="fsdp", compression="fp16"), r"session\.compression must be none with strategy"),
    (lambda: SessionConfig(grad_accum=True), r"session\.grad_accum must be an integer"),
    (lambda: SessionConfig(grad_accum="2"), r"session\.grad_accum must be an integer"),
    (lambda: WorkloadConfig(lr=math.nan), r"workload\.lr must be a finite number, got nan \(--lr\)"),
    (lambda: WorkloadConfig(lr=math.inf), r"workload\.lr must be a finite number"),
    (lambda: WorkloadConfig(lr=-1.0), r"workload\.lr must be positive"),
    (lambda: WorkloadConfig(seed=-1), r"workload\.seed must be >= 0"),
    (lambda: WorkloadConfig(seed=10**20), r"workload\.seed must be <="),
    (lambda: WorkloadConfig(steps=10**21), r"workload\.steps must be <="),
    (lambda: WorkloadConfig(batch_size=10**9), r"workload\.batch_size must be <="),
    (lambda: EnergyConfig(cpu_tdp_w=math.nan), r"energy\.cpu_tdp_w must be a finite number, got nan \(--cpu-tdp\)"),
    (lambda: EnergyConfig(grid_g_per_kwh=math.nan), r"energy\.grid_g_per_kwh must be a finite number"),
    (lambda: EnergyConfig(price_per_kwh=-1.0), r"energy\.price_per_kwh must be >= 0"),
    (lambda: KnobConfig(power_limit_w=math.inf),
     r"knobs\.power_limit_w must be a finite number, got inf \(--power-limit\)"),
    (lambda: KnobConfig(sm_clock_mhz=10**20), r"knobs\.sm_clock_mhz must be <="),
    (lambda: KnobConfig(mode="yolo"), r"knobs\.mode must be one of apply, dry-run, observe"),
    (lambda: LaunchConfig(workers=0), r"launch\.workers must be >= 1, got 0 \(--workers\)"),
    (lambda: LaunchConfig(run_dir=""), r"launch\.run_dir must name a directory"),
    (lambda: LaunchConfig(backend="mpi"), r"launch\.backend must be one of gloo, nccl"),
])
def test_bad_values_name_the_field_and_its_flag(make, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make()


def test_sections_are_keyword_only() -> None:
    with pytest.raises(TypeError):
        SessionConfig("32-true")  # type: ignore[misc]


def test_integers_are_accepted_where_numbers_are_expected() -> None:
    assert EnergyConfig(cpu_tdp_w=65).cpu_tdp_w == 65.0
    assert isinstance(EnergyConfig(cpu_tdp_w=65).cpu_tdp_w, float)


def test_every_field_is_documented_and_every_flag_is_unique() -> None:
    fields = config_fields()
    assert {f.section for f in fields} == set(SECTIONS)
    undocumented = [f.path for f in fields if not f.help]
    assert not undocumented
    flags = [f.flag for f in fields if f.flag]
    assert len(flags) == len(set(flags))
    assert field_docs(SessionConfig)["grad_accum"].startswith("Micro-batches per optimizer step")


def test_json_round_trip_keeps_every_value(tmp_path: Path) -> None:
    config = RunConfig(workload=WorkloadConfig(name="mlp", steps=7, lr=0.5, seed=3),
                       session=SessionConfig(precision="bf16-mixed", grad_accum=3, compression="powersgd",
                                             powersgd_rank=2),
                       energy=EnergyConfig(price_per_kwh=0.3, cpu_tdp_w=35.0),
                       knobs=KnobConfig(power_limit_w=250.0, mode="dry-run"),
                       launch=LaunchConfig(workers=3, threads_per_worker=1))
    path = config.save(tmp_path / "config.json")
    assert json.loads(path.read_text())["schema"] == "dtpo.config/1"
    assert RunConfig.load(path) == config
    assert RunConfig.load(tmp_path) == config  # a run directory works too


def test_toml_files_load(tmp_path: Path) -> None:
    (tmp_path / "run.toml").write_text('[workload]\nname = "cnn"\nsteps = 12\n[session]\ngrad_accum = 2\n')
    config = RunConfig.load(tmp_path / "run.toml")
    assert (config.workload.name, config.workload.steps, config.session.grad_accum) == ("cnn", 12, 2)
    assert config.energy == EnergyConfig()


@pytest.mark.parametrize("data, message", [
    ({"sesion": {}}, "unknown configuration section"),
    ({"session": {"grad_acum": 2}}, r"unknown setting\(s\) in session: grad_acum"),
    ({"session": {"grad_accum": 0}}, r"session\.grad_accum must be >= 1"),
    ({"session": 3}, "session must be a mapping"),
    ({"schema": "dtpo.config/99"}, "unsupported configuration schema"),
])
def test_bad_files_are_one_clear_error(data: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RunConfig.from_dict(data)


def test_unreadable_files_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no configuration file"):
        RunConfig.load(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid json"):
        RunConfig.load(tmp_path / "bad.json")


def test_replace_validates_again() -> None:
    config = RunConfig()
    assert config.replace(launch={"workers": 4}).launch.workers == 4
    with pytest.raises(ConfigError, match="launch.workers"):
        config.replace(launch={"workers": -1})


@pytest.mark.parametrize("sections, message", [
    ({"workload": {"steps": 2}}, r"^workload\.steps \(2\) must be larger than session\.warmup_steps \(2\)"),
    ({"workload": {"steps": 3}, "session": {"warmup_steps": 3}}, r"workload\.steps \(3\) must be larger"),
    ({"tune": {"knob": "power-limit"}, "knobs": {"power_limit_w": 200.0}},
     r"^--tune power-limit chooses the GPU settings itself; drop --power-limit / --sm-clock$"),
    ({"tune": {"knob": "both"}, "knobs": {"sm_clock_mhz": 1410}}, r"^--tune both chooses the GPU settings itself"),
    ({"tune": {"knob": "stragglers"}, "launch": {"workers": 1}}, r"^--tune stragglers .* needs --workers 2 or more$"),
    ({"tune": {"knob": "precision"}, "energy": {"enabled": False}},
     r"^--tune precision --cost zeus:0\.5 needs energy measured: drop --no-energy, or tune for --cost time$"),
    ({"tune": {"knob": "compression"}, "launch": {"workers": 1}}, r"^--tune compression needs DDP on 2 or more"),
    ({"tune": {"knob": "grad-accum,compression"}, "session": {"strategy": "fsdp"}},
     r"^--tune compression needs DDP on 2 or more workers"),
    ({"tune": {"knob": "rebalance"}, "launch": {"workers": 1}},
     r"^--tune rebalance moves samples between ranks: it needs --workers 2 or more$"),
    ({"tune": {"knob": "stragglers,rebalance"}, "launch": {"workers": 2}, "session": {"strategy": "fsdp"}},
     r"^--tune rebalance,stragglers needs --strategy ddp: FSDP shards"),
    ({"tune": {"knob": "rebalance"}, "launch": {"workers": 2}, "session": {"grad_accum": 2}},
     r"^--tune rebalance .* cannot yet combine with --grad-accum 2"),
    ({"tune": {"knob": "rebalance"}, "launch": {"workers": 2}, "workload": {"batch_size": 1}},
     r"^--tune rebalance needs at least 2 samples per rank"),
    ({"tune": {"knob": "rebalance,stragglers"}, "launch": {"workers": 2}, "knobs": {"power_limit_w": 200.0}},
     r"^--tune rebalance,stragglers chooses the GPU settings itself"),
])
def test_rules_across_sections_hold_for_every_way_in(sections: dict, message: str) -> None:
    """The same one-line error from the tree, a file's dict and a replace (what Session and dtpo train build)."""
    with pytest.raises(ConfigError, match=message):
        RunConfig.from_dict(sections)
    with pytest.raises(ConfigError, match=message):
        RunConfig().replace(**sections)
    built = {name: SECTIONS[name](**values) for name, values in sections.items()}
    with pytest.raises(ConfigError, match=message):
        RunConfig(**built)


@pytest.mark.parametrize("sections", [
    {"workload": {"steps": 3}},  # one measured step
    {"tune": {"knob": "precision", "cost": "time"}, "energy": {"enabled": False}},  # time needs no energy
    {"tune": {"knob": "grad-accum"}, "launch": {"workers": 1}},  # accumulation works on one worker
    {"knobs": {"power_limit_w": 200.0}, "tune": {"knob": "precision"}},  # fixed GPU knobs, tuned job knobs
    {"knobs": {"power_limit_w": 200.0}, "tune": {"knob": "rebalance"}, "launch": {"workers": 2}},  # moves samples
])
def test_consistent_sections_pass(sections: dict) -> None:
    assert RunConfig.from_dict(sections).to_dict() == RunConfig().replace(**sections).to_dict()


def test_rebalance_and_stragglers_are_one_tuner_in_either_order() -> None:
    for knob in ("rebalance,stragglers", "stragglers, rebalance"):
        tune = RunConfig.from_dict({"tune": {"knob": knob}, "launch": {"workers": 2}}).tune
        assert tune.knob == "rebalance,stragglers" and tune.rebalance and tune.stragglers
        assert tune.job_knobs == ()
    with pytest.raises(ConfigError, match=r"^tune.knob cannot combine rebalance with job knobs yet"):
        TuneConfig(knob="rebalance,precision")
    with pytest.raises(ConfigError, match=r"^tune.rebalance_max_share must be at least 1 .*--rebalance-max-share"):
        TuneConfig(knob="rebalance", rebalance_max_share=0.5)
    alone = TuneConfig(knob="rebalance")
    assert alone.rebalance and not alone.stragglers
    assert TuneConfig(knob="stragglers").stragglers and not TuneConfig(knob="stragglers").rebalance
