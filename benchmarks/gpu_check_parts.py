"""The child processes ``benchmarks/gpu_check.py`` starts, and its guard against NVML setters (its verdicts are
in ``gpu_check_judges.py``).

``gpu_check.py`` never imports torch itself: what needs torch runs here, in a child process it starts and can
kill (a hung CUDA call then costs one check, not the run). Three commands::

    python benchmarks/gpu_check_parts.py probe                    # JSON: torch, CUDA, the GPU torch sees
    python benchmarks/gpu_check_parts.py load --seconds 20 --ready FILE
    python benchmarks/gpu_check_parts.py session --precision bf16-mixed --steps 30 --run-dir DIR --out FILE

``load`` keeps the GPU busy with bf16 matrix products (8192^3 by default) for ``--seconds``, touching ``--ready``
once the first products ran, and prints its TFLOP/s as JSON. ``session`` trains dtpo's own GPT (``TinyGPT`` of
the built-in ``lm`` workload, sized up through its ``LMConfig``: the CLI has no width flags) with
``dtpo.Session`` on ``cuda:0`` alone, so dtpo counts its FLOPs, reads the catalogue's peak and measures its
energy as in any run; it writes ``RUN_DIR/record.json`` and, to ``--out``, the share of the counted FLOPs that are
attention (torch's FLOP counter counts causal attention as full attention: ``gpu_check`` reports the figure
with that half taken out too).

The guard (:func:`install_guard`) replaces every function of ``pynvml`` that could change a GPU (anything but
``nvmlInit*``, ``nvmlShutdown``, ``nvmlErrorString`` and readers with the word ``Get`` in their name) with one
that refuses and notes the attempt. ``gpu_check`` installs it in its own process and, through a
``sitecustomize`` it writes (:func:`sitecustomize_text`), in every process it starts: ``dtpo train`` and its
workers included.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# -- the guard against NVML setters ---------------------------------------------------------------------------------


GUARD_LOG_ENV = "GPU_CHECK_GUARD_LOG"  # a file each refused call is appended to, one line each
# Words of pynvml function names that change something; a name holding one is refused even if it reads too.
CHANGING = ("Set", "Reset", "Clear", "Create", "Destroy", "Modify", "Remove", "Register", "Inject", "Freeze",
            "Discover", "Validate", "Activate", "Update", "Force", "Write")
ALWAYS_ALLOWED = ("nvmlShutdown", "nvmlErrorString", "nvmlExceptionClass", "nvmlStructToFriendlyObject",
                  "nvmlFriendlyObjectToStruct")


class ForbiddenNvmlCall(RuntimeError):
    """A pynvml function that could change the GPU was called while the guard was on."""


def is_read_only(name: str) -> bool:
    """Whether the pynvml function ``name`` may be called: initialisation, shutdown, error text, or a reader
    (the word ``Get`` in its camel-case name) whose name holds none of the words :data:`CHANGING`."""
    if name in ALWAYS_ALLOWED or name.startswith("nvmlInit"):
        return True
    words = set(re.findall(r"[A-Z][a-z0-9]*|[a-z0-9]+", name))  # nvmlDeviceGetPowerUsage: Device, Get, Power, ...
    return "Get" in words and not words & set(CHANGING)


def forbidden_names(module: Any) -> list[str]:
    """The callables of a pynvml module the guard refuses: every ``nvml*`` one that is not read-only."""
    names = set(dir(module)) | set(dir(type(module)))  # a fake's functions may be methods of its class
    return sorted(name for name in names
                  if name.startswith("nvml") and callable(getattr(module, name, None)) and not is_read_only(name))


def install_guard(module: Any, log_path: str | os.PathLike[str] | None = None,
                  seen: list[str] | None = None) -> list[str]:
    """Refuse every changing function of ``module`` (pynvml, or a fake of it) from now on in this process.

    Args:
        module: The pynvml module.
        log_path: A file each refused call is appended to (``pid name``), so a parent sees its children's.
        seen: A list each refused call's name is appended to.

    Returns:
        The names replaced. Idempotent: a second call replaces nothing more.
    """
    replaced = []
    for name in forbidden_names(module):
        if getattr(getattr(module, name), "_gpu_check_guard", False):
            continue

        def refuse(*args: Any, _name: str = name, **kwargs: Any) -> None:
            if seen is not None:
                seen.append(_name)
            if log_path is not None:
                try:
                    with open(log_path, "a") as fh:
                        fh.write(f"{os.getpid()} {_name}\n")
                except OSError:
                    pass
            raise ForbiddenNvmlCall(f"gpu_check refuses {_name}: it only reads the GPU's settings")

        refuse._gpu_check_guard = True  # type: ignore[attr-defined]
        setattr(module, name, refuse)
        replaced.append(name)
    return replaced


def sitecustomize_text(parts: Path) -> str:
    """The ``sitecustomize.py`` that installs the guard in every process started with its folder first on
    ``PYTHONPATH``, then runs the ``sitecustomize`` it hides, if any (as dtpo's agent does)."""
    return f'''"""Written by benchmarks/gpu_check.py: refuse every NVML setter here (see gpu_check_parts)."""
import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _guard():
    try:
        import pynvml
    except Exception:
        return
    spec = importlib.util.spec_from_file_location("_gpu_check_guard", {str(parts)!r})
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    module.install_guard(pynvml, os.environ.get({GUARD_LOG_ENV!r}))


def _chain():
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_guard()
_chain()
'''


# -- probe ---------------------------------------------------------------------------------------------------------


def guarded() -> bool | None:
    """Whether this process's pynvml refuses setters (the guard's ``sitecustomize`` ran); ``None`` without pynvml."""
    try:
        import pynvml
    except ImportError:
        return None
    return bool(getattr(getattr(pynvml, "nvmlDeviceSetPowerManagementLimit", None), "_gpu_check_guard", False))


def cli_error() -> str | None:
    """Why dtpo's CLI (``python -m dtpo``) cannot be imported here (a missing or too old dependency), or ``None``."""
    try:
        importlib.import_module("dtpo.cli.app")
    except Exception as exc:  # noqa: BLE001 - whatever stops the import is the answer
        return f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
    return None


def probe() -> dict[str, Any]:
    """What torch can do here: version, CUDA, the first GPU; ``reason`` says why CUDA is unusable."""
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - any import failure is the answer
        return {"torch": None, "cuda": False, "guarded": guarded(), "cli_error": cli_error(),
                "reason": f"torch cannot be imported ({type(exc).__name__}: {exc})"}
    out: dict[str, Any] = {"torch": torch.__version__, "cuda_version": torch.version.cuda, "cuda": False,
                           "guarded": guarded(), "cli_error": cli_error()}
    if torch.version.cuda is None:
        out["reason"] = f"torch {torch.__version__} was built without CUDA"
        return out
    try:
        torch.cuda.init()
        count = torch.cuda.device_count()
    except Exception as exc:  # noqa: BLE001
        out["reason"] = f"CUDA unusable: {' '.join(str(exc).split())[:200]}"
        return out
    if count < 1:
        out["reason"] = "torch sees no CUDA device"
        return out
    props = torch.cuda.get_device_properties(0)
    out.update(cuda=True, device_count=count, name=torch.cuda.get_device_name(0),
               memory_gib=props.total_memory / 2**30, capability=list(torch.cuda.get_device_capability(0)),
               bf16=bool(torch.cuda.is_bf16_supported()))
    return out


# -- a steady load -------------------------------------------------------------------------------------------------


def steady_load(seconds: float, ready: Path | None, size: int = 8192,
                clock: Callable[[], float] = time.monotonic) -> dict[str, Any]:
    """bf16 matrix products on ``cuda:0`` for ``seconds``; ``ready`` is touched once the first ones ran."""
    import torch

    device = torch.device("cuda", 0)
    a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    c = torch.empty(size, size, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        torch.mm(a, b, out=c)
    torch.cuda.synchronize(device)
    if ready is not None:
        ready.write_text("ready\n")
    start = clock()
    products = 0
    while clock() - start < seconds:
        for _ in range(16):  # queue a few, then wait: the queue never grows and the load stays even
            torch.mm(a, b, out=c)
        torch.cuda.synchronize(device)
        products += 16
    elapsed = clock() - start
    return {"products": products, "seconds": elapsed, "size": size,
            "tflops": 2.0 * size**3 * products / elapsed / 1e12 if elapsed > 0 else None}


# -- dtpo's own GPT, sized up, through dtpo.Session ----------------------------------------------------------------


def gpt_size(memory_gib: float, width: int | None = None, layers: int | None = None, batch: int | None = None,
             seq: int | None = None) -> dict[str, int]:
    """The GPT's shape: what was asked, else a size that reaches full matmul speed and fits the GPU (d_model
    4096, 4 layers, 4 sequences of 2048 bytes where 60 GiB or more; half the width and batch below). Heads are
    128 wide (fewer than one: one head)."""
    big = memory_gib >= 60
    width = width or (4096 if big else 2048)
    return {"width": width, "layers": layers or 4, "heads": max(1, width // 128), "seq": seq or 2048,
            "batch": batch or (4 if big else 2)}


def attention_share(model: Any, batch: tuple[Any, Any], loss_fn: Callable[..., Any], autocast: Any) -> dict[str, float]:
    """FLOPs of one forward and backward as torch's FLOP counter counts them (what dtpo counts for MFU), and
    the share of them in scaled-dot-product attention; ``autocast`` is a dtype or ``None``."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    inputs, targets = batch
    counter = FlopCounterMode(display=False)
    with counter:
        with torch.autocast(inputs.device.type, dtype=autocast, enabled=autocast is not None):
            out = model(inputs)
        loss_fn(out.float(), targets).backward()
    model.zero_grad(set_to_none=True)
    total = float(counter.get_total_flops())
    attention = sum(float(v) for op, v in counter.get_flop_counts().get("Global", {}).items()
                    if "attention" in str(op))
    return {"flops": total, "attention_flops": attention, "attention_share": attention / total if total else 0.0}


def run_session(args: argparse.Namespace) -> dict[str, Any]:
    """Train dtpo's GPT for ``args.steps`` steps with ``dtpo.Session`` on ``args.device`` (``cuda``: ``cuda:0``;
    ``cpu`` only to try this code on a machine without a GPU); returns what the record lacks."""
    import torch

    import dtpo
    from dtpo.workloads.lm import CharLM, LMConfig

    cuda = args.device == "cuda"
    device = torch.device("cuda", 0) if cuda else torch.device(args.device)
    memory = torch.cuda.get_device_properties(0).total_memory / 2**30 if cuda else 0.0
    size = gpt_size(memory, args.width, args.layers, args.batch, args.seq)
    workload = CharLM(LMConfig(n_layer=size["layers"], n_head=size["heads"], d_model=size["width"],
                               block_size=size["seq"]))
    torch.manual_seed(0)
    with torch.device(device):
        model = workload.build_model()
    data = workload.batches(size["batch"], 0, 1, seed=0)
    out: dict[str, Any] = {"size": size, "gpu": torch.cuda.get_device_name(0) if cuda else str(device),
                           "torch": torch.__version__}
    if args.count_attention:
        inputs, targets = next(data)
        autocast = torch.bfloat16 if args.precision == "bf16-mixed" else None
        out.update(attention_share(model, (inputs.to(device), targets.to(device)), workload.loss, autocast))
    session = dtpo.Session(precision=args.precision, warmup_steps=2, window_steps=args.window,
                           run_dir=args.run_dir, device=device, progress=False, summary=False)
    with session:
        model = session.wrap(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=cuda)
        for inputs, targets in session.batches(data, steps=args.steps):
            session.backward(workload.loss(model(inputs), targets))
            session.step(optimizer)
    if cuda:
        out["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    return out


# -- command line ----------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Run one of the commands; JSON on stdout (``probe``, ``load``) or in ``--out`` (``session``)."""
    parser = argparse.ArgumentParser(prog="gpu_check_parts.py", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("probe")
    load = commands.add_parser("load")
    load.add_argument("--seconds", type=float, required=True)
    load.add_argument("--ready", type=Path)
    load.add_argument("--size", type=int, default=8192)
    session = commands.add_parser("session")
    session.add_argument("--precision", required=True)
    session.add_argument("--steps", type=int, required=True)
    session.add_argument("--window", type=int, default=5)
    session.add_argument("--run-dir", required=True)
    session.add_argument("--out", type=Path, required=True)
    session.add_argument("--count-attention", action="store_true")
    session.add_argument("--width", type=int)
    session.add_argument("--layers", type=int)
    session.add_argument("--batch", type=int)
    session.add_argument("--seq", type=int)
    session.add_argument("--device", default="cuda", help="cuda (cuda:0); cpu only to try this code without a GPU")
    args = parser.parse_args(argv)
    if args.command == "probe":
        print(json.dumps(probe()))
        return 0
    if args.command == "load":
        print(json.dumps(steady_load(args.seconds, args.ready, args.size)), flush=True)
        return 0
    try:
        result = run_session(args)
    except Exception as exc:
        message = " ".join(str(exc).split())[:300]
        if "out of memory" in message.lower():
            message = f"out of memory ({message[:120]}): lower --gpt-batch or --gpt-width"
        args.out.write_text(json.dumps({"error": f"{type(exc).__name__}: {message}"}))
        raise
    args.out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
