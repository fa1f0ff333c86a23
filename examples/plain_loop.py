"""A plain PyTorch training loop that keeps its own model, optimizer and process group, and reports only when
each step ended and how many samples it carried: ``dtpo.StepReporter`` gives it the run record, energy windows,
the GPU knobs and the power tuner that a ``dtpo.Session`` loop gets.

Run it alone or under torchrun (the reporter joins the process group the script made)::

    python examples/plain_loop.py --steps 200
    torchrun --nproc-per-node 2 examples/plain_loop.py --steps 200
    python examples/plain_loop.py --steps 2000 --tune power-limit     # on GPUs with power knobs

``runs/<run-id>/record.json`` then holds every step, the energy windows and, with ``--tune``, the tuner's choice.
"""

from __future__ import annotations

import argparse
import itertools
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dtpo


def main(argv: list[str] | None = None) -> None:
    """Train a small classifier on random data for ``--steps`` steps, reporting each step to dtpo."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="optimizer steps to run")
    parser.add_argument("--tune", choices=["power-limit", "sm-clock"], help="tune this GPU knob while training")
    parser.add_argument("--run-dir", help="where the record goes (default: runs/<run-id>)")
    args = parser.parse_args(argv)

    distributed = "RANK" in os.environ and not dist.is_initialized()
    if distributed:
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    device = torch.device(f"cuda:{os.environ.get('LOCAL_RANK', 0)}" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    model: nn.Module = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)).to(device)
    if distributed:
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = TensorDataset(torch.randn(4096, 64), torch.randint(0, 10, (4096,)))
    loader = DataLoader(data, batch_size=64, shuffle=True)

    # --- the dtpo part: one `with` and one call per step ------------------------------------------------------
    tune = dtpo.TuneConfig(knob=args.tune) if args.tune else None
    with dtpo.StepReporter(total_steps=args.steps, tune=tune, run_dir=args.run_dir, device=device) as steps:
        for x, y in itertools.islice(itertools.cycle(loader), args.steps):
            x, y = x.to(device), y.to(device)
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            steps.step(samples=len(x))
    # -----------------------------------------------------------------------------------------------------------

    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
