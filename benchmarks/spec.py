"""What the benchmarks run: sizes, settings, and the shared initial parameters and data.

Every framework starts from the same numpy parameters and batch (keyed by the PyTorch ``state_dict``
names), so the three implementations of a model compute the same numbers and their losses can be
compared. This module imports only numpy: a subprocess that measures one framework imports only that
framework.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np

# A torch framework's name alone: ``opt.zero_grad()`` after ``opt.step()``; with ZERO_GRAD_FIRST appended, the
# idiom most PyTorch code uses: ``opt.zero_grad()`` at the top of the loop (the gradients are alive at the sync).
ZERO_GRAD_FIRST = ", zero_grad first"
FRAMEWORKS = (
    "jax.jit",
    "eager",
    "eager" + ZERO_GRAD_FIRST,
    "lazyxla",
    "lazyxla" + ZERO_GRAD_FIRST,
    "lazyxla compiled",
    "lazyxla compiled" + ZERO_GRAD_FIRST,
    "lazyxla captured",
    "lazyxla captured" + ZERO_GRAD_FIRST,
)
# lazyxla compiled: the same lazyxla step with model + loss and the optimizer step under
# torch.compile(backend="lazyxla"); COMPILED_LAZY_OPTIMIZER: model + loss only (the optimizer step in lazy mode),
# not in FRAMEWORKS: benchmarks/compiled_step.py sets it side by side with the two others
COMPILED_LAZY_OPTIMIZER = "lazyxla compiled, lazy optimizer"
# lazyxla captured: the whole step under lazyxla.compile(capture=True) (warm steps replayed without recording)
MODELS = ("mlp", "gpt")
# The device eager PyTorch runs on: the CPU by default; ``cuda`` on a GPU host (``benchmarks.agreement
# --eager-device``), so eager is what a PyTorch user on that machine would run. Only in a process of its own: with
# lazyxla imported, PyTorch's autograd engine fails every CUDA backward (pytorch/pytorch#161129).
EAGER_DEVICE_VARIABLE = "BENCH_EAGER_DEVICE"


@dataclasses.dataclass(frozen=True)
class MLPSpec:
    """An MLP ``sizes[0] -> ... -> sizes[-1]`` with ReLU, cross-entropy, SGD momentum 0.9, lr 0.01."""

    sizes: tuple[int, ...] = (784, 2048, 2048, 10)
    batch: int = 128

    def describe(self) -> str:
        """One line for the table header."""
        return f"MLP {'-'.join(map(str, self.sizes))}, batch {self.batch}, SGD momentum 0.9 lr 0.01, cross-entropy"


@dataclasses.dataclass(frozen=True)
class GPTSpec:
    """A pre-LayerNorm GPT (causal SDPA, GELU MLP 4x, untied embeddings, no dropout) trained with AdamW."""

    vocab: int = 1024
    d_model: int = 256
    layers: int = 4
    heads: int = 4
    seq: int = 128
    batch: int = 8

    def describe(self) -> str:
        """One line for the table header."""
        return (
            f"GPT vocab {self.vocab}, d_model {self.d_model}, {self.layers} layers, {self.heads} heads, "
            f"seq {self.seq}, batch {self.batch}, AdamW (torch defaults, weight decay 0.01)"
        )


@dataclasses.dataclass(frozen=True)
class Settings:
    """Sizes and repetition counts of one benchmark run (``full()`` or ``quick()``)."""

    mlp: MLPSpec
    gpt: GPTSpec
    steps: int  # measured training steps per framework, (a) and (b)
    warmup: int  # training steps before measuring (lazyxla compiles in the first two)
    memory_steps: int  # steps a fresh subprocess runs for the first-step time and peak memory, (c) and (e)
    process_repeats: int  # fresh subprocesses per row of (c) and (e); the tables show their median
    chain_ops: int  # torch calls in the recording-cost chain, (d)
    chain_repeats: int  # warm repetitions of the chain

    @staticmethod
    def full() -> Settings:
        """The default run: the sizes the performance issue asks for."""
        return Settings(
            MLPSpec(),
            GPTSpec(),
            steps=20,
            warmup=3,
            memory_steps=5,
            process_repeats=3,
            chain_ops=2000,
            chain_repeats=10,
        )

    @staticmethod
    def quick() -> Settings:
        """Small sizes and few steps: a smoke test of the harness, not a measurement."""
        return Settings(
            MLPSpec(sizes=(64, 128, 128, 10), batch=16),
            GPTSpec(vocab=64, d_model=32, layers=1, heads=2, seq=16, batch=2),
            steps=3,
            warmup=2,
            memory_steps=1,
            process_repeats=1,
            chain_ops=30,
            chain_repeats=2,
        )

    def spec(self, model: str) -> MLPSpec | GPTSpec:
        """The spec of ``model`` ('mlp' or 'gpt')."""
        return {"mlp": self.mlp, "gpt": self.gpt}[model]


def mlp_params(spec: MLPSpec, seed: int = 0) -> dict[str, np.ndarray]:
    """Initial MLP parameters, named like ``nn.Sequential(Linear, ReLU, Linear, ...)``'s state_dict."""
    rng = np.random.default_rng(seed)
    out = {}
    for i, (a, b) in enumerate(zip(spec.sizes[:-1], spec.sizes[1:])):
        out[f"{2 * i}.weight"] = (rng.standard_normal((b, a)) / math.sqrt(a)).astype(np.float32)
        out[f"{2 * i}.bias"] = np.zeros(b, np.float32)
    return out


