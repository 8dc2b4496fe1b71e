"""``lazyxla.scan`` and ``lazyxla.scan_layers`` (and torch_xla's ``experimental.scan`` / ``scan_layers``): one loop
in the program, forward and backward, equal to the Python loop run eagerly on the CPU."""

from __future__ import annotations

import copy
import importlib.util
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import lazyxla
import lazyxla.compat as compat
from lazyxla.frontend.scan import ScanError
from tests.models import GPT
from tests.util import ROOT, run_python

TOL = {"rtol": 1e-5, "atol": 1e-5}


def _close(actual, expected, **kw):
    torch.testing.assert_close(actual.detach().cpu(), expected.detach(), **{**TOL, **kw})


def _leaf(t, dev=None):
    return t.detach().clone().to(dev or "cpu").requires_grad_(t.requires_grad)


def _rnn(h, x):
    """An iteration with a carry, a tuple of slices (input, weight) and two outputs (one None)."""
    inp, w = x
    h = torch.tanh(h @ w + inp) * 0.5
    return h, (h.sum(-1), None)


def _rnn_inputs():
    torch.manual_seed(0)
    h0 = torch.randn(2, 4, requires_grad=True)
    xs = (torch.randn(6, 2, 4, requires_grad=True), torch.randn(6, 4, 4, requires_grad=True))
    return h0, xs


def _cpu_rnn(h, xs):
    ys = []
    for i in range(xs[0].shape[0]):
        h, (y, _) = _rnn(h, (xs[0][i], xs[1][i]))
        ys.append(y)
    return h, torch.stack(ys)


def _scan_ops(tensors) -> int:
    return lazyxla.debug.ir_text(tensors).count("lazyxla.scan")


@pytest.mark.parametrize("checkpoint", [False, True])
def test_scan_values_and_gradients_equal_the_cpu_loop(dev, checkpoint):
    h0, xs = _rnn_inputs()
    ref_h, ref_ys = _cpu_rnn(h0, xs)
    (ref_h.sum() + (ref_ys**2).sum()).backward()

    h0_d, xs_d = _leaf(h0, dev), tuple(_leaf(x, dev) for x in xs)
    h, (ys, none) = lazyxla.scan(_rnn, h0_d, xs_d, checkpoint=checkpoint)
    assert none is None and ys.shape == (6, 2)
    loss = h.sum() + (ys**2).sum()
    _close(loss, ref_h.sum() + (ref_ys**2).sum())  # a host read between forward and backward
    loss.backward()
    grads = [h0_d.grad, *(x.grad for x in xs_d)]
    # the backward is one more loop over the saved activations; the forward loop is not run again
    assert _scan_ops(grads) == 1
    for got, want in zip(grads, [h0.grad, *(x.grad for x in xs)]):
        _close(got, want)
    _close(h, ref_h)
    _close(ys, ref_ys)
    counters = lazyxla.metrics.counters()
    assert (counters["scan_traces"], counters["scan_calls"]) == (1, 2)


def test_pytrees_dtypes_constants_and_aliases(dev):
    """Dict carries with an int64 counter, a dict of xs, ys that alias inputs, a constant made inside fn and
    a tensor read from outside (no gradient wanted)."""
    torch.manual_seed(1)
    scale = torch.randn(3)
    init = {"sum": torch.randn(3, requires_grad=True), "count": torch.tensor(0), "same": torch.randn(2)}
    xs = {"a": torch.randn(4, 3, requires_grad=True), "b": torch.randn(4, 3)}

    def fn(scale):
        def step(c, x):
            bias = torch.tensor([1.0, 2.0, 3.0], device=x["a"].device)
            new = {"sum": c["sum"] * scale + x["a"] * x["b"] + bias, "count": c["count"] + 1, "same": c["same"]}
            return new, (x["a"], new["sum"].double(), c["count"])

        return step

    def cpu_loop(c, xs):
        ys = []
        for i in range(4):
            c, y = fn(scale)(c, {k: v[i] for k, v in xs.items()})
            ys.append(y)
        return c, tuple(torch.stack(col) for col in zip(*ys))

    ref_c, ref_ys = cpu_loop(init, xs)
    (ref_c["sum"].sum() + ref_ys[0].sum() * 3 + ref_ys[1].sum()).backward()
    init_d = {k: _leaf(v, dev) for k, v in init.items()}
    xs_d = {k: _leaf(v, dev) for k, v in xs.items()}
    c, ys = lazyxla.scan(fn(scale.to(dev)), init_d, xs_d)
    (c["sum"].sum() + ys[0].sum() * 3 + ys[1].sum()).backward()
    assert ys[1].dtype == torch.float64 and ys[2].dtype == torch.int64 and c["count"].dtype == torch.int64
    for k in ref_c:
        _close(c[k], ref_c[k])
    for got, want in zip(ys, ref_ys):
        _close(got, want)
    _close(init_d["sum"].grad, init["sum"].grad)
    _close(xs_d["a"].grad, xs["a"].grad)
    assert xs_d["b"].grad is None


