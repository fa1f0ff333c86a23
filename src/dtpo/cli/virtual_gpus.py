"""``dtpo virtual-gpus``: GPUs behind the real NVML binding on a machine with none, their figures simulated.

``create`` compiles dtpo's stand-in for ``libnvidia-ml.so.1`` with the system's C compiler and writes the
virtual GPUs' state; every dtpo command run with ``DTPO_VIRTUAL_GPUS=<dir>`` (and any NVML program run with
``LD_LIBRARY_PATH=<dir>``) then sees them through nvidia-ml-py, unmodified. ``show`` lists them as NVML
reports them; ``fault`` makes one lost, a straggler, or its energy counter wrap or jump back.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from dtpo.core.errors import ConfigError
from dtpo.telemetry.summary import make_console

CONTEXT = {"help_option_names": ["-h", "--help"]}
HELP = ("Virtual GPUs for a machine with none: dtpo's NVML stand-in, driven by its GPU simulator; every figure "
        "from them is labelled simulated (`dtpo virtual-gpus COMMAND --help`).")

virtual_gpus_app = typer.Typer(name="virtual-gpus", help=HELP, no_args_is_help=True, add_completion=False,
                               pretty_exceptions_enable=False, context_settings=CONTEXT)

DirArgument = Annotated[Path, typer.Argument(metavar="DIR", help="Where the stand-in and its state live.",
                                             show_default=False)]


@virtual_gpus_app.command("create")
def create_command(
    directory: DirArgument,
    gpu: Annotated[str, typer.Option("--gpu", metavar="MODEL", help="GPU model, e.g. A40, V100, H100, T4.")] = "A40",
    count: Annotated[int, typer.Option("--count", metavar="N", help="How many GPUs (1-16).")] = 2,
    workload: Annotated[str, typer.Option("--workload", metavar="NAME",
                                          help="Workload whose power they draw (dtpo simulate's names).")] = "resnet50",
    root: Annotated[bool, typer.Option("--root/--no-root",
                                       help="Allow setting power limits and clocks, as root may; without it "
                                            "NVML answers NO_PERMISSION, as for an ordinary user.")] = False,
    utilization: Annotated[float, typer.Option("--utilization", metavar="SHARE",
                                               help="Share of time busy, 0-1.")] = 1.0,
    log_calls: Annotated[bool, typer.Option("--log-calls", help="Log every NVML call to DIR/calls.log.")] = False,
    slow_steps: Annotated[bool, typer.Option("--slow-steps",
                                             help="Slow each training step by the simulator's slowdown at the GPU's "
                                                  "setting (a delay inside compute, labelled in the record), so "
                                                  "tuning trades time as on a GPU.")] = False,
) -> None:
    """Build the NVML stand-in and a fresh set of virtual GPUs in DIR, and print how to use them."""
    from dtpo.devices.virtual_nvml.make import create

    made = create(directory, gpu=gpu, count=count, workload=workload, root=root, utilization=utilization,
                  log_calls=log_calls, slow_steps=slow_steps)
    print(f"{made.count} virtual {made.gpu} GPU(s) in {made.directory} ({'root' if root else 'no permission to set'}"
          f"{'; steps slowed by the simulated slowdown' if slow_steps else ''}; every figure from them is simulated)")
    print(f"export DTPO_VIRTUAL_GPUS={shlex.quote(str(made.directory.resolve()))}")


@virtual_gpus_app.command("show")
def show_command(directory: DirArgument) -> None:
    """List the virtual GPUs in DIR as NVML reports them: limit, power, clock, energy counter."""
    from dtpo.devices import virtual_nvml
    from dtpo.devices.base import DeviceError

    if not (directory / virtual_nvml.LIBRARY).is_file():
        raise ConfigError(f"no virtual GPUs in {directory}: make them with `dtpo virtual-gpus create {directory}`")
    os.environ[virtual_nvml.ENV] = str(directory.resolve())  # this process reads them through the binding
    from dtpo.devices.nvml import open_nvml_gpus
    from dtpo.devices.virtual_nvml.state import STATE_FILE, locked

    table = Table(title=f"virtual GPUs in {directory} (simulated)")
    for column in ("gpu", "name", "power limit", "power", "SM clock", "energy counter"):
        table.add_column(column)
    try:
        gpus = open_nvml_gpus(env={})
    except DeviceError as exc:
        raise ConfigError(f"virtual GPUs in {directory} do not answer: {exc}") from None
    with locked(directory / STATE_FILE) as shared:  # straggler faults (--slow), noted beside the GPU's name
        slow = {i: shared.gpus[i].slow_factor for i in range(shared.count) if shared.gpus[i].slow_factor > 1.0}
    for device in gpus:
        try:
            state = device.knob_state()
            power = device.power_w()
            clock = device.sm_clock_mhz()
            counter = device.counter_mj()
            name = device.info.name + (f", slow x{slow[device.index]:.2f}" if device.index in slow else "")
            table.add_row(str(device.index), name, f"{state.power_limit_w:g} W",
                          "-" if power is None else f"{power:.1f} W", "-" if clock is None else f"{clock:.0f} MHz",
                          "not supported" if counter is None else f"{counter:,} mJ")
        finally:
            device.close()
    with locked(directory / STATE_FILE) as state:
        for index in range(state.count):
            if state.gpus[index].lost:
                table.add_row(str(index), state.gpus[index].name.decode(), "-", "-", "-", "lost (GPU_IS_LOST)")
    make_console().print(table)


@virtual_gpus_app.command("fault")
def fault_command(
    directory: DirArgument,
    gpu: Annotated[int, typer.Option("--gpu", metavar="INDEX", help="Which virtual GPU.")] = 0,
    lost: Annotated[bool | None, typer.Option("--lost/--found",
                                              help="Make it answer GPU_IS_LOST to every call (or answer again).",
                                              show_default=False)] = None,
    lose_after: Annotated[int | None, typer.Option("--lose-after", metavar="READS",
                                                   help="Lose it after this many more power or energy reads.",
                                                   show_default=False)] = None,
    energy_offset: Annotated[int | None, typer.Option("--energy-offset", metavar="MJ",
                                                      help="Add this to its energy counter, modulo 2^64 (near "
                                                           "2^64: it wraps; negative: it goes backwards).",
                                                      show_default=False)] = None,
    slow: Annotated[float | None, typer.Option("--slow", metavar="FACTOR",
                                               help="Make it a straggler: each step takes FACTOR times as long "
                                                    "(on top of its setting's slowdown; power stays the "
                                                    "setting's). 1 clears it. Needs --slow-steps GPUs.",
                                               show_default=False)] = None,
) -> None:
    """Inject a fault into one virtual GPU; every process sees it at its next NVML call."""
    import math

    from dtpo.devices.virtual_nvml.make import inject

    if lost is None and lose_after is None and energy_offset is None and slow is None:
        raise ConfigError("name a fault: --lost, --found, --lose-after READS, --energy-offset MJ or --slow FACTOR")
    if lose_after is not None and lose_after < 0:
        raise ConfigError(f"--lose-after must be 0 or more, got {lose_after}")
    if slow is not None and not (math.isfinite(slow) and slow >= 1.0):
        raise ConfigError(f"--slow must be a finite factor of 1 or more (1: normal speed), got {slow:g}")
    inject(directory, gpu, lost=lost, lose_after_reads=lose_after, energy_offset_mj=energy_offset, slow_factor=slow)
    print(f"virtual GPU {gpu} in {directory}: fault set")
