"""An accelerate training loop as a torch_xla user writes it (it imports nothing from lazyxla).

Under ``python -m lazyxla.run`` accelerate finds ``torch_xla`` and takes its XLA code paths
(``DistributedType.XLA``, ``MpDeviceLoader``, ``xm.all_reduce`` of the gradients, ``xm.all_gather``,
``xm.save``, ...); with plain ``python`` it trains on the CPU. ``xmp.spawn`` starts one replica per device
(``CPU_NUM_DEVICES=2``: two processes).

A tiny random Llama trains one epoch (8 batches) with ``Accelerator.prepare``, ``backward``,
``clip_grad_norm_`` and ``gather``, saving its state after batch 4 (``save_state``); then it is evaluated
with ``gather_for_metrics``, the saved state is loaded back (``load_state``) and training goes on over the
batches after the fourth (``skip_first_batches``). Every replica writes what it saw to
``<out>/result_<rank>.pt``.

The loader shuffles with accelerate's seedable sampler: its order depends on the seed only, whereas a plain
shuffled DataLoader's order also depends on the global RNG, which accelerate's XLA branch draws from once
more than its CPU branch (with torch_xla as well). The schedule steps once per call
(``step_scheduler_with_optimizer=False``) so that it is the same for one replica and for two.
Safetensors' ``load_model`` reads storage pointers, which XLA tensors (torch_xla's and lazyxla's) do not
have, so the state is saved with ``safe_serialization=False``.

    python -m lazyxla.run hf_accelerate.py OUT BATCH       # on lazyxla (CPU_NUM_DEVICES=2: 2 replicas)
    python hf_accelerate.py OUT BATCH                      # on the CPU
"""

import os
import sys

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, is_torch_xla_available, set_seed
from hf_common import compiled, cpu_ops, examples, llama, xmp
from torch.utils.data import DataLoader


def cpu_state(accelerator, model):
    return {k: v.detach().cpu().clone() for k, v in accelerator.unwrap_model(model).state_dict().items()}


def train(accelerator, model, optimizer, scheduler, loader, record, save_to=None):
    model.train()
    for step, batch in enumerate(loader):
        loss = model(**batch).loss
        accelerator.backward(loss)
        record["norms"].append(accelerator.clip_grad_norm_(model.parameters(), 1.0))
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        record["losses"].append(accelerator.gather(loss.detach()))
        record["compiles"].append(compiled())
        if step == 3 and save_to:
            accelerator.save_state(save_to, safe_serialization=False)
            record["saved"] = cpu_state(accelerator, model)


def evaluate(accelerator, model, loader):
    model.eval()
    predictions = []
    for batch in loader:
        with torch.no_grad():
            logits = model(**batch).logits
        predicted, labels = accelerator.gather_for_metrics((logits.argmax(-1), batch["labels"]))
        predictions.append(torch.stack([predicted, labels]).cpu())
    return torch.cat(predictions, dim=1)


def host(record):
    """The record's device values read to the host."""
    record["losses"] = [v.cpu().reshape(-1) for v in record["losses"]]
    record["norms"] = [float(v) for v in record["norms"]]
    return record


def main(out, batch):
    accelerator = Accelerator(
        step_scheduler_with_optimizer=False,
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
    )
    set_seed(0)
    model = llama()
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, 1.0, 0.25, total_iters=8)
    loader = DataLoader(examples(32, 1), batch_size=batch, shuffle=True)
    eval_loader = DataLoader(examples(8, 2), batch_size=batch)
    model, optimizer, loader, eval_loader, scheduler = accelerator.prepare(
        model, optimizer, loader, eval_loader, scheduler
    )
    first = {"losses": [], "norms": [], "compiles": []}
    train(accelerator, model, optimizer, scheduler, loader, first, save_to=os.path.join(out, "state"))
    predictions = evaluate(accelerator, model, eval_loader)
    final = cpu_state(accelerator, model)
    accelerator.load_state(os.path.join(out, "state"))
    loaded = cpu_state(accelerator, model)
    resumed = {"losses": [], "norms": [], "compiles": []}
    train(accelerator, model, optimizer, scheduler, accelerator.skip_first_batches(loader, 4), resumed)
    result = {
        "xla": is_torch_xla_available(),
        "device": str(accelerator.device),
        "param_device": str(next(model.parameters()).device),
        "distributed_type": str(accelerator.distributed_type),
        "num_processes": accelerator.num_processes,
        "train_loader": type(loader).__name__,
        "initial": initial,
        "first": host(first),
        "predictions": predictions,
        "final": final,
        "loaded": loaded,
        "resumed": host(resumed),
        "resumed_final": cpu_state(accelerator, model),
        "cpu_ops": cpu_ops(),
    }
    torch.save(result, os.path.join(out, f"result_{accelerator.process_index}.pt"))


def _mp_fn(index, out, batch):
    main(out, batch)


if __name__ == "__main__":
    out, batch = sys.argv[1], int(sys.argv[2])
    if xmp is not None:
        xmp.spawn(_mp_fn, args=(out, batch))
    else:
        main(out, batch)