def test_nested_loops(dev):
    """A scan inside the scanned function: the outer body holds the inner loop, forward and backward."""

    def inner(c, x):
        c = torch.sin(c) * x
        return c, c.sum()

    def outer(c, xs):
        c, ys = lazyxla.scan(inner, c, xs)
        return c * 0.9, ys

    def cpu(c, xss):
        out = []
        for xs in xss:
            ys = []
            for x in xs:
                c, y = inner(c, x)
                ys.append(y)
            c = c * 0.9
            out.append(torch.stack(ys))
        return c, torch.stack(out)

    torch.manual_seed(0)
    c0, xss = torch.randn(3, requires_grad=True), torch.randn(4, 5, 3, requires_grad=True)
    ref_c, ref_ys = cpu(c0, xss)
    (ref_c.sum() + ref_ys.sum()).backward()
    c0_d, xss_d = _leaf(c0, dev), _leaf(xss, dev)
    c, ys = lazyxla.scan(outer, c0_d, xss_d)
    (c.sum() + ys.sum()).backward()
    for got, want in ((c, ref_c), (ys, ref_ys), (c0_d.grad, c0.grad), (xss_d.grad, xss.grad)):
        _close(got, want)


def test_a_tensor_from_outside_that_requires_grad_is_refused(dev):
    w = torch.randn(3, device=dev, requires_grad=True)
    with pytest.raises(ScanError, match="from outside that requires grad"):
        lazyxla.scan(lambda c, x: (c * w + x, None), torch.zeros(3, device=dev), torch.ones(2, 3, device=dev))


def test_zero_iterations_and_cpu_tensors(dev):
    def step(c, x):
        return c + x, c * x

    c, ys = lazyxla.scan(step, torch.ones(2, device=dev), torch.ones(0, 2, device=dev))
    assert ys.shape == (0, 2)
    _close(c, torch.ones(2))
    # CPU tensors run the Python loop itself
    c, ys = lazyxla.scan(step, torch.ones(2), torch.arange(6.0).view(3, 2))
    assert c.device.type == "cpu"
    torch.testing.assert_close(c, torch.tensor([7.0, 10.0]))
    torch.testing.assert_close(ys, torch.tensor([[0.0, 1.0], [2.0, 6.0], [12.0, 25.0]]))


def test_fn_may_modify_its_inputs_in_place_as_in_torch_xla(dev):
    """torch_xla's scan example: ``accumulated += element; return accumulated, accumulated``. The change stays
    inside the iteration: init and xs are unchanged, and the results are the running sums."""

    def cumsum(acc, el):
        acc += el
        el.mul_(0)  # an x input modified too: the caller's xs keep their values
        return acc, acc

    init = torch.tensor([0.0], device=dev)
    xs = torch.tensor([[1.0], [2.0], [3.0]], device=dev)
    final, ys = lazyxla.scan(cumsum, init, xs)
    _close(final, torch.tensor([6.0]))
    _close(ys, torch.tensor([[1.0], [3.0], [6.0]]))
    _close(init, torch.tensor([0.0]))
    _close(xs, torch.tensor([[1.0], [2.0], [3.0]]))
    w = torch.ones(1, device=dev, requires_grad=True)  # with gradients through the carry, PyTorch's own rule
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        lazyxla.scan(lambda c, x: (c.mul_(x), c), w * 1.0, xs)


