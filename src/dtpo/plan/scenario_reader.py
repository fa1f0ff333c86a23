"""Reading a scenario document field by field: types, ranges, unknown keys; every error is one line naming the
field's path (``h100.toml: model.parameters must be a positive integer, got -3``). The schema is documented
in :mod:`dtpo.plan.scenario`."""

from __future__ import annotations

import difflib
import json
import logging
import math
import os
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from dtpo.core.config import COMPRESSIONS, PRECISIONS, STRATEGIES
from dtpo.core.errors import ConfigError
from dtpo.core.record import RECORD_FILE
from dtpo.devices.physics.traces import known_trace_workloads
from dtpo.plan.interconnect import find_link
from dtpo.plan.scenario import (
    CPU,
    DEFAULT_NODE_OVERHEAD_W,
    GRADIENT_DTYPES,
    KNOWN_LINKS,
    SUFFIXES,
    THROUGHPUT_UNITS,
    Baseline,
    MicroBatch,
    ModelSpec,
    PowerSection,
    Prices,
    Scenario,
    Work,
    _fail,
    resolve_gpu,
)

logger = logging.getLogger(__name__)

_TOP_KEYS = ("gpu", "gpus_per_node", "gpu_counts", "intra_link", "inter_link", "nics_per_node",
             "fabric_efficiency", "model", "strategy", "precision", "compression", "powersgd_rank",
             "per_gpu_batch", "grad_accum", "overlap", "jitter_cv", "overlap_slowdown", "baseline", "power", "prices",
             "work", "unit", "sequence_length", "micro_batch")
_MICRO_BATCH_KEYS = ("fixed_share", "times_s")
_MODEL_KEYS = ("parameters", "gradient_bytes", "gradient_dtype", "flops_per_sample")
_BASELINE_KEYS = ("gpus", "throughput", "run_dir", "compute_s_per_sample", "multi_node_gpus", "multi_node_throughput")
_POWER_KEYS = ("setting", "node_overhead_w", "pue", "waiting_power_fraction", "busy_power_w", "workload")
_PRICES_KEYS = ("per_gpu_hour", "per_kwh", "grid_g_co2_per_kwh")
_WORK_KEYS = ("samples", "epochs", "dataset_samples")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


