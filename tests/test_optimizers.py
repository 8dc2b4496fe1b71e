"""Every torch.optim optimizer, in every implementation PyTorch offers (for-loop, foreach, fused), trains on lazyxla
exactly like CPU eager and compiles nothing after its second step; so do GradScaler and the common LR schedulers.

Each case trains a small float32 model (Linear, tanh, Linear) for a few steps from the same weights and data on
the CPU and on lazyxla, and compares the losses, the final parameters and the optimizer's state. Step 1 creates
the optimizer's state and step 2 is the first regular step, so each compiles its program(s); from step 3 on
every program is a cache hit.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import lazyxla

optim = torch.optim
STEPS = 4
TOL = {"rtol": 1e-4, "atol": 1e-5}
IMPLS = {"for-loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}
LOOP_FOREACH = ("for-loop", "foreach")
ALL = ("for-loop", "foreach", "fused")

# optimizer -> (class, base arguments, {variant: arguments}, implementations PyTorch offers for it)
OPTIMIZERS = {
    "SGD": (
        optim.SGD,
        {"lr": 0.1},
        {
            "plain": {},
            "momentum_dampening_wd": {"momentum": 0.9, "dampening": 0.1, "weight_decay": 0.01},
            "nesterov_maximize": {"momentum": 0.9, "nesterov": True, "maximize": True},
            "tensor_lr": {"lr": "tensor", "momentum": 0.9},
        },
        ALL,
    ),
    "Adam": (
        optim.Adam,
        {"lr": 0.01},
        {
            "plain": {},
            "amsgrad_wd": {"amsgrad": True, "weight_decay": 0.1},
            "maximize": {"maximize": True},
            "capturable_tensor_lr": {"capturable": True, "lr": "tensor"},
        },
        ALL,
    ),
    "AdamW": (
        optim.AdamW,
        {"lr": 0.01},
        {
            "plain": {},
            "amsgrad_maximize": {"amsgrad": True, "maximize": True},
            "capturable": {"capturable": True, "weight_decay": 0.1},
            "tensor_lr": {"lr": "tensor"},  # with foreach PyTorch wants capturable=True for that
        },
        ALL,
    ),
    "Adagrad": (
        optim.Adagrad,
        {"lr": 0.1},
        {
            "plain": {},
            "wd_lr_decay_maximize": {"weight_decay": 0.01, "lr_decay": 0.01, "maximize": True},
            "initial_accumulator": {"initial_accumulator_value": 0.1, "lr": "tensor"},
        },
        ALL,
    ),
    "Adadelta": (
        optim.Adadelta,
        {"lr": 1.0},
        {"plain": {}, "wd_maximize": {"weight_decay": 0.01, "maximize": True}, "capturable": {"capturable": True}},
        LOOP_FOREACH,
    ),
    "Adamax": (
        optim.Adamax,
        {"lr": 0.01},
        {"plain": {}, "wd_maximize": {"weight_decay": 0.01, "maximize": True}, "capturable": {"capturable": True}},
        LOOP_FOREACH,
    ),
    "NAdam": (
        optim.NAdam,
        {"lr": 0.01},
        {
            "plain": {},
            "decoupled_wd": {"weight_decay": 0.01, "decoupled_weight_decay": True, "momentum_decay": 0.008},
            "capturable_maximize": {"capturable": True, "maximize": True},
        },
        LOOP_FOREACH,
    ),
    "RAdam": (
        optim.RAdam,
        {"lr": 0.01},
        {
            "plain": {},
            "decoupled_wd_maximize": {"weight_decay": 0.01, "decoupled_weight_decay": True, "maximize": True},
            "capturable": {"capturable": True},
        },
        LOOP_FOREACH,
    ),
    "RMSprop": (
        optim.RMSprop,
        {"lr": 0.01},
        {
            "plain": {},
            "momentum_centered_wd": {"momentum": 0.9, "centered": True, "weight_decay": 0.01},
            "capturable_maximize": {"capturable": True, "maximize": True},
        },
        LOOP_FOREACH,
    ),
    "Rprop": (
        optim.Rprop,
        {"lr": 0.01},
        {"plain": {}, "maximize": {"maximize": True}, "capturable": {"capturable": True}},
        LOOP_FOREACH,
    ),
    "ASGD": (
        optim.ASGD,
        {"lr": 0.05},
        {
            "plain": {},
            "averaging_wd_maximize": {"t0": -1.0, "weight_decay": 0.01, "maximize": True},  # averages from step 2
            "capturable": {"capturable": True, "t0": 2.0},
        },
        LOOP_FOREACH,
    ),
    # PyTorch's Adafactor reads two norms per parameter on the host in every step (its step-size rule): those
    # reads split the step into programs, which are all compiled by step 2.
    "Adafactor": (
        optim.Adafactor,
        {"lr": 0.01},
        {"plain": {}, "wd_maximize": {"weight_decay": 0.01, "maximize": True}},
        LOOP_FOREACH,
    ),
}

# Cases whose programs are all compiled only after a later step than 2, and why.
_SETTLES_AFTER = {
    # The for-loop ASGD reads mu on the host and copies the parameters into its averages while mu is 1 (its
    # first step, always), then averages: step 2 reads parameters and averages that are still one buffer, step
    # 3 two buffers, so steps 2 and 3 run different programs.
    "ASGD-for-loop-averaging_wd_maximize": 3,
}

# Combinations PyTorch itself refuses (on any device).
_PYTORCH_REFUSES = {"AdamW-foreach-tensor_lr"}  # "lr as a Tensor is not supported for capturable=False and foreach"


def _cases():
    for name, (_, _, variants, impls) in OPTIMIZERS.items():
        for impl in impls:
            for variant in variants:
                case = f"{name}-{impl}-{variant}"
                if case in _PYTORCH_REFUSES:
                    continue
                yield pytest.param(name, impl, variant, id=case)


def _model(dtype=torch.float32) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)).to(dtype)


def _data(n: int = 8, dtype=torch.float32):
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 4, generator=g).to(dtype), torch.randn(n, 2, generator=g).to(dtype)


def _kwargs(name: str, impl: str, variant: str, device: torch.device) -> dict:
    cls, base, variants, _ = OPTIMIZERS[name]
    kw = {**base, **variants[variant], **IMPLS[impl]}
    if kw["lr"] == "tensor":
        kw["lr"] = torch.tensor(base["lr"])
    # PyTorch offers capturable only on accelerators: on the CPU the same math runs uncaptured (and foreach with
    # a tensor lr needs capturable, so the for-loop runs it)
    captured = device.type == "cpu" and kw.pop("capturable", False)
    if captured and isinstance(kw["lr"], torch.Tensor) and kw.get("foreach"):
        kw["foreach"] = False
    return kw


def _state(opt) -> dict:
    """The optimizer's per-parameter state on the CPU (``step`` as a float, wherever PyTorch keeps it)."""
    out = {}
    for i, s in opt.state_dict()["state"].items():
        for k, v in s.items():
            if isinstance(v, torch.Tensor):
                out[f"{i}.{k}"] = v.detach().cpu().to(torch.float64).reshape(v.shape)
            elif isinstance(v, (int, float)):
                out[f"{i}.{k}"] = torch.tensor(float(v), dtype=torch.float64)
    return out


