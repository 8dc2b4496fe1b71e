"""Recurrent modules and cells against CPU eager (rules/rnn.py): PyTorch takes the fused LSTM/GRU cell kernels on
every device but the CPU, and the CPU has no such kernel to fall back to. Forward outputs, input, state and
parameter gradients; packed sequences; double backward; a training step's compiles; bf16 autocast."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn
from torch.nn.utils import rnn as rnn_utils

import lazyxla
from tests.util import assert_same, to_dev
from tests.util import normal as _r

TOL = dict(rtol=1e-5, atol=1e-5)
T, B, I, H = 5, 3, 4, 6  # noqa: E741 -- sequence, batch, input and hidden sizes


def _no_fallback():
    fell = sorted(k for k in lazyxla.metrics.counters() if k.startswith("fallback."))
    assert not fell, f"ops ran on the CPU: {fell}"


def _weights_like(outs, seed):
    """Random cotangents for each output, so that every output's gradient (``c_n`` too) is checked."""
    return [_r(*o.shape, grad=False, seed=seed + k) for k, o in enumerate(outs)]


def _flat(out):
    """A module's or cell's outputs as a flat list of tensors: ``(y, (h, c))``, ``(y, h)``, ``(h, c)``, ``h``."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, rnn_utils.PackedSequence):
        return [out.data]
    return [t for o in out for t in _flat(o)]


def _compare(module, *inputs):
    """``module(*inputs)`` on CPU and on lazyxla: outputs, and the gradients of a random weighting of every
    output w.r.t. the inputs and the parameters."""
    torch.manual_seed(0)
    dev_module = copy.deepcopy(module).to(lazyxla.device())
    cpu_inputs = [
        x.detach().clone().requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor) else x for x in inputs
    ]
    dev_inputs = to_dev(inputs)
    expected, actual = _flat(module(*cpu_inputs)), _flat(dev_module(*dev_inputs))
    assert_same(actual, expected, **TOL)
    weights = _weights_like(expected, seed=11)
    sum(((o * w).sum() for o, w in zip(expected, weights)), torch.tensor(0.0)).backward()
    sum((o * w.to(o.device)).sum() for o, w in zip(actual, weights)).backward()
    for (name, p), q in zip(module.named_parameters(), dev_module.parameters()):
        assert q.grad is not None, name
        torch.testing.assert_close(q.grad.cpu(), p.grad, **TOL, msg=lambda m, n=name: f"grad of {n}: {m}")
    for x, d in zip(cpu_inputs, dev_inputs):
        if isinstance(x, torch.Tensor) and x.requires_grad:
            torch.testing.assert_close(d.grad.cpu(), x.grad, **TOL)
    _no_fallback()


# ---- cells ----

CELLS = [
    (nn.LSTMCell, {}),
    (nn.LSTMCell, dict(bias=False)),
    (nn.GRUCell, {}),
    (nn.GRUCell, dict(bias=False)),
    (nn.RNNCell, dict(nonlinearity="tanh")),
    (nn.RNNCell, dict(nonlinearity="relu", bias=False)),
]


def _cell_state(cls, batch, seed):
    shape = (batch, H) if batch else (H,)
    h = _r(*shape, seed=seed)
    return (h, _r(*shape, seed=seed + 1)) if cls is nn.LSTMCell else h


@pytest.mark.parametrize("cls,kw", CELLS, ids=lambda v: getattr(v, "__name__", str(v)))
@pytest.mark.parametrize("state", ["given", "zeros"])
def test_cell(cls, kw, state):
    torch.manual_seed(0)
    cell = cls(I, H, **kw)
    x = _r(B, I, seed=1)
    _compare(cell, x, _cell_state(cls, B, seed=2)) if state == "given" else _compare(cell, x)


@pytest.mark.parametrize("cls,kw", CELLS[::2], ids=lambda v: getattr(v, "__name__", str(v)))
def test_cell_unbatched(cls, kw):
    torch.manual_seed(0)
    _compare(cls(I, H, **kw), _r(I, seed=1), _cell_state(cls, 0, seed=2))


def test_gru_cell_from_the_issue(dev):
    # issue 26: raised "Could not run 'aten::_thnn_fused_gru_cell' with arguments from the 'CPU' backend"
    torch.manual_seed(0)
    cell = nn.GRUCell(3, 4)
    expected = cell(torch.ones(2, 3))
    assert_same(copy.deepcopy(cell).to(dev)(torch.ones(2, 3, device=dev)), expected, **TOL)


# ---- modules ----

MODULES = {
    "lstm": (nn.LSTM, {}),
    "lstm-2layer-bidir": (nn.LSTM, dict(num_layers=2, bidirectional=True)),
    "lstm-batch_first-nobias": (nn.LSTM, dict(batch_first=True, bias=False)),
    "lstm-proj": (nn.LSTM, dict(proj_size=3, num_layers=2)),
    "gru": (nn.GRU, {}),
    "gru-2layer-bidir": (nn.GRU, dict(num_layers=2, bidirectional=True)),
    "gru-batch_first-nobias": (nn.GRU, dict(batch_first=True, bias=False)),
    "rnn-tanh-2layer": (nn.RNN, dict(num_layers=2)),
    "rnn-relu-bidir-batch_first": (nn.RNN, dict(nonlinearity="relu", bidirectional=True, batch_first=True)),
}


def _module_state(module, seed):
    dirs = module.num_layers * (2 if module.bidirectional else 1)
    h = _r(dirs, B, module.proj_size or H, seed=seed)
    return (h, _r(dirs, B, H, seed=seed + 1)) if isinstance(module, nn.LSTM) else h


@pytest.mark.parametrize("state", ["given", "zeros"])
@pytest.mark.parametrize("name", MODULES)
def test_module(name, state):
    cls, kw = MODULES[name]
    torch.manual_seed(0)
    module = cls(I, H, **kw)
    x = _r(*((B, T, I) if kw.get("batch_first") else (T, B, I)), seed=1)
    _compare(module, x, _module_state(module, seed=2)) if state == "given" else _compare(module, x)


@pytest.mark.parametrize("cls", [nn.LSTM, nn.GRU])
def test_module_unbatched(cls):
    torch.manual_seed(0)
    _compare(cls(I, H, num_layers=2), _r(T, I, seed=1))


@pytest.mark.parametrize("lengths", [[5, 3, 2], [3, 5, 2]], ids=["sorted", "unsorted"])
@pytest.mark.parametrize("cls", [nn.LSTM, nn.GRU, nn.RNN])
def test_packed_sequence(cls, lengths):
    # Padded sequences of lengths 5, 3 and 2: each step runs the cell on the batch still active. PyTorch keeps
    # the lengths and batch sizes on the CPU, as on CUDA.
    torch.manual_seed(0)
    module = cls(I, H, bidirectional=True)
    lengths = torch.tensor(lengths)

    def run(m, x):
        packed = rnn_utils.pack_padded_sequence(x, lengths, enforce_sorted=False)
        assert packed.batch_sizes.device.type == "cpu" and packed.batch_sizes.tolist() == [3, 3, 2, 1, 1]
        out, state = m(packed)
        padded, _ = rnn_utils.pad_packed_sequence(out)
        return padded, state

    wrapper = _Wrap(module, run)
    _compare(wrapper, _r(T, B, I, seed=1))


class _Wrap(nn.Module):
    def __init__(self, module, fn):
        super().__init__()
        self.module, self.fn = module, fn

    def forward(self, *args):
        return self.fn(self.module, *args)


@pytest.mark.parametrize("cls", [nn.LSTMCell, nn.GRUCell])
def test_cell_double_backward(cls):
    # With create_graph, autograd differentiates the fused cell through PyTorch's differentiable formula.
    torch.manual_seed(0)
    cell = cls(I, H)
    results = []
    for device in ("cpu", lazyxla.device()):
        m = copy.deepcopy(cell).to(device)
        x = _r(B, I, seed=1).detach().to(device).requires_grad_()
        out = _flat(m(x))[0]
        (gx,) = torch.autograd.grad(out.square().sum(), x, create_graph=True)
        gx.square().sum().backward()
        results.append([gx.detach().cpu(), *(p.grad.cpu() for p in m.parameters())])
    torch.testing.assert_close(results[1], results[0], rtol=1e-4, atol=1e-5)
    _no_fallback()


# ---- training ----


def test_nested_recurrent_module_keeps_its_parameters(dev):
    # nn.LSTM keeps weak references to its parameters, remade by its own _apply inside the outer module's move;
    # they must not make lazyxla give up keeping the Parameter objects (an optimizer built before .to trains).
    torch.manual_seed(0)
    model = nn.Sequential(_Wrap(nn.LSTM(I, H), lambda m, x: m(x)[0]), nn.Linear(H, 2))
    reference = copy.deepcopy(model)
    params = list(model.parameters())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.to(dev)
    assert all(p is q for p, q in zip(model.parameters(), params))
    assert all(p.device == dev for p in params)
    lstm = model[0].module
    assert all(w is getattr(lstm, n) for w, n in zip(lstm._flat_weights, lstm._flat_weights_names))
    x = _r(T, B, I, grad=False, seed=1)
    for m, o, xs in ((model, opt, x.to(dev)), (reference, torch.optim.SGD(reference.parameters(), lr=0.1), x)):
        m(xs).square().mean().backward()
        o.step()
    torch.testing.assert_close([p.detach().cpu() for p in params], [p.detach() for p in reference.parameters()])


@pytest.mark.parametrize("cls", [nn.LSTM, nn.GRU])
def test_training_steps_match_eager_and_compile_once(cls, dev):
    torch.manual_seed(0)
    model = nn.Sequential(_Wrap(cls(I, H, num_layers=2), lambda m, x: m(x)[0]), nn.Linear(H, 2))
    x, y = _r(T, B, I, grad=False, seed=1), _r(T, B, 2, grad=False, seed=2)
    runs = {}
    for device in ("cpu", dev):
        m = copy.deepcopy(model).to(device)
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        xs, ys = x.to(device), y.to(device)
        losses, compiles = [], []
        for _ in range(4):
            loss = nn.functional.mse_loss(m(xs), ys)
            loss.backward()
            opt.step()
            opt.zero_grad()
            if device == dev:
                lazyxla.sync()
                compiles.append(lazyxla.metrics.counters()["compiles"])
            losses.append(loss.detach().cpu())
        runs[device] = (torch.stack(losses), {k: v.detach().cpu() for k, v in m.state_dict().items()}, compiles)
    (ref_losses, ref_state, _), (losses, state, compiles) = runs["cpu"], runs[dev]
    torch.testing.assert_close(losses, ref_losses, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(state, ref_state, rtol=1e-4, atol=1e-5)
    # the first step compiles the step, the second adds the momentum buffers; then nothing
    assert compiles[2:] == [compiles[1]] * 2, compiles
    _no_fallback()


# ---- bf16 autocast ----


def test_lstm_under_bf16_autocast(dev):
    # The fused cell is on autocast's lower-precision list: bf16 gates, computed in float32 and rounded once.
    torch.manual_seed(0)
    module = nn.LSTM(I, H, num_layers=2)
    x = _r(T, B, I, grad=False, seed=1)
    expected, _ = module(x)
    m = copy.deepcopy(module).to(dev)
    with torch.autocast("lazyxla", dtype=torch.bfloat16):
        out, (h, c) = m(x.to(dev))
    assert out.dtype == torch.bfloat16, out.dtype
    out.float().sum().backward()
    torch.testing.assert_close(out.float().cpu(), expected.detach(), rtol=0, atol=3e-2)
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in m.parameters())
    assert all(torch.isfinite(p.grad.cpu()).all() for p in m.parameters())
    _no_fallback()