class ScenarioReader:
    """Reads one document field by field; every error names the field's path."""

    def __init__(self, where: str, base_dir: Path) -> None:
        self.where = where
        self.base_dir = base_dir

    def fail(self, message: str) -> ConfigError:
        return _fail(self.where, message)

    # --- generic checks

    def table(self, data: object, path: str, allowed: Iterable[str]) -> Mapping[str, Any]:
        """``data`` as a mapping with only ``allowed`` keys."""
        if not isinstance(data, Mapping):
            raise self.fail(f"{path or 'the scenario'} must be a table, got {type(data).__name__}")
        allowed = tuple(allowed)
        for key in data:
            if key not in allowed:
                name = f"{path}.{key}" if path else str(key)
                close = difflib.get_close_matches(str(key), allowed, n=1)
                hint = f" (did you mean '{close[0]}'?)" if close else f" (known: {', '.join(allowed)})"
                raise self.fail(f"unknown field '{name}'{hint}")
        return data

    def require(self, data: Mapping[str, Any], key: str, path: str) -> Any:
        if key not in data:
            raise self.fail(f"missing field '{path}{key}'")
        return data[key]

    def integer(self, value: object, path: str, minimum: int = 1, maximum: int | None = None) -> int:
        if not _is_int(value) or value < minimum or (maximum is not None and value > maximum):
            if maximum is not None:
                wanted = f"an integer from {minimum} to {maximum}"
            else:
                wanted = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
            raise self.fail(f"{path} must be {wanted}, got {value!r}")
        return int(value)  # type: ignore[arg-type]

    def number(self, value: object, path: str, *, low: float, low_open: bool = False, high: float | None = None,
               what: str | None = None) -> float:
        ok = _is_number(value)
        if ok:
            number = float(value)  # type: ignore[arg-type]
            ok = (number > low if low_open else number >= low) and (high is None or number <= high)
        if not ok:
            if what is None:
                what = "a positive number" if (low == 0 and low_open and high is None) else "a number"
            raise self.fail(f"{path} must be {what}, got {value!r}")
        return float(value)  # type: ignore[arg-type]

    def link(self, value: object, path: str) -> str:
        """A catalogue link's canonical name (aliases accepted, see :func:`dtpo.plan.interconnect.find_link`)."""
        if not isinstance(value, str):
            raise self.fail(f"{path} must be one of {', '.join(KNOWN_LINKS)}, got {value!r}")
        try:
            return find_link(value).name
        except ConfigError:
            raise self.fail(f"{path} must be one of {', '.join(KNOWN_LINKS)}, got {value!r}") from None

    def choice(self, value: object, path: str, choices: Iterable[str]) -> str:
        choices = tuple(choices)
        if not isinstance(value, str) or value not in choices:
            raise self.fail(f"{path} must be one of {', '.join(choices)}, got {value!r}")
        return value

    # --- sections

    def scenario(self, data: object) -> Scenario:
        top = self.table(data, "", _TOP_KEYS)
        gpu = self.gpu(self.require(top, "gpu", ""))
        gpus_per_node = self.integer(top.get("gpus_per_node", 8), "gpus_per_node")
        counts = self.gpu_counts(self.require(top, "gpu_counts", ""), gpus_per_node)
        intra = self.link(top.get("intra_link", "nvlink4"), "intra_link")
        inter = self.link(top.get("inter_link", "ib-ndr"), "inter_link")
        nics = self.integer(top.get("nics_per_node", 8), "nics_per_node")
        efficiency = top.get("fabric_efficiency")
        if efficiency is not None:
            efficiency = self.number(efficiency, "fabric_efficiency", low=0.0, low_open=True, high=1.0,
                                     what="a number in (0, 1]")
        model = self.model(self.require(top, "model", ""))
        strategy = self.choice(top.get("strategy", "ddp"), "strategy", STRATEGIES)
        precision = self.choice(top.get("precision", "bf16-mixed"), "precision", PRECISIONS)
        compression = self.choice(top.get("compression", "none"), "compression", COMPRESSIONS)
        if strategy == "fsdp" and compression != "none":
            raise self.fail(f"compression must be none with strategy fsdp (FSDP has no DDP comm hook), "
                            f"got {compression!r}")
        rank = self.integer(top.get("powersgd_rank", 1), "powersgd_rank", 1, 4)
        batch = self.per_count(self.require(top, "per_gpu_batch", ""), counts, "per_gpu_batch", "per-GPU batch")
        accum = self.per_count(top.get("grad_accum", 1), counts, "grad_accum", "accumulation")
        overlap = top.get("overlap", True)
        if not isinstance(overlap, bool):
            raise self.fail(f"overlap must be true or false, got {overlap!r}")
        jitter = top.get("jitter_cv")
        if jitter is not None:
            jitter = self.number(jitter, "jitter_cv", low=0.0, high=1.0, what="a number in [0, 1]")
        slowdown = top.get("overlap_slowdown")
        if slowdown is not None:
            slowdown = self.number(slowdown, "overlap_slowdown", low=0.0, high=1.0, what="a number in [0, 1]")
        unit = self.choice(top.get("unit", "samples/s"), "unit", THROUGHPUT_UNITS)
        length = top.get("sequence_length")
        if length is not None:
            length = self.integer(length, "sequence_length")
        if unit == "tokens/s" and length is None:
            raise self.fail("unit tokens/s needs sequence_length (tokens per sample): per_gpu_batch is in samples")
        micro = self.micro_batch(top["micro_batch"]) if "micro_batch" in top else None
        baseline = self.baseline(top["baseline"]) if "baseline" in top else None
        if baseline is not None and baseline.multi_node_gpus is not None and (
                baseline.multi_node_gpus <= gpus_per_node or baseline.multi_node_gpus % gpus_per_node):
            raise self.fail(f"baseline.multi_node_gpus must span 2 or more whole nodes of {gpus_per_node} GPUs, "
                            f"got {baseline.multi_node_gpus}")
        if baseline is None and model.flops_per_sample is None:
            raise self.fail("needs baseline or model.flops_per_sample to know the compute time")
        power = self.power(top.get("power", {}), gpu)
        prices = self.prices(top.get("prices", {}))
        work = self.work(top["work"]) if "work" in top else None
        return Scenario(gpu=gpu, gpu_counts=counts, model=model, per_gpu_batch=batch, gpus_per_node=gpus_per_node,
                        intra_link=intra, inter_link=inter, nics_per_node=nics, fabric_efficiency=efficiency,
                        strategy=strategy, precision=precision, compression=compression, powersgd_rank=rank,
                        grad_accum=accum, overlap=overlap, jitter_cv=jitter, overlap_slowdown=slowdown,
                        baseline=baseline, power=power, prices=prices, work=work,
                        source=self.where, unit=unit, sequence_length=length, micro_batch=micro)

    def gpu(self, value: object) -> str:
        if not isinstance(value, str) or not value.strip():
            raise self.fail(f"gpu must be a GPU model name, got {value!r}")
        name = value.strip()
        if name.lower() == CPU:
            return CPU
        if resolve_gpu(name) == (None, None):
            raise self.fail(f"gpu {name!r} is not a GPU model dtpo knows (e.g. H100, A100, V100, A40, MI250X, "
                            f"L40S, or cpu)")
        return name

    def gpu_counts(self, value: object, gpus_per_node: int) -> tuple[int, ...]:
        if not isinstance(value, list | tuple) or not value:
            raise self.fail(f"gpu_counts must be a non-empty list of positive integers, got {value!r}")
        counts = [self.integer(count, f"gpu_counts[{i}]") for i, count in enumerate(value)]
        for count in counts:
            if count > gpus_per_node and count % gpus_per_node:
                raise self.fail(f"gpu_counts: {count} is not a multiple of gpus_per_node {gpus_per_node}")
        if len(set(counts)) != len(counts):
            twice = sorted({count for count in counts if counts.count(count) > 1})
            raise self.fail(f"gpu_counts: {twice[0]} is listed twice")
        return tuple(sorted(counts))

    def model(self, value: object) -> ModelSpec:
        table = self.table(value, "model", _MODEL_KEYS)
        if ("parameters" in table) == ("gradient_bytes" in table):
            raise self.fail("model needs exactly one of parameters or gradient_bytes"
                            + (", not both" if "parameters" in table else ""))
        parameters = table.get("parameters")
        if parameters is not None:
            parameters = self.integer(parameters, "model.parameters")
        gradient_bytes = table.get("gradient_bytes")
        if gradient_bytes is not None:
            gradient_bytes = self.integer(gradient_bytes, "model.gradient_bytes")
        dtype = self.choice(table.get("gradient_dtype", "fp32"), "model.gradient_dtype", GRADIENT_DTYPES)
        flops = table.get("flops_per_sample")
        if flops is not None:
            flops = self.number(flops, "model.flops_per_sample", low=0.0, low_open=True)
        return ModelSpec(parameters=parameters, gradient_bytes=gradient_bytes, gradient_dtype=dtype,
                         flops_per_sample=flops)

    def per_count(self, value: object, counts: tuple[int, ...], name: str,
                  what: str) -> int | tuple[tuple[int, int], ...]:
        """One positive integer, or a table of one per GPU count of ``counts`` (and no other)."""
        if not isinstance(value, Mapping):
            return self.integer(value, name)
        by_count: dict[int, int] = {}
        for key, number in value.items():
            count = int(key) if _is_int(key) or (isinstance(key, str) and key.strip().isdigit()) else None
            if count is None or count < 1:
                raise self.fail(f"{name}: key {key!r} must be a GPU count (a positive integer)")
            if count not in counts:
                raise self.fail(f"{name}: {count} GPUs is not in gpu_counts")
            by_count[count] = self.integer(number, f"{name}.{key}")
        for count in counts:
            if count not in by_count:
                raise self.fail(f"{name}: no {what} for {count} GPUs (give one for every count of gpu_counts)")
        return tuple(sorted(by_count.items()))

    def micro_batch(self, value: object) -> MicroBatch:
        table = self.table(value, "micro_batch", _MICRO_BATCH_KEYS)
        if ("fixed_share" in table) == ("times_s" in table):
            raise self.fail("micro_batch needs exactly one of fixed_share or times_s")
        if "fixed_share" in table:
            share = self.number(table["fixed_share"], "micro_batch.fixed_share", low=0.0, high=1.0,
                                what="a number in [0, 1)")
            if share >= 1.0:
                raise self.fail(f"micro_batch.fixed_share must be a number in [0, 1), got {share!r}")
            return MicroBatch(fixed_share=share)
        raw = table["times_s"]
        if not isinstance(raw, Mapping) or len(raw) < 2:
            raise self.fail("micro_batch.times_s must be a table of two or more batch sizes to seconds "
                            "({8 = 0.011, 32 = 0.029})")
        times = []
        for key, seconds in raw.items():
            if not (isinstance(key, str) and key.strip().isdigit() and int(key) > 0) and not (_is_int(key) and key > 0):
                raise self.fail(f"micro_batch.times_s: key {key!r} must be a batch size (a positive integer)")
            times.append((int(key), self.number(seconds, f"micro_batch.times_s.{key}", low=0.0, low_open=True,
                                                what="a positive number (seconds)")))
        return MicroBatch(times_s=tuple(sorted(times)))

    def baseline(self, value: object) -> Baseline:
        table = dict(self.table(value, "baseline", _BASELINE_KEYS))
        multi = {k: table.pop(k) for k in ("multi_node_gpus", "multi_node_throughput") if k in table}
        if len(multi) == 1:
            raise self.fail("baseline.multi_node_gpus and baseline.multi_node_throughput go together")
        plain = self._baseline(table)
        if not multi:
            return plain
        return replace(plain, multi_node_gpus=self.integer(multi["multi_node_gpus"], "baseline.multi_node_gpus"),
                       multi_node_throughput=self.number(multi["multi_node_throughput"],
                                                         "baseline.multi_node_throughput", low=0.0, low_open=True,
                                                         what="a positive number"))

    def _baseline(self, table: Mapping[str, Any]) -> Baseline:
        forms = [name for name, present in (("gpus and throughput", "gpus" in table or "throughput" in table),
                                            ("run_dir", "run_dir" in table),
                                            ("compute_s_per_sample", "compute_s_per_sample" in table)) if present]
        if len(forms) != 1:
            raise self.fail("baseline needs exactly one of: gpus and throughput, run_dir, compute_s_per_sample"
                            + (f" (got {' and '.join(forms)})" if forms else ""))
        if forms[0] == "gpus and throughput":
            gpus = self.integer(self.require(table, "gpus", "baseline."), "baseline.gpus")
            throughput = self.number(self.require(table, "throughput", "baseline."), "baseline.throughput",
                                     low=0.0, low_open=True, what="a positive number (samples/s)")
            return Baseline(gpus=gpus, throughput=throughput)
        if forms[0] == "run_dir":
            raw = table["run_dir"]
            if not isinstance(raw, str) or not raw.strip():
                raise self.fail(f"baseline.run_dir must be a directory path, got {raw!r}")
            run_dir = Path(raw).expanduser()
            if not run_dir.is_absolute():
                run_dir = self.base_dir / run_dir
            if not (run_dir / RECORD_FILE).is_file():
                raise self.fail(f"baseline.run_dir: {raw} has no {RECORD_FILE}")
            return Baseline(run_dir=run_dir)
        seconds = self.number(table["compute_s_per_sample"], "baseline.compute_s_per_sample", low=0.0,
                              low_open=True, what="a positive number (seconds)")
        return Baseline(compute_s_per_sample=seconds)

    def power(self, value: object, gpu: str) -> PowerSection:
        table = self.table(value, "power", _POWER_KEYS)
        setting: str | float = "max"
        if "setting" in table and table["setting"] != "max":
            setting = self.number(table["setting"], "power.setting", low=0.0, low_open=True,
                                  what='"max" or a power limit in W')
            self.check_limit(setting, gpu)
        overhead = self.number(table.get("node_overhead_w", DEFAULT_NODE_OVERHEAD_W), "power.node_overhead_w",
                               low=0.0, what="a number >= 0 (W)")
        pue = self.number(table.get("pue", 1.0), "power.pue", low=1.0, what="a number >= 1")
        fraction = table.get("waiting_power_fraction")
        if fraction is not None:
            fraction = self.number(fraction, "power.waiting_power_fraction", low=0.0, high=1.0,
                                   what="a number in [0, 1]")
        busy = table.get("busy_power_w")
        if busy is not None:
            busy = self.number(busy, "power.busy_power_w", low=0.0, low_open=True, what="a positive number (W)")
        elif gpu == CPU:
            raise self.fail("power.busy_power_w is required with gpu 'cpu' (a CPU has no power model here: give "
                            "the measured power of one worker)")
        workload = table.get("workload")
        if workload is not None:
            known = known_trace_workloads()
            if not isinstance(workload, str) or workload not in known:
                raise self.fail(f"power.workload must be one of {', '.join(known)}, got {workload!r}")
        return PowerSection(setting=setting, node_overhead_w=overhead, pue=pue, waiting_power_fraction=fraction,
                            busy_power_w=busy, workload=workload)

    def check_limit(self, limit: float, gpu: str) -> None:
        """A power limit must lie in the GPU's settable range (or at most its datasheet power)."""
        spec, sheet = resolve_gpu(gpu)
        if spec is not None and not spec.min_power_w <= limit <= spec.max_power_w:
            raise self.fail(f"power.setting {limit:g} W is outside the {spec.name}'s power-limit range "
                            f"{spec.min_power_w:g}-{spec.max_power_w:g} W")
        if spec is None and sheet is not None and limit > sheet.tdp_w:
            raise self.fail(f"power.setting {limit:g} W is above the {sheet.name}'s {sheet.tdp_w:g} W maximum")

    def prices(self, value: object) -> Prices:
        table = self.table(value, "prices", _PRICES_KEYS)
        numbers = {key: self.number(table[key], f"prices.{key}", low=0.0, what="a number >= 0")
                   for key in _PRICES_KEYS if key in table}
        return Prices(**numbers)

    def work(self, value: object) -> Work:
        table = self.table(value, "work", _WORK_KEYS)
        if "samples" in table:
            if "epochs" in table or "dataset_samples" in table:
                raise self.fail("work needs samples, or epochs with dataset_samples, not both")
            return Work(samples=self.integer(table["samples"], "work.samples"))
        if not table:
            raise self.fail("work needs samples, or epochs with dataset_samples")
        epochs = self.number(self.require(table, "epochs", "work."), "work.epochs", low=0.0, low_open=True)
        dataset = self.integer(self.require(table, "dataset_samples", "work."), "work.dataset_samples")
        return Work(epochs=epochs, dataset_samples=dataset)