def _train(make_opt, device, steps=STEPS, make_sched=None, data=None, step_fn=None, dtype=torch.float32):
    """Train the model ``steps`` steps; returns (losses, parameters, optimizer state, compiles after each step)."""
    model = _model(dtype).to(device)
    opt = make_opt(model.parameters())
    sched = make_sched(opt) if make_sched is not None else None
    x, y = (t.to(device) for t in (data or _data()))
    losses, compiles = [], []
    for step in range(steps):
        opt.zero_grad()
        if step_fn is not None:
            loss = step_fn(model, opt, x, y, step)
        else:
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
        opt.zero_grad()
        if sched is not None:
            sched.step(loss.detach()) if isinstance(sched, optim.lr_scheduler.ReduceLROnPlateau) else sched.step()
        if device.type == "lazyxla":
            lazyxla.sync()
            compiles.append(lazyxla.metrics.counters()["compiles"])
        losses.append(loss.detach())
    params = [p.detach().cpu() for p in model.parameters()]
    return torch.stack([v.cpu().reshape(()) for v in losses]), params, _state(opt), compiles


def _assert_same(got, ref):
    losses, params, state, _ = got
    ref_losses, ref_params, ref_state, _ = ref
    torch.testing.assert_close(losses, ref_losses, **TOL, equal_nan=True)
    for i, (p, r) in enumerate(zip(params, ref_params)):
        torch.testing.assert_close(p, r, **TOL, msg=lambda m, i=i: f"parameter {i}: {m}")
    assert state.keys() == ref_state.keys()
    for k, r in ref_state.items():
        torch.testing.assert_close(state[k], r, **TOL, msg=lambda m, k=k: f"state {k}: {m}")


