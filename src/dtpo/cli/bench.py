"""``dtpo bench``: one workload at several worker counts, with scaling efficiency against the smallest."""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from dtpo.cli.runs import conclude_run
from dtpo.cli.train import TrainOptions, check_workers, launch_training
from dtpo.core.errors import ConfigError
from dtpo.core.record import RunRecord, new_run_id, write_json_atomic
from dtpo.session.config import EnergyConfig
from dtpo.telemetry.summary import make_console

BENCH_SCHEMA = "dtpo.bench/1"


def parse_worker_counts(text: str) -> list[int]:
    """``"1,2,4"`` -> ``[1, 2, 4]``, rejecting anything that is not a list of positive integers."""
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ConfigError(f"--workers must be a comma-separated list of integers, got {text!r}") from None
    if not counts:
        raise ConfigError("--workers names no worker count")
    for count in counts:
        check_workers(count)
    return sorted(set(counts))


def scaling_rows(records: dict[int, RunRecord]) -> list[dict[str, Any]]:
    """Per worker count: throughput and scaling efficiency against the smallest count, per worker."""
    base_count = min(records)
    base = records[base_count].totals["throughput"]["value"]
    rows = []
    for count, record in sorted(records.items()):
        t = record.totals
        throughput = t["throughput"]["value"]
        rows.append({
            "workers": count,
            "run_id": record.run_id,
            "throughput": t["throughput"],
            "scaling_efficiency": {"value": throughput / (base * count / base_count), "unit": "fraction",
                                   "source": "derived", "note": f"against {base_count} worker(s)"},
            "step_time_s": t["step_time_s"],
            "comm_overhead": t["comm_overhead"],
            "sync_latency_s": t["sync_latency_s"],
            "data_wait_fraction": t["data_wait_fraction"],
            "mfu": t["mfu"],
            "energy_per_sample_j": (record.energy or {}).get("energy_per_sample_j"),
        })
    return rows


def _number(m: dict[str, Any] | None, scale: float = 1.0, digits: int = 1) -> str:
    if not m or m.get("value") is None:
        return "n/a"
    text = f"{m['value'] * scale:,.{digits}f}"
    return text + ("*" if m.get("source") == "estimated" else "")


def bench_table(rows: list[dict[str, Any]], title: str) -> Table:
    """The scaling table (units in the headers; * marks an estimated figure)."""
    table = Table(title=title, title_justify="left", caption="* estimated (no hardware energy counter)")
    for name in ("workers", "samples/s", "scaling eff. %", "step ms", "comm %", "sync wait ms", "data wait %",
                 "MFU %", "mJ/sample"):
        table.add_column(name, justify="right")
    for row in rows:
        table.add_row(str(row["workers"]), _number(row["throughput"]), _number(row["scaling_efficiency"], 100),
                      _number(row["step_time_s"], 1e3, 2), _number(row["comm_overhead"], 100),
                      _number(row["sync_latency_s"], 1e3, 2), _number(row["data_wait_fraction"], 100),
                      _number(row["mfu"], 100), _number(row["energy_per_sample_j"], 1e3, 3))
    return table


def bench_command(
    workers: str = typer.Option("1,2", help="Comma-separated worker counts, e.g. 1,2,4."),
    workload: str = typer.Option("mlp", help="Built-in workload: lm, mlp, cnn."),
    steps: int = typer.Option(None, help="Optimizer steps per run (default: the workload's)."),
    batch_size: int = typer.Option(None, help="Micro-batch size per worker, the same at every count."),
    precision: str = typer.Option("32-true", help="32-true, bf16-mixed or 16-mixed."),
    grad_accum: int = typer.Option(1, help="Micro-batches per optimizer step."),
    strategy: str = typer.Option("ddp", help="ddp or fsdp."),
    seed: int = typer.Option(0, help="Seed for the model and the data."),
    run_dir: Path = typer.Option(None, help="Where to write the runs and bench.json (default: runs/<id>)."),
    cpu_tdp: float = typer.Option(None, help="CPU TDP in watts for the modelled CPU (default: a table)."),
) -> None:
    """Measure throughput and scaling efficiency of one workload at several worker counts (weak scaling)."""
    counts = parse_worker_counts(workers)
    options = TrainOptions(workload, steps, batch_size, precision, grad_accum, strategy, None, seed,
                           EnergyConfig(cpu_tdp_w=cpu_tdp))
    bench_dir = (run_dir or Path("runs") / f"bench-{new_run_id()}").resolve()
    console = make_console()
    records: dict[int, RunRecord] = {}
    for count in counts:
        console.print(f"[bold]bench:[/bold] {workload} on {count} worker(s)")
        outcome = launch_training(options, count, bench_dir / f"workers-{count}")
        record = conclude_run(outcome, console, quiet=True)
        if outcome.failed or record is None or "throughput" not in record.totals:
            print(f"dtpo: bench run with {count} worker(s) failed: {outcome.message or 'no steps measured'}",
                  file=sys.stderr)
            raise typer.Exit(1)
        records[count] = record
    rows = scaling_rows(records)
    console.print(bench_table(rows, f"dtpo bench: {workload}, per-worker batch fixed (weak scaling)"))
    path = bench_dir / "bench.json"
    write_json_atomic(path, {"schema": BENCH_SCHEMA, "workload": workload, "options": asdict(options), "rows": rows})
    console.print(f"bench record: {path}")
