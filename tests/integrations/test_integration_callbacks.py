"""``dtpo.integrations``: the Lightning and ``transformers`` callbacks, each in one process with the real library,
write a record with one step per optimizer step and the samples trained on."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch

from dtpo.core.record import RunRecord

pytestmark = pytest.mark.ecosystem

MISSING = "{} not installed: make integration installs the ecosystems extra"


def test_the_package_imports_without_the_libraries() -> None:
    module = importlib.import_module("dtpo.integrations")
    assert "lightning.py" in module.__doc__ and "transformers.py" in module.__doc__


def test_the_lightning_callback_records_one_step_per_optimizer_step(tmp_path: Path) -> None:
    pl = pytest.importorskip("pytorch_lightning", reason=MISSING.format("pytorch_lightning"))
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset

    from dtpo.integrations.lightning import DtpoCallback

    class Classifier(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(8, 2)

        def training_step(self, batch, batch_idx):  # noqa: ANN001, ANN201 - Lightning's signature
            x, y = batch
            return F.cross_entropy(self.net(x), y)

        def configure_optimizers(self):  # noqa: ANN201
            return torch.optim.SGD(self.parameters(), lr=0.1)

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(40, 8), torch.randint(0, 2, (40,)))  # batches of 8: 5 per epoch
    callback = DtpoCallback(run_dir=tmp_path / "run", summary=False)
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=2, accumulate_grad_batches=2, logger=False,
                         enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                         callbacks=[callback])
    trainer.fit(Classifier(), DataLoader(data, batch_size=8))
    record = RunRecord.load(tmp_path / "run")
    assert record.status == "completed"
    steps = record.ranks[0].steps
    assert trainer.global_step == 6  # 2 + 2 + 1 (the epoch's last batch steps alone), twice
    assert [step.samples for step in steps] == [16, 16, 8] * 2
    assert callback.reporter is None  # finished


def test_the_transformers_callback_records_one_step_per_optimizer_step(tmp_path: Path) -> None:
    pytest.importorskip("transformers", reason=MISSING.format("transformers"))
    pytest.importorskip("accelerate", reason=MISSING.format("accelerate"))
    from torch.utils.data import Dataset
    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

    from dtpo.integrations.transformers import DtpoCallback

    class Tokens(Dataset):
        def __init__(self, size: int) -> None:
            self.ids = torch.randint(1, 100, (size, 12), generator=torch.Generator().manual_seed(0))

        def __len__(self) -> int:
            return len(self.ids)

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            return {"input_ids": self.ids[i], "attention_mask": torch.ones_like(self.ids[i]),
                    "labels": torch.tensor(i % 2)}

    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1,
                                                     num_attention_heads=2, intermediate_size=37,
                                                     max_position_embeddings=16, num_labels=2))
    args = TrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True, report_to=[], save_strategy="no",
                             logging_strategy="no", disable_tqdm=True, max_steps=5, per_device_train_batch_size=4,
                             gradient_accumulation_steps=2, dataloader_num_workers=0)
    callback = DtpoCallback(run_dir=tmp_path / "run", summary=False)
    # 20 samples in batches of 4, 2 batches per step: 3 steps per epoch (the last of one batch); 5 stops mid-epoch
    Trainer(model=model, args=args, train_dataset=Tokens(20), callbacks=[callback]).train()
    record = RunRecord.load(tmp_path / "run")
    assert record.status == "completed"
    steps = record.ranks[0].steps
    assert [step.samples for step in steps] == [8, 8, 4, 8, 8]
    assert [step.tokens for step in steps] == [96, 96, 48, 96, 96]  # 12 token ids per sample