def _assert_no_compile_after_step_2(compiles, step: int = 2):
    """Nothing was compiled after step ``step`` (1-based; ``compiles`` holds the count after each step)."""
    assert compiles[step:] == [compiles[step - 1]] * (len(compiles) - step), f"compiles after each step: {compiles}"


def _assert_no_fallback():
    fell = sorted(k for k in lazyxla.metrics.counters() if k.startswith("fallback."))
    assert not fell, f"ops ran on the CPU: {fell}"


@pytest.mark.parametrize(("name", "impl", "variant"), list(_cases()))
def test_optimizer_trains_like_cpu_and_compiles_nothing_after_step_2(name, impl, variant, dev):
    cls = OPTIMIZERS[name][0]
    settles = _SETTLES_AFTER.get(f"{name}-{impl}-{variant}", 2)
    steps = max(STEPS, settles + 2)
    cpu = torch.device("cpu")
    ref = _train(lambda ps: cls(ps, **_kwargs(name, impl, variant, cpu)), cpu, steps=steps)
    got = _train(lambda ps: cls(ps, **_kwargs(name, impl, variant, dev)), dev, steps=steps)
    _assert_same(got, ref)
    _assert_no_compile_after_step_2(got[3], settles)
    _assert_no_fallback()


def test_fused_adamw_as_transformers_uses_it(dev):
    """The issue's reproduction: ``AdamW(fused=True)`` (transformers' default optimizer) used to fail at ``step()``
    with PyTorch's INTERNAL ASSERT "mutating a non-functional tensor with a functional tensor"."""
    m = torch.nn.Linear(4, 4).to(dev)
    opt = optim.AdamW(m.parameters(), fused=True)
    before = m.weight.detach().cpu()
    m(torch.randn(2, 4, device=dev)).sum().backward()
    opt.step()
    lazyxla.sync()
    assert not torch.equal(m.weight.detach().cpu(), before)
    assert opt.state[m.weight]["step"].device == dev


def test_fused_step_is_one_node_per_parameter_list(dev):
    """A fused step records one op for all the parameters (what fused means), besides PyTorch's step counters."""
    model = _model().to(dev)
    opt = optim.Adam(model.parameters(), lr=0.01, fused=True)
    x, y = (t.to(dev) for t in _data())
    recorded = []
    for _ in range(2):
        F.mse_loss(model(x), y).backward()
        lazyxla.sync()
        before = lazyxla.metrics.counters()["ops_recorded"]
        opt.step()
        recorded.append(lazyxla.metrics.counters()["ops_recorded"] - before)
        opt.zero_grad()
        lazyxla.sync()
    n = len(list(model.parameters()))
    assert recorded[1] == n + 1, recorded  # step 2: a step counter per parameter (+1 each), one _fused_adam


def test_a_changing_lr_is_an_input_of_the_fused_step(dev):
    """The fused ops take lr and the betas as ``float`` (not ``Scalar``): they are graph inputs all the same."""
    model = _model().to(dev)
    opt = optim.AdamW(model.parameters(), lr=0.01, fused=True)
    x, y = (t.to(dev) for t in _data())
    compiles = []
    for step in range(5):
        F.mse_loss(model(x), y).backward()
        for group in opt.param_groups:
            group["lr"] = 0.01 / (step + 1)
            group["betas"] = (0.9 - 0.01 * step, 0.999)
        opt.step()
        opt.zero_grad()
        lazyxla.sync()
        compiles.append(lazyxla.metrics.counters()["compiles"])
    _assert_no_compile_after_step_2(compiles)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_fused_adam_on_half_parameters_keeps_its_hyperparameters_exact(dtype, dev):
    """Half-precision parameters are updated in float32 with float64 hyperparameters, as PyTorch's fused kernels
    do: beta2 = 0.999 rounded to bfloat16 would be 0.996, a different optimizer."""
    torch.manual_seed(0)
    params = [torch.randn(16, dtype=dtype), torch.randn(4, 4, dtype=dtype)]
    grads = [torch.randn_like(p) for p in params]
    results = []
    for device in (torch.device("cpu"), dev):
        ps = [p.clone().to(device).requires_grad_() for p in params]
        opt = optim.Adam(ps, lr=1e-3, betas=(0.9, 0.999), fused=True)
        for _ in range(3):
            for p, g in zip(ps, grads):
                p.grad = g.to(device)
            opt.step()
        results.append([p.detach().cpu() for p in ps] + [opt.state[ps[0]]["exp_avg_sq"].cpu()])
    for got, ref in zip(results[1], results[0]):
        torch.testing.assert_close(got, ref, atol=0, rtol=0.01)


