"""``lazyxla.scan`` and ``lazyxla.scan_layers``: loops whose body XLA compiles once, forward and backward.

Example::

    def step(carry, x):                      # one iteration: (carry, x) -> (new carry, y)
        new = torch.tanh(carry @ w_h + x)
        return new, new
    h, hs = lazyxla.scan(step, h0, xs)       # xs: (T, ...) -> hs: (T, ...), one loop in the program

    x = lazyxla.scan_layers(model.blocks, x) # a stack of identical layers: one compiled layer

Design
------
A call traces ``fn`` once, for one iteration, on placeholder tensors (``frontend/scan_body.py``) and records
ONE node of the op ``torch.ops.lazyxla.scan(inputs, body, length)``, lowered to ``jax.lax.scan`` over the
traced body (``lowering/rules/scan.py``): the program holds one iteration whatever the length (with
``StackedLayers`` a 24-layer GPT's training step compiles in the time of a 2-layer one). The node's inputs
are the initial carries, the stacked ``xs``, the loop invariants the body reads (tensors from outside,
constants, Python scalars) and one RNG key per random op. Under autograd the call is a
``torch.autograd.Function``: the trace also records PyTorch's own backward of the iteration, the forward
loop outputs the activations that backward needs (stacked, one per iteration), and the Function's backward
records a second loop node over that backward body, run in reverse, whose carries are the carries'
gradients and whose stacked outputs are the ``xs``' gradients. ``scan_layers`` stacks each parameter (and
buffer) of the layers with ``torch.stack`` (so gradients reach each layer's own parameters through the
stack's backward) and scans the first layer's code over the stacks with ``torch.func.functional_call``;
``StackedLayers`` keeps the stacks as its parameters.

A call retraces ``fn`` (one iteration's ops, not ``length`` of them) unless ``pure=True`` says that ``fn``
reads nothing that changes between calls; every trace of the same function gives the same body digest, so
the compiled program is reused either way.

Random numbers: each random op in the body draws from its own key, folded with the iteration number
(``jax.random.fold_in``), so iterations draw different numbers, every call draws new ones and
``torch.manual_seed`` makes them reproducible; they are not the numbers an unrolled loop would draw (as in
torch_xla). With ``checkpoint=True`` the backward recomputes each iteration's forward with the same keys.
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch

from lazyxla.config import config
from lazyxla.device import devices
from lazyxla.frontend.scan_body import Loop, Plan, ScanError, aval_of, flatten, trace  # noqa: F401  (ScanError: re-exported)
from lazyxla.ir import IN, Aval, canonical, node, op_hash
from lazyxla.lazy import rng
from lazyxla.lazy.tensor import LazyTensor, unwrap, wrap
from lazyxla.lowering.rules.scan import OP
from lazyxla.observe import diagnostics, metrics
from lazyxla.ops import ops

_PURE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # fn (or first layer) -> {signature: Plan}


def scan(fn: Callable, init: Any, xs: Any, *, checkpoint: bool = False, pure: bool = False) -> tuple[Any, Any]:
    """Apply ``fn`` over the leading dimension of ``xs``, carrying state: one loop in the XLA program.

    ``fn(carry, x) -> (new_carry, y)``, where ``x`` is ``xs`` (a tensor or a pytree of tensors with the same
    leading size) at one index. Returns the last carry and the ``y``s stacked along a new first dimension
    (a pytree like ``y``; ``None`` leaves stay ``None``). The same as::

        carry, ys = init, []
        for i in range(len(xs)):
            carry, y = fn(carry, xs[i]); ys.append(y)
        return carry, torch.stack(ys)

    but traced once: the program holds one iteration, forward and backward (autograd works through it).
    The carry must keep its shapes and dtypes; ``fn`` must not modify its inputs or read values on the host,
    and tensors it reads from outside get no gradient (pass them in ``xs`` or the carry).
    ``checkpoint=True``: the backward recomputes each iteration's activations instead of keeping them
    (memory of one carry per iteration). ``pure=True``: ``fn`` reads nothing that changes between calls, so
    its trace is kept and reused. On CPU tensors it runs the Python loop above.

    Example::

        def cumsum(total, x):
            total = total + x
            return total, total
        total, partial_sums = lazyxla.scan(cumsum, torch.zeros(2, device=dev), xs)   # xs: (n, 2)
    """
    if not callable(fn):
        raise ValueError(f"scan: fn must be callable, got {fn!r}")
    flat_xs, unflatten_xs = flatten(xs)
    if not flat_xs:
        raise ValueError(f"scan: xs must hold at least one tensor to scan over, got {xs!r}")
    cache = _PURE.setdefault(fn, {}) if pure else None
    return _scan(fn, init, flat_xs, unflatten_xs, _length(flat_xs), checkpoint, cache)


def scan_layers(layers: Iterable[torch.nn.Module], input_data: Any, *, checkpoint: bool = False, pure: bool = False):
    """Run ``layers`` one after the other on ``input_data``, as one loop over the first layer's code.

    The same as ``torch.nn.Sequential(*layers)(input_data)`` (a tuple ``input_data`` is passed as
    positional arguments, and each layer must return the same structure), but the program holds one layer,
    forward and backward. The layers keep their own parameters: each call stacks them and splits their
    gradients, and the optimizer updates each layer's tensors (:class:`StackedLayers` stores them stacked,
    so that a training step's program stops growing with depth). The layers must be
    structurally identical: same class, submodules, parameter and buffer names, shapes and dtypes, and the
    same code for the same parameters (settings such as a dropout probability or an epsilon are the first
    layer's). Each call stacks the parameters (gradients reach every layer's own parameters).
    ``checkpoint`` and ``pure`` as in :func:`scan`; no layers returns ``input_data``.

    Example::

        class GPT(nn.Module):
            def forward(self, idx):
                x = self.tok(idx) + self.pos(positions)
                x = lazyxla.scan_layers(self.blocks, x)       # instead of: for b in self.blocks: x = b(x)
                return self.head(self.ln(x))
    """
    layers = list(layers)
    if not layers:
        return input_data
    check_same_layers(layers)
    stacked = {}
    for what in ("named_parameters", "named_buffers"):
        per_layer = [dict(getattr(layer, what)()) for layer in layers]
        stacked.update({name: torch.stack([p[name] for p in per_layer]) for name in per_layer[0]})
    cache = _PURE.setdefault(layers[0], {}) if pure else None
    return _scan_module(layers[0], stacked, input_data, len(layers), checkpoint, cache)


def _scan_module(module: torch.nn.Module, stacked: dict, carry, length: int, checkpoint: bool, cache):
    """``module``'s code scanned over ``stacked`` (its parameters and buffers by name, one slice per
    iteration), the carry passed as its arguments (a tuple as positional arguments)."""

    def one_layer(carry, state):
        return torch.func.functional_call(module, state, carry, strict=True), None

    flat, unflatten = flatten(stacked)
    out, _ = _scan(one_layer, carry, flat, unflatten, length, checkpoint, cache)
    return out


class StackedLayers(torch.nn.Module):
    """Identical layers held as ONE module whose parameters and buffers are the layers' own stacked along a
    new first dimension, run as one loop over the layer's code (:func:`scan`).

    Unlike :func:`scan_layers`, which stacks the layers' parameters at every call, the stacks *are* the
    parameters: the optimizer updates one tensor per parameter name whatever the depth (with a per-layer
    ``ModuleList`` its update grows with every layer), and no copy is made per step. An elementwise
    optimizer (SGD, Adam, AdamW, ...) computes what it computes for the separate layers; one that looks at
    whole tensors (LAMB's trust ratio, Adafactor's factored moments) sees all layers at once.
    ``state_dict`` keys are the layer's own, prefixed ``layer.``, with stacked shapes; :meth:`unstack` gives
    the layers back. The layers must be identical as for :func:`scan_layers` and share no parameter with
    one another (stacking would untie it). Calls take the layer's arguments; ``checkpoint`` as in :func:`scan`.

    Example::

        class GPT(nn.Module):
            def __init__(self):
                ...
                self.blocks = lazyxla.StackedLayers(Block(d, heads) for _ in range(24))

            def forward(self, idx):
                x = self.blocks(self.tok(idx) + self.pos(positions))    # 24 blocks, one compiled block
                ...

        model.blocks.layer.fc1.weight.shape         # (24, 4 * d, d)
    """

    def __init__(self, layers: Iterable[torch.nn.Module], *, checkpoint: bool = False) -> None:
        super().__init__()
        layers = list(layers)
        if not layers:
            raise ValueError("StackedLayers: no layers to stack")
        check_same_layers(layers)
        _check_unshared(layers)
        self.length = len(layers)
        self.checkpoint = checkpoint
        # a copy of the first layer whose tensors are the stacks (deepcopy's memo: tied tensors stay tied)
        first = layers[0]
        memo = {
            id(p): torch.nn.Parameter(torch.stack([m.get_parameter(n).detach() for m in layers]), p.requires_grad)
            for n, p in first.named_parameters()
        }
        memo.update({id(b): torch.stack([m.get_buffer(n) for m in layers]) for n, b in first.named_buffers()})
        self.layer = copy.deepcopy(first, memo)

    def forward(self, *args):
        state = {**dict(self.layer.named_parameters()), **dict(self.layer.named_buffers())}
        carry = args[0] if len(args) == 1 else args
        return _scan_module(self.layer, state, carry, self.length, self.checkpoint, None)

    def unstack(self) -> torch.nn.ModuleList:
        """The layers as separate modules, each with a copy of its slice of the stacks.

        Example::

            blocks = model.blocks.unstack()          # nn.ModuleList of 24 Blocks
        """
        layers = torch.nn.ModuleList()
        for i in range(self.length):
            memo = {id(p): torch.nn.Parameter(p[i].detach().clone(), p.requires_grad) for p in self.layer.parameters()}
            memo.update({id(b): b[i].clone() for b in self.layer.buffers()})
            layers.append(copy.deepcopy(self.layer, memo))
        return layers

    def extra_repr(self) -> str:
        return f"length={self.length}" + (", checkpoint=True" if self.checkpoint else "")


def _check_unshared(layers: list[torch.nn.Module]) -> None:
    owner: dict[int, int] = {}
    for i, layer in enumerate(layers):
        for name, p in layer.named_parameters():
            j = owner.setdefault(id(p), i)
            if j != i:
                raise ValueError(
                    f"StackedLayers: layers {j} and {i} share '{name}'; stacking would untie it (use scan_layers, "
                    "which keeps each layer's own tensors)"
                )


def check_same_layers(layers: list[torch.nn.Module]) -> None:
    """Raise ``ValueError`` naming the first difference between ``layers[0]`` and another layer: class,
    submodules, training mode, parameter and buffer names (torch_xla's "mismatched keys"), shapes ("Shape
    mismatch"), dtypes.

    Example::

        check_same_layers([nn.Linear(4, 4), nn.Linear(4, 5)])   # ValueError: Shape mismatch for 'weight' ...
    """
    ref = layers[0]
    for idx, layer in enumerate(layers[1:], start=1):
        for what in ("named_parameters", "named_buffers"):
            _same_tensors(dict(getattr(ref, what)()), dict(getattr(layer, what)()), idx)
        mods, ref_mods = dict(layer.named_modules()), dict(ref.named_modules())
        for name, m in ref_mods.items():
            other = mods.get(name)
            where = f"submodule '{name}'" if name else "the layer"
            if type(other) is not type(m):
                got = type(other).__name__ if other is not None else "missing"
                raise ValueError(f"Layer {idx} differs from layer 0: {where} is {got}, in layer 0 {type(m).__name__}")
            if other.training != m.training:
                raise ValueError(f"Layer {idx} differs from layer 0: {where} has training={other.training}")
        extra = sorted(set(mods) - set(ref_mods))
        if extra:
            raise ValueError(f"Layer {idx} differs from layer 0: it has submodules layer 0 lacks: {extra}")


def _same_tensors(ref: dict, cur: dict, idx: int) -> None:
    if set(cur) != set(ref):
        message = f"Layer {idx} has mismatched keys."
        missing, extra = sorted(set(ref) - set(cur)), sorted(set(cur) - set(ref))
        message += f" Missing keys: {missing}." if missing else ""
        message += f" Extra keys: {extra}." if extra else ""
        raise ValueError(message)
    for key, t in ref.items():
        if cur[key].shape != t.shape:
            raise ValueError(f"Shape mismatch for '{key}' in layer {idx}: expected {t.shape}, got {cur[key].shape}.")
        if cur[key].dtype != t.dtype:
            raise ValueError(f"Dtype mismatch for '{key}' in layer {idx}: expected {t.dtype}, got {cur[key].dtype}.")


def _length(flat_xs: list) -> int:
    lengths = set()
    for t in flat_xs:
        if not isinstance(t, torch.Tensor) or t.dim() == 0:
            raise ValueError(f"scan: xs must hold tensors of at least one dimension, got {_describe(t)}")
        lengths.add(t.shape[0])
    if len(lengths) > 1:
        raise ValueError(f"scan: the tensors in xs must have the same leading size, got {sorted(lengths)}")
    return lengths.pop()


def _describe(t) -> str:
    return f"a {t.dim()}-d tensor" if isinstance(t, torch.Tensor) else type(t).__name__


def _scan(fn, init, flat_xs: list, unflatten_xs, length: int, checkpoint: bool, cache: dict | None):
    flat_init, unflatten_carry = flatten(init)
    for t in flat_init:
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"scan: the carry must hold tensors (or None), got {_describe(t)}")
    tensors = flat_init + flat_xs
    on_device = [t.device for t in tensors if devices.on_device(t)]  # ("xla" under python -m lazyxla.run)
    if not on_device:
        return _python_loop(fn, init, flat_xs, unflatten_xs, length)
    device = on_device[0]
    for t in tensors:
        if t.device != device:
            raise ValueError(f"scan: init and xs must be on one lazyxla device ({device}); a tensor is on {t.device}")
    need_grad = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
    plan = _plan(fn, unflatten_carry, unflatten_xs, flat_init, flat_xs, need_grad, checkpoint, device.index, cache)
    call = _Call(plan, device.index, length, [unwrap(t) for t in tensors])
    outs = _ScanFunction.apply(call, *tensors) if plan.backward is not None else call.forward()
    n_carry = len(flat_init)
    return unflatten_carry(list(outs[:n_carry])), plan.y_unflatten(list(outs[n_carry:]))


def _plan(fn, unflatten_carry, unflatten_xs, flat_init, flat_xs, need_grad, checkpoint, device, cache) -> Plan:
    key = None
    if cache is not None:
        key = (
            device,
            need_grad,
            checkpoint,
            unflatten_carry.spec,
            unflatten_xs.spec,
            tuple(aval_of(t) for t in flat_init),
            tuple((aval_of(t), t.requires_grad) for t in flat_xs),
            torch.is_autocast_enabled(devices.torch_name()),
            torch.get_autocast_dtype(devices.torch_name()),
        )
        plan = cache.get(key)
        if plan is not None:
            return plan
    plan = trace(fn, unflatten_carry, unflatten_xs, flat_init, flat_xs, need_grad, checkpoint, device)
    if cache is not None:
        cache[key] = plan
    return plan


class _Call:
    """One call of a plan: records its forward loop now, its backward loop when autograd asks."""

    def __init__(self, plan: Plan, device: int, length: int, inputs: list[LazyTensor]) -> None:
        self.plan = plan
        self.device = device
        self.length = length
        self.inputs = inputs  # the carries' and the xs' LazyTensors (their values when the call was made)
        self.keys = [(rng.next_key_leaf(device), 0) for _ in range(plan.n_keys)]
        self.residuals: list[LazyTensor] = []

    def forward(self) -> list[torch.Tensor]:
        """The forward loop's carries and stacked ys (the residuals are kept for the backward)."""
        loop = self.plan.forward
        n = self._record(loop, [t._value for t in self.inputs])
        n_out = loop.n_carry + self.plan.n_ys
        self.residuals = [LazyTensor((n, k), n.avals[k]) for k in range(n_out, len(n.avals))]
        return [wrap(LazyTensor((n, k), n.avals[k])) for k in range(n_out)]

    def backward(self, grads: tuple, needs: tuple) -> list:
        """The gradients of the carries and xs (None where not needed) from those of the outputs."""
        plan, loop = self.plan, self.plan.backward
        n_carry = plan.forward.n_carry
        values = [unwrap(grads[k])._value for k in plan.grad_carries]
        for role, k in loop.xs:
            if role == "x":
                values.append(self.inputs[n_carry + k]._value)
            elif role == "ct":
                values.append(unwrap(grads[n_carry + plan.grad_ys[k]])._value)
            else:
                values.append(self.residuals[k]._value)
        n = self._record(loop, values)
        out: list = [None] * len(self.inputs)
        for j, k in enumerate(plan.grad_carries):
            out[k] = self._gradient(n, j, k) if needs[k] else None
        for j, k in enumerate(plan.grad_xs):
            pos = len(plan.grad_carries) + j
            out[n_carry + k] = self._gradient(n, pos, n_carry + k) if needs[n_carry + k] else None
        return out

    def _gradient(self, n, pos: int, k: int) -> torch.Tensor:
        """Output ``pos`` of backward loop ``n``: the gradient of input ``k``, in SPMD mode laid out as that input
        is (torch_xla's scan constrains them alike: XLA's propagation alone may replicate the gradient)."""
        grad = LazyTensor((n, pos), n.avals[pos])
        if devices.spmd_enabled():
            grad = ops.shard_like(grad, LazyTensor(self.inputs[k]._value, self.inputs[k]._aval))
        return wrap(grad)

    def _record(self, loop: Loop, values: list):
        inputs = [*values]
        inputs += [h._value if type(h) is LazyTensor else h for h in loop.invariants]
        inputs += [self.keys[k] for k in loop.keys]
        template = ((tuple(IN[: len(inputs)]), loop.name, self.length), ())
        stacked = tuple(Aval((self.length, *a.shape), a.dtype) for a in loop.stacked_avals)
        base = op_hash(OP, canonical(template), self.device)
        n = node(OP, tuple(inputs), template, loop.carry_avals + stacked, self.device, base)
        if config.explain_recompiles:
            diagnostics.note_recorded(n, skip=3)
        metrics.inc("scan_calls")
        return n


class _ScanFunction(torch.autograd.Function):
    """The loop under autograd: forward records the forward loop, backward the backward loop."""

    @staticmethod
    def forward(ctx, call: _Call, *tensors):
        ctx.call = call
        return tuple(call.forward())

    @staticmethod
    def backward(ctx, *grads):
        if torch.is_grad_enabled():  # create_graph=True: the backward loop's gradients would be taken as constants
            raise NotImplementedError(
                "lazyxla.scan: gradients of gradients through a loop (backward with create_graph=True) are not "
                "supported; run the loop in Python for higher-order derivatives"
            )
        with torch.no_grad():
            return (None, *ctx.call.backward(grads, ctx.needs_input_grad[1:]))


def _python_loop(fn, init, flat_xs: list, unflatten_xs, length: int):
    """The loop itself, for tensors that are not on a lazyxla device."""
    carry, ys, y_unflatten = init, [], None
    for i in range(length):
        carry, y = fn(carry, unflatten_xs([t[i] for t in flat_xs]))
        flat_y, y_unflatten = flatten(y)
        ys.append(flat_y)
    if y_unflatten is None:
        raise ValueError("scan: a loop of 0 iterations over tensors that are not on a lazyxla device")
    return carry, y_unflatten([torch.stack(column) for column in zip(*ys)])
