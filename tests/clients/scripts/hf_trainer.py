"""A transformers ``Trainer`` script as a torch_xla user writes it (it imports nothing from lazyxla).

Under ``python -m lazyxla.run`` transformers finds ``torch_xla`` and takes its XLA code paths (accelerate's
``DistributedType.XLA``, ``MpDeviceLoader``, ``xm.mark_step``, ``xm.save``, ...); with plain ``python`` it
trains on the CPU. ``xmp.spawn`` starts one replica per device (``CPU_NUM_DEVICES=2``: two processes).

It trains a tiny random Llama for STEPS optimizer steps (default 4) with Trainer's defaults (fused AdamW, pinned
memory, ``max_grad_norm=1.0``, linear schedule) plus gradient accumulation, evaluation and checkpoints every
STEPS/2 steps (at least 2), then trains again from the first checkpoint (``resume_from_checkpoint``) to the last
step. Every replica writes what it saw to ``<out>/result_<rank>.pt``: logs, parameters, the device and
distributed facts, compile and capture replay counts per step and the ops that ran on the CPU.

    python -m lazyxla.run hf_trainer.py OUT BATCH [STEPS]  # on lazyxla (CPU_NUM_DEVICES=2: 2 replicas)
    python hf_trainer.py OUT BATCH [STEPS]                 # on the CPU
"""

import os
import sys

import torch
import transformers as T
from hf_common import compiled, cpu_ops, examples, llama, replays, xmp
from transformers.utils import is_torch_xla_available


def seeded_llama(seed):
    torch.manual_seed(seed)
    return llama()


def cpu_state(model):
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


class CompileCounts(T.TrainerCallback):
    """Programs compiled so far, at the end of each optimizer step (torch_xla's UncachedCompile counter), and
    captured steps replayed so far (lazyxla's ``capture_replays``; ``LAZYXLA_CAPTURE=1``)."""

    def __init__(self):
        self.counts = []
        self.replays = []

    def on_step_end(self, args, state, control, **kwargs):
        self.counts.append(compiled())
        self.replays.append(replays())


def trainer(out, batch, model, counts, steps):
    every = max(2, steps // 2)  # evaluation and checkpoints: steps 2 and 4 of the default 4 steps
    args = T.TrainingArguments(
        output_dir=out,
        per_device_train_batch_size=batch,
        per_device_eval_batch_size=batch,
        gradient_accumulation_steps=2,
        learning_rate=5e-3,  # Trainer's 5e-5 would move the weights less than the tolerance of the comparison
        max_steps=steps,
        eval_strategy="steps",
        eval_steps=every,
        save_steps=every,
        logging_steps=1,
        report_to="none",
    )
    return T.Trainer(
        model=model, args=args, train_dataset=examples(32, 1), eval_dataset=examples(8, 2), callbacks=[counts]
    )


def main(out, batch, steps=4):
    model = seeded_llama(0)
    initial = cpu_state(model)
    counts = CompileCounts()
    first = trainer(out, batch, model, counts, steps)
    first.train()
    final = cpu_state(first.model)
    resumed_counts = CompileCounts()
    second = trainer(out, batch, seeded_llama(1), resumed_counts, steps)
    second.train(resume_from_checkpoint=os.path.join(out, f"checkpoint-{first.args.save_steps}"))
    args = first.args
    optimizer = first.optimizer.optimizer  # the torch optimizer inside accelerate's wrapper
    result = {
        "xla": is_torch_xla_available(),
        "device": str(args.device),
        "param_device": str(next(first.model.parameters()).device),
        "distributed_type": str(first.accelerator.distributed_type),
        "parallel_mode": str(args.parallel_mode),
        "world_size": args.world_size,
        "optimizer": type(optimizer).__name__,
        "fused": optimizer.defaults.get("fused"),
        "train_loader": type(first.get_train_dataloader()).__name__,
        "logs": first.state.log_history,
        "initial": initial,
        "final": final,
        "resumed_logs": second.state.log_history,
        "resumed": cpu_state(second.model),
        "compiles": counts.counts,
        "replays": counts.replays,
        "resumed_compiles": resumed_counts.counts,
        "resumed_replays": resumed_counts.replays,
        "cpu_ops": cpu_ops(),
    }
    torch.save(result, os.path.join(out, f"result_{args.process_index}.pt"))


def _mp_fn(index, out, batch, steps):
    main(out, batch, steps)


if __name__ == "__main__":
    out, batch = sys.argv[1], int(sys.argv[2])
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 4
    if xmp is not None:
        xmp.spawn(_mp_fn, args=(out, batch, steps))
    else:
        main(out, batch, steps)
