"""What the FSDPv2 test runs in a fresh process with 8 fake CPU devices (importable by the child), and the CPU
reference of the decoder-only examples."""

from __future__ import annotations

import collections
import importlib.util
import sys
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "torch_xla"


def _example():
    """examples/torch_xla/fsdpv2_train.py as a module (its folder on sys.path, as when it runs as a script)."""
    sys.path.insert(0, str(EXAMPLES))
    spec = importlib.util.spec_from_file_location("_fsdpv2_train", EXAMPLES / "fsdpv2_train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _buffer(t: torch.Tensor):
    from lazyxla.lazy.tensor import unwrap

    return unwrap(t)._value[0].payload  # the jax.Array behind a computed lazyxla tensor


def _holdings(tensors: dict[str, torch.Tensor]) -> tuple[dict[str, list[float]], dict[int, int], int]:
    """Per tensor, the fraction of its elements each device holds (its addressable shards); per device, the bytes
    it holds in all; and the bytes of all the tensors."""
    fractions, per_device, total = {}, collections.Counter(), 0
    for name, t in tensors.items():
        shards = _buffer(t).addressable_shards
        fractions[name] = [s.data.size / t.numel() for s in shards]
        for s in shards:
            per_device[s.device.id] += s.data.nbytes
        total += t.numel() * t.element_size()
    return fractions, dict(per_device), total


def cpu_reference(ex, flags, scale=lambda ids: 1.0) -> tuple[list[float], torch.nn.Module, torch.optim.Optimizer]:
    """What the decoder-only examples (``ex``: the script as a module, run with ``flags``) train, single-device
    eager on the CPU: the losses, the model and its AdamW. ``scale(ids)``: the model's embedding scale per batch."""
    torch.manual_seed(flags.seed)
    model = ex.DecoderOnly()
    opt = torch.optim.AdamW(model.parameters(), lr=flags.lr, weight_decay=0.01)
    losses = []
    for ids in ex.fake_batches(flags.steps, flags.batch_size):
        opt.zero_grad()
        loss = F.cross_entropy(model(ids[:, :-1], scale(ids)).flatten(0, 1), ids[:, 1:].flatten())
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model, opt


def _difference(got: torch.Tensor, want: torch.Tensor) -> float:
    """assert_close's rule with rtol 1e-5: the largest |a - b| - 1e-5 |b| (<= 1e-5 passes with atol 1e-5)."""
    return ((got.cpu() - want.detach()).abs() - 1e-5 * want.detach().abs()).max().item()


def train_and_measure(rank: int, steps: int) -> dict:
    """Run the torch_xla FSDPv2 script's training under the compatibility layer, compare it with CPU eager and
    read how much of the parameters and of AdamW's state each device holds."""
    import lazyxla
    import lazyxla.compat

    lazyxla.compat.install()
    ex = _example()
    flags = ex.parse_args(["--steps", str(steps)])
    compiles = []
    ex._log = lambda step, loss: compiles.append(lazyxla.metrics.counters()["compiles"])  # after each step's sync
    model, opt, losses = ex.train(flags)
    ref_losses, ref, ref_opt = cpu_reference(ex, flags)

    params = dict(model.named_parameters())
    state = {f"{name}.{key}": opt.state[p][key] for name, p in params.items() for key in ("exp_avg", "exp_avg_sq")}
    param_fractions, param_devices, param_bytes = _holdings(params)
    state_fractions, state_devices, state_bytes = _holdings(state)
    diff = max(_difference(p, r) for p, r in zip(params.values(), ref.parameters()))
    state_diff = max(
        _difference(opt.state[p][k], ref_opt.state[r][k])
        for p, r in zip(params.values(), ref.parameters())
        for k in ("exp_avg", "exp_avg_sq")
    )
    return {
        "devices": lazyxla.spmd.device_count(),
        "losses": [loss.item() for loss in losses],
        "ref_losses": ref_losses,
        "diff": diff,
        "state_diff": state_diff,
        "compiles": compiles,
        "param_fractions": param_fractions,
        "state_fractions": state_fractions,
        "param_devices": param_devices,
        "param_bytes": param_bytes,
        "state_devices": state_devices,
        "state_bytes": state_bytes,
        "specs": {name: lazyxla.spmd.get_sharding(p)[1] for name, p in params.items()},
        "wrapped": [type(b).__name__ for b in model.module.blocks],
        "api": _api_checks(ex),
    }


def _raises(call) -> str:
    try:
        call()
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


def _api_checks(ex) -> dict:
    """torch_xla's FSDPv2 behaviours beyond training (its test_fsdp_v2.py cases, in our words)."""
    import numpy as np
    import torch_xla
    import torch_xla.distributed.spmd as xs
    from torch_xla.experimental.spmd_fully_sharded_data_parallel import SpmdFullyShardedDataParallel as FSDPv2

    import lazyxla

    n = lazyxla.spmd.device_count()
    mesh = xs.Mesh(np.arange(n), (n, 1), ("fsdp", "tensor"))
    two = xs.Mesh(np.arange(n), (2, n // 2, 1), ("data", "fsdp", "tensor"))
    out = {}

    def model():
        return torch.nn.Sequential(torch.nn.Linear(128, 64), torch.nn.ReLU(), torch.nn.Linear(64, 3))

    xs.set_global_mesh(None)
    out["no_mesh"] = _raises(lambda: FSDPv2(model()))
    out["no_fsdp_axis"] = _raises(lambda: FSDPv2(model(), mesh=xs.Mesh(np.arange(n), (n,), ("data",))))
    out["bad_extra_axis"] = _raises(lambda: FSDPv2(model(), mesh=two, extra_data_axis="ddp"))
    out["module_list"] = _raises(lambda: FSDPv2(torch.nn.ModuleList([torch.nn.Linear(2, 2)]), mesh=mesh))

    xs.set_global_mesh(mesh)
    wrapped = FSDPv2(model())  # a CPU model: moved to the device; the global mesh
    out["global_mesh"] = wrapped._mesh is mesh
    out["device"] = str(next(wrapped.parameters()).device)
    out["twice"] = _raises(lambda: FSDPv2(wrapped))
    out["layer_specs"] = [lazyxla.spmd.get_sharding(p) for p in wrapped.parameters()]
    out["layer_specs"] = [None if s is None else s[1] for s in out["layer_specs"]]
    x = torch.randn(16, 128).to(torch_xla.device())
    xs.mark_sharding(x, mesh, ("fsdp", None))
    y = wrapped(x)
    out["output_spec"] = lazyxla.spmd.get_sharding(y)[1]
    out["getitem"] = type(wrapped[0]).__name__  # reaches the wrapped Sequential
    out["getattr"] = wrapped.training and hasattr(wrapped, "_modules")

    seen = []
    custom = FSDPv2(model(), mesh=mesh, shard_output=lambda output, m: seen.append((tuple(output.shape), m is mesh)))
    custom(x)
    out["custom_shard_output"] = seen

    class Pair(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(128, 8)

        def forward(self, v):
            return self.fc(v), v.sum()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first, _ = FSDPv2(Pair(), mesh=mesh)(x)
    out["tuple_warning"] = any("only the first element is sharded" in str(w.message) for w in caught)
    out["tuple_spec"] = lazyxla.spmd.get_sharding(first)[1]

    def linear_policy(module, recurse, unwrapped_params):
        return recurse or isinstance(module, torch.nn.Linear)

    auto = FSDPv2(model(), mesh=mesh, auto_wrap_policy=linear_policy)
    out["auto_wrapped"] = [type(m).__name__ for m in auto.module]
    untouched = FSDPv2(model(), mesh=mesh, auto_wrap_policy=linear_policy, auto_wrapper_callable=lambda m, **kw: m)
    out["callable_wrapped"] = [type(m).__name__ for m in untouched.module]
    inner = model()
    inner[0] = FSDPv2(inner[0], mesh=mesh)
    out["wrapped_inside"] = _raises(lambda: FSDPv2(inner, mesh=mesh, auto_wrap_policy=linear_policy))

    multi = FSDPv2(model(), mesh=two, extra_data_axis="data")
    xm = torch.randn(16, 128).to(torch_xla.device())
    xs.mark_sharding(xm, two, (("data", "fsdp"), None))
    out["extra_axis_output_spec"] = lazyxla.spmd.get_sharding(multi(xm))[1]
    out["extra_axis_param_spec"] = lazyxla.spmd.get_sharding(multi.module[0].weight)[1]
    return out
