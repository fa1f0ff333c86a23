"""A plain Hugging Face ``transformers`` Trainer run on the CPU: a tiny BERT built from a config (nothing is
downloaded), synthetic token ids, no dtpo anywhere.

    torchrun --nproc-per-node 2 trainer_script.py             # trains, unmeasured
    dtpo launch --nproc-per-node 2 trainer_script.py          # the same script, measured per step

It counts its own optimizer steps (a ``TrainerCallback``) and the samples the model trained on (a forward
pre-hook); ``--counts FILE`` writes them to ``FILE.<rank>`` as JSON.
"""

import argparse
import json
import os
import tempfile

import torch
from torch.utils.data import Dataset
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainerCallback, TrainingArguments


class Tokens(Dataset):
    """Random token ids with a label each."""

    def __init__(self, size: int, length: int = 16, vocab: int = 100) -> None:
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(1, vocab, (size, length), generator=generator)
        self.labels = torch.randint(0, 2, (size,), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "attention_mask": torch.ones_like(self.ids[i]), "labels": self.labels[i]}


class CountSteps(TrainerCallback):
    def __init__(self) -> None:
        self.steps = 0

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201 - transformers' signature
        self.steps += 1


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-steps", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--samples", type=int, default=32, help="dataset size (split across the ranks)")
    parser.add_argument("--accumulate", type=int, default=1, help="gradient accumulation steps")
    parser.add_argument("--counts", default=None, help="write the script's own step and sample counts here")
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=37, max_position_embeddings=32, num_labels=2)
    model = BertForSequenceClassification(config)
    trained = {"samples": 0}

    def count(module: torch.nn.Module, positional: tuple, kwargs: dict) -> None:
        if module.training:
            trained["samples"] += int(kwargs["input_ids"].shape[0])

    model.register_forward_pre_hook(count, with_kwargs=True)
    steps = CountSteps()
    with tempfile.TemporaryDirectory() as out:
        training = TrainingArguments(output_dir=out, use_cpu=True, report_to=[], save_strategy="no",
                                     logging_strategy="no", disable_tqdm=True, max_steps=args.max_steps,
                                     per_device_train_batch_size=args.batch_size,
                                     gradient_accumulation_steps=args.accumulate, dataloader_num_workers=0,
                                     learning_rate=1e-3, ddp_find_unused_parameters=False)
        trainer = Trainer(model=model, args=training, train_dataset=Tokens(args.samples), callbacks=[steps])
        trainer.train()
    rank = int(os.environ.get("RANK", "0"))
    if rank == 0:
        print(f"trained {steps.steps} steps, {trained['samples']} samples on rank 0")
    if args.counts:
        with open(f"{args.counts}.{rank}", "w") as out_file:
            json.dump({"steps": steps.steps, "samples": trained["samples"]}, out_file)


if __name__ == "__main__":
    main()
