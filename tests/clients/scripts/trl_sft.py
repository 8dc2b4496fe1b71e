"""A TRL ``SFTTrainer`` script as a torch_xla user writes it (it imports nothing from lazyxla).

Under ``python -m lazyxla.run`` transformers and accelerate find ``torch_xla`` and take their XLA code paths; with
plain ``python`` it trains on the CPU. It fine-tunes a tiny random Llama on 16 short texts of different lengths
(a word-level tokenizer built here from their words: nothing is downloaded) for STEPS optimizer steps with
``SFTConfig``'s defaults (gradient checkpointing included) but ``bf16=False`` (a float32 run compares with the CPU
at 1e-4) and the learning rate, plus the settings given as ``KEY=VALUE`` arguments (``logging_steps=4``,
``pad_to_multiple_of=16``; integers as integers). It writes ``<out>/result_0.pt``: the log history, parameters
before and after, the device facts, and, after each optimizer step, torch_xla's counters of programs run
(``ExecuteComputation``), compiled (``UncachedCompile``), ``mark_step``s and host reads.

    python -m lazyxla.run trl_sft.py OUT BATCH STEPS [KEY=VALUE ...]  # on lazyxla
    python trl_sft.py OUT BATCH STEPS [KEY=VALUE ...]                 # on the CPU
"""

import os
import sys

import datasets
import tokenizers
import torch
import transformers as T
import trl
from hf_common import cpu_ops, llama, met
from transformers.utils import is_torch_xla_available

TEXTS = [
    "the cat sat on the mat",
    "a dog runs fast",
    "the big red house on the hill is old",
    "tree",
    "small blue cars drive slowly down the long road",
    "birds sing",
    "the sun rises over the quiet sea every morning",
    "rain falls on the roof",
] * 2
COUNTERS = ("ExecuteComputation", "UncachedCompile", "MarkStep", "aten::_local_scalar_dense")


def tokenizer():
    """A word-level tokenizer of the texts' words, with the special tokens TRL needs (pad, eos)."""
    words = sorted({w for t in TEXTS for w in t.split()})
    vocab = {w: i for i, w in enumerate(["<pad>", "<eos>", "<unk>", *words])}
    raw = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    raw.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    return T.PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


class Counts(T.TrainerCallback):
    """torch_xla's counters at the end of each optimizer step (None on the CPU)."""

    def __init__(self):
        self.counts = []

    def on_step_end(self, args, state, control, **kwargs):
        self.counts.append({c: met.counter_value(c) or 0 for c in COUNTERS} if met is not None else None)


def setting(text):
    key, value = text.split("=", 1)
    return key, int(value) if value.lstrip("-").isdigit() else value


def main(out, batch, steps, settings):
    torch.manual_seed(0)
    model = llama()
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    config = trl.SFTConfig(
        output_dir=out,
        per_device_train_batch_size=batch,
        max_steps=steps,
        learning_rate=5e-3,  # SFT's 2e-5 would move the weights less than the tolerance of the comparison
        bf16=False,
        report_to="none",
        save_strategy="no",
        seed=0,
        **settings,
    )
    counts = Counts()
    trainer = trl.SFTTrainer(
        model=model,
        args=config,
        train_dataset=datasets.Dataset.from_dict({"text": TEXTS}),
        processing_class=tokenizer(),
        callbacks=[counts],
    )
    trainer.train()
    result = {
        "xla": is_torch_xla_available(),
        "device": str(config.device),
        "param_device": str(next(trainer.model.parameters()).device),
        "distributed_type": str(trainer.accelerator.distributed_type),
        "train_loader": type(trainer.get_train_dataloader()).__name__,
        "gradient_checkpointing": trainer.model.is_gradient_checkpointing,
        "logs": trainer.state.log_history,
        "initial": initial,
        "final": {k: v.detach().cpu().clone() for k, v in trainer.model.state_dict().items()},
        "counts": counts.counts,
        "cpu_ops": cpu_ops(),
    }
    torch.save(result, os.path.join(out, "result_0.pt"))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), dict(setting(a) for a in sys.argv[4:]))
