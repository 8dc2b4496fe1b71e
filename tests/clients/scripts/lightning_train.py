"""A Lightning script as a torch_xla user writes it (imports nothing from lazyxla or torch_xla).

``python lightning_train.py OUT ACCELERATOR DEVICES [OPTIMIZER]``: seeds, builds a tiny LightningModule, fits it
for one epoch of 4 batches (fixed data, batch 4; SGD with momentum or Adam), validates, tests and predicts, and
saves ``OUT/result_<rank>.pt``: the losses of every step, the initial and final parameters, the validation and
test losses, the predictions, and which of Lightning's classes ran (strategy, precision, accelerator, the
parameters' device, the training loader's type). ``ACCELERATOR`` is Lightning's (``cpu``, ``tpu``, ``auto``),
``cpu-epoch-order`` (the CPU, batches in the order of Lightning's DistributedSampler: the reference of
``DEVICES`` = 2), or ``lazyxla``: ``strategy=lazyxla.lightning.Strategy()`` (the integration without torch_xla).
With ``DEVICES`` > 1 fit, test and predict each run in Lightning's new processes: each process saves its own
fit result, and for validation, test and predict the batches it saw with its losses or predictions
(``OUT/<stage>_<rank>.pt``), so that the CPU's model can be checked on exactly those batches.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from lightning.pytorch import LightningModule, Trainer
from torch.utils.data import DataLoader, TensorDataset


class Tiny(LightningModule):
    def __init__(self, optimizer: str, save_fit_to: Path | None = None) -> None:
        super().__init__()
        self.save_fit_to = save_fit_to  # several processes: each saves its own fit's result (see main)
        self.net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
        self.optimizer = optimizer
        self.losses: list[torch.Tensor] = []
        self.eval_losses: dict[str, list[torch.Tensor]] = {"val": [], "test": []}
        self.eval_batches: dict[str, list[torch.Tensor]] = {"val": [], "test": [], "predict": []}
        self.predictions: list[torch.Tensor] = []
        self.seen = {}

    def forward(self, x):
        return self.net(x)

    def _loss(self, batch):
        x, y = batch
        return torch.nn.functional.cross_entropy(self(x), y)

    def training_step(self, batch, batch_idx):
        loss = self._loss(batch)
        self.losses.append(loss.detach())
        self.seen["param_device"] = str(next(self.parameters()).device)
        self.seen["batch_device"] = str(batch[0].device)
        return loss

    def on_train_start(self):
        self.seen["train_loader"] = type(self.trainer.train_dataloader).__name__

    def on_train_end(self):  # not on_fit_end: XLAStrategy has torn down (its ranks read 0) by then
        if self.save_fit_to is None:
            return
        result = {
            "initial": self.initial,
            "final": {k: v.detach().to("cpu") for k, v in self.state_dict().items()},
            "losses": torch.stack(_cpu(self.losses)),
            "val": torch.stack(_cpu(self.eval_losses["val"])),
            "strategy": type(self.trainer.strategy).__name__,
            "precision": type(self.trainer.precision_plugin).__name__,
            "accelerator": type(self.trainer.accelerator).__name__,
            "world_size": self.trainer.world_size,
            "rank": self.global_rank,
            **{k: self.seen.get(k) for k in ("param_device", "batch_device", "train_loader")},
        }
        torch.save(result, self.save_fit_to / f"result_{self.global_rank}.pt")

    def _seen_batch(self, stage: str, batch) -> None:
        if self.save_fit_to is not None:  # several processes: which samples this rank got is the sampler's
            self.eval_batches[stage].append(batch[0].detach().to("cpu"))

    def validation_step(self, batch, batch_idx):
        self._seen_batch("val", batch)
        self.eval_losses["val"].append(self._loss(batch).detach())

    def test_step(self, batch, batch_idx):
        self._seen_batch("test", batch)
        self.eval_losses["test"].append(self._loss(batch).detach())

    def predict_step(self, batch, batch_idx):
        self._seen_batch("predict", batch)
        prediction = self(batch[0]).softmax(-1)
        self.predictions.append(prediction.detach())
        return prediction

    def _save_stage(self, stage: str, outputs: list[torch.Tensor]) -> None:
        if self.save_fit_to is None:
            return
        result = {"inputs": _cpu(self.eval_batches[stage]), "outputs": _cpu(outputs), "rank": self.global_rank}
        result["world_size"] = self.trainer.world_size
        torch.save(result, self.save_fit_to / f"{stage}_{self.global_rank}.pt")

    def on_validation_end(self):
        self._save_stage("val", self.eval_losses["val"])

    def on_test_end(self):
        self._save_stage("test", self.eval_losses["test"])

    def on_predict_end(self):
        self._save_stage("predict", self.predictions)

    def configure_optimizers(self):
        if self.optimizer == "adam":
            return torch.optim.Adam(self.parameters(), lr=0.05)
        return torch.optim.SGD(self.parameters(), lr=0.2, momentum=0.9)


def _placement(name: str) -> dict:
    """Trainer's accelerator/strategy arguments: Lightning's accelerator names, or ``lazyxla`` (the
    integration's strategy), ``lazyxla-names`` (both by their registered names), ``lazyxla-accelerator-only`` and
    ``lazyxla-strategy-name-only`` (its accelerator alone, its strategy's name alone: each must refuse)."""
    if name.startswith("lazyxla"):
        import lazyxla.lightning  # only in these modes: the others import nothing of lazyxla's

        if name == "lazyxla-accelerator-only":
            return {"accelerator": lazyxla.lightning.Accelerator()}
        if name == "lazyxla-names":  # the registered names
            return {"accelerator": "lazyxla", "strategy": "lazyxla"}
        if name == "lazyxla-strategy-name-only":  # Lightning would hand it its CPU accelerator: must refuse
            return {"strategy": "lazyxla"}
        return {"strategy": lazyxla.lightning.Strategy()}
    return {"accelerator": "cpu" if name == "cpu-epoch-order" else name}


def _cpu(values):
    return [v.detach().to("cpu") for v in values]


def main(out: Path, accelerator: str, devices: int, optimizer: str) -> None:
    torch.manual_seed(0)
    x, y = torch.randn(16, 6), torch.randint(0, 3, (16,))
    data = TensorDataset(x, y)
    # devices > 1: Lightning's launcher fits in new processes (xmp.spawn on its XLA path); the losses and
    # parameters live there, so each process saves its own result at the end of training, and only fit runs
    model = Tiny(optimizer, save_fit_to=out if devices > 1 else None)
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    model.initial = initial
    trainer = Trainer(
        **_placement(accelerator),
        devices=devices,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    if devices > 1 or accelerator == "cpu-epoch-order":
        # With several processes Lightning always gives the training loader a shuffling DistributedSampler
        # (seed 0): rank r takes order[r::devices]. "cpu-epoch-order" is the one-process reference: batches of
        # 4 in that order, which step k of the ranks splits between them (the same samples, whole batch)
        generator = torch.Generator()
        generator.manual_seed(0)
        order = torch.randperm(len(data), generator=generator).tolist()  # DistributedSampler's, epoch 0
        loader = DataLoader(data, batch_size=4 // devices, sampler=order if devices == 1 else None)
    else:
        loader = DataLoader(data, batch_size=4, shuffle=False)
    trainer.fit(model, train_dataloaders=loader, val_dataloaders=DataLoader(data, batch_size=8))
    trainer.test(model, DataLoader(data, batch_size=8), verbose=False)
    predictions = trainer.predict(model, DataLoader(data, batch_size=8))
    if devices > 1:
        return  # the processes saved their own results (see Tiny._save_stage)
    result = {
        "initial": initial,
        "final": {k: v.detach().to("cpu") for k, v in model.state_dict().items()},
        "losses": torch.stack(_cpu(model.losses)),
        "val": torch.stack(_cpu(model.eval_losses["val"])),
        "test": torch.stack(_cpu(model.eval_losses["test"])),
        "predictions": torch.cat(_cpu(predictions)) if predictions else torch.zeros(0),
        "strategy": type(trainer.strategy).__name__,
        "precision": type(trainer.precision_plugin).__name__,
        "accelerator": type(trainer.accelerator).__name__,
        "param_device": model.seen.get("param_device"),
        "batch_device": model.seen.get("batch_device"),
        "train_loader": model.seen.get("train_loader"),
        "rank": trainer.global_rank,
    }
    torch.save(result, out / f"result_{trainer.global_rank}.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4] if len(sys.argv) > 4 else "sgd")
