"""A Keras 3 model on the PyTorch backend trained with DistributedDataParallel, as Keras's own guide to
multi-GPU training with PyTorch writes it (the Keras model is a ``torch.nn.Module``; a torch optimizer and loop):
no dtpo anywhere.

    KERAS_BACKEND=torch torchrun --nproc-per-node 2 keras_torch_ddp.py                        # trains, unmeasured
    KERAS_BACKEND=torch dtpo launch --framework keras --nproc-per-node 2 keras_torch_ddp.py   # measured per step

It counts its own optimizer steps and samples (``--counts FILE`` writes them to ``FILE.<rank>`` as JSON).
"""

import argparse
import json
import os

os.environ.setdefault("KERAS_BACKEND", "torch")

import keras  # noqa: E402 - the backend is chosen before Keras is imported
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--counts", default=None)
    args = parser.parse_args()

    assert keras.backend.backend() == "torch"
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(86, 16), torch.randint(0, 4, (86,)))
    sampler = DistributedSampler(data, shuffle=False)  # 43 samples per rank: 5 batches of 8 and one of 3
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(4)])
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    loss_fn = torch.nn.CrossEntropyLoss()

    steps = samples = 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            loss_fn(ddp(x), y).backward()
            optimizer.step()
            steps += 1
            samples += len(x)
    if args.counts:
        with open(f"{args.counts}.{dist.get_rank()}", "w") as out:
            json.dump({"steps": steps, "samples": samples}, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
