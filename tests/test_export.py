"""lazyxla.export: StableHLO artifacts that a process without torch runs to eager PyTorch's numbers."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import lazyxla
from tests.models import GPT, MLP

# Runs in a fresh interpreter that imports jax and numpy only: loads the artifact, runs it ``steps`` times
# (feeding the state back), and compares every output with the expected arrays (elementwise, relative to
# 1 + |expected|) and the final state (normwise relative difference over all of it); prints the worst.
_CONSUMER = textwrap.dedent(
    """
    import sys
    import jax
    import numpy as np

    jax.config.update("jax_enable_x64", True)  # int64 token inputs stay int64
    folder, steps, n_args = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    with open(folder + "/program.jaxexport", "rb") as f:
        exported = jax.export.deserialize(bytearray(f.read()))
    inputs = np.load(folder + "/inputs.npz")
    inputs = [inputs[f"arr_{i}"] for i in range(len(inputs.files))]
    args, state = inputs[:n_args], inputs[n_args:]
    expected = np.load(folder + "/expected.npz")
    worst = 0.0
    for step in range(steps):
        outs = exported.call(*args, *state)
        n_out = len(outs) - len(state)
        state = [np.asarray(s) for s in outs[n_out:]]
        for k, o in enumerate(outs[:n_out]):
            want = expected[f"out{step}_{k}"]
            worst = max(worst, float(np.max(np.abs(np.asarray(o) - want) / (1 + np.abs(want)))))
    given = sum(name.startswith("state_") for name in expected.files)  # the first states, when given
    if given:  # normwise over all of them: AdamW magnifies rounding in near-zero gradients (layer-norm biases)
        got = np.concatenate([state[k].ravel() for k in range(given)])
        want = np.concatenate([expected[f"state_{k}"].ravel() for k in range(given)])
        worst = max(worst, float(np.linalg.norm(got - want) / np.linalg.norm(want)))
    assert "torch" not in sys.modules and "lazyxla" not in sys.modules
    print("WORST", worst)
    """
)


def _consume(tmp_path, exported, args, steps, expected_outs, expected_state=()) -> float:
    exported.save(tmp_path / "program.jaxexport")
    state = list(exported.state_values().values())
    np.savez(tmp_path / "inputs.npz", *[a.numpy() for a in args], *state)
    want = {f"out{s}_{k}": o for s, outs in enumerate(expected_outs) for k, o in enumerate(outs)}
    want.update({f"state_{k}": s for k, s in enumerate(expected_state)})
    np.savez(tmp_path / "expected.npz", **want)
    done = subprocess.run(
        [sys.executable, "-c", _CONSUMER, str(tmp_path), str(steps), str(len(args))],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return float(done.stdout.split("WORST")[1])


def test_mlp_forward_round_trip_without_torch(tmp_path, dev):
    torch.manual_seed(0)
    ref = MLP()
    model = MLP().to(dev)
    model.load_state_dict(ref.state_dict())
    x = torch.randn(8, 32)
    exported = lazyxla.export(model, (x,))
    assert exported.in_names == ["args[0]"] and exported.out_names == ["out[0]"]
    assert "stablehlo.dot_general" in exported.stablehlo_text()
    want = ref(x).detach().numpy()
    np.testing.assert_allclose(np.asarray(exported.call(x)), want, rtol=1e-5, atol=1e-6)
    # A new input (the weights are baked in): the program is a function of x alone.
    x2 = torch.randn(8, 32)
    worst = _consume(tmp_path, exported, [x2], 1, [[ref(x2).detach().numpy()]])
    assert worst < 1e-5


def _gpt_step(model, opt):
    def step(idx, tgt):
        opt.zero_grad()
        loss = F.cross_entropy(model(idx).flatten(0, 1), tgt.flatten())
        loss.backward()
        opt.step()
        return loss

    return step


def test_gpt_training_step_round_trip_without_torch(tmp_path, dev):
    torch.manual_seed(0)
    ref = GPT()
    model = GPT().to(dev)
    model.load_state_dict(ref.state_dict())
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, capturable=True)  # its step count on the device
    idx, tgt = torch.randint(0, 64, (4, 16)), torch.randint(0, 64, (4, 16))
    _gpt_step(ref, ref_opt)(idx, tgt)  # one step first: the optimizer's state exists
    _gpt_step(model, opt)(idx.to(dev), tgt.to(dev))
    lazyxla.sync()
    before = [p.detach().cpu().clone() for p in model.parameters()]

    exported = lazyxla.export(_gpt_step(model, opt), (idx, tgt), state=(model, opt))

    n_params = len(before)
    assert exported.state_names[0] == "state[0].tok.weight"
    assert len(exported.state_names) == n_params * 4  # parameters; AdamW's step, exp_avg, exp_avg_sq each
    # Exporting changed nothing: the parameters are where they were.
    for p, b in zip(model.parameters(), before):
        torch.testing.assert_close(p.detach().cpu(), b, rtol=0, atol=0)
    # Three more eager steps: the reference the exported step must reproduce.
    batches = [(torch.randint(0, 64, (4, 16)), torch.randint(0, 64, (4, 16)))]
    # The consumer feeds the same batch to its three steps.
    losses = [_gpt_step(ref, ref_opt)(*batches[0]).detach().numpy() for _ in range(3)]
    final = [p.detach().numpy() for p in ref.parameters()]
    worst = _consume(tmp_path, exported, list(batches[0]), 3, [[v] for v in losses], final)
    assert worst < 1e-5
    # A lazyxla step after the export matches eager's first step after the warm-up: nothing was changed.
    loss = _gpt_step(model, opt)(*(b.to(dev) for b in batches[0]))
    assert loss.item() == pytest.approx(float(losses[0]), rel=1e-5)


def test_export_restores_grads_and_rng(dev):
    torch.manual_seed(0)
    model = MLP().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(8, 32), torch.randint(0, 10, (8,))

    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(F.dropout(model(x), 0.5), y)
        loss.backward()
        opt.step()
        return loss

    step(x.to(dev), y.to(dev))
    lazyxla.sync()
    grads = [p.grad for p in model.parameters()]
    grad_values = [g.cpu().clone() for g in grads]
    momentum = [opt.state[p]["momentum_buffer"].cpu().clone() for p in model.parameters()]
    rng = torch.lazyxla.get_rng_state()
    exported = lazyxla.export(step, (x, y), state=(model, opt))
    assert all(p.grad is g for p, g in zip(model.parameters(), grads))
    for g, v in zip(grads, grad_values):
        torch.testing.assert_close(g.cpu(), v, rtol=0, atol=0)
    for p, m in zip(model.parameters(), momentum):
        torch.testing.assert_close(opt.state[p]["momentum_buffer"].cpu(), m, rtol=0, atol=0)
    assert torch.equal(torch.lazyxla.get_rng_state(), rng)
    # The dropout mask is baked in: two calls with the same state give the same loss.
    state = list(exported.state_values().values())
    (a, _), (b, _) = exported.call(x, y, *state), exported.call(x, y, *state)
    assert float(a) == float(b)


def test_export_errors_name_the_cause(dev):
    model = MLP().to(dev)

    def reads_host(x):
        y = model(x)
        if y.sum().item() > 0:  # the line the error names
            return y
        return -y

    with pytest.raises(lazyxla.ExportError, match=r"\.item\(\) at .*test_export.py:\d+.*exported function"):
        lazyxla.export(reads_host, (torch.randn(2, 32),))
    with pytest.raises(ValueError, match="move the module to the lazyxla device"):
        lazyxla.export(MLP(), (torch.randn(2, 32),))
    with pytest.raises(lazyxla.ExportError, match="output 1 is a int"):
        lazyxla.export(lambda x: (model(x), 3), (torch.randn(2, 32),))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(x):
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
        return x

    with pytest.raises(lazyxla.ExportError, match="Run one training step before exporting"):
        lazyxla.export(step, (torch.randn(2, 32),), state=(model, opt))
    assert not opt.state  # the state the failed export made is gone again
    with pytest.raises(TypeError, match="state= takes modules, optimizers"):
        lazyxla.export(model, (torch.randn(2, 32),), state=[3])
    exported = lazyxla.export(model, (torch.randn(2, 32),))
    with pytest.raises(TypeError, match="takes 1 arrays"):
        exported.call()


def test_python_scalars_and_integer_inputs(dev):
    def fn(x, idx, scale):
        return (x[idx] * scale).sum(0), idx + 1

    x, idx = torch.randn(6, 3), torch.tensor([0, 2, 5])
    exported = lazyxla.export(fn, (x, idx, 2.5))
    assert exported.in_names == ["args[0]", "args[1]"]  # the Python number is baked in
    out, nxt = exported.call(x, idx)
    want, want_idx = fn(x, idx, 2.5)
    np.testing.assert_allclose(np.asarray(out), want.numpy(), rtol=1e-6)
    assert np.asarray(nxt).dtype == np.int64 and (np.asarray(nxt) == want_idx.numpy()).all()


def test_random_key_input_draws_new_numbers_per_call(dev):
    def fn(x):
        return torch.nn.functional.dropout(x, 0.5, training=True)

    x = torch.ones(64, 64)
    baked = lazyxla.export(fn, (x,))
    assert np.array_equal(np.asarray(baked.call(x)), np.asarray(baked.call(x)))  # the recorded key, baked in
    keyed = lazyxla.export(fn, (x,), random_key=True)
    assert keyed.in_names == ["args[0]", "random_key"]
    k1, k2 = np.array([0, 1], np.uint32), np.array([0, 2], np.uint32)
    a, b, a2 = (np.asarray(keyed.call(x, k)) for k in (k1, k2, k1))
    assert np.array_equal(a, a2) and not np.array_equal(a, b)  # a new key, new numbers; the same key, the same
    for out in (a, b):  # dropout's semantics: zeros or 1 / (1 - p), about half each
        assert set(np.unique(out)) == {0.0, 2.0} and 0.4 < (out == 0).mean() < 0.6
