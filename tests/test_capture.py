"""Whole-step capture (``lazyxla.compile(step, capture=True)``, lazy/capture.py): a replayed step computes
exactly what lazy mode computes, every guard that changes falls back to recording (counted), and a step that
cannot be replayed says why and still computes the right numbers."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import lazyxla


class _Tiny(nn.Module):
    """Embedding, layer norm, attention-like mixing, GELU MLP, dropout: the ops of a GPT step, tiny."""

    def __init__(self, vocab=11, d=8, dropout=0.0):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.ln = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)  # (the key bias gets no gradient: Adam would amplify its noise)
        self.mlp = nn.Sequential(nn.Linear(d, 16), nn.GELU(), nn.Dropout(dropout), nn.Linear(16, d))
        self.head = nn.Linear(d, vocab)

    def forward(self, ids):
        x = self.emb(ids)
        q, k, v = self.qkv(self.ln(x)).chunk(3, -1)
        x = x + F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.head(x + self.mlp(x))


def _batches(n, vocab=11, batch=4, seq=6, seed=3):
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randint(0, vocab, (batch, seq), generator=g), torch.randint(0, vocab, (batch, seq), generator=g))
        for _ in range(n)
    ]


_OPTIMIZERS = {
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2, capturable=True),
    "adamw_foreach": lambda ps: torch.optim.AdamW(ps, lr=1e-2, foreach=True, capturable=True),
    "adam_single": lambda ps: torch.optim.Adam(ps, lr=1e-2, foreach=False, capturable=True),
}
_CPU_ADAMW = lambda ps: torch.optim.AdamW(ps, lr=1e-2)  # noqa: E731  (capturable needs an accelerator)


def _step_fn(model, opt, idiom):
    def step(ids, target):
        if idiom == "zero_grad_first":
            opt.zero_grad()
        logits = model(ids)
        loss = F.cross_entropy(logits.flatten(0, 1), target.flatten())
        loss.backward()
        opt.step()
        if idiom == "zero_grad_after":
            opt.zero_grad()
        return loss

    return step


def _train(dev, opt_kind, idiom, captured, steps=8, dropout=0.0, seed=0):
    torch.manual_seed(seed)
    model = _Tiny(dropout=dropout).to(dev)
    opt = (_CPU_ADAMW if dev.type == "cpu" else _OPTIMIZERS[opt_kind])(model.parameters())
    # lazy mode: the same step as one program per call (a region syncs before and after it; a host read
    # alone would split the step's work into other programs, whose fusions round differently)
    step = lazyxla.compile(_step_fn(model, opt, idiom), capture=captured)
    torch.manual_seed(7)  # the device RNG stream too
    losses = []
    for ids, target in _batches(steps):
        losses.append(step(ids.to(dev), target.to(dev)).item())
    params = {k: v.cpu() for k, v in model.state_dict().items()}
    grads = {k: None if p.grad is None else p.grad.cpu() for k, p in model.named_parameters()}
    return losses, params, grads, step


def _assert_identical(a, b):
    assert a[0] == b[0], (a[0], b[0])
    for k in a[1]:
        torch.testing.assert_close(a[1][k], b[1][k], rtol=0, atol=0, msg=k)
    for k in a[2]:
        if a[2][k] is None:
            assert b[2][k] is None, k
        else:
            torch.testing.assert_close(a[2][k], b[2][k], rtol=0, atol=0, msg=k)


@pytest.mark.parametrize("idiom", ["zero_grad_first", "zero_grad_after"])
@pytest.mark.parametrize("opt_kind", list(_OPTIMIZERS))
def test_replayed_steps_equal_lazy_mode_exactly(dev, opt_kind, idiom):
    lazy = _train(dev, opt_kind, idiom, captured=False)
    lazyxla.metrics.reset()
    replayed = _train(dev, opt_kind, idiom, captured=True)
    counters = lazyxla.metrics.counters()
    assert replayed[3].capture_status == "replaying"
    # calls 1-3 at least are recorded (learn, record, verify): SGD's first step makes its momentum buffer the
    # gradient itself, so its second call differs from the third; the targets' host values (known values) make
    # the next calls forget them (lazy/capture.py); the last calls replay
    assert counters.get("capture_replays", 0) >= 2, counters
    assert counters["compiles"] <= 2, counters  # no program beyond lazy mode's two
    _assert_identical(lazy, replayed)


def test_replayed_steps_match_cpu_eager(dev):
    """Against CPU eager: capture switches AdamW to capturable, as torch.compile does; the numbers stay
    those of the same optimizer on the CPU."""
    eager = _train(torch.device("cpu"), "adamw", "zero_grad_first", captured=False)
    replayed = _train(dev, "adamw", "zero_grad_first", captured=True)
    torch.testing.assert_close(torch.tensor(replayed[0]), torch.tensor(eager[0]), rtol=1e-5, atol=1e-6)
    for k in eager[1]:
        torch.testing.assert_close(replayed[1][k], eager[1][k], rtol=1e-4, atol=1e-5, msg=k)


def test_default_adamw_is_made_capturable_and_equals_lazy_capturable(dev):
    torch.manual_seed(0)
    model = _Tiny().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)  # capturable=False, CPU step counters
    step = lazyxla.compile(_step_fn(model, opt, "zero_grad_first"), capture=True)
    losses = [step(i.to(dev), t.to(dev)).item() for i, t in _batches(8)]
    assert opt.param_groups[0]["capturable"] is True
    assert all(s["step"].device.type == dev.type for s in opt.state.values())
    assert step.capture_status == "replaying"
    lazy = _train(dev, "adamw", "zero_grad_first", captured=False)
    assert losses == lazy[0]


def test_dropout_draws_the_same_random_numbers_as_lazy_mode(dev):
    lazy = _train(dev, "sgd_momentum", "zero_grad_first", captured=False, dropout=0.5)
    lazyxla.metrics.reset()
    replayed = _train(dev, "sgd_momentum", "zero_grad_first", captured=True, dropout=0.5)
    assert lazyxla.metrics.counters().get("capture_replays", 0) >= 2
    _assert_identical(lazy, replayed)


def _loss(model, ids, target):
    return F.cross_entropy(model(ids).flatten(0, 1), target.flatten())


def _make(dev, opt_kind="sgd_momentum"):
    torch.manual_seed(0)
    model = _Tiny().to(dev)
    opt = _OPTIMIZERS[opt_kind](model.parameters())
    return model, opt


def _run_changes(dev, captured, change):
    """Twelve steps; ``change(i, model, opt, args)`` may change something before step i and returns the args."""
    model, opt = _make(dev)

    def step(ids, target, scale=1.0):
        opt.zero_grad()
        loss = _loss(model, ids, target) * scale
        loss.backward()
        opt.step()
        return loss

    step = lazyxla.compile(step, capture=captured)
    losses = []
    for i, (ids, target) in enumerate(_batches(12)):
        args = change(i, model, opt, [ids.to(dev), target.to(dev)])
        losses.append(step(*args).item())
    return losses, {k: v.cpu() for k, v in model.state_dict().items()}


def _shorter(i, model, opt, args):
    return [a[:, :4] for a in args] if i == 8 else args


def _int32_ids(i, model, opt, args):
    return [args[0].int(), args[1]] if i == 8 else args


def _scale(i, model, opt, args):
    return [*args, 0.5 if i >= 8 else 1.0]


def _lr(i, model, opt, args):
    if i == 8:
        opt.param_groups[0]["lr"] = 0.01
    return args


def _eval_mode(i, model, opt, args):
    model.train(i != 8)
    return args


def _frozen(i, model, opt, args):
    if i == 8:
        model.head.weight.requires_grad_(False)
        model.head.weight.grad = None
    return args


def _new_param(i, model, opt, args):
    if i == 8:
        model.extra = nn.Parameter(torch.zeros(3, device=args[0].device))
        opt.add_param_group({"params": [model.extra]})
    return args


def _forward_hook(i, model, opt, args):
    if i == 8:
        model.head.register_forward_hook(lambda m, a, out: out * 0.5)
    return args


def _state_replaced(i, model, opt, args):
    if i == 8:  # an optimizer state entry replaced by a copy of itself (the guard holds it by identity)
        state = opt.state[model.head.weight]
        state["momentum_buffer"] = state["momentum_buffer"].clone()
    return args


@pytest.mark.parametrize(
    "change",
    [_shorter, _int32_ids, _scale, _lr, _eval_mode, _frozen, _new_param, _forward_hook, _state_replaced],
    ids=lambda f: f.__name__[1:],
)
def test_a_changed_guard_records_and_equals_lazy_mode(dev, change):
    lazy = _run_changes(dev, False, change)
    lazyxla.metrics.reset()
    replayed = _run_changes(dev, True, change)
    counters = lazyxla.metrics.counters()
    assert counters.get("capture_replays", 0) >= 2, counters  # steps before the change replayed
    assert counters.get("capture_guard_misses", 0) >= 1, counters  # the changed step was recorded
    assert lazy[0] == replayed[0]
    for k in lazy[1]:
        torch.testing.assert_close(replayed[1][k], lazy[1][k], rtol=0, atol=0, msg=k)


def test_a_view_of_a_parameter_held_across_steps_sees_replayed_updates(dev):
    model, opt = _make(dev)
    step = lazyxla.compile(_step_fn(model, opt, "zero_grad_first"), capture=True)
    w_t = model.head.weight.t()  # an alias of the parameter, held by the user
    for ids, target in _batches(8):
        step(ids.to(dev), target.to(dev))
    assert step.capture_status == "replaying"
    torch.testing.assert_close(w_t.cpu(), model.head.weight.cpu().t(), rtol=0, atol=0)


def test_a_pending_copy_of_a_parameter_is_not_lost_to_donation(dev):
    model, opt = _make(dev)
    step = lazyxla.compile(_step_fn(model, opt, "zero_grad_first"), capture=True)
    batches = _batches(9)
    for ids, target in batches[:7]:
        step(ids.to(dev), target.to(dev))
    before = model.head.weight * 1  # pending: it reads the buffer the next step takes over
    expected = model.head.weight.cpu()
    step(*(a.to(dev) for a in batches[7]))
    torch.testing.assert_close(before.cpu(), expected, rtol=0, atol=0)


def test_gradient_accumulation_and_set_to_none_false(dev):
    def run(captured):
        model, opt = _make(dev)

        def step(batches):
            opt.zero_grad(set_to_none=False)
            for ids, target in batches:
                F.cross_entropy(model(ids).flatten(0, 1), target.flatten()).backward()
            opt.step()
            return model.head.weight.grad.sum()

        step = lazyxla.compile(step, capture=captured)
        data = _batches(16)
        out = [step([(i.to(dev), t.to(dev)) for i, t in data[k : k + 2]]).item() for k in range(0, 16, 2)]
        return out, {k: v.cpu() for k, v in model.state_dict().items()}, step

    lazy, replayed = run(False), run(True)
    assert replayed[2].capture_status == "replaying"
    # the step's ops on the targets run on the device once captured (known values, lazy/capture.py): the
    # program differs from lazy mode's there, and the gradient sums (about 0) round differently
    torch.testing.assert_close(torch.tensor(replayed[0]), torch.tensor(lazy[0]), rtol=0, atol=1e-6)
    for k in lazy[1]:
        torch.testing.assert_close(replayed[1][k], lazy[1][k], rtol=1e-6, atol=1e-7, msg=k)


def test_a_host_read_inside_the_step_is_recorded_every_call_and_says_why(dev):
    model, opt = _make(dev)
    seen = []

    def step(ids, target):
        opt.zero_grad()
        loss = _loss(model, ids, target)
        seen.append(loss.item())  # a host read: the step is two programs
        loss.backward()
        opt.step()
        return loss

    step = lazyxla.compile(step, capture=True)
    with pytest.warns(UserWarning, match="reads values on the host"):
        for ids, target in _batches(5):
            step(ids.to(dev), target.to(dev))
    assert len(seen) == 5  # every call ran the Python
    assert "reads values on the host" in step.capture_status
    assert lazyxla.metrics.counters().get("capture_replays", 0) == 0


def test_a_tensor_outside_the_known_locations_is_refused_with_the_reason(dev):
    model, opt = _make(dev)
    hidden = [torch.ones(8, device=dev)]  # not a buffer, not an argument, not a variable of the step

    def step(ids, target):
        opt.zero_grad()
        loss = _loss(model, ids, target) + hidden[0].sum()
        loss.backward()
        opt.step()
        return loss

    step = lazyxla.compile(step, capture=True)
    with pytest.warns(UserWarning, match="register it as a buffer"):
        for ids, target in _batches(5):
            step(ids.to(dev), target.to(dev))
    assert "not an argument" in step.capture_status
    hidden[0] = hidden[0] * 2  # had it been replayed, this change would be missed
    loss = step(*(a.to(dev) for a in _batches(1)[0]))
    assert torch.isfinite(loss.cpu())


def test_a_result_kept_elsewhere_is_refused(dev):
    model, opt = _make(dev)
    kept = {}

    def step(ids, target):
        opt.zero_grad()
        logits = model(ids)
        kept["logits"] = logits.detach()
        loss = F.cross_entropy(logits.flatten(0, 1), target.flatten())
        loss.backward()
        opt.step()
        return loss

    step = lazyxla.compile(step, capture=True)
    with pytest.warns(UserWarning, match="cannot find them again"):
        for ids, target in _batches(5):
            step(ids.to(dev), target.to(dev))
    assert lazyxla.metrics.counters().get("capture_replays", 0) == 0


def test_returns_numbers_tuples_and_dicts(dev):
    model, opt = _make(dev)

    def step(ids, target):
        opt.zero_grad()
        logits = model(ids)
        loss = F.cross_entropy(logits.flatten(0, 1), target.flatten())
        loss.backward()
        opt.step()
        return {"loss": loss, "tokens": ids.numel(), "mean": logits.mean()}

    step = lazyxla.compile(step, capture=True)
    outs = [step(i.to(dev), t.to(dev)) for i, t in _batches(7)]
    assert step.capture_status == "replaying"
    assert outs[-1]["tokens"] == 24 and outs[-1]["loss"].shape == () and outs[-1]["mean"].dtype == torch.float32


def test_cpu_tensor_arguments_are_refused(dev):
    model, opt = _make(dev)

    def step(ids, target):
        opt.zero_grad()
        loss = _loss(model, ids.to(dev), target.to(dev))
        loss.backward()
        opt.step()
        return loss

    step = lazyxla.compile(step, capture=True)
    with pytest.warns(UserWarning, match="pass lazyxla tensors"):
        losses = [step(i, t).item() for i, t in _batches(4)]
    assert all(x == x for x in losses)


def test_capture_status_requires_capture(dev):
    with pytest.raises(ValueError, match="capture=True"):
        _ = lazyxla.compile(lambda: None).capture_status


def test_bf16_model_and_int64_ids(dev):
    def run(captured):
        torch.manual_seed(0)
        model = _Tiny().to(dev).to(torch.bfloat16)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        step = lazyxla.compile(_step_fn(model, opt, "zero_grad_first"), capture=captured)
        return [step(i.to(dev), t.to(dev)).float().item() for i, t in _batches(8)], step

    lazy, (replayed, step) = run(False)[0], run(True)
    assert step.capture_status == "replaying"
    assert lazy == replayed


def test_a_module_copy_is_a_different_world(dev):
    """Replacing the model object (e.g. a deepcopy) changes the guards: the next call is recorded."""
    model, opt = _make(dev)
    holder = {"m": model}

    def step(ids, target):
        opt.zero_grad()
        loss = _loss(holder["m"], ids, target)
        loss.backward()
        opt.step()
        return loss

    step = lazyxla.compile(step, capture=True)
    for i, t in _batches(5):
        step(i.to(dev), t.to(dev))
    holder["m"] = copy.deepcopy(model)  # its parameters are not the optimizer's: they get gradients only
    step(*(a.to(dev) for a in _batches(1)[0]))
    assert holder["m"].head.weight.grad is not None
    assert step.capture_status.startswith("recorded")  # the new world is recorded, not replayed


def test_replays_send_the_steps_python_numbers_to_the_device_once(dev):
    """The packed Python numbers a replayed program takes (SGD's learning rate, momentum) are the verified call's in
    every replay: they stay on the device, so a replay copies nothing from the host; the losses are lazy mode's."""
    batches = [(ids.to(dev), target.to(dev)) for ids, target in _batches(10)]
    runs = []
    for captured in (False, True):
        model, opt = _make(dev)
        step = lazyxla.compile(_step_fn(model, opt, "zero_grad_first"), capture=captured)
        losses = [step(*b).item() for b in batches[:6]]
        lazyxla.metrics.reset()
        losses += [step(*b).item() for b in batches[6:]]
        runs.append((losses, lazyxla.metrics.counters(), lazyxla.metrics.sizes()))
    (lazy, _, _), (replayed, counters, sizes) = runs
    assert replayed == lazy
    assert counters.get("capture_replays", 0) == 4, counters
    # every copy to the device is a batch tensor's (ids or targets, 4 x 6 int64, uploaded when first read), none
    # the numbers'
    sent = sizes["bytes_to_device"]
    assert sent["total_bytes"] == 4 * 6 * 8 * sent["count"], sizes


class _Scaled(nn.Module):
    """A linear layer times a tensor attribute (not a parameter or buffer: a location of its own)."""

    def __init__(self, scale):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.scale = scale

    def forward(self, x):
        return self.lin(x) * self.scale


@pytest.mark.parametrize("captured", [False, True])
def test_two_places_sharing_a_tensor_then_not(dev, captured):
    """Two modules hold one tensor: the program reads it once, from the first place. When the second module gets a
    tensor of its own, the replay must not read the first one's for it: the call records (lazy mode's numbers)."""
    torch.manual_seed(0)
    shared = torch.full((3,), 2.0, device=dev)
    a, b = _Scaled(shared).to(dev), _Scaled(shared).to(dev)
    step = lazyxla.compile(lambda x: (a(x) + b(x)).sum(), capture=captured)
    x = torch.ones(2, 3, device=dev)
    lazyxla.metrics.reset()
    seen = [step(x).item() for _ in range(5)]
    b.scale = torch.full((3,), 5.0, device=dev)
    seen += [step(x).item() for _ in range(2)]
    with torch.no_grad():
        ref = [((a.lin(x) + b.lin(x)) * 2.0).sum().item()] * 5 + [(a.lin(x) * 2 + b.lin(x) * 5).sum().item()] * 2
    torch.testing.assert_close(torch.tensor(seen), torch.tensor(ref))
    if captured:
        assert lazyxla.metrics.counters().get("capture_replays", 0) >= 2
