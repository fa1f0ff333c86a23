"""dtpo plan's configuration tree: one job source, a deadline or a budget, documented flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from dtpo.core.config_section import tree_fields
from dtpo.core.errors import ConfigError
from dtpo.core.plan_config import PlanConfig


@pytest.mark.parametrize("sections, message", [
    ({"source": {}}, r"^give one of: a scenario file, --from-run RUN_DIR, --from-bench BENCH_DIR$"),
    ({"source": {"scenario": "a.toml", "from_run": "runs/x"}}, r"^give one of"),
    ({"source": {"scenario": "a.toml"}, "choice": {"deadline": 1, "budget": 2}}, r"^give --deadline or --budget"),
    ({"source": {"scenario": "a.toml"}, "choice": {"deadline": -1}}, r"^--deadline must be positive, got -1$"),
    ({"source": {"scenario": "a.toml"}, "choice": {"budget": 0.0}}, r"^--budget must be positive, got 0$"),
    ({"source": {"scenario": "a.toml"}, "target": {"gpus_per_node": "8"}}, r"^target\.gpus_per_node must be an"),
])
def test_bad_requests_are_one_line(sections: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        PlanConfig.from_dict(sections)


def test_a_scenario_plan_keeps_its_values() -> None:
    config = PlanConfig.from_dict({"source": {"scenario": "a.toml"}, "choice": {"deadline": 12}})
    assert config.source.scenario == Path("a.toml") and config.choice.deadline == 12.0
    assert config.target.intra_link == "nvlink4" and config.output.json is None


def test_every_field_is_documented_and_the_scenario_is_the_argument() -> None:
    fields = tree_fields(PlanConfig)
    assert all(f.help for f in fields)
    assert [f.name for f in fields if f.argument] == ["scenario"]
    flags = [f.flag for f in fields if not f.argument]
    assert None not in flags and len(flags) == len(set(flags))