def gpt_params(spec: GPTSpec, seed: int = 0) -> dict[str, np.ndarray]:
    """Initial GPT parameters, named like ``benchmarks.torch_models.GPT``'s state_dict."""
    rng = np.random.default_rng(seed)
    d = spec.d_model
    normal = lambda *shape: (rng.standard_normal(shape) / math.sqrt(d)).astype(np.float32)
    zeros = lambda n: np.zeros(n, np.float32)
    ones = lambda n: np.ones(n, np.float32)
    out = {"tok.weight": normal(spec.vocab, d), "pos.weight": normal(spec.seq, d)}
    for i in range(spec.layers):
        p = f"blocks.{i}."
        out.update(
            {
                p + "ln1.weight": ones(d),
                p + "ln1.bias": zeros(d),
                p + "qkv.weight": normal(3 * d, d),
                p + "proj.weight": normal(d, d),
                p + "proj.bias": zeros(d),
                p + "ln2.weight": ones(d),
                p + "ln2.bias": zeros(d),
                p + "fc1.weight": normal(4 * d, d),
                p + "fc1.bias": zeros(4 * d),
                p + "fc2.weight": normal(d, 4 * d),
                p + "fc2.bias": zeros(d),
            }
        )
    out.update({"ln.weight": ones(d), "ln.bias": zeros(d), "head.weight": normal(spec.vocab, d)})
    return out


def mlp_batch(spec: MLPSpec, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """One batch: inputs ``(batch, sizes[0])`` float32 and class labels ``(batch,)`` int64."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((spec.batch, spec.sizes[0])).astype(np.float32)
    return x, rng.integers(0, spec.sizes[-1], spec.batch).astype(np.int64)


def gpt_batch(spec: GPTSpec, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """One batch: token ids ``(batch, seq)`` and next-token targets ``(batch, seq)``, both int64."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, spec.vocab, (spec.batch, spec.seq + 1)).astype(np.int64)
    return tokens[:, :-1].copy(), tokens[:, 1:].copy()


def make_step(framework: str, model: str, spec: MLPSpec | GPTSpec) -> Callable[[], float]:
    """A training step of ``model`` in ``framework``: each call runs one step, syncs and returns the loss.

    Imports only what ``framework`` needs (jax for 'jax.jit'; torch, plus lazyxla for 'lazyxla' and
    'lazyxla compiled'); a torch framework's name may end in ``ZERO_GRAD_FIRST`` (the loop's idiom). A torch
    step also keeps, as ``step.record_s``, the seconds its last call spent before the sync (recording for
    lazyxla; the whole computation for eager). Every step keeps, as ``step.host_s``, the CPU seconds its thread
    spent in the last call before reading the loss (recording and dispatch; for eager, the computation).
    """
    if framework == "jax.jit":
        from benchmarks import jax_models

        return jax_models.make_step(model, spec)
    from benchmarks import torch_models

    base = framework.removesuffix(ZERO_GRAD_FIRST)
    return torch_models.make_step(model, spec, base, zero_grad_first=base != framework)