FOREACH_WITH_NUMBERS = {
    "pow": lambda xs: torch._foreach_pow(xs, 2.0),
    "pow_list": lambda xs: torch._foreach_pow(xs, [2.0, 0.5]),
    "clamp_min": lambda xs: torch._foreach_clamp_min(xs, 0.1),
    "clamp_max_list": lambda xs: torch._foreach_clamp_max(xs, [0.1, 0.2]),
    "maximum": lambda xs: torch._foreach_maximum(xs, 1.0),
    "minimum_list": lambda xs: torch._foreach_minimum(xs, [0.0, 0.3]),
}


@pytest.mark.parametrize("op", list(FOREACH_WITH_NUMBERS))
def test_foreach_ops_with_numbers(op, dev):
    """The optimizers' foreach ops taking a number per list or per tensor (ASGD's, Adafactor's): each element is
    the per-tensor op's overload that takes a number (pow.Tensor_Scalar, not pow.Scalar, which takes the number
    as the base; clamp_min, as aten.maximum takes no number)."""
    xs = [torch.tensor([-1.5, 0.05, 2.0, math.nan]), torch.tensor([[0.25, 3.0]])]
    ref = FOREACH_WITH_NUMBERS[op]([x.abs() if op.startswith("pow") else x for x in xs])
    got = FOREACH_WITH_NUMBERS[op]([(x.abs() if op.startswith("pow") else x).to(dev) for x in xs])
    for g, r in zip(got, ref):
        torch.testing.assert_close(g.cpu(), r, equal_nan=True)


# ---- LBFGS ----
#
# LBFGS evaluates a closure several times per step and reads the host several times per iteration (its line
# search and stopping tests are Python control flow on the loss, the gradient and the direction). Each read runs
# a program; the two-loop recursion's programs grow with LBFGS's history until it holds ``history_size``
# entries, so compiling stops once the history is full, not after step 2. LBFGS amplifies rounding (it divides
# by curvatures that shrink as it converges): in float32, CPU and XLA differ by 1e-3 after two default steps
# (their reductions add in different orders), in float64 by 1e-12. So it is compared in float64.


def _lbfgs_step(model, opt, x, y, step):
    def closure():
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        return loss

    return opt.step(closure)


@pytest.mark.parametrize("line_search", [None, "strong_wolfe"])
def test_lbfgs_with_its_defaults_matches_cpu(line_search, dev):
    """LBFGS's defaults (20 iterations, history 100). Before, every host read compiled the whole step's history
    again: the first step compiled ever larger programs until XLA ran out of memory maps and the process aborted."""
    data = _data(32, torch.float64)  # more samples than the model can fit: LBFGS does not converge in one step

    def make(ps):
        return optim.LBFGS(ps, line_search_fn=line_search)

    ref = _train(make, torch.device("cpu"), steps=2, data=data, step_fn=_lbfgs_step, dtype=torch.float64)
    got = _train(make, dev, steps=2, data=data, step_fn=_lbfgs_step, dtype=torch.float64)
    _assert_same(got, ref)


def test_lbfgs_compiles_nothing_once_its_history_is_full(dev):
    data = _data(32, torch.float64)

    def make(ps):
        return optim.LBFGS(ps, max_iter=4, history_size=2)

    ref = _train(make, torch.device("cpu"), steps=5, data=data, step_fn=_lbfgs_step, dtype=torch.float64)
    got = _train(make, dev, steps=5, data=data, step_fn=_lbfgs_step, dtype=torch.float64)
    _assert_same(got, ref)
    _assert_no_compile_after_step_2(got[3])


def test_sparse_adam_needs_sparse_gradients_which_lazyxla_refuses(dev):
    """SparseAdam only takes sparse gradients (``nn.Embedding(sparse=True)``); lazyxla tensors are dense, so the
    backward that would make one raises a clear error instead (use Adam, or Embedding(sparse=False))."""
    emb = torch.nn.Embedding(10, 3, sparse=True).to(dev)
    with pytest.raises(TypeError, match="dense"), pytest.warns(UserWarning, match="runs on the CPU"):
        emb(torch.tensor([1, 2], device=dev)).sum().backward()


# ---- LR schedulers: a new lr every step is a new input, not a new program ----

