"""Rules for the fused recurrent cells and their backward ops.

PyTorch's ``lstm_cell`` and ``gru_cell`` (and so ``nn.LSTM``/``nn.GRU``, their cells, packed sequences) take
the fused kernels on every device that is not the CPU: the gate matmuls are ordinary ops, and
``_thnn_fused_lstm_cell``/``_thnn_fused_gru_cell`` add the biases and compute the gates. The CPU has no such
kernel, so these ops cannot fall back: they are computed here, the gate arithmetic in the order of PyTorch's
CPU cells (``RNN.cpp``), and the saved ``workspace`` laid out as CUDA's kernel lays it out, since the backward
ops (autograd's formula for the fused forward) read it back: LSTM ``[i, f, g, o]`` (the activated gates),
GRU ``[r, z, n, hx, hn]`` (``hn`` the hidden gate's new-gate part, bias included). Half precision is computed
in float32 and rounded once, as CUDA's kernels do.
"""

from __future__ import annotations

import jax.numpy as jnp
import torch
from jax import nn as jnn

from lazyxla.lowering.registry import lowers
from lazyxla.lowering.rules.common import acc

aten = torch.ops.aten


def _biased(gates, bias):
    return acc(gates) if bias is None else acc(gates) + acc(bias)


def _chunks(x, n):
    return jnp.split(x, n, axis=1)


@lowers(aten._thnn_fused_lstm_cell.default)
def _fused_lstm_cell(ctx, input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    # CPU: gates = linear_hh(hx) + linear_ih(x), each linear adding its bias
    gates = _biased(hidden_gates, hidden_bias) + _biased(input_gates, input_bias)
    i, f, g, o = _chunks(gates, 4)
    i, f, g, o = jnn.sigmoid(i), jnn.sigmoid(f), jnp.tanh(g), jnn.sigmoid(o)
    cy = f * acc(cx) + i * g
    hy = o * jnp.tanh(cy)
    return hy, cy, jnp.concatenate([i, f, g, o], axis=1)


@lowers(aten._thnn_fused_lstm_cell_backward_impl.default)
def _fused_lstm_cell_backward(ctx, grad_hy, grad_cy, cx, cy, workspace, has_bias):
    if grad_hy is None and grad_cy is None:  # PyTorch returns no gradients then (nor does its meta kernel)
        return None, None, None
    i, f, g, o = _chunks(acc(workspace), 4)
    cx, cy = acc(cx), acc(cy)
    # An output autograd holds no gradient for arrives as None: a zero gradient, as CUDA's kernel takes it.
    go = jnp.zeros_like(cy) if grad_hy is None else acc(grad_hy)
    gc = jnp.zeros_like(cy) if grad_cy is None else acc(grad_cy)
    tcy = jnp.tanh(cy)
    gcell = go * o * (1 - tcy * tcy) + gc
    grad_gates = jnp.concatenate(
        [gcell * g * (1 - i) * i, gcell * cx * (1 - f) * f, gcell * i * (1 - g * g), go * tcy * (1 - o) * o], axis=1
    )
    grad_bias = grad_gates.sum(0) if has_bias else None
    return grad_gates, gcell * f, grad_bias


@lowers(aten._thnn_fused_gru_cell.default)
def _fused_gru_cell(ctx, input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    ir, ii, in_ = _chunks(_biased(input_gates, input_bias), 3)
    hr, hi, hn = _chunks(_biased(hidden_gates, hidden_bias), 3)
    hx = acc(hx)
    # CPU: r = sigmoid(hr + ir), z = sigmoid(hi + ii), n = tanh(in + hn * r), hy = (hx - n) * z + n
    r = jnn.sigmoid(hr + ir)
    z = jnn.sigmoid(hi + ii)
    n = jnp.tanh(in_ + hn * r)
    hy = (hx - n) * z + n
    return hy, jnp.concatenate([r, z, n, hx, hn], axis=1)


@lowers(aten._thnn_fused_gru_cell_backward.default)
def _fused_gru_cell_backward(ctx, grad_hy, workspace, has_bias):
    r, z, n, hx, hn = _chunks(acc(workspace), 5)
    go = acc(grad_hy)
    gz = go * (hx - n) * (1 - z) * z
    gn = go * (1 - z) * (1 - n * n)
    gr = gn * hn * (1 - r) * r
    grad_input = jnp.concatenate([gr, gz, gn], axis=1)
    grad_hidden = jnp.concatenate([gr, gz, gn * r], axis=1)
    if not has_bias:
        return grad_input, grad_hidden, go * z, None, None
    return grad_input, grad_hidden, go * z, grad_input.sum(0), grad_hidden.sum(0)