def scenario_from_dict(data: Mapping[str, Any], where: str = "", base_dir: str | os.PathLike[str] | None = None,
                       ) -> Scenario:
    """Validate ``data`` (a parsed TOML or JSON document) and build a scenario.

    Args:
        data: The document.
        where: Where it came from (a file name), the prefix of every error message.
        base_dir: Directory that a relative ``baseline.run_dir`` is resolved against (default: the
            current directory).

    Raises:
        ConfigError: A missing, unknown or invalid field (one line naming it).
    """
    return ScenarioReader(where, Path(base_dir) if base_dir is not None else Path.cwd()).scenario(data)


def load_scenario(path: str | os.PathLike[str]) -> Scenario:
    """Read a scenario from a ``.toml`` or ``.json`` file.

    Raises:
        ConfigError: The file is missing, unreadable, malformed, or holds an invalid scenario (one line).
    """
    source = Path(path)
    where = str(path)
    suffix = source.suffix.lower()
    if suffix not in SUFFIXES:
        raise ConfigError(f"{where}: a scenario file must end in .toml or .json")
    try:
        text = source.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{where}: no such scenario file") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{where}: not UTF-8 text ({exc.reason})") from None
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read it: {exc.strerror or exc}") from None
    try:
        data = tomllib.loads(text) if suffix == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        detail = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise ConfigError(f"{where}: not valid {suffix.lstrip('.').upper()}: {detail}") from None
    scenario = scenario_from_dict(data, where=where)
    logger.debug("loaded scenario %s: %s at %s GPUs", where, scenario.gpu, list(scenario.gpu_counts))
    return scenario