SCHEDULERS = {
    "StepLR": lambda opt: optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7),
    "CosineAnnealingLR": lambda opt: optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10),
    "LambdaLR": lambda opt: optim.lr_scheduler.LambdaLR(opt, lambda s: 1 / (s + 1)),
    "OneCycleLR": lambda opt: optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=10),
    "LinearLR_warmup": lambda opt: optim.lr_scheduler.SequentialLR(
        opt,
        [optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=3), optim.lr_scheduler.ExponentialLR(opt, 0.9)],
        milestones=[3],
    ),
    # mode="max" on a falling loss: no improvement, so the lr is cut after every step (its read of the loss is
    # a host read, as PyTorch's scheduler compares numbers)
    "ReduceLROnPlateau": lambda opt: optim.lr_scheduler.ReduceLROnPlateau(opt, mode="max", factor=0.5, patience=0),
}
SCHEDULED = {
    "SGD-foreach": lambda ps: optim.SGD(ps, lr=0.05, momentum=0.9, foreach=True),
    "AdamW-fused": lambda ps: optim.AdamW(ps, lr=0.01, fused=True),
    "Adam-for-loop": lambda ps: optim.Adam(ps, lr=0.01, foreach=False),
}


@pytest.mark.parametrize("opt", list(SCHEDULED))
@pytest.mark.parametrize("sched", list(SCHEDULERS))
def test_lr_scheduler_matches_cpu_and_does_not_recompile(sched, opt, dev):
    steps = 6
    ref = _train(SCHEDULED[opt], torch.device("cpu"), steps=steps, make_sched=SCHEDULERS[sched])
    got = _train(SCHEDULED[opt], dev, steps=steps, make_sched=SCHEDULERS[sched])
    _assert_same(got, ref)
    _assert_no_compile_after_step_2(got[3])
    _assert_no_fallback()


# ---- GradScaler: a loss scale, an overflowing step that is skipped, a growing scale ----

BAD_STEP = 3  # the step whose input holds an inf: its gradients overflow, so the optimizer must skip it
SCALED = {
    "SGD-foreach": lambda ps: optim.SGD(ps, lr=0.05, momentum=0.9, foreach=True),
    "Adam-for-loop": lambda ps: optim.Adam(ps, lr=0.01, foreach=False),
    "AdamW-fused": lambda ps: optim.AdamW(ps, lr=0.01, fused=True),
    "SGD-fused": lambda ps: optim.SGD(ps, lr=0.05, momentum=0.9, fused=True),
}


def _scaled_run(make_scaler, make_opt, device, steps=6):
    scaler = make_scaler(device)
    good, _ = _data()
    bad = good.clone()
    bad[0, 0] = math.inf  # tanh squashes it in the loss, but the first layer's weight gradient is NaN
    inputs = [bad if step == BAD_STEP else good for step in range(steps)]
    xs = [x.to(device) for x in inputs]

    def step_fn(model, opt, x, y, step):
        loss = F.mse_loss(model(xs[step]), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss

    result = _train(make_opt, device, steps=steps, step_fn=step_fn)
    return result, scaler


def _amp_scaler(device):
    return torch.amp.GradScaler(device.type, init_scale=2.0**10, growth_interval=2)


def _torch_xla_scaler(device):
    if device.type == "cpu":
        return _amp_scaler(device)
    from lazyxla.compat.torch_xla.amp import GradScaler  # torch_xla's spelling: no device argument

    return GradScaler(init_scale=2.0**10, growth_interval=2)


@pytest.mark.parametrize("scaler", ["torch.amp", "torch_xla.amp"])
@pytest.mark.parametrize("opt", list(SCALED))
def test_grad_scaler_matches_cpu_and_skips_the_overflowing_step(opt, scaler, dev):
    make_scaler = _amp_scaler if scaler == "torch.amp" else _torch_xla_scaler
    ref, ref_scaler = _scaled_run(_amp_scaler, SCALED[opt], torch.device("cpu"))
    got, got_scaler = _scaled_run(make_scaler, SCALED[opt], dev)
    _assert_same(got, ref)
    assert got_scaler.get_scale() == ref_scaler.get_scale() == 2.0**10 * 2 * 0.5 * 2  # grew, halved, grew
    compiles = got[3]
    per_step = [b - a for a, b in zip(compiles, compiles[1:])]  # programs compiled in steps 2, 3, ...
    if "fused" in opt:
        # the fused step takes found_inf itself: the skip is decided on the device, in the same program
        assert per_step[1:] == [0] * (len(per_step) - 1), compiles
    else:
        # GradScaler reads found_inf on the host to skip opt.step(): the skipping step is a program of its own
        assert [n for i, n in enumerate(per_step[1:], start=2) if i != BAD_STEP] == [0] * (len(per_step) - 2), compiles
    _assert_no_fallback()
