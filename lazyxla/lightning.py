"""``lazyxla.lightning``: PyTorch Lightning on lazyxla's device, without torch_xla (implementation:
``lazyxla/frontend/lightning.py``). Importing it imports Lightning and registers the accelerator and
both strategies (a Trainer's, Fabric's) under the name ``"lazyxla"``.

Example::

    import lightning.pytorch as pl
    import lazyxla.lightning

    # or pl.Trainer(accelerator="lazyxla", strategy="lazyxla", max_epochs=1)
    trainer = pl.Trainer(strategy=lazyxla.lightning.Strategy(), max_epochs=1)
    trainer.fit(model, train_loader, val_loader)
    trainer.test(model, test_loader)
    predictions = trainer.predict(model, test_loader)

    fabric = lightning.fabric.Fabric(strategy="lazyxla")        # Fabric: lazyxla.lightning.FabricStrategy
"""

from lazyxla.frontend.lightning import NAME, Accelerator, FabricStrategy, Strategy

__all__ = ["NAME", "Accelerator", "FabricStrategy", "Strategy"]
