"""A plain PyTorch Lightning run with DDP on the CPU: no dtpo anywhere.

    torchrun --nproc-per-node 2 lightning_script.py           # trains, unmeasured (Lightning sees torchelastic)
    dtpo launch --nproc-per-node 2 lightning_script.py        # the same script, measured per step

It counts its own optimizer steps and the samples it trained on (in the LightningModule);
``--counts FILE`` writes them to ``FILE.<rank>`` as JSON.
"""

import argparse
import json

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class Classifier(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
        self.samples = 0
        self.steps = 0

    def training_step(self, batch, batch_idx):  # noqa: ANN001, ANN201 - Lightning's signature
        x, y = batch
        self.samples += len(x)
        return F.cross_entropy(self.net(x), y)

    def on_before_zero_grad(self, optimizer) -> None:  # noqa: ANN001 - after each optimizer step
        self.steps += 1

    def configure_optimizers(self):  # noqa: ANN201
        return torch.optim.SGD(self.parameters(), lr=0.05)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--max-steps", type=int, default=-1)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--samples", type=int, default=192, help="dataset size (split across the ranks)")
    parser.add_argument("--accumulate", type=int, default=1, help="accumulate_grad_batches")
    parser.add_argument("--counts", default=None, help="write the script's own step and sample counts here")
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(args.samples, 32), torch.randint(0, 4, (args.samples,)))
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True)
    model = Classifier()
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=args.epochs,
                         max_steps=args.max_steps, accumulate_grad_batches=args.accumulate,
                         enable_progress_bar=False, enable_model_summary=False, logger=False,
                         enable_checkpointing=False)
    trainer.fit(model, loader)
    rank = trainer.global_rank
    if rank == 0:
        print(f"trained {model.steps} steps (global_step {trainer.global_step}), {model.samples} samples on rank 0")
    if args.counts:
        with open(f"{args.counts}.{rank}", "w") as out:
            json.dump({"steps": model.steps, "samples": model.samples}, out)


if __name__ == "__main__":
    main()
