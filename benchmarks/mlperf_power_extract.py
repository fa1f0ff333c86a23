"""Recompute the MLPerf Training figures the planner is checked against (``data/mlperf_*.json``) from raw logs.

The logs are the upstream files, unchanged, packed in ``data/mlperf_training_v4.0_smc_resnet_power.tar.gz``
(mlcommons/training_results_v4.0, Apache License 2.0, its ``LICENSE.md`` inside the archive): Sustainable Metal
Cloud's closed-division ResNet-50 results with AC power, on 1 node and on 8 nodes of 8 H100-SXM5-80GB each
(``smc-ac-power/results/{1x,8x}SMC-H100-SXM-80GB/resnet/``): every ``result_*.txt`` (the MLLOG of one run), its
``power/<run>/node_*.txt`` (one AC power log per node) and ``sw_*.txt`` (the submitter's interconnect estimate),
and the systems' descriptions.

How each figure is derived from those lines (all MLLOG ``:::MLLOG {json}`` lines):

* time to train: ``run_stop.time_ms - run_start.time_ms`` (the MLPerf score's time, evaluation included);
* samples: ``epoch_stop`` lines (epochs trained; checked against ``run_stop``'s ``metadata.epoch`` + 1) x
  ``train_samples`` (images per epoch, 1,281,167);
* throughput: samples / time to train (images/s, evaluation time included, as the score is);
* node energy: each node's ``power_reading`` lines (watts, about every 2 s) integrated over
  [run_start, run_stop] by the trapezoid rule, a reading held flat to the window's edge where the readings
  start after run_start or end before run_stop; summed over the nodes. The logs' ``power_measurement_start`` /
  ``_stop`` markers are not used: in the 8-node logs both carry the same time stamp;
* J/sample: node energy / samples; mean node power: node energy / time to train / nodes;
* node power at rest: each node's lowest reading in [run_start, run_stop] (on one node, the reading at run
  start, before the GPUs ramp up), averaged over the nodes;
* switch estimate: the ``interconnect_power_est`` (W) of each ``sw_*.txt`` x time to train (8-node runs only;
  an estimate the submitter states, not a measurement), kept apart from the measured node energy;
* each system's figure: MLPerf's olympic mean over its 5 runs: the runs with the shortest and the longest time to
  train are dropped and the other 3 averaged (every figure over the same 3 runs).

One-node steps at several per-GPU batches (``data/mlperf_resnet_h100_batch_times.json``, from
``data/mlperf_training_resnet_h100_one_node.tar.xz``: every closed-division ResNet-50 result of MLPerf Training
v3.0, v3.1 and v4.0 on one node of H100-SXM-80GB but Sustainable Metal Cloud's, byte for byte with the systems'
descriptions and each repository's ``LICENSE.md``, Apache License 2.0): a run's optimizer step is
``global_batch_size`` x its median epoch (the first left out; evaluation, between epochs, not counted) /
``train_samples``; a system's step is the median over its successful runs (:func:`batch_times`).

Usage: ``python benchmarks/mlperf_power_extract.py [--write]``: prints every run and each system's figures and
the one-node steps, and exits 1 when they differ from the JSON files' (``--write`` rewrites their ``systems`` and
``points`` instead).
"""

from __future__ import annotations

import hashlib
import json
import re
import statistics
import sys
import tarfile
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent / "data"
ARCHIVE = DATA / "mlperf_training_v4.0_smc_resnet_power.tar.gz"
FIGURES = DATA / "mlperf_power_smc_resnet_v4.0.json"
RESULTS = "smc-ac-power/results"
BENCHMARK = "resnet"
SYSTEMS = ("1xSMC-H100-SXM-80GB", "8xSMC-H100-SXM-80GB")
RELATIVE_TOLERANCE = 1e-9  # a figure of the JSON file matches a recomputed one within this share
_RUN_FILE = re.compile(rf"^{RESULTS}/(?P<system>[^/]+)/{BENCHMARK}/(?P<run>result_[^/]+)\.txt$")
_POWER_FILE = re.compile(rf"^{RESULTS}/(?P<system>[^/]+)/{BENCHMARK}/power/(?P<run>result_[^/]+)/"
                         r"(?P<kind>node|sw)_(?P<index>\d+)\.txt$")


