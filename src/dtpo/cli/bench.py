"""``dtpo bench``: one workload at several worker counts, with scaling efficiency against the smallest."""

from __future__ import annotations

import inspect
import logging
import os
from pathlib import Path

import typer

from dtpo.cli.conclude import conclude_run, end_run
from dtpo.cli.options import config_command
from dtpo.cli.register import open_store_for, registered
from dtpo.cli.train import launch_training, resolve
from dtpo.core.config import MAX_WORKERS, RunConfig
from dtpo.core.errors import ConfigError
from dtpo.core.files import default_run_root
from dtpo.core.record import RunRecord, new_run_id, write_json_atomic
from dtpo.distributed.run_dir import prepare_run_dir
from dtpo.plan.batch_fit import BATCH_RUN_PREFIX, batch_times_from_bench, fit_batch_times
from dtpo.telemetry.artifacts import write_report_beside
from dtpo.telemetry.scaling import BENCH_SCHEMA, bench_table, scaling_rows
from dtpo.telemetry.store.figures import config_kind
from dtpo.telemetry.store.paths import check_store_path
from dtpo.telemetry.summary import make_console

log = logging.getLogger(__name__)


def parse_worker_counts(text: str) -> list[int]:
    """``"1,2,4"`` -> ``[1, 2, 4]``, rejecting anything that is not a list of positive integers."""
    parts = [part.strip() for part in text.split(",")]
    if not all(part.isdigit() for part in parts):
        raise ConfigError(f"--workers must be a comma-separated list of positive integers, e.g. 1,2,4; got {text!r}")
    counts = [int(part) for part in parts]
    for count in counts:
        if not 1 <= count <= MAX_WORKERS:
            raise ConfigError(f"--workers counts must be between 1 and {MAX_WORKERS}, got {count}")
    return sorted(set(counts))


LINK_PROBE_FILE = "link_probe.json"
LINK_PROBE_SIZES = "4K,64K,1M,8M,32M"


def probe_link(workers: int, out: Path, backend: str | None = None) -> None:
    """Time all-reduces of several sizes on ``workers`` local processes (``python -m dtpo.distributed.link_probe``
    under torchrun's launcher), for ``dtpo plan --from-bench`` to fit the link's alpha and beta. A failure
    only costs the fit, with a warning."""
    import subprocess
    import sys

    if backend not in (None, "gloo"):
        log.info("bench: the link probe runs on gloo only; %s links are not probed", backend)
        return
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(workers),
           "-m", "dtpo.distributed.link_probe", "--sizes", LINK_PROBE_SIZES, "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        log.warning("bench: the link probe on %d workers failed (%s); dtpo plan --from-bench cannot fit this link",
                    workers, tail[0])


def for_worker_count(config: RunConfig, count: int) -> RunConfig:
    """``config`` at ``count`` workers. Job-knob tuning drops the compression knob on one worker (there is no
    all-reduce to compress), so ``dtpo bench --tune compression`` shows where compression starts to pay."""
    knobs = config.tune.job_knobs
    if count < 2 and "compression" in knobs:  # in one step: the tree refuses compression on one worker
        rest = [k for k in knobs if k != "compression"]
        log.info("bench: 1 worker has no all-reduce to compress: tuning %s there", ", ".join(rest) or "nothing")
        return config.replace(launch={"workers": count}, tune={
            "knob": ",".join(rest) or None,
            "allow_batch_change": config.tune.allow_batch_change and "grad-accum" in rest})
    return config.replace(launch={"workers": count})


def parse_batch_sizes(text: str) -> list[int]:
    """``"8,32,128"`` -> ``[8, 32, 128]``: two or more distinct positive integers (a fit needs two)."""
    parts = [part.strip() for part in text.split(",")]
    if not all(part.isdigit() and int(part) > 0 for part in parts):
        raise ConfigError(f"--batch-sizes must be a comma-separated list of positive integers, e.g. 8,32,128; "
                          f"got {text!r}")
    sizes = sorted({int(part) for part in parts})
    if len(sizes) < 2:
        raise ConfigError(f"--batch-sizes needs two or more different sizes to split a fixed from a per-sample part, "
                          f"got {text!r}")
    return sizes