def test_errors_say_what_to_change(dev):
    init, xs = torch.zeros(2, device=dev), torch.ones(3, 2, device=dev)
    with pytest.raises(ValueError, match="callable"):
        lazyxla.scan(1000, init, xs)
    with pytest.raises(ValueError, match="at least one tensor"):
        lazyxla.scan(lambda c, x: (c, x), init, ())
    with pytest.raises(ValueError, match="same leading size"):
        lazyxla.scan(lambda c, x: (c, x), init, (xs, torch.ones(2, 2, device=dev)))
    with pytest.raises(ScanError, match=r"carry leaf 0 is \(2,\) torch.float32 in init but fn returned \(1,\)"):
        lazyxla.scan(lambda c, x: (c[:1], x), init, xs)
    with pytest.raises(ScanError, match="same structure as init"):
        lazyxla.scan(lambda c, x: ((c, c), x), init, xs)
    with pytest.raises(ScanError, match="on the host"):
        lazyxla.scan(lambda c, x: (c + x.sum().item(), x), init, xs)
    assert lazyxla.metrics.counters()["executions"] == 0  # nothing was computed on the way
    c, _ = lazyxla.scan(lambda c, x: (c + x, None), init, xs)  # and a good call still works after them
    _close(c, torch.full((2,), 3.0))


@pytest.mark.parametrize("checkpoint", [False, True])
def test_random_ops_draw_per_iteration_and_the_backward_uses_the_same_masks(dev, checkpoint):
    xs = torch.ones(8, 64, device=dev, requires_grad=True)
    zeros = torch.zeros(64, device=dev)
    torch.manual_seed(3)
    _, ys = lazyxla.scan(lambda c, x: (c, F.dropout(x, 0.5) + c), zeros, xs, checkpoint=checkpoint)
    ys.sum().backward()
    ys, grad = ys.cpu(), xs.grad.cpu()
    assert len({tuple(row.tolist()) for row in ys}) == 8  # every iteration drew its own mask
    torch.testing.assert_close(grad, ys)  # d/dx dropout(x) = mask / (1 - p), here = y since x = 1, c = 0
    torch.manual_seed(3)
    _, again = lazyxla.scan(lambda c, x: (c, F.dropout(x, 0.5) + c), zeros, xs.detach())
    torch.testing.assert_close(again.cpu(), ys)  # torch.manual_seed reproduces the draws


def test_autocast_inside_the_loop_as_in_the_unrolled_loop(dev):
    """Under ``torch.autocast`` the iteration is traced with autocast's casts (bfloat16 matmuls): the same
    values and gradients as the unrolled loop under autocast."""
    torch.manual_seed(0)
    h0, xs = torch.randn(2, 4, device=dev), torch.randn(5, 4, 4, device=dev, requires_grad=True)

    def step(h, w):
        h = torch.tanh(h @ w).float()
        return h, h.sum()

    with torch.autocast("lazyxla", dtype=torch.bfloat16):
        h, ys = lazyxla.scan(step, h0, xs)
        ref_h, ref_ys = h0, []
        for i in range(5):
            ref_h, y = step(ref_h, xs[i])
            ref_ys.append(y)
        ref_ys = torch.stack(ref_ys)
    (g,) = torch.autograd.grad(h.sum() + ys.sum(), xs)
    (ref_g,) = torch.autograd.grad(ref_h.sum() + ref_ys.sum(), xs)
    for got, want in ((h, ref_h), (ys, ref_ys), (g, ref_g)):
        torch.testing.assert_close(got.cpu(), want.cpu(), rtol=1e-5, atol=1e-5)


def _scanned(model: GPT, how: str = "scan_layers") -> GPT:
    """``model`` with its blocks run by ``lazyxla.scan_layers``, or held as ``lazyxla.StackedLayers`` (the same
    parameter values either way)."""
    if how == "StackedLayers":
        model.blocks = lazyxla.StackedLayers(model.blocks)

    def forward(idx):
        x = model.tok(idx) + model.pos(torch.arange(idx.shape[1], device=idx.device))
        x = lazyxla.scan_layers(model.blocks, x) if how == "scan_layers" else model.blocks(x)
        return model.head(model.ln(x))

    model.forward = forward
    return model


