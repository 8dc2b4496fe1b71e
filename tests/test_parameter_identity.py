"""Module moves keep Parameter objects as PyTorch does for CUDA (issue 26, point 3).

On CPU <-> CUDA, ``nn.Module._apply`` keeps each ``Parameter`` and its ``.grad`` object (``param.data = new``), so an
optimizer built before ``model.cuda()`` trains. lazyxla keeps the same objects for CPU <-> lazyxla moves
(``frontend/modules.py``). Each case runs in its own process and compares with CPU eager.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

import lazyxla
from tests.util import run_case

TOL = {"rtol": 1e-4, "atol": 1e-5}


class _Net(nn.Module):
    """Buffers (BatchNorm) and a tied weight: the embedding is the output projection."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.hidden = nn.Linear(8, 8)
        self.norm = nn.BatchNorm1d(8)
        self.head = nn.Linear(8, 16, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids):
        h = torch.tanh(self.hidden(self.embed(ids)))
        return self.head(self.norm(h))


def _loss(model, ids, target):
    return F.cross_entropy(model(ids), target)


def _train_built_before_move(make_opt, device, steps=4):
    torch.manual_seed(0)
    model = _Net()
    opt = make_opt(model.parameters())  # before the move: the pattern that trains on CUDA
    params = list(model.parameters())
    model.to(device)
    assert list(model.parameters()) == params and all(a is b for a, b in zip(model.parameters(), params))
    assert model.head.weight is model.embed.weight
    g = torch.Generator().manual_seed(1)
    ids, target = torch.randint(0, 16, (6,), generator=g), torch.randint(0, 16, (6,), generator=g)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = _loss(model, ids.to(device), target.to(device))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return model, losses


def _optimizer_built_before_the_move_trains_like_eager():
    makers = {
        "sgd": lambda ps: torch.optim.SGD(ps, lr=0.5, momentum=0.9),
        "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2),
    }
    for name, make_opt in makers.items():
        ref, ref_losses = _train_built_before_move(make_opt, "cpu")
        lazy, losses = _train_built_before_move(make_opt, lazyxla.device())
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), **TOL, msg=name)
        for (key, a), b in zip(lazy.state_dict().items(), ref.state_dict().values()):
            torch.testing.assert_close(a.cpu(), b, **TOL, msg=f"{name} {key}")


def _move_back_to_cpu_keeps_objects_values_ties_and_grads():
    dev = lazyxla.device()
    model = _Net().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids, target = torch.tensor([1, 2, 3, 4]), torch.tensor([5, 6, 7, 8])
    for _ in range(2):
        opt.zero_grad()
        _loss(model, ids.to(dev), target.to(dev)).backward()
        opt.step()
    params = list(model.parameters())
    grads = [p.grad for p in params]
    values = {k: v.cpu() for k, v in model.state_dict().items()}
    grad_values = [g.cpu() for g in grads]
    model.to("cpu")
    assert all(a is b for a, b in zip(model.parameters(), params)), "to('cpu') made new Parameter objects"
    assert all(p.grad is g for p, g in zip(params, grads)), "to('cpu') made new gradient objects"
    assert model.head.weight is model.embed.weight
    assert all(p.device.type == "cpu" and p.grad.device.type == "cpu" for p in params)
    for key, v in model.state_dict().items():
        torch.testing.assert_close(v, values[key], rtol=0, atol=0, msg=key)
    for p, g in zip(params, grad_values):
        torch.testing.assert_close(p.grad, g, rtol=0, atol=0)
    # the optimizer (its state still on lazyxla, as CUDA's would stay on CUDA) holds the moved parameters
    assert opt.param_groups[0]["params"][0] is params[0]


def _grads_move_with_the_parameters_as_on_cpu():
    """CPU -> lazyxla with gradients present, then a dtype change on the device: objects kept, like PyTorch's
    ``.data``/``.grad.data`` swap on CPU (measured here on CPU with a dtype change, which takes the same path as
    a CUDA move)."""
    for device in ("cpu", lazyxla.device()):
        model = nn.Linear(3, 2)
        model(torch.ones(1, 3)).sum().backward()
        weight, grad = model.weight, model.weight.grad
        expected = grad.clone()
        model.to(device) if device != "cpu" else model.double()
        assert model.weight is weight and model.weight.grad is grad, device
        torch.testing.assert_close(grad.cpu().float(), expected, rtol=0, atol=0)
        model.half()
        assert model.weight is weight and model.weight.grad is grad and grad.dtype == torch.float16, device


def _python_attributes_survive_the_move():
    model = nn.Linear(2, 2)
    model.weight.tag = "kept"  # libraries mark parameters (HF's _is_hf_initialized, sharding specs)
    model.to(lazyxla.device())
    assert model.weight.tag == "kept"
    model.to("cpu")
    assert model.weight.tag == "kept"


def _a_parameter_that_cannot_be_swapped_warns_naming_the_pattern():
    import warnings
    import weakref

    model = nn.Linear(2, 2)
    ref = weakref.ref(model.weight)  # swap_tensors refuses a tensor with weak references
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.to(lazyxla.device())
    assert model.weight is not ref()  # the new object stays
    assert model.weight.device.type == "lazyxla"
    message = " ".join(str(w.message) for w in caught)
    assert "optimizer" in message and "weak" in message, message


def _cpu_only_moves_are_pytorchs():
    """Importing lazyxla changes no CPU program (tests/test_ties.py checks the values; here the objects)."""
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    try:
        model = nn.Linear(2, 2)
        weight = model.weight
        model.to(lazyxla.device())
        assert model.weight is not weight  # the user asked for new parameters: PyTorch makes them on CUDA too
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(False)
    model = copy.deepcopy(nn.Linear(2, 2))
    weight = model.weight
    model.double()
    assert model.weight is weight


def test_optimizer_built_before_the_move_trains_like_eager():
    run_case(__file__, "_optimizer_built_before_the_move_trains_like_eager")


def test_move_back_to_cpu_keeps_objects_values_ties_and_grads():
    run_case(__file__, "_move_back_to_cpu_keeps_objects_values_ties_and_grads")


def test_grads_move_with_the_parameters():
    run_case(__file__, "_grads_move_with_the_parameters_as_on_cpu")


def test_python_attributes_of_parameters_survive_the_move():
    run_case(__file__, "_python_attributes_survive_the_move")


def test_a_parameter_that_cannot_be_swapped_warns():
    run_case(__file__, "_a_parameter_that_cannot_be_swapped_warns_naming_the_pattern")


def test_overwrite_on_conversion_and_cpu_moves_are_pytorchs():
    run_case(__file__, "_cpu_only_moves_are_pytorchs")
