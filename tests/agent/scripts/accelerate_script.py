"""A plain Hugging Face Accelerate training loop on the CPU: no dtpo anywhere.

    accelerate launch --cpu --num_processes 2 accelerate_script.py    # trains, unmeasured
    dtpo launch --nproc-per-node 2 accelerate_script.py               # the same script, measured per step

It counts its own optimizer steps and samples (``--counts FILE`` writes them to ``FILE.<rank>`` as JSON), so the
agent's figures can be checked against the script's.
"""

import argparse
import json

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--accumulate", type=int, default=1, help="gradient accumulation steps")
    parser.add_argument("--max-steps", type=int, default=0, help="stop after this many optimizer steps (0: none)")
    parser.add_argument("--counts", default=None, help="write the script's own step and sample counts here")
    args = parser.parse_args()

    torch.set_num_threads(1)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=args.accumulate)
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(args.samples, 32), torch.randint(0, 4, (args.samples,)))
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    steps = samples = 0
    done = False
    for _ in range(args.epochs):
        model.train()
        for x, y in loader:
            with accelerator.accumulate(model):
                loss = F.cross_entropy(model(x), y)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
            samples += len(x)
            if accelerator.sync_gradients:  # the optimizer really stepped (the end of an accumulation)
                steps += 1
                if args.max_steps and steps == args.max_steps:
                    done = True
                    break
        if done:
            break
    rank = accelerator.process_index
    if accelerator.is_main_process:
        print(f"trained {steps} steps, {samples} samples on rank 0")
    if args.counts:
        with open(f"{args.counts}.{rank}", "w") as out:
            json.dump({"steps": steps, "samples": samples}, out)
    accelerator.end_training()


if __name__ == "__main__":
    main()