def _per_layer(model: GPT, grads: bool = False) -> dict:
    """The parameters (or their gradients) of ``model`` by the unrolled model's names (a StackedLayers'
    stacks split per layer)."""
    value = (lambda p: p.grad) if grads else (lambda p: p)
    out = {n: value(p) for n, p in model.named_parameters()}
    if isinstance(model.blocks, lazyxla.StackedLayers):
        for name, p in model.blocks.layer.named_parameters():
            out.update({f"blocks.{i}.{name}": value(p)[i] for i in range(model.blocks.length)})
    return out


@pytest.mark.parametrize("how", ["scan_layers", "StackedLayers"])
def test_a_scanned_gpt_trains_like_the_unrolled_model_on_the_cpu(dev, how):
    torch.manual_seed(0)
    ref = GPT(layers=3)
    model = _scanned(copy.deepcopy(ref), how).to(dev)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (ref, model)]
    idx, tgt = torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16))
    idx_d, tgt_d = idx.to(dev), tgt.to(dev)
    compiles = []
    for step in range(3):
        ref_loss = F.cross_entropy(ref(idx).flatten(0, 1), tgt.flatten())
        ref_loss.backward()
        loss = F.cross_entropy(model(idx_d).flatten(0, 1), tgt_d.flatten())
        loss.backward()
        if step == 0:
            assert _scan_ops([p.grad for p in model.parameters()]) == 2  # the forward loop and the backward loop
            grads = _per_layer(model, grads=True)
            for n, p in ref.named_parameters():
                _close(grads[n], p.grad, msg=n)
        for opt in opts:
            opt.step()
            opt.zero_grad()
        lazyxla.sync()
        _close(loss, ref_loss)
        compiles.append(lazyxla.metrics.counters()["compiles"])
    assert compiles[2] == compiles[1], compiles  # the third step compiled nothing
    params = _per_layer(model)
    for n, p in ref.named_parameters():
        _close(params[n], p, msg=n)


def _model_program_lines(dev, layers: int, scan: bool) -> int:
    torch.manual_seed(0)
    model = GPT(layers=layers).to(dev)
    model = _scanned(model) if scan else model
    idx = torch.randint(0, 64, (2, 16), device=dev)
    model(idx).sum().backward()
    text = lazyxla.debug.stablehlo_text([p.grad for p in model.parameters()])
    model.zero_grad()
    return len(text.splitlines())


def test_the_program_does_not_grow_with_depth(dev):
    """Forward and backward of 2 and 8 scanned layers: one trace, one program, of about the same size (the
    per-layer stacking of parameters and the split of their gradients is what grows); unrolled, more than twice
    (2.4 times: every layer's attention calls one function of the StableHLO, written once, rules/attention.py)."""
    lines = {}
    for layers in (2, 8):
        traces = lazyxla.metrics.counters().get("scan_traces", 0)
        lines[layers] = _model_program_lines(dev, layers, scan=True)
        assert lazyxla.metrics.counters()["scan_traces"] == traces + 1
    unrolled = {layers: _model_program_lines(dev, layers, scan=False) for layers in (2, 8)}
    assert lines[8] < 1.25 * lines[2], lines
    assert unrolled[8] > 2 * unrolled[2], unrolled
    lazyxla.sync()
    assert lazyxla.metrics.counters()["compiles"] == 0  # (stablehlo_text lowers without compiling)


