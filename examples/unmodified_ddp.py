"""A plain DDP training script in the style of PyTorch's own examples: no dtpo anywhere.

    torchrun --nproc-per-node 2 examples/unmodified_ddp.py          # trains, unmeasured
    dtpo launch --nproc-per-node 2 examples/unmodified_ddp.py       # the same script, measured per step

It counts its own optimizer steps and samples and prints them at the end (``--counts FILE`` writes them as JSON),
so the agent's figures can be checked against the script's.
"""

import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--eval-every", type=int, default=0, help="evaluate every N steps (0: only at the end)")
    parser.add_argument("--counts", default=None, help="write the script's own step and sample counts here")
    args = parser.parse_args()

    distributed = "RANK" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(args.samples, 64), torch.randint(0, 10, (args.samples,)))
    val = TensorDataset(torch.randn(256, 64), torch.randint(0, 10, (256,)))
    sampler = DistributedSampler(data) if distributed else None
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, shuffle=sampler is None)
    val_loader = DataLoader(val, batch_size=64)
    model = torch.nn.Sequential(torch.nn.Linear(64, args.width), torch.nn.ReLU(), torch.nn.Linear(args.width, 10))
    if distributed:
        model = DDP(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    steps = samples = 0
    for epoch in range(args.epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
        model.train()
        for x, y in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            steps += 1
            samples += len(x)
            if args.eval_every and steps % args.eval_every == 0:
                evaluate(model, val_loader)
        evaluate(model, val_loader)
    if rank == 0:
        print(f"trained {steps} steps, {samples} samples on rank 0")
    if args.counts:
        with open(f"{args.counts}.{rank}", "w") as out:
            json.dump({"steps": steps, "samples": samples}, out)
    if distributed:
        dist.destroy_process_group()


@torch.no_grad()
def evaluate(model: torch.nn.Module, loader: DataLoader) -> float:
    model.eval()
    correct = sum(int((model(x).argmax(1) == y).sum()) for x, y in loader)
    model.train()
    return correct / len(loader.dataset)


if __name__ == "__main__":
    main()
