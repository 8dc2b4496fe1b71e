"""The benchmark models in PyTorch, run eagerly on the CPU (or ``$BENCH_EAGER_DEVICE``, e.g. cuda) or lazily on
the lazyxla device (op by op, or with model + loss under ``torch.compile(backend="lazyxla")``)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks import spec as S


class Block(nn.Module):
    """Pre-LayerNorm transformer block: causal self-attention, then a GELU MLP 4x, each residual."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: (batch, seq, d) -> (batch, seq, d)."""
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    """Token + learned position embeddings, ``layers`` blocks, final LayerNorm, untied output head."""

    def __init__(self, spec: S.GPTSpec) -> None:
        super().__init__()
        self.tok = nn.Embedding(spec.vocab, spec.d_model)
        self.pos = nn.Embedding(spec.seq, spec.d_model)
        self.blocks = nn.ModuleList(Block(spec.d_model, spec.heads) for _ in range(spec.layers))
        self.ln = nn.LayerNorm(spec.d_model)
        self.head = nn.Linear(spec.d_model, spec.vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """``idx``: (batch, seq) token ids -> (batch, seq, vocab) logits."""
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def _mlp(spec: S.MLPSpec) -> nn.Module:
    layers: list[nn.Module] = []
    for a, b in zip(spec.sizes[:-1], spec.sizes[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def _device(framework: str) -> torch.device:
    if framework == "eager":
        return torch.device(os.environ.get(S.EAGER_DEVICE_VARIABLE, "cpu"))
    if framework in ("lazyxla", "lazyxla compiled", S.COMPILED_LAZY_OPTIMIZER, "lazyxla captured"):
        import lazyxla

        return lazyxla.device()
    raise ValueError(f"not a torch framework: {framework!r}")


def setup(
    model: str,
    spec: S.MLPSpec | S.GPTSpec,
    framework: str,
    zero_grad_first: bool = False,
    autocast: torch.dtype | None = None,
):
    """``(record, sync)`` for ``model`` ('mlp' or 'gpt') on ``framework`` ('eager', 'lazyxla' or
    'lazyxla compiled').

    ``record()`` runs forward, backward, the optimizer step and ``zero_grad`` and returns the loss
    tensor (unread); ``zero_grad_first``: ``zero_grad`` comes first instead of last (the gradients are then
    alive at the sync, as in most PyTorch training loops); ``sync`` is ``lazyxla.sync`` (a no-op for eager).
    Parameters and the batch come from :mod:`benchmarks.spec` and are on the device when this returns (for
    lazyxla, waited for).
    'lazyxla compiled' runs model + loss as ``torch.compile(..., backend="lazyxla")`` (one forward and
    one backward IR op per step) and the optimizer step as ``torch.compile(opt.step, backend="lazyxla")`` (one
    more); ``S.COMPILED_LAZY_OPTIMIZER`` compiles model + loss only, the optimizer step recorded op by op in lazy
    mode. 'lazyxla captured' runs the whole step
    under ``lazyxla.compile(capture=True)``: from its third or fourth call on, replayed without recording (its
    AdamW becomes ``capturable``, as under torch.compile). ``autocast``: model + loss run under
    ``torch.autocast(<the device's type>, dtype=autocast)`` (e.g. ``torch.bfloat16``).
    """
    dev = _device(framework)
    if model == "mlp":
        net, params, (x, y) = _mlp(spec), S.mlp_params(spec), S.mlp_batch(spec)
        make_opt = lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9)
        loss_fn = F.cross_entropy
    elif model == "gpt":
        net, params, (x, y) = GPT(spec), S.gpt_params(spec), S.gpt_batch(spec)
        make_opt = lambda ps: torch.optim.AdamW(ps, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
        loss_fn = lambda logits, t: F.cross_entropy(logits.flatten(0, 1), t.flatten())
    else:
        raise ValueError(f"unknown model {model!r}")
    net.load_state_dict({k: torch.from_numpy(v) for k, v in params.items()})
    net = net.to(dev)
    opt = make_opt(net.parameters())
    x, y = torch.from_numpy(x).to(dev), torch.from_numpy(y).to(dev)
    sync = lambda: None
    forward = lambda a, b: loss_fn(net(a), b)
    if autocast is not None:
        plain = forward

        def forward(a, b):
            with torch.autocast(dev.type, dtype=autocast):
                return plain(a, b)

    step = opt.step
    if framework in ("lazyxla", "lazyxla compiled", S.COMPILED_LAZY_OPTIMIZER, "lazyxla captured"):
        import lazyxla

        sync = lazyxla.sync
        lazyxla.sync(wait=True)
    if framework in ("lazyxla compiled", S.COMPILED_LAZY_OPTIMIZER):
        from lazyxla import dynamo  # noqa: F401  (registers the "lazyxla" backend; importing lazyxla does too)

        forward = torch.compile(forward, backend="lazyxla")
    if framework == "lazyxla compiled":
        step = torch.compile(opt.step, backend="lazyxla")

    def record() -> torch.Tensor:
        if zero_grad_first:
            opt.zero_grad()
        loss = forward(x, y)
        loss.backward()
        step()
        if not zero_grad_first:
            opt.zero_grad()
        return loss

    if framework == "lazyxla captured":  # the step syncs itself: recorded, or replayed once verified
        record, sync = lazyxla.compile(record, capture=True), lambda: None
    return record, sync


def make_step(
    model: str,
    spec: S.MLPSpec | S.GPTSpec,
    framework: str,
    zero_grad_first: bool = False,
    autocast: torch.dtype | None = None,
) -> Callable[[], float]:
    """A training step of ``model`` ('mlp' or 'gpt') on ``framework`` ('eager', 'lazyxla' or 'lazyxla
    compiled'): forward, backward, the optimizer step, ``lazyxla.sync()`` on lazyxla; returns
    ``loss.item()``. ``step.record_s``: the seconds the last call spent before the sync. ``autocast``: as
    ``setup``'s."""
    record, sync = setup(model, spec, framework, zero_grad_first, autocast)

    def step() -> float:
        start, cpu = time.perf_counter(), time.thread_time()
        loss = record()
        step.record_s = time.perf_counter() - start
        sync()
        step.host_s = time.thread_time() - cpu
        return loss.item()

    step.record_s = step.host_s = None
    return step