def test_mismatched_layers_raise_naming_the_difference():
    with pytest.raises(ValueError, match="Layer 1 has mismatched keys. Missing keys: \\['bias'\\]"):
        lazyxla.scan_layers([nn.Linear(4, 4), nn.Linear(4, 4, bias=False)], torch.zeros(4))
    with pytest.raises(ValueError, match="Shape mismatch for 'weight' in layer 2"):
        lazyxla.scan_layers([nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(5, 4)], torch.zeros(4))
    with pytest.raises(ValueError, match="Dtype mismatch for 'weight' in layer 1"):
        lazyxla.scan_layers([nn.Linear(4, 4), nn.Linear(4, 4).double()], torch.zeros(4))
    gelu, relu = (nn.Sequential(nn.Linear(4, 4), act()) for act in (nn.GELU, nn.ReLU))
    with pytest.raises(ValueError, match="Layer 1 differs from layer 0: submodule '1' is ReLU, in layer 0 GELU"):
        lazyxla.scan_layers([gelu, relu], torch.zeros(4))
    with pytest.raises(ValueError, match="training=False"):
        lazyxla.scan_layers([nn.Dropout(0.1), nn.Dropout(0.1).eval()], torch.zeros(4))


class _Triple(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.w = nn.Parameter(torch.randn(8, 8) / 3)

    def forward(self, x, y, z):
        return self.lin(x).sin(), self.lin(y).cos(), self.lin(z) @ self.w


def test_one_layer_no_layers_and_layers_on_tuples(dev):
    x = torch.randn(8, device=dev)
    assert lazyxla.scan_layers([], x) is x
    torch.manual_seed(0)
    for n in (1, 3):
        layers = [_Triple() for _ in range(n)]
        args = tuple(torch.randn(2, 8) for _ in range(3))
        out = args
        for layer in layers:
            out = layer(*out)
        sum(o.sum() for o in out).backward()
        scanned = [copy.deepcopy(layer).to(dev) for layer in layers]
        for layer in scanned:
            layer.zero_grad()
        got = lazyxla.scan_layers(scanned, tuple(a.to(dev) for a in args))
        sum(o.sum() for o in got).backward()
        for g, o in zip(got, out):
            _close(g, o)
        for a, b in zip(scanned, layers):
            for (name, p), q in zip(a.named_parameters(), b.parameters()):
                _close(p.grad, q.grad, msg=name)


def test_pure_keeps_the_trace_and_impure_calls_retrace(dev):
    layers = [nn.Linear(4, 4).to(dev) for _ in range(3)]
    x = torch.randn(2, 4, device=dev)
    outs = [lazyxla.scan_layers(layers, x, pure=True) for _ in range(3)]
    assert lazyxla.metrics.counters()["scan_traces"] == 1
    lazyxla.scan_layers(layers, x)
    assert lazyxla.metrics.counters()["scan_traces"] == 2
    expected = x.cpu()
    for layer in layers:
        expected = F.linear(expected, layer.weight.cpu(), layer.bias.cpu())
    for out in outs:
        _close(out, expected)


def _optimizer_program_lines(dev, layers: int, how: str) -> int:
    """The StableHLO lines of one AdamW update of a GPT's parameters (given gradients)."""
    model = _scanned(GPT(layers=layers), how).to(dev)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    torch.optim.AdamW(model.parameters(), lr=1e-3).step()
    return len(lazyxla.debug.stablehlo_text(list(model.parameters())).splitlines())


def test_stacked_layers_keep_the_optimizers_program_from_growing(dev):
    """AdamW over 2 and 8 layers: with StackedLayers it updates one tensor per parameter name whatever the
    depth; with scan_layers (one tensor per layer and name) its program grows with the layers."""
    stacked = {n: _optimizer_program_lines(dev, n, "StackedLayers") for n in (2, 8)}
    per_layer = {n: _optimizer_program_lines(dev, n, "scan_layers") for n in (2, 8)}
    assert stacked[8] == stacked[2], stacked
    assert per_layer[8] > 2.5 * per_layer[2], per_layer
    lazyxla.sync()


def test_stacked_layers_state_unstack_and_what_they_refuse(dev):
    torch.manual_seed(0)
    layers = [nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4)) for _ in range(3)]
    stacked = lazyxla.StackedLayers(layers)
    assert {k: tuple(v.shape) for k, v in stacked.state_dict().items()} == {
        "layer.0.weight": (3, 4, 4), "layer.0.bias": (3, 4), "layer.1.weight": (3, 4), "layer.1.bias": (3, 4),
    }  # fmt: skip
    x = torch.randn(2, 4)
    expected = x
    for layer in layers:
        expected = layer(expected)
    torch.testing.assert_close(stacked(x), expected)  # on the CPU: the Python loop
    stacked.to(dev)
    _close(stacked(x.to(dev)), expected)
    for layer, back in zip(layers, stacked.unstack()):
        assert type(back) is nn.Sequential
        for p, q in zip(layer.parameters(), back.parameters()):
            _close(q, p)
    shared = nn.Linear(4, 4)
    with pytest.raises(ValueError, match="layers 0 and 1 share 'weight'"):
        lazyxla.StackedLayers([shared, shared])
    with pytest.raises(ValueError, match="no layers"):
        lazyxla.StackedLayers([])


