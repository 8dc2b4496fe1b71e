"""Eager mode with a compiled step, written for torch_xla (fake data).

As torch_xla's eager-mode guide writes it: ``torch_xla.experimental.eager_mode(True)`` makes every op run as
soon as it is called (for debugging: an error points at its own line, values can be printed anywhere), while
the training step wrapped in ``torch_xla.compile`` is still traced and compiled as one program. Here the batches
are normalized on the device eagerly, then the compiled step trains a small decoder-only language model with
AdamW. It imports only torch_xla:

    python -m lazyxla.run examples/torch_xla/eager_train.py --steps 5
    python -m lazyxla.run examples/torch_xla/eager_train.py --eager-step   # the step op by op too

Each step prints ``loss step=S value=V``; then ``programs eager=E compiled=C`` (programs run eagerly, one per
op, and compiled programs, from ``torch_xla.debug.metrics``); the last line is ``final loss V``.
"""

import argparse

import torch
import torch.nn.functional as F
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.debug.metrics as met
from decoder_only_model import DecoderOnly, fake_batches


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--eager-step", action="store_true", help="run the training step eagerly too")
    return parser.parse_args(argv)


def token_scale(ids, vocab=64):
    """A per-batch embedding scale computed from the batch (eagerly, on the device, before the step)."""
    return 1.0 + ids.float().mean() / vocab


def main(flags):
    torch_xla.experimental.eager_mode(True)
    torch.manual_seed(flags.seed)
    device = torch_xla.device()
    model = DecoderOnly().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=flags.lr, weight_decay=0.01)

    def step_fn(inputs, targets, scale):
        optimizer.zero_grad()
        logits = model(inputs, scale)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        loss.backward()
        optimizer.step()
        return loss

    step = step_fn if flags.eager_step else torch_xla.compile(step_fn, full_graph=True, name="train_step")
    met.clear_all()
    losses = []
    for i, ids in enumerate(fake_batches(flags.steps, flags.batch_size)):
        ids = ids.to(device)
        inputs, targets = ids[:, :-1], ids[:, 1:]
        scale = token_scale(ids)  # runs now, op by op
        losses.append(step(inputs, targets, scale))
        print(f"loss step={i} value={losses[-1].item()!r}", flush=True)
    xm.wait_device_ops()
    eager = met.metric_data("EagerOpExecuteTime")
    compiled = met.metric_data("ExecuteTime")
    print(f"programs eager={eager[0] if eager else 0} compiled={compiled[0] if compiled else 0}", flush=True)
    print(f"final loss {losses[-1].item()!r}", flush=True)


if __name__ == "__main__":
    main(parse_args())