def mllog(text: str) -> list[dict[str, Any]]:
    """The MLLOG events of a log's text, in file order (other lines, and lines that are not JSON, skipped)."""
    events = []
    for line in text.splitlines():
        at = line.find(":::MLLOG ")
        if at < 0:
            continue
        try:
            event = json.loads(line[at + len(":::MLLOG "):])
        except json.JSONDecodeError:
            continue
        if isinstance(event, dict) and "key" in event:
            events.append(event)
    return events


def _one(events: list[dict[str, Any]], key: str) -> dict[str, Any]:
    found = [e for e in events if e["key"] == key]
    if len(found) != 1:
        raise ValueError(f"expected one {key!r} line, found {len(found)}")
    return found[0]


def energy_in_window(readings: list[tuple[int, float]], start_ms: int, stop_ms: int) -> float:
    """Joules of ``(time_ms, watts)`` readings over [start_ms, stop_ms]: trapezoids between readings, the first
    and last reading held flat to the window's edges where the readings do not reach them."""
    if stop_ms <= start_ms:
        raise ValueError(f"empty window {start_ms}..{stop_ms}")
    points = sorted(readings)
    if not points:
        raise ValueError("no power readings")
    inside = [(t, w) for t, w in points if start_ms < t < stop_ms]

    def at(t: int) -> float:  # the power at t: interpolated between readings, held beyond them
        if t <= points[0][0]:
            return points[0][1]
        if t >= points[-1][0]:
            return points[-1][1]
        for (t0, w0), (t1, w1) in zip(points, points[1:], strict=False):
            if t0 <= t <= t1:
                return w0 if t1 == t0 else w0 + (w1 - w0) * (t - t0) / (t1 - t0)
        raise AssertionError("unreachable")

    knots = [(start_ms, at(start_ms)), *inside, (stop_ms, at(stop_ms))]
    return sum((w0 + w1) / 2 * (t1 - t0) / 1000.0 for (t0, w0), (t1, w1) in zip(knots, knots[1:], strict=False))


def run_figures(result_text: str, node_texts: list[str], switch_texts: list[str]) -> dict[str, Any]:
    """One run's figures from its MLLOG, its nodes' power logs and its switch estimates (see the module text)."""
    events = mllog(result_text)
    start = _one(events, "run_start")["time_ms"]
    stop_event = _one(events, "run_stop")
    stop = stop_event["time_ms"]
    if stop_event.get("metadata", {}).get("status") != "success":
        raise ValueError("run_stop does not say success")
    epochs = sum(1 for e in events if e["key"] == "epoch_stop")
    logged = stop_event.get("metadata", {}).get("epoch")
    if logged is not None and logged + 1 != epochs:
        raise ValueError(f"{epochs} epoch_stop lines but run_stop says epoch {logged} (0-based)")
    per_epoch = int(_one(events, "train_samples")["value"])
    seconds = (stop - start) / 1000.0
    samples = epochs * per_epoch
    node_j, lowest = 0.0, []
    for text in node_texts:
        readings = [(int(e["time_ms"]), float(e["value"])) for e in mllog(text) if e["key"] == "power_reading"]
        node_j += energy_in_window(readings, start, stop)
        window = [w for t, w in readings if start <= t <= stop]
        lowest.append(min(window) if window else min(w for _, w in readings))
    switch_w = sum(float(e["value"]) for text in switch_texts for e in mllog(text)
                   if e["key"] == "interconnect_power_est")
    return {"run_start_ms": start, "run_stop_ms": stop, "time_to_train_s": seconds, "epochs": epochs,
            "train_samples_per_epoch": per_epoch, "samples": samples,
            "global_batch_size": int(_one(events, "global_batch_size")["value"]),
            "per_gpu_batch": int(_one(events, "d_batch_size")["value"]),
            "eval_accuracy": float([e for e in events if e["key"] == "eval_accuracy"][-1]["value"]),
            "throughput": samples / seconds, "nodes": len(node_texts), "node_energy_j": node_j,
            "joules_per_sample": node_j / samples, "node_power_w": node_j / seconds / len(node_texts),
            "switch_estimate_w": switch_w, "switch_energy_j": switch_w * seconds,
            "rest_node_power_w": sum(lowest) / len(lowest)}


