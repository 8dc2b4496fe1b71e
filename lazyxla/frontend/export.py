"""``lazyxla.export``: a function or module as a self-contained StableHLO program.

The function is run once on lazyxla tensors, recorded as a sync would record it, and the graph is
lowered to one jax function and exported with ``jax.export``: a serialized artifact that any JAX
process can load and run (``jax.export.deserialize(blob).call(*arrays)``) without PyTorch or lazyxla.

- The example arguments' tensors become the program's inputs (same shapes and dtypes, fixed).
- Every other tensor the function reads (a module's weights, buffers, constants) is baked into the
  program as a constant, as are Python numbers (learning rates, ...) and, unless ``random_key=True``
  makes the key an input, random keys: a random op (dropout) then draws the same numbers at every call.
- ``state=`` (modules, optimizers, tensors) names tensors the function updates in place, such as a
  training step's parameters and optimizer state: they become extra inputs *and* extra outputs, so the
  artifact is a pure step function ``(args, state) -> (outputs, new state)``.
- Exporting changes nothing: the state, the parameters' ``.grad`` and the lazyxla RNG hold what they held
  before, and the function may not force an execution (``.item()``, a CPU fallback: it raises, naming
  the line).

Example::

    exported = lazyxla.export(model, (torch.randn(8, 32),))
    print(exported.stablehlo_text())
    blob = exported.serialize()            # bytes, jax.export's format
    # in any JAX process:
    #   jax.export.deserialize(blob).call(x)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
import torch

from lazyxla import torch_private
from lazyxla.config import config
from lazyxla.device import devices
from lazyxla.device.devices import on_device, torch_device
from lazyxla.ir import Leaf, raise_if_error
from lazyxla.lazy import graph, rng
from lazyxla.lazy.tensor import LazyTensor, unwrap
from lazyxla.lowering.to_jax import ArgLayout, graph_fn
from lazyxla.observe import diagnostics
from lazyxla.observe.diagnostics import CompileRegionError
from lazyxla.util import atomic_write


class ExportError(RuntimeError):
    """The function cannot become one exported program (it forces an execution, returns a non-tensor, ...)."""


class Exported:
    """An exported lazyxla program (``lazyxla.export``'s result).

    The program takes the example arguments' arrays, then the state's (``state_names`` order), then the
    random key (``export(..., random_key=True)``), and returns the function's outputs (``out_names``), then
    the state's new values.

    Example::

        exported = lazyxla.export(step, (x, y), state=(model, opt))
        loss, new_state = exported.call(x.numpy(), y.numpy(), *exported.state_values().values())
    """

    def __init__(self, exported, out_tree, in_names, out_names, state_names, state_values) -> None:
        self.jax = exported  #: the underlying ``jax.export.Exported``
        self.in_names = in_names  #: the program's inputs: ``args[i]`` and the state's names
        self.out_names = out_names  #: the program's outputs: ``out[i]`` and the state's names
        self.state_names = state_names  #: the names of the state tensors (inputs after the arguments)
        self._out_tree = out_tree
        self._state = state_values

    def stablehlo_text(self) -> str:
        """The program as StableHLO text (MLIR).

        Example::

            assert "stablehlo.dot_general" in exported.stablehlo_text()
        """
        return self.jax.mlir_module()

    def serialize(self) -> bytes:
        """The artifact in ``jax.export``'s serialized format; load it with ``jax.export.deserialize``.

        Example::

            blob = exported.serialize()
            out = jax.export.deserialize(blob).call(x)   # no torch needed
        """
        return bytes(self.jax.serialize())

    def save(self, path: str | os.PathLike) -> None:
        """Write :meth:`serialize`'s bytes to ``path`` atomically (``lazyxla.util.atomic_write``).

        Example::

            exported.save("mlp.jaxexport")
        """
        atomic_write(path, self.serialize())

    def state_values(self) -> dict[str, np.ndarray]:
        """The state's values at export time, by name, in the program's input order.

        Example::

            state = list(exported.state_values().values())
            out, state = exported.call(x, *state)
        """
        return dict(self._state)

    def call(self, *arrays) -> Any:
        """Run the exported program (jax arrays, NumPy arrays or CPU torch tensors).

        Returns the function's outputs in its structure (as jax arrays); with state, the pair
        ``(outputs, new_state)`` with ``new_state`` a tuple in ``state_names`` order.

        Example::

            logits = exported.call(x)
        """
        want = len(self.in_names)
        if len(arrays) != want:
            raise TypeError(
                f"this exported program takes {want} arrays ({', '.join(self.in_names)}), got {len(arrays)}"
            )
        arrays = [_host(a) for a in arrays]
        with devices.x64():
            flat = self.jax.call(*arrays)
        n = len(self.out_names) - len(self.state_names)
        outputs = torch_private.tree_unflatten(list(flat[:n]), self._out_tree)
        return (outputs, tuple(flat[n:])) if self.state_names else outputs

    def __repr__(self) -> str:
        return f"<lazyxla.Exported ({', '.join(self.in_names)}) -> ({', '.join(self.out_names)})>"


def _host(a):
    if isinstance(a, torch.Tensor):
        if a.device.type != "cpu":
            a = a.cpu()
        return devices.host_array(a.detach())
    return a


def export(
    fn: Callable | torch.nn.Module,
    example_args: Sequence[Any] | torch.Tensor,
    *,
    state: Any = None,
    platforms: Sequence[str] | None = None,
    random_key: bool = False,
) -> Exported:
    """Export ``fn(*example_args)`` as a StableHLO program (see the module docstring).

    ``fn``: a function or a module on a lazyxla device. ``example_args``: its arguments; tensors (CPU or
    lazyxla) become the program's inputs, other values are passed as they are and baked in. ``state``: a
    module, an optimizer, a tensor, or a list/tuple/dict of them, whose lazyxla tensors ``fn`` updates in
    place (a training step: ``state=(model, opt)``); they become inputs and outputs. An optimizer's state
    must exist (run one step first) and live on the device (``torch.optim.AdamW(..., capturable=True)``
    keeps its step count there; otherwise the count is read once and baked in). ``platforms``: jax
    platforms to export for (default: this process's, e.g. ``("cpu",)``; ``("cpu", "cuda", "tpu")``).
    ``random_key``: random ops (dropout) draw from a key the program takes as its last input (a ``uint32[2]``
    array, e.g. ``jax.random.key_data(jax.random.key(step))``), so each call can draw new numbers; by
    default the keys of the recorded call are baked in and every call draws the same numbers.

    int64 inputs stay int64: a consumer passes them with ``jax_enable_x64`` on.

    Example::

        model = MLP().to("lazyxla")
        exported = lazyxla.export(model, (torch.randn(8, 32),))
        logits = exported.call(np.ones((8, 32), np.float32))

        def step(x, y):
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return loss
        exported = lazyxla.export(step, (x, y), state=(model, opt))
    """
    # Nothing is computed on the host from known values (lazy/known.py) while the function is recorded: an
    # integer input, or state updated in place (BatchNorm's num_batches_tracked), would become a constant of
    # the program instead of an input it computes from.
    with config.scoped(known_values_limit=0):
        return _export(fn, example_args, state, platforms, random_key)


def _export(fn, example_args, state, platforms, random_key) -> Exported:
    if isinstance(example_args, torch.Tensor) or not isinstance(example_args, (tuple, list)):
        example_args = (example_args,)
    if isinstance(fn, torch.nn.Module):
        _check_on_device(fn, "the module passed to lazyxla.export")
    objects = _state_objects(state)
    optimizers = [o for _, o in objects if isinstance(o, torch.optim.Optimizer)]
    named = _state_tensors(objects)
    graph.sync()  # everything the function reads is device data from here on
    device = _device_of(fn, named)
    args = [_fresh_input(a, device, k) for k, a in enumerate(example_args)]
    before = [unwrap(t)._value for _, t in named]
    grads = _grads(objects)
    held = [g for _, g in grads if g is not None]
    grad_values = [unwrap(g)._value for g in held]
    opt_keys = {id(o): {id(p) for p in o.state} for o in optimizers}
    rng_state = rng.get_state()
    region = diagnostics.Region("lazyxla.export", full_graph=True, max_graphs=None)
    region.what = f"lazyxla.export({getattr(fn, '__qualname__', type(fn).__name__)})"
    region.inside = "the exported function: an exported program cannot stop to run on the host"
    region.preamble = ""
    diagnostics.enter(region)
    try:
        result = fn(*args)
        out_leaves, out_tree = torch_private.tree_flatten(result)
        outs = [_output(o, k) for k, o in enumerate(out_leaves)]
        after = [unwrap(t)._value for _, t in named]
        new_entries = _new_optimizer_entries(optimizers, opt_keys)
    except CompileRegionError as e:
        raise ExportError(str(e)) from None
    finally:
        diagnostics.leave(region)
        for (_, t), v in zip(named, before):  # exporting changes nothing
            _set_value(t, v)
        for g, v in zip(held, grad_values):
            _set_value(g, v)
        for p, g in grads:
            p.grad = g
        rng.set_state(rng_state)
    if new_entries:
        raise ExportError(
            f"lazyxla.export: the optimizer created its state during the exported call ({new_entries}): the "
            "program's inputs would not include it. Run one training step before exporting, so the "
            "optimizer's state (momentum buffers, step counts) exists"
        )
    return _build(args, outs, out_tree, named, before, after, platforms, random_key)


def _set_value(t: torch.Tensor, value: tuple) -> None:
    """Make the user tensor ``t`` hold the IR value ``value`` again, as an in-place op would (so views of
    it, ``t.detach()`` included, see the value too)."""
    inner = unwrap(t)
    if inner._value is value:
        return
    torch_private.replace_inner(t, LazyTensor(value, inner._aval))


def _check_on_device(module: torch.nn.Module, what: str) -> None:
    for name, t in [*module.named_parameters(), *module.named_buffers()]:
        if not on_device(t):
            raise ValueError(
                f"{what} has {name!r} on {t.device}: move the module to the lazyxla device first "
                "(model.to(lazyxla.device()))"
            )


def _device_of(fn, named: list[tuple[str, torch.Tensor]]) -> int:
    for _, t in named:
        return t.device.index or 0
    if isinstance(fn, torch.nn.Module):
        for t in [*fn.parameters(), *fn.buffers()]:
            return t.device.index or 0
    return 0


def _fresh_input(a, device: int, k: int):
    """An example argument as the function sees it: tensors become new device data (one program input
    each, even when two arguments are the same tensor)."""
    if not isinstance(a, torch.Tensor):
        return a
    if not (a.device.type == "cpu" or on_device(a)):
        raise ValueError(f"lazyxla.export: example argument {k} is on {a.device}; pass CPU or lazyxla tensors")
    host = a.detach().cpu() if on_device(a) else a.detach()
    t = host.to(torch_device(device))
    return t.requires_grad_(a.requires_grad)


def _output(o, k: int):
    if not isinstance(o, torch.Tensor):
        raise ExportError(
            f"lazyxla.export: the function's output {k} is a {type(o).__name__}; an exported program returns "
            "tensors only (return it as a tensor, or leave it out)"
        )
    if not on_device(o):
        raise ExportError(
            f"lazyxla.export: the function's output {k} is on {o.device}; return lazyxla tensors (computed on "
            "the device) so the program can compute it"
        )
    return unwrap(o)._value


def _state_objects(state, name: str = "state") -> list[tuple[str, Any]]:
    """The modules, optimizers and tensors in ``state`` (nested in lists, tuples and dicts), named."""
    if state is None:
        return []
    if isinstance(state, (torch.Tensor, torch.nn.Module, torch.optim.Optimizer)):
        return [(name, state)]
    if isinstance(state, dict):
        return [x for k, v in state.items() for x in _state_objects(v, f"{name}.{k}")]
    if isinstance(state, (list, tuple)):
        many = len(state) > 1
        return [x for i, v in enumerate(state) for x in _state_objects(v, f"{name}[{i}]" if many else name)]
    raise TypeError(
        f"lazyxla.export: state= takes modules, optimizers, tensors and lists/dicts of them; {name} is a "
        f"{type(state).__name__}"
    )


def _state_tensors(objects: list[tuple[str, Any]]) -> list[tuple[str, torch.Tensor]]:
    """The lazyxla tensors of the state's objects, named, without duplicates."""
    out: list[tuple[str, torch.Tensor]] = []
    seen: set[int] = set()

    def add(name, t):
        if isinstance(t, torch.Tensor) and on_device(t) and id(t) not in seen:
            seen.add(id(t))
            out.append((name, t))

    for name, x in objects:
        if isinstance(x, torch.Tensor):
            if not on_device(x):
                raise ValueError(f"lazyxla.export: state tensor {name} is on {x.device}; state lives on lazyxla")
            add(name, x)
        elif isinstance(x, torch.nn.Module):
            _check_on_device(x, f"the state module {name}")
            for n, t in [*x.named_parameters(), *x.named_buffers()]:
                add(f"{name}.{n}", t)
        else:  # an optimizer: its per-parameter state (CPU entries are read during the call and baked in)
            for i, p in enumerate(_params(x)):
                for k, v in x.state.get(p, {}).items():
                    add(f"{name}.state.{i}.{k}", v)
    return out


def _params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def _grads(objects: list[tuple[str, Any]]) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """(parameter, its .grad) for the state modules' and optimizers' parameters: restored after the call."""
    params = {}
    for _, x in objects:
        if isinstance(x, torch.nn.Module):
            params.update((id(p), p) for p in x.parameters())
        elif isinstance(x, torch.optim.Optimizer):
            params.update((id(p), p) for p in _params(x))
    return [(p, p.grad) for p in params.values()]


def _new_optimizer_entries(optimizers: list, before: dict[int, set[int]]) -> str:
    """Optimizer state created by the exported call (removed again); '' when there is none."""
    made = []
    for o in optimizers:
        for p in list(o.state):
            if id(p) not in before[id(o)]:
                made.append(f"{sorted(o.state[p])} for a parameter of shape {list(p.shape)}")
                del o.state[p]
    return "; ".join(made[:2]) + ("; ..." if len(made) > 2 else "")


def _build(args, outs, out_tree, named, before, after, platforms, random_key) -> Exported:
    inputs = [unwrap(a)._value for a in args if isinstance(a, torch.Tensor)]
    in_names = [f"args[{k}]" for k, a in enumerate(args) if isinstance(a, torch.Tensor)]
    in_names += [n for n, _ in named]
    if random_key:
        in_names.append("random_key")
    out_names = [f"out[{k}]" for k in range(len(outs))] + [n for n, _ in named]
    wanted = outs + after
    roots, order, leaves, _ = graph.plan_values(wanted)
    root_pos = {(id(m), i): k for k, (m, i) in enumerate(roots)}
    picks = [root_pos[(id(v[0]), v[1])] for v in wanted]
    positions = {}  # leaf index -> program input position
    for k, v in enumerate(inputs + before):
        positions.setdefault(id(v[0]), k)
    layout = ArgLayout(leaves)
    constants = {}
    for i in layout.data:
        n = leaves[i]
        raise_if_error(n)
        if id(n) not in positions:
            constants[i] = np.asarray(jax.device_get(n.payload))
    extra = layout.packed_scalars(leaves)
    if layout.keys and not random_key:
        extra.append(np.stack([leaves[i].payload for i in layout.keys]))
    body = graph_fn(order, leaves, roots, layout)
    slot = {i: positions.get(id(leaves[i])) for i in layout.data}
    n_keys = len(layout.keys)

    def program(*program_inputs):
        data = [program_inputs[slot[i]] if slot[i] is not None else constants[i] for i in layout.data]
        keys = []
        if random_key and n_keys:  # one key per random op, derived from the call's key
            base = jax.random.wrap_key_data(program_inputs[-1], impl="threefry2x32")
            keys = [jax.vmap(lambda i: jax.random.key_data(jax.random.fold_in(base, i)))(np.arange(n_keys))]
        results = body(*data, *extra, *keys)
        return tuple(results[k] for k in picks)

    specs = [
        jax.ShapeDtypeStruct(v[0].avals[v[1]].shape, devices.np_dtype(v[0].avals[v[1]].dtype)) for v in inputs + before
    ]
    if random_key:
        specs.append(jax.ShapeDtypeStruct((2,), np.uint32))
    with devices.x64(), jax.default_matmul_precision(config.matmul_precision):
        exported = jax.export.export(jax.jit(program), platforms=platforms)(*specs)
    state_values = [(n, np.asarray(jax.device_get(v[0].payload))) for (n, _), v in zip(named, before)]
    for n, v in zip([n for n, _ in named], before):
        if v[0].op is not Leaf.DATA:
            raise ExportError(f"lazyxla.export internal error: state {n} was not device data at the start")
    return Exported(exported, out_tree, in_names, out_names, [n for n, _ in named], state_values)


__all__ = ["ExportError", "Exported", "export"]