def test_gradients_of_gradients_through_the_loop_raise(dev):
    xs = torch.randn(3, 2, device=dev, requires_grad=True)
    c, _ = lazyxla.scan(lambda c, x: (c * x, None), torch.ones(2, device=dev), xs)
    with pytest.raises(NotImplementedError, match="create_graph=True"):
        torch.autograd.grad(c.sum(), xs, create_graph=True)


def test_torch_xla_scan_and_scan_layers(torch_xla):
    from functorch.compile import default_partition, min_cut_rematerialization_partition
    from torch_xla.experimental.scan import scan
    from torch_xla.experimental.scan_layers import scan_layers

    dev = torch_xla.device()
    init = torch.tensor([0.0, 0.0], device=dev, requires_grad=True)
    xs = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], device=dev, requires_grad=True)
    final, ys = scan(lambda c, x: (c + x, c + x), init, xs, partition_fn=default_partition, is_fn_pure=True)
    torch_xla.sync()
    assert final.cpu().tolist() == [9.0, 12.0] and ys.cpu().tolist() == [[1.0, 2.0], [4.0, 6.0], [9.0, 12.0]]
    with pytest.raises(NotImplementedError, match="partition_fn"):
        scan(lambda c, x: (c, x), init, xs, partition_fn=lambda *a: a)

    torch.manual_seed(0)
    layers = [nn.Linear(16, 16) for _ in range(4)]
    x = torch.randn(16)
    expected = x
    for layer in layers:
        expected = layer(expected)
    expected.sum().backward()
    scanned = [copy.deepcopy(layer).to(dev) for layer in layers]
    for layer in scanned:
        layer.zero_grad()
    out = scan_layers(scanned, x.to(dev), partition_fn=min_cut_rematerialization_partition)
    out.sum().backward()
    _close(out, expected)
    for a, b in zip(scanned, layers):
        _close(a.weight.grad, b.weight.grad)
    with pytest.raises(ValueError, match="mismatched keys"):
        scan_layers([nn.Linear(4, 4).to(dev), nn.Sequential(nn.Linear(4, 4)).to(dev)], torch.zeros(4, device=dev))


def test_torch_xla_decoder_script_with_scan_layers_equals_cpu_eager(tmp_path):
    """``examples/torch_xla/decoder_scan_layers.py`` under ``python -m lazyxla.run``: every step's loss equals
    the same decoder trained with the Python loop on the CPU (AdamW, 3 steps)."""
    path = ROOT / "examples" / "torch_xla" / "decoder_scan_layers.py"
    args = ["--layers", "3", "--hidden", "32", "--vocab", "64", "--steps", "3"]
    proc = run_python(["-m", "lazyxla.run", str(path), *args], tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    got = [float(v) for v in re.findall(r"loss step=\d+ value=(\S+)", proc.stdout)]

    spec = importlib.util.spec_from_file_location("_decoder_scan_layers", path)
    script = importlib.util.module_from_spec(spec)
    assert compat.install()  # the script imports torch_xla: the compat layer, for the CPU run's import
    try:
        spec.loader.exec_module(script)
    finally:
        compat.uninstall()
    flags = script.parse_args(args)
    model = script.make_model(flags, use_scan=False)
    opt = torch.optim.AdamW(model.parameters(), lr=flags.lr)
    want = []
    for ids, targets in script.batches(flags):
        loss = script.loss_fn(model(ids), targets)
        loss.backward()
        opt.step()
        opt.zero_grad()
        want.append(loss.item())
    assert len(got) == flags.steps
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-5, atol=0)
