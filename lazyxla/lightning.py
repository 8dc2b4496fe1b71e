"""``lazyxla.lightning``: PyTorch Lightning on lazyxla's device, without torch_xla (implementation:
``lazyxla/frontend/lightning.py``). Importing it imports Lightning and registers both under the name
``"lazyxla"``.

Example::

    import lightning.pytorch as pl
    import lazyxla.lightning

    trainer = pl.Trainer(strategy=lazyxla.lightning.Strategy(), max_epochs=1)   # or strategy="lazyxla"
    trainer.fit(model, train_loader, val_loader)
    trainer.test(model, test_loader)
    predictions = trainer.predict(model, test_loader)
"""

from lazyxla.frontend.lightning import NAME, Accelerator, Strategy

__all__ = ["NAME", "Accelerator", "Strategy"]
