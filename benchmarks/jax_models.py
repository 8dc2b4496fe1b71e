"""The benchmark models written directly in jax: the same math as ``torch_models``, one ``jax.jit`` per step.

The floor the lazyxla numbers are compared with: what a hand-written jax program does with the same
parameters, batch, loss and optimizer (PyTorch's SGD-momentum and AdamW update rules, written out).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp

from benchmarks import spec as S

Params = dict[str, jax.Array]


def _cross_entropy(logits: jax.Array, target: jax.Array) -> jax.Array:
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, target[..., None], axis=-1))


def _linear(p: Params, name: str, x: jax.Array, bias: bool = True) -> jax.Array:
    y = x @ p[name + ".weight"].T
    return y + p[name + ".bias"] if bias else y


def _layer_norm(p: Params, name: str, x: jax.Array, eps: float = 1e-5) -> jax.Array:
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * p[name + ".weight"] + p[name + ".bias"]


def mlp_loss(p: Params, x: jax.Array, y: jax.Array, layers: int) -> jax.Array:
    """Cross-entropy of the MLP (Linear, ReLU, ..., Linear) on one batch."""
    h = x
    for i in range(layers):
        h = _linear(p, str(2 * i), h)
        if i < layers - 1:
            h = jax.nn.relu(h)
    return _cross_entropy(h, y)


def _attention(p: Params, name: str, x: jax.Array, heads: int) -> jax.Array:
    b, t, d = x.shape
    q, k, v = jnp.split(_linear(p, name + ".qkv", x, bias=False), 3, axis=-1)
    q, k, v = (z.reshape(b, t, heads, d // heads).transpose(0, 2, 1, 3) for z in (q, k, v))
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d // heads)
    causal = jnp.tril(jnp.ones((t, t), bool))
    weights = jax.nn.softmax(jnp.where(causal, scores, -jnp.inf), axis=-1)
    y = (weights @ v).transpose(0, 2, 1, 3).reshape(b, t, d)
    return _linear(p, name + ".proj", y)


def gpt_loss(p: Params, idx: jax.Array, target: jax.Array, spec: S.GPTSpec) -> jax.Array:
    """Next-token cross-entropy of the pre-LayerNorm GPT on one batch (``torch_models.GPT``'s math)."""
    x = p["tok.weight"][idx] + p["pos.weight"][: idx.shape[1]]
    for i in range(spec.layers):
        blk = f"blocks.{i}"
        x = x + _attention(p, blk, _layer_norm(p, blk + ".ln1", x), spec.heads)
        h = jax.nn.gelu(_linear(p, blk + ".fc1", _layer_norm(p, blk + ".ln2", x)), approximate=False)
        x = x + _linear(p, blk + ".fc2", h)
    return _cross_entropy(_linear(p, "head", _layer_norm(p, "ln", x), bias=False), target)


def sgd_momentum(p: Params, g: Params, buf: Params, lr: float = 0.01, momentum: float = 0.9):
    """``torch.optim.SGD(momentum=0.9)``: buf = momentum * buf + g (buf starts at zero); p -= lr * buf."""
    buf = jax.tree.map(lambda b, gi: momentum * b + gi, buf, g)
    return jax.tree.map(lambda pi, b: pi - lr * b, p, buf), buf


def adamw(p: Params, g: Params, m: Params, v: Params, step: jax.Array, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8, wd=0.01):
    """``torch.optim.AdamW`` with its defaults and weight decay 0.01 (``step`` counts from 1)."""
    m = jax.tree.map(lambda mi, gi: b1 * mi + (1 - b1) * gi, m, g)
    v = jax.tree.map(lambda vi, gi: b2 * vi + (1 - b2) * gi * gi, v, g)
    step_size = lr / (1 - b1**step)
    bc2_sqrt = jnp.sqrt(1 - b2**step)
    new = lambda pi, mi, vi: pi * (1 - lr * wd) - step_size * mi / (jnp.sqrt(vi) / bc2_sqrt + eps)
    return jax.tree.map(new, p, m, v), m, v


def make_step(model: str, spec: S.MLPSpec | S.GPTSpec) -> Callable[[], float]:
    """A jitted training step of ``model`` ('mlp' or 'gpt'); each call runs one step and returns ``float(loss)``.

    ``step.host_s``: the CPU seconds the last call's dispatch took (its thread's, before reading the loss).
    Parameters, optimizer state and the batch are device arrays when this returns; the step count of
    AdamW is an argument, so every step runs the same compiled program. Parameters and optimizer state
    are donated to the step, as a jax training loop would (lazyxla donates them too).
    """
    if model == "mlp":
        params, batch = S.mlp_params(spec), S.mlp_batch(spec)
        layers = len(spec.sizes) - 1

        @functools.partial(jax.jit, donate_argnums=(0, 1))
        def train(p, buf, x, y):
            loss, g = jax.value_and_grad(mlp_loss)(p, x, y, layers)
            p, buf = sgd_momentum(p, g, buf)
            return p, buf, loss

        state = {"p": jax.tree.map(jnp.asarray, params)}
        state["buf"] = jax.tree.map(jnp.zeros_like, state["p"])
        x, y = (jnp.asarray(a) for a in batch)

        def step() -> float:
            cpu = time.thread_time()
            state["p"], state["buf"], loss = train(state["p"], state["buf"], x, y)
            step.host_s = time.thread_time() - cpu
            return float(loss)

        def lowered():
            return train.lower(state["p"], state["buf"], x, y)

    elif model == "gpt":
        params, batch = S.gpt_params(spec), S.gpt_batch(spec)

        @functools.partial(jax.jit, donate_argnums=(0, 1, 2, 3))
        def train(p, m, v, count, idx, target):
            loss, g = jax.value_and_grad(gpt_loss)(p, idx, target, spec)
            count = count + 1
            p, m, v = adamw(p, g, m, v, count)
            return p, m, v, count, loss

        state = {"p": jax.tree.map(jnp.asarray, params)}
        state["m"] = jax.tree.map(jnp.zeros_like, state["p"])
        state["v"] = jax.tree.map(jnp.zeros_like, state["p"])
        state["count"] = jnp.zeros((), jnp.float32)
        idx, target = (jnp.asarray(a) for a in batch)

        def step() -> float:
            cpu = time.thread_time()
            state["p"], state["m"], state["v"], state["count"], loss = train(
                state["p"], state["m"], state["v"], state["count"], idx, target
            )
            step.host_s = time.thread_time() - cpu
            return float(loss)

        def lowered():
            return train.lower(state["p"], state["m"], state["v"], state["count"], idx, target)

    else:
        raise ValueError(f"unknown model {model!r}")
    jax.block_until_ready(state)
    step.lowered = lowered  # the step's program, lowered (benchmarks.program_size counts its lines)
    step.program = lambda: lowered().compile()  # compiled again: for its memory_analysis()
    return step