def run_bench(config: RunConfig, counts: list[int], batch_sizes: list[int] | None = None) -> tuple[Path, list[dict]]:
    """Train ``config`` at every worker count (weak scaling: the per-worker batch stays the same), and with
    ``batch_sizes``, on one worker at each of those micro-batch sizes (``batch-B/``), whose times
    :mod:`dtpo.plan.batch_fit` splits into a fixed and a per-sample part for ``dtpo plan --from-bench``.

    Threads per worker are decided for each count (unless the user fixed them), so a 2-worker run does not
    inherit the 1-worker run's threads and oversubscribe the CPU. Returns the bench directory and its rows.

    The run store (``--store``) gets a ``bench`` row for the bench (its figures: every row's, per worker count)
    and a ``train`` (or ``tune``) row for each worker count's run, whose ``parent`` is the bench's id: each is
    ``running`` until it ends, then ``completed`` or how it failed.
    """
    resolved = {count: resolve(for_worker_count(config, count)) for count in counts}
    by_batch = {size: resolve(for_worker_count(config, 1).replace(workload={"batch_size": size}))
                for size in batch_sizes or ()}
    check_store_path(config.telemetry.store)
    bench_dir = prepare_run_dir(config.launch.run_dir or default_run_root() / f"bench-{new_run_id()}",
                                overwrite=config.launch.overwrite)
    store = open_store_for(bench_dir, config.telemetry.store)
    first = resolved[counts[0]]
    bench_config = first.replace(launch={"workers": counts[0]}).to_dict()
    console = make_console()
    with registered(store, "bench", bench_dir, bench_config) as bench:
        records: dict[int, RunRecord] = {}
        for count, run_config in resolved.items():
            threads = run_config.launch.threads_per_worker
            console.print(f"[bold]bench:[/bold] {run_config.workload.name} on {count} worker(s), "
                          f"{threads} thread(s) each")
            run_dir = prepare_run_dir(bench_dir / f"workers-{count}", overwrite=config.launch.overwrite)
            run_dict = run_config.replace(launch={"run_dir": str(run_dir)}).to_dict()
            with registered(store, config_kind(run_dict), run_dir, run_dict, parent=bench.id) as entry:
                outcome = launch_training(run_config, run_dir)
                record = conclude_run(outcome, console, quiet=True) if outcome.recorded else None
                entry.record = record
                end_run(outcome, record)
            assert record is not None
            records[count] = record
            if count > 1:
                probe_link(count, run_dir / LINK_PROBE_FILE, run_config.launch.backend)
        for size, run_config in by_batch.items():
            console.print(f"[bold]bench:[/bold] {run_config.workload.name} on 1 worker, micro-batch {size}")
            run_dir = prepare_run_dir(bench_dir / f"{BATCH_RUN_PREFIX}{size}", overwrite=config.launch.overwrite)
            run_dict = run_config.replace(launch={"run_dir": str(run_dir)}).to_dict()
            with registered(store, config_kind(run_dict), run_dir, run_dict, parent=bench.id) as entry:
                outcome = launch_training(run_config, run_dir)
                entry.record = conclude_run(outcome, console, quiet=True) if outcome.recorded else None
                end_run(outcome, entry.record)
        rows = scaling_rows(records)
        for row in rows:
            row["threads_per_worker"] = resolved[row["workers"]].launch.threads_per_worker
        console.print(bench_table(rows, f"dtpo bench: {first.workload.name}, per-worker batch "
                                        f"{first.workload.batch_size} fixed (weak scaling)"))
        path = bench_dir / "bench.json"
        data = {"schema": BENCH_SCHEMA, "workload": first.workload.name, "config": bench_config, "rows": rows}
        if by_batch:
            data["micro_batch"] = micro_batch_section(bench_dir, console)
        write_json_atomic(path, data)
        bench.result = data
        console.print(f"bench record: {path}")
        if config.telemetry.report:
            report = write_report_beside(bench_dir)
            if report is not None:
                console.print(f"report: {report}")
    return bench_dir, rows


def micro_batch_section(bench_dir: Path, console: object) -> dict:
    """The bench's micro-batch times by batch size and their fit (fixed and per-sample parts), printed and as a dict
    for ``bench.json``; the fit is ``None`` (with its reason) where the times do not split."""
    points = batch_times_from_bench(bench_dir)
    section: dict = {"times_s": {str(b): t for b, t in points}, "fit": None}
    try:
        fit = fit_batch_times(points)
    except ConfigError as exc:
        section["note"] = str(exc)
        console.print(f"micro-batch: no fit: {exc}")  # type: ignore[attr-defined]
        return section
    section["fit"] = {"fixed_s": fit.fixed_s, "per_sample_s": fit.per_sample_s}
    sizes = ", ".join(f"{b}: {t * 1e3:.3g} ms" for b, t in points)
    console.print(f"micro-batch on 1 worker ({sizes}): {fit.fixed_s * 1e3:.3g} ms fixed + "  # type: ignore[attr-defined]
                  f"{fit.per_sample_s * 1e3:.3g} ms per sample")
    return section


def _bench(config: RunConfig, workers: str = "1,2", batch_sizes: str | None = None) -> None:
    """Measure throughput and scaling efficiency of one workload at several worker counts (weak scaling), and
    with --batch-sizes a micro-batch's fixed and per-sample time on one worker."""
    counts = parse_worker_counts(workers)
    run_bench(config, counts, parse_batch_sizes(batch_sizes) if batch_sizes is not None else None)


bench_command = config_command(
    _bench, exclude=("launch.workers", "launch.max_restarts", "checkpoint.every", "checkpoint.dir", "checkpoint.keep",
                     "checkpoint.async_save", "checkpoint.resume"), defaults={"workload.name": "mlp"},
    extra=[inspect.Parameter("workers", inspect.Parameter.KEYWORD_ONLY, annotation=str,
                             default=typer.Option("1,2", "--workers", help="Comma-separated worker counts, "
                                                  "e.g. 1,2,4.")),
           inspect.Parameter("batch_sizes", inspect.Parameter.KEYWORD_ONLY, annotation=str | None,
                             default=typer.Option(None, "--batch-sizes", help="Also time one worker's micro-batch at "
                                                  "these sizes, e.g. 8,32,128: dtpo plan --from-bench splits it "
                                                  "into a fixed and a per-sample part."))])