def read_archive(archive: Path = ARCHIVE) -> dict[str, dict[str, Any]]:
    """The archive's files by system and run: ``{system: {"system": desc, "runs": {run: {"result": text,
    "node": [texts], "sw": [texts]}}}}``."""
    out: dict[str, dict[str, Any]] = {}
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar.getmembers():
            if not member.isfile():
                continue
            handle = tar.extractfile(member)
            assert handle is not None
            text = handle.read().decode("utf-8", errors="replace")
            name = member.name
            if name.startswith("smc-ac-power/systems/") and name.endswith(".json"):
                out.setdefault(Path(name).stem, {"runs": {}})["system"] = json.loads(text)
            elif (match := _RUN_FILE.match(name)) is not None:
                runs = out.setdefault(match["system"], {"runs": {}})["runs"]
                runs.setdefault(match["run"], {"node": {}, "sw": {}})["result"] = text
            elif (match := _POWER_FILE.match(name)) is not None:
                runs = out.setdefault(match["system"], {"runs": {}})["runs"]
                runs.setdefault(match["run"], {"node": {}, "sw": {}})[match["kind"]][int(match["index"])] = text
    return out


def olympic(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """MLPerf's olympic selection: with 5 or more runs, all but the shortest and the longest time to train."""
    ordered = sorted(runs, key=lambda r: r["time_to_train_s"])
    return ordered[1:-1] if len(ordered) >= 5 else ordered


def extract(archive: Path = ARCHIVE) -> dict[str, Any]:
    """Every system's runs and its olympic-mean figures, recomputed from the archive."""
    files = read_archive(archive)
    systems: dict[str, Any] = {}
    for name in SYSTEMS:
        entry = files[name]
        desc = entry["system"]
        runs = []
        for run, parts in sorted(entry["runs"].items()):
            nodes = [parts["node"][i] for i in sorted(parts["node"])]
            figures = run_figures(parts["result"], nodes, [parts["sw"][i] for i in sorted(parts["sw"])])
            runs.append({"run": run, **figures})
        chosen = olympic(runs)
        mean = {key: sum(r[key] for r in chosen) / len(chosen)
                for key in ("time_to_train_s", "samples", "throughput", "node_energy_j", "joules_per_sample",
                            "node_power_w", "switch_estimate_w", "switch_energy_j", "rest_node_power_w")}
        nodes = int(desc["number_of_nodes"])
        if any(r["nodes"] != nodes for r in runs):
            raise ValueError(f"{name}: a run's node logs do not match number_of_nodes {nodes}")
        systems[name] = {"nodes": nodes, "gpus_per_node": int(desc["accelerators_per_node"]),
                         "gpus": nodes * int(desc["accelerators_per_node"]),
                         "accelerator": desc["accelerator_model_name"],
                         "per_gpu_batch": runs[0]["per_gpu_batch"], "global_batch_size": runs[0]["global_batch_size"],
                         "olympic_runs": [r["run"] for r in chosen], **mean,
                         "joules_per_sample_with_switch_estimate": (mean["node_energy_j"] + mean["switch_energy_j"])
                         / mean["samples"], "runs": runs}
    return systems


def differences(stored: Any, fresh: Any, path: str = "systems") -> list[str]:
    """Where ``stored`` (the JSON file's) and ``fresh`` (recomputed) figures differ, one line each."""
    if isinstance(fresh, dict):
        if not isinstance(stored, dict):
            return [f"{path}: not a table"]
        out = [f"{path}.{k}: missing" for k in fresh if k not in stored]
        out += [f"{path}.{k}: not recomputed" for k in stored if k not in fresh]
        for key in fresh:
            if key in stored:
                out += differences(stored[key], fresh[key], f"{path}.{key}")
        return out
    if isinstance(fresh, list):
        if not isinstance(stored, list) or len(stored) != len(fresh):
            return [f"{path}: list differs"]
        return [d for i, (a, b) in enumerate(zip(stored, fresh, strict=True))
                for d in differences(a, b, f"{path}[{i}]")]
    if isinstance(fresh, float) and isinstance(stored, (int, float)) and not isinstance(stored, bool):
        return [] if abs(stored - fresh) <= RELATIVE_TOLERANCE * max(abs(fresh), 1e-12) else [
            f"{path}: file {stored!r}, recomputed {fresh!r}"]
    return [] if stored == fresh else [f"{path}: file {stored!r}, recomputed {fresh!r}"]


# --------------------------------------------------------------------------------- one-node batch times

BATCH_ARCHIVE = DATA / "mlperf_training_resnet_h100_one_node.tar.xz"
BATCH_FIGURES = DATA / "mlperf_resnet_h100_batch_times.json"
ONE_NODE_ACCELERATORS = ("NVIDIA H100-SXM5-80GB", "NVIDIA H100-SXM-80GB")
_BATCH_RUN = re.compile(rf"^(?P<round>training_results_v[\d.]+)/(?P<org>[^/]+)/results/(?P<system>[^/]+)/{BENCHMARK}/"
                        r"(?P<run>result_[^/]+)\.txt$")
_BATCH_SYSTEM = re.compile(r"^(?P<round>training_results_v[\d.]+)/(?P<org>[^/]+)/systems/(?P<system>[^/]+)\.json$")


def training_step(result_text: str) -> dict[str, Any]:
    """One run's optimizer step from its MLLOG: ``global_batch_size`` x the median epoch (``epoch_start`` to
    ``epoch_stop``, the first epoch left out: it warms up) / ``train_samples``; evaluation, between epochs, is not
    counted. Every GPU of a data-parallel step runs one micro-batch of ``d_batch_size`` in that time."""
    events = mllog(result_text)
    stop = _one(events, "run_stop")
    if stop.get("metadata", {}).get("status") != "success":
        raise ValueError("run_stop does not say success")
    starts = {e["metadata"]["epoch_num"]: e["time_ms"] for e in events if e["key"] == "epoch_start"}
    stops = {e["metadata"]["epoch_num"]: e["time_ms"] for e in events if e["key"] == "epoch_stop"}
    first = min(stops) if stops else 0
    epochs = [(stops[k] - starts[k]) / 1000.0 for k in sorted(stops) if k in starts and k != first]
    if len(epochs) < 2:
        raise ValueError("fewer than 3 timed epochs")
    global_batch = int(_one(events, "global_batch_size")["value"])
    batch = int(_one(events, "d_batch_size")["value"])
    samples = int(_one(events, "train_samples")["value"])
    epoch_s = statistics.median(epochs)
    return {"per_gpu_batch": batch, "gpus": global_batch // batch, "epoch_s": epoch_s,
            "step_s": global_batch * epoch_s / samples}


def batch_times(archive: Path = BATCH_ARCHIVE) -> list[dict[str, Any]]:
    """Every one-node H100-SXM-80GB closed-division ResNet-50 result in the archive: its per-GPU batch and its
    step (the median over its successful runs of :func:`training_step`), ascending by batch. A log shipped in two
    rounds (the same bytes) counts once, in the first."""
    systems: dict[tuple[str, str, str], dict[str, Any]] = {}
    logs: dict[tuple[str, str, str], list[tuple[str, str]]] = {}
    with tarfile.open(archive, "r:*") as tar:
        for member in sorted(tar.getmembers(), key=lambda m: m.name):
            handle = tar.extractfile(member) if member.isfile() else None
            if handle is None:
                continue
            if (match := _BATCH_SYSTEM.match(member.name)) is not None:
                systems[(match["round"], match["org"], match["system"])] = json.loads(handle.read())
            elif (match := _BATCH_RUN.match(member.name)) is not None:
                logs.setdefault((match["round"], match["org"], match["system"]), []).append(
                    (match["run"], handle.read().decode("utf-8", errors="replace")))
    seen: set[str] = set()
    points = []
    for key in sorted(logs):
        desc = systems.get(key, {})
        if (desc.get("division") != "closed" or str(desc.get("number_of_nodes")) != "1"
                or desc.get("accelerator_model_name") not in ONE_NODE_ACCELERATORS):
            continue
        steps, runs = [], []
        for run, text in logs[key]:
            digest = hashlib.sha256(text.encode()).hexdigest()
            if digest in seen:
                continue
            seen.add(digest)
            try:
                steps.append(training_step(text))
            except (ValueError, KeyError):
                continue  # a failed or cut-short run
            runs.append(run)
        if not steps:
            continue
        points.append({"round": key[0], "submitter": key[1], "system": key[2], "gpus": steps[0]["gpus"],
                       "per_gpu_batch": steps[0]["per_gpu_batch"], "runs": runs,
                       "step_s": statistics.median(s["step_s"] for s in steps)})
    return sorted(points, key=lambda p: (p["per_gpu_batch"], p["round"], p["submitter"], p["system"]))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args not in ([], ["--write"]):
        sys.stderr.write("mlperf_power_extract.py: error: the only option is --write\n")
        return 2
    systems = extract()
    for name, system in systems.items():
        print(f"{name}: {system['gpus']} GPUs, {system['per_gpu_batch']} images per GPU, global batch "
              f"{system['global_batch_size']}")
        for run in system["runs"]:
            mark = "*" if run["run"] in system["olympic_runs"] else " "
            print(f" {mark} {run['run']}: {run['time_to_train_s']:.3f} s, {run['epochs']} epochs, "
                  f"{run['throughput']:,.0f} images/s, {run['node_energy_j'] / 1e6:.4f} MJ, "
                  f"{run['joules_per_sample']:.4f} J/image, {run['node_power_w']:,.0f} W per node")
        print(f"   olympic mean (*): {system['throughput']:,.0f} images/s, {system['joules_per_sample']:.4f} J/image "
              f"(nodes' AC), {system['node_power_w']:,.0f} W per node (lowest reading "
              f"{system['rest_node_power_w']:,.0f} W); with the switch estimate "
              f"{system['joules_per_sample_with_switch_estimate']:.4f} J/image")
    points = batch_times()
    print(f"one-node H100-SXM-80GB ResNet-50 results ({BATCH_ARCHIVE.name}): per-GPU batch, step")
    for point in points:
        print(f"   {point['per_gpu_batch']:4d} on {point['gpus']} GPUs: {point['step_s'] * 1e3:7.2f} ms  "
              f"{point['round']}/{point['submitter']}/{point['system']} ({len(point['runs'])} runs)")
    document = json.loads(FIGURES.read_text()) if FIGURES.exists() else {}
    batches = json.loads(BATCH_FIGURES.read_text()) if BATCH_FIGURES.exists() else {}
    if args == ["--write"]:
        document["systems"] = systems
        batches["points"] = points
        FIGURES.write_text(json.dumps(document, indent=1) + "\n")
        BATCH_FIGURES.write_text(json.dumps(batches, indent=1) + "\n")
        print(f"wrote {FIGURES} and {BATCH_FIGURES}")
        return 0
    found = differences(document.get("systems"), systems) + differences(batches.get("points"), points, "points")
    for line in found:
        print(f"DIFFERS {line}")
    print("the files' figures are reproduced" if not found else f"{len(found)} figures differ from {FIGURES.name} "
          f"or {BATCH_FIGURES.name}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
