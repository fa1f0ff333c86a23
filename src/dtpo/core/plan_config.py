"""The configuration tree of ``dtpo plan``: what to plan, the hardware to plan it on, what to pick, where to write.

::

    PlanConfig
      source  PlanSourceConfig   a scenario file, a measured run (--from-run) or a bench (--from-bench)
      target  PlanTargetConfig   the hardware a run or bench is planned on: GPU, counts, nodes, links
      choice  PlanChoiceConfig   other links to compare, a deadline or a budget to pick a configuration by
      output  PlanOutputConfig   plot, JSON, run directory and run store

Every field carries its documentation under it and its flag in its metadata; ``dtpo plan``'s flags are
generated from them (:mod:`dtpo.cli.options`). What the values must agree on is checked here, in one line
naming the flags; what needs the planner (a link's name, a scenario's contents, a plot's format) is checked
by the planner.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from dtpo.core.config_section import Section, Tree, argument, flag
from dtpo.core.errors import ConfigError

__all__ = ["PlanChoiceConfig", "PlanConfig", "PlanOutputConfig", "PlanSourceConfig", "PlanTargetConfig"]


@dataclass(kw_only=True)
class PlanSourceConfig(Section):
    """The job to plan: exactly one of a scenario file, a measured run and a bench."""

    SECTION: ClassVar[str] = "source"

    scenario: Path | None = field(default=None, metadata=argument())
    """Scenario file (.toml or .json)."""
    from_run: Path | None = field(default=None, metadata=flag("--from-run"))
    """Plan a measured dtpo run's job (with --gpu and --gpu-counts)."""
    from_bench: Path | None = field(default=None, metadata=flag("--from-bench"))
    """Plan a dtpo bench's job: compute from its smallest run, the link's alpha and beta fitted from its link
    probe, and a micro-batch's fixed part fitted from its --batch-sizes runs when it has them (with --gpu cpu and
    --gpu-counts)."""

    def __post_init__(self) -> None:
        for name in ("scenario", "from_run", "from_bench"):
            self._path(name)
        if sum(x is not None for x in (self.scenario, self.from_run, self.from_bench)) != 1:
            raise ConfigError("give one of: a scenario file, --from-run RUN_DIR, --from-bench BENCH_DIR")


@dataclass(kw_only=True)
class PlanTargetConfig(Section):
    """The hardware a measured run or bench is planned on (a scenario file names its own)."""

    SECTION: ClassVar[str] = "target"

    gpu: str | None = field(default=None, metadata=flag("--gpu"))
    """Target GPU model for --from-run, e.g. H100."""
    gpu_counts: str | None = field(default=None, metadata=flag("--gpu-counts"))
    """GPU counts for --from-run, e.g. 8,64,512."""
    gpus_per_node: int = field(default=8, metadata=flag("--gpus-per-node"))
    """GPUs per node (--from-run)."""
    intra_link: str = field(default="nvlink4", metadata=flag("--intra-link"))
    """Link inside a node (--from-run)."""
    inter_link: str = field(default="ib-ndr", metadata=flag("--inter-link"))
    """Link between nodes (--from-run)."""
    nics_per_node: int = field(default=8, metadata=flag("--nics-per-node"))
    """NICs per node (--from-run)."""
    grad_accum: int = field(default=1, metadata=flag("--grad-accum"))
    """Accumulation at scale (--from-run)."""

    def __post_init__(self) -> None:
        self._check_type("gpu", str, True)
        self._check_type("gpu_counts", str, True)
        self._check_type("intra_link", str, False)
        self._check_type("inter_link", str, False)
        for name in ("gpus_per_node", "nics_per_node", "grad_accum"):  # ranges: the scenario's own checks
            self._check_type(name, int, False)


@dataclass(kw_only=True)
class PlanChoiceConfig(Section):
    """Other links to predict on, and the deadline or budget a configuration is picked by."""

    SECTION: ClassVar[str] = "choice"

    compare_link: str | None = field(default=None, metadata=flag("--compare-link"))
    """Also predict on these inter-node links, comma-separated (e.g. roce-100g)."""
    deadline: float | None = field(default=None, metadata=flag("--deadline"))
    """Hours: the cheapest configuration that finishes the scenario's work in time."""
    budget: float | None = field(default=None, metadata=flag("--budget"))
    """Money: the fastest configuration that costs at most this."""

    def __post_init__(self) -> None:
        self._check_type("compare_link", str, True)
        if self.deadline is not None and self.budget is not None:
            raise ConfigError("give --deadline or --budget, not both")
        for name, flag_name in (("deadline", "--deadline"), ("budget", "--budget")):
            value = self._optional_number(name)
            if value is not None and not value > 0:
                raise ConfigError(f"{flag_name} must be positive, got {value:g}")


@dataclass(kw_only=True)
class PlanOutputConfig(Section):
    """Where the predictions go besides the terminal."""

    SECTION: ClassVar[str] = "output"

    plot: Path | None = field(default=None, metadata=flag("--plot"))
    """Write throughput, efficiency and J/sample against GPUs to FILE.png or FILE.svg."""
    json: Path | None = field(default=None, metadata=flag("--json"))
    """Write the predictions as JSON."""
    run_dir: Path | None = field(default=None, metadata=flag("--run-dir"))
    """Write the predictions here as plan.json (default: runs/plan-<run id>)."""
    store: str | None = field(default=None, metadata=flag("--store"))
    """SQLite run store the plan is registered in (default: $DTPO_STORE, else runs/dtpo.sqlite)."""

    def __post_init__(self) -> None:
        for name in ("plot", "json", "run_dir"):
            self._path(name)
        self._check_type("store", str, True)


@dataclass(kw_only=True)
class PlanConfig(Tree):
    """Everything ``dtpo plan`` was asked to do."""

    SECTIONS: ClassVar[dict[str, type[Section]]] = {
        "source": PlanSourceConfig, "target": PlanTargetConfig, "choice": PlanChoiceConfig,
        "output": PlanOutputConfig}

    source: PlanSourceConfig
    """The job to plan."""
    target: PlanTargetConfig = field(default_factory=PlanTargetConfig)
    """The hardware a run or bench is planned on."""
    choice: PlanChoiceConfig = field(default_factory=PlanChoiceConfig)
    """Links to compare, a deadline or a budget."""
    output: PlanOutputConfig = field(default_factory=PlanOutputConfig)
    """Plot, JSON, run directory and run store."""
