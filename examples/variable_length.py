"""A causal LM trained on variable-length batches: compiles and time without and with shape buckets.

The batches come as a Hugging Face collator makes them (``DataCollatorWithPadding``,
``DataCollatorForLanguageModeling``: each batch padded to its longest sequence, attention mask 0 and labels -100
on the padding), so almost every batch has a new length. Run it once per way of padding (each in a fresh process,
so no program is cached):

    python examples/variable_length.py --pad none            # the loader moves batches as they come
    python examples/variable_length.py --pad buckets         # DeviceLoader(..., pad_to_buckets=(64, 128, 256))
    python examples/variable_length.py --pad multiple        # DeviceLoader(..., pad_to_buckets=Buckets(multiple_of=32))

Each prints the steps, the distinct sequence lengths and padded shapes seen, the programs compiled, the
time of each epoch, and the final loss (the same whichever way: padding does not change the math).
"""

from __future__ import annotations

import argparse
import time

import torch
import transformers as T
from torch.utils.data import DataLoader

import lazyxla

VOCAB, PAD = 256, 0


def collate(rows: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Pad to the longest row of the batch, as Hugging Face's collators do."""
    n = max(len(r) for r in rows)
    ids = torch.full((len(rows), n), PAD)
    mask = torch.zeros(len(rows), n, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)], mask[i, : len(r)] = r, 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pad", choices=("none", "buckets", "multiple"), default="buckets")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--sequences", type=int, default=128)
    args = parser.parse_args()

    g = torch.Generator().manual_seed(0)
    # log-uniform lengths in [8, 250], as text is: many short sequences, a few long ones
    sizes = torch.exp(torch.empty(args.sequences).uniform_(2.08, 5.52, generator=g)).long()
    data = [torch.randint(1, VOCAB, (int(n),), generator=g) for n in sizes]
    loader = DataLoader(data, batch_size=4, collate_fn=collate, drop_last=True)
    pad = {"none": None, "buckets": (64, 128, 256), "multiple": lazyxla.Buckets(multiple_of=32)}[args.pad]

    torch.manual_seed(0)
    config = T.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256,
    )  # fmt: skip
    dev = lazyxla.device()
    model = T.LlamaForCausalLM(config).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    lengths = {batch["input_ids"].shape[1] for batch in loader}
    shapes, steps, epoch_s = set(), 0, []
    for _ in range(args.epochs):
        epoch_start = time.perf_counter()
        for batch in lazyxla.DeviceLoader(loader, dev, pad_to_buckets=pad):
            loss = model(**batch).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            steps += 1
            shapes.add(tuple(batch["input_ids"].shape))
        epoch_s.append(time.perf_counter() - epoch_start)
    print(
        f"pad={args.pad}: {steps} steps, {len(lengths)} lengths, {len(shapes)} shapes, "
        f"{lazyxla.metrics.counters()['compiles']} compiles, epochs {', '.join(f'{s:.1f}' for s in epoch_s)} s, "
        f"final loss {loss.item():.5f}"
    )


if __name__ == "__main__":
    main()
