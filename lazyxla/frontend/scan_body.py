"""Tracing a scanned function into loop bodies: one iteration forward and, for autograd, its backward.

``trace(fn, ...)`` runs ``fn(carry, x)`` once in lazy mode on placeholder tensors shaped like one
iteration (``lazy/placeholders.py``), and, when gradients are wanted, runs PyTorch's autograd over that
iteration too (``torch.autograd.grad`` with placeholder cotangents), so the backward is PyTorch's own
backward of the function, recorded op by op like any backward. The IR recorded is then cut:

- *varying* values depend on the iteration: they reach a placeholder (a carry, a slice of ``xs``, a
  cotangent) or an RNG key (each iteration draws its own numbers). They form the body.
- every other value the body reads is a *loop invariant*: computed once, outside the loop, and passed in
  (a tensor the function reads from outside, a constant it makes, a Python scalar, which stays a graph
  input as everywhere in lazyxla).
- the backward body reads forward values (*residuals*, the activations autograd saved): the forward loop
  outputs them stacked, one per iteration, and the backward loop takes them as per-iteration inputs
  (reshapes and transposes excepted: the backward redoes them from their input). With ``checkpoint=True``
  the backward body recomputes them all instead, from the iteration's carry.

Each body is rebuilt over fresh input leaves (``ir.rewired``), named by its ``ir.digest`` and registered
with the loop op's rule (``lowering/rules/scan.py``). :class:`Plan` says how a call feeds the two loops.

Example::

    plan = trace(fn, init_tree, xs_tree, flat_init, flat_xs, need_grad=True, checkpoint=False, device=0)
    plan.forward.name, plan.backward.name          # the bodies' digests
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from lazyxla import torch_private
from lazyxla.config import config
from lazyxla.device import devices
from lazyxla.ir import Aval, Leaf, digest, leaf, rewired
from lazyxla.lazy import rng
from lazyxla.lazy.placeholders import Placeholder, disarm, placeholder, reaches
from lazyxla.lazy.tensor import LazyTensor, unwrap, wrap
from lazyxla.lowering.rules import scan as scan_rule
from lazyxla.observe import metrics
from lazyxla.ops import COLLECTIVE_OPS

aten = torch.ops.aten

# Forward values the backward recomputes from their input instead of reading them saved: reshapes and
# transposes cost nothing to redo and are no smaller than their input (a transposed weight saved per
# iteration would be a second copy of every layer's weight).
_RECOMPUTED = frozenset(
    {
        aten.view_copy.default,
        aten._unsafe_view.default,
        aten.t_copy.default,
        aten.transpose_copy.int,
        aten.permute_copy.default,
        aten.unsqueeze_copy.default,
        aten.squeeze_copy.default,
        aten.squeeze_copy.dim,
        aten.squeeze_copy.dims,
        aten.expand_copy.default,
        aten.alias_copy.default,
    }
)


class ScanError(ValueError):
    """``fn``, ``init`` or ``xs`` cannot be scanned (the message says why and what to change)."""


@dataclasses.dataclass
class Loop:
    """One loop node as a call records it: the body's digest, what feeds it, what it gives.

    ``xs`` names each per-iteration input: ``("x", k)`` the k-th flattened ``xs`` leaf, ``("ct", j)`` the
    gradient of the j-th stacked output ``ys``, ``("res", r)`` the forward loop's r-th residual.
    ``invariants`` are outer values: LazyTensors (pending values, kept so that a sync computes them once)
    or IR values of leaves. ``keys`` index the plan's RNG keys.
    """

    name: str
    n_carry: int
    xs: list
    invariants: list
    keys: list[int]
    carry_avals: tuple
    stacked_avals: tuple  # per iteration; the loop's outputs are (length, *shape)


@dataclasses.dataclass
class Plan:
    """How calls of one traced function record their loops.

    ``y_unflatten`` rebuilds ``ys`` from the stacked outputs. With autograd (``backward`` set): the forward
    loop also outputs the ``residuals`` (after the ``ys``); the backward loop's carries are the gradients
    of the carries in ``grad_carries`` and it returns them for ``init``, then the stacked gradients of the
    ``xs`` leaves in ``grad_xs``; ``grad_ys`` are the ``ys`` whose gradients it takes.
    """

    forward: Loop
    backward: Loop | None
    n_keys: int
    n_ys: int
    y_unflatten: Callable
    grad_carries: list[int]
    grad_xs: list[int]
    grad_ys: list[int]


def flatten(tree) -> tuple[list, Callable]:
    """The leaves of a PyTorch pytree without its ``None`` leaves, and the function that puts a list of
    that length back (with the ``None``s where they were)."""
    leaves, spec = torch_private.tree_flatten(tree)
    where = [i for i, v in enumerate(leaves) if v is not None]

    def unflatten(values):
        full = [None] * len(leaves)
        for i, v in zip(where, values):
            full[i] = v
        return torch_private.tree_unflatten(full, spec)

    unflatten.spec = (spec, tuple(where))
    return [leaves[i] for i in where], unflatten


def aval_of(t: torch.Tensor) -> Aval:
    return Aval(tuple(t.shape), t.dtype)


def differentiable(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point or dtype.is_complex


# ---- running fn on placeholders ---------------------------------------------------------------------------


@dataclasses.dataclass
class _Traced:
    """What one run of fn (and its autograd) on placeholders recorded."""

    carry_in: list  # placeholder leaves
    x_in: list
    carry_ct: list  # cotangent placeholder leaves, per differentiable carry (grad_carries)
    y_ct: list  # per y in grad_ys
    carry_out: list  # IR values
    ys: list
    grads: list  # IR values: d carry_in (grad_carries), then d x (grad_xs); empty: nothing to differentiate
    y_unflatten: Callable
    grad_carries: list[int]
    grad_xs: list[int]
    grad_ys: list[int]


def _run(fn, unflatten_carry, unflatten_xs, flat_init, flat_xs, need_grad, device, made: list) -> _Traced:
    """Run fn (and its autograd) on placeholders; ``made`` collects every placeholder leaf made."""
    carry_ph = [_placeholder(aval_of(t), device, made) for t in flat_init]
    x_ph = [_placeholder(Aval(tuple(t.shape[1:]), t.dtype), device, made) for t in flat_xs]
    carry_w = [wrap(p) for p in carry_ph]
    x_w = [wrap(p) for p in x_ph]
    grad_carries = [k for k, t in enumerate(flat_init) if need_grad and differentiable(t.dtype)]
    grad_xs = [k for k, t in enumerate(flat_xs) if need_grad and t.requires_grad and differentiable(t.dtype)]
    for k in grad_carries:  # gradients flow through every iteration's carry, whatever init requires
        carry_w[k].requires_grad_(True)
    for k in grad_xs:
        x_w[k].requires_grad_(True)
    # (run in the caller's grad mode, even when no input requires grad: a tensor from outside that does is seen)
    out = fn(unflatten_carry(carry_w), unflatten_xs(x_w))
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise ScanError(f"scan: fn must return a pair (new_carry, y), got {type(out).__name__}")
    carry_out, _ = flatten(out[0])
    ys, y_unflatten = flatten(out[1])
    _check_carry(out[0], unflatten_carry, carry_out, flat_init)
    for t in ys:
        _check_on_device(t, "the y")
    _check_no_outside_gradient([t for t in carry_out + ys if t.requires_grad], {id(w) for w in carry_w + x_w})
    # fn may modify its inputs in place (torch_xla's own example does: ``acc += x; return acc, acc``): each
    # iteration's inputs are its own values, so the change stays inside the iteration, and what fn returns is the
    # modified value (the placeholders keep their nodes: the loop body reads them as its inputs)
    traced = _Traced(
        carry_in=[p._value[0] for p in carry_ph],
        x_in=[p._value[0] for p in x_ph],
        carry_ct=[],
        y_ct=[],
        carry_out=[unwrap(t)._value for t in carry_out],
        ys=[unwrap(t)._value for t in ys],
        grads=[],
        y_unflatten=y_unflatten,
        grad_carries=grad_carries,
        grad_xs=grad_xs,
        grad_ys=[j for j, t in enumerate(ys) if need_grad and t.requires_grad],
    )
    if need_grad:
        _backward(traced, carry_w, x_w, carry_out, ys, device, made)
    return traced


def _placeholder(aval: Aval, device: int, made: list) -> LazyTensor:
    p = placeholder(aval, device)
    made.append(p._value[0])
    return p


def _check_carry(new_carry, unflatten_carry, carry_out: list, flat_init: list) -> None:
    """The new carry must have init's structure, shapes and dtypes (the loop carries it)."""
    try:
        same_structure = flatten(new_carry)[1].spec == unflatten_carry.spec
    except Exception:
        same_structure = False
    if not same_structure or len(carry_out) != len(flat_init):
        raise ScanError("scan: fn must return a new carry with the same structure as init (the same nesting)")
    for k, (t, i) in enumerate(zip(carry_out, flat_init)):
        _check_on_device(t, "the new carry")
        if aval_of(t) != aval_of(i):
            raise ScanError(
                f"scan: fn must keep the carry's shapes and dtypes: carry leaf {k} is {tuple(i.shape)} {i.dtype} "
                f"in init but fn returned {tuple(t.shape)} {t.dtype}"
            )


def _check_on_device(t, what: str) -> None:
    if not isinstance(t, torch.Tensor) or not devices.on_device(t):
        got = f"a tensor on {t.device}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise ScanError(f"scan: {what} fn returns must hold lazyxla tensors (or None), got {got}")


def _backward(traced: _Traced, carry_w, x_w, carry_out, ys, device, made: list) -> None:
    """Run PyTorch's autograd over the iteration: gradients of the carries and slices from placeholder
    cotangents of the outputs that require grad."""
    outs = [(k, carry_out[k]) for k in traced.grad_carries if carry_out[k].requires_grad]
    outs += [(None, ys[j]) for j in traced.grad_ys]
    carry_ct = {k: _placeholder(aval_of(carry_out[k]), device, made) for k in traced.grad_carries}
    y_ct = [_placeholder(aval_of(ys[j]), device, made) for j in traced.grad_ys]
    traced.carry_ct = [carry_ct[k]._value[0] for k in traced.grad_carries]
    traced.y_ct = [p._value[0] for p in y_ct]
    inputs = [carry_w[k] for k in traced.grad_carries] + [x_w[k] for k in traced.grad_xs]
    if not outs or not inputs:  # nothing to differentiate: no backward loop
        return
    cotangents = [wrap(carry_ct[k]) for k, _ in outs if k is not None] + [wrap(p) for p in y_ct]
    # PyTorch's own backward of the iteration, without autocast (a loop's backward runs outside it)
    with torch_private.disable_autocast():
        grads = torch.autograd.grad([t for _, t in outs], inputs, cotangents, allow_unused=True, materialize_grads=True)
    traced.grads = [unwrap(g)._value for g in grads]


def _check_no_outside_gradient(outputs: list, ours: set[int]) -> None:
    """A tensor fn reads from outside that requires grad would get no gradient from the loop: refuse it."""
    stack = [t.grad_fn for t in outputs if t.grad_fn is not None]
    seen: dict[int, object] = {}
    while stack:
        f = stack.pop()
        if f is None or id(f) in seen:
            continue
        seen[id(f)] = f
        variable = getattr(f, "variable", None)  # an AccumulateGrad: a leaf tensor that requires grad
        if variable is not None and id(variable) not in ours:
            raise ScanError(
                f"scan: fn uses a tensor from outside that requires grad (shape {tuple(variable.shape)}, "
                f"{variable.dtype}); the loop would give it no gradient. Pass it in xs (stacked, one per "
                "iteration) or in the carry, or detach it if it needs no gradient"
            )
        stack.extend(g for g, _ in f.next_functions)


# ---- cutting the recorded IR into bodies -----------------------------------------------------------------


def _cut(results: list, boundary: Callable) -> tuple[list, list]:
    """The nodes computing ``results`` (post-order) up to the ``boundary`` nodes, and the values of boundary
    nodes they read (first use first; a result that is one counts as read)."""
    order, inputs = [], []
    seen: set = set()
    read: set = set()

    def note(m, i) -> None:
        if (id(m), i) not in read:
            read.add((id(m), i))
            inputs.append((m, i))

    for m, i in results:
        if boundary(m):
            note(m, i)
            continue
        stack = [(m, False)]
        while stack:
            n, expanded = stack.pop()
            if expanded:
                order.append(n)
                continue
            if id(n) in seen:
                continue
            seen.add(id(n))
            stack.append((n, True))
            for p, k in reversed(n.inputs):
                if boundary(p):
                    note(p, k)
                elif id(p) not in seen:
                    stack.append((p, False))
    return order, inputs


def _slot(value):
    """A fresh input leaf of a body standing for ``value`` (a Python scalar and a key keep their kind)."""
    m, i = value
    kind = m.op if m.op is Leaf.SCALAR or m.op is Leaf.RNG else Leaf.DATA
    return leaf(kind, None, m.avals[i], m.device)


def _register(order, inputs: list, results: list, counts, reverse: bool, device: int) -> str:
    """Rebuild a body over fresh leaves for ``inputs`` (values), register it, return its digest."""
    slots = [_slot(v) for v in inputs]
    where = {(id(m), i): s for (m, i), s in zip(inputs, slots)}
    new: dict[int, object] = {}

    def value(m, i):
        s = where.get((id(m), i))
        return (s, 0) if s is not None else (new[id(m)], i)

    body = []
    for n in order:
        if n.op in COLLECTIVE_OPS:
            raise ScanError(f"scan: fn holds a replica collective ({n.op}); collectives cannot run inside a loop body")
        r = rewired(n, tuple(value(m, i) for m, i in n.inputs))
        new[id(n)] = r
        body.append(r)
    outs = [value(m, i) for m, i in results]
    name = digest(body, slots, outs, extra=("scan", device, counts, reverse), size=16)
    scan_rule.register(name, scan_rule.Body(body, slots, outs, counts, reverse))
    return name


def _held(value):
    """What a plan keeps of an outer value: a LazyTensor for a pending one (a sync computes it once), else the
    value (a leaf)."""
    m, i = value
    return value if type(m.op) is Leaf else LazyTensor(value, m.avals[i])


class _Cutter:
    """Sorts the recorded values into bodies: which depend on the iteration, what each body reads."""

    def __init__(self, traced: _Traced, checkpoint: bool) -> None:
        self.checkpoint = checkpoint
        self.roles: dict[int, tuple] = {}
        for k, n in enumerate(traced.carry_in):
            self.roles[id(n)] = ("carry", k)
        for k, n in enumerate(traced.x_in):
            self.roles[id(n)] = ("x", k)
        for k, n in enumerate(traced.carry_ct):
            self.roles[id(n)] = ("ct_carry", k)
        for j, n in enumerate(traced.y_ct):
            self.roles[id(n)] = ("ct", j)
        self.memo: dict[int, bool] = {}
        self.keys: dict[int, int] = {}  # id of a trace's RNG leaf -> its key's number (first use first)

    def varying(self, m) -> bool:
        return reaches(m, lambda n: id(n) in self.roles or n.op is Leaf.RNG, self.memo)

    def key(self, m) -> int:
        return self.keys.setdefault(id(m), len(self.keys))

    def split(self, reads: list, fixed: list) -> tuple[list, list, list]:
        """``reads`` (a cut's inputs) minus the ``fixed`` slots: per-iteration ones, invariants, keys."""
        skip = {(id(m), i) for m, i in fixed}
        per_iteration, invariants, keys = [], [], []
        for m, i in reads:
            if (id(m), i) in skip:
                continue
            if m.op is Leaf.RNG:
                keys.append((m, i))
            elif id(m) in self.roles or self.varying(m):
                per_iteration.append((m, i))
            else:
                invariants.append((m, i))
        return per_iteration, invariants, keys


def trace(fn, unflatten_carry, unflatten_xs, flat_init, flat_xs, need_grad: bool, checkpoint: bool, device: int):
    """Trace ``fn`` for one iteration and register its bodies; returns the :class:`Plan`."""
    state = rng.get_state()
    syncs = metrics.counters()["syncs"]
    made: list = []  # every placeholder leaf: whatever is still alive and reads one is disarmed after
    try:
        # (for the process, not this thread: config.scoped would not reach autograd's thread, which records the
        # iteration's backward)
        with config.override(strict=True):
            traced = _run(fn, unflatten_carry, unflatten_xs, flat_init, flat_xs, need_grad, device, made)
        if metrics.counters()["syncs"] != syncs:
            raise ScanError(
                "scan: fn synced while it was traced (a host read: .item(), .cpu(), print, a "
                "data-dependent shape); a scanned function must stay on the device"
            )
        plan = _plan(traced, checkpoint, device)
    except Exception as e:
        if _reads_placeholder(e):
            raise ScanError(
                "scan: fn needs a value on the host (.item(), .cpu(), print, a data-dependent shape, an op run on "
                "the CPU); a scanned function must stay on the device"
            ) from e
        raise
    finally:
        rng.set_state(state)  # the trace's keys are never used: each call draws its own
        disarm({id(n) for n in made})
    metrics.inc("scan_traces")
    return plan


def _reads_placeholder(e: BaseException) -> bool:
    while e is not None:
        if isinstance(e, Placeholder):
            return True
        e = e.__cause__ or e.__context__
    return False


def _plan(traced: _Traced, checkpoint: bool, device: int) -> Plan:
    cut = _Cutter(traced, checkpoint)
    fwd_results = traced.carry_out + traced.ys
    is_leaf = lambda m: type(m.op) is Leaf  # noqa: E731
    fwd_order, fwd_reads = _cut(fwd_results, lambda m: is_leaf(m) or not cut.varying(m))
    backward, residuals = None, []
    if traced.grads:
        backward, residuals = _backward_loop(cut, traced, {id(n) for n in fwd_order}, device)
    carry_slots = [(n, 0) for n in traced.carry_in]
    x_slots = [(n, 0) for n in traced.x_in]
    _, invariants, keys = cut.split(fwd_reads, carry_slots + x_slots)
    counts = (len(carry_slots), len(x_slots), len(invariants), len(keys))
    name = _register(
        fwd_order, carry_slots + x_slots + invariants + keys, fwd_results + residuals, counts, False, device
    )
    per_iter = [m.avals[i] for m, i in traced.ys + residuals]
    forward = Loop(
        name=name,
        n_carry=len(carry_slots),
        xs=[("x", k) for k in range(len(x_slots))],
        invariants=[_held(v) for v in invariants],
        keys=[cut.key(m) for m, _ in keys],
        carry_avals=tuple(n.avals[0] for n in traced.carry_in),
        stacked_avals=tuple(per_iter),
    )
    return Plan(
        forward=forward,
        backward=backward,
        n_keys=len(cut.keys),
        n_ys=len(traced.ys),
        y_unflatten=traced.y_unflatten,
        grad_carries=traced.grad_carries,
        grad_xs=traced.grad_xs,
        grad_ys=traced.grad_ys,
    )


def _backward_loop(cut: _Cutter, traced: _Traced, forward_nodes: set[int], device: int) -> tuple[Loop, list]:
    """The backward body (reads: cotangents, residuals, slices, invariants, keys) and the residuals, the
    forward values it reads per iteration (the carries fed to each iteration among them)."""
    saved = (lambda m: False) if cut.checkpoint else (lambda m: id(m) in forward_nodes and m.op not in _RECOMPUTED)
    boundary = lambda m: type(m.op) is Leaf or saved(m) or not cut.varying(m)  # noqa: E731
    order, reads = _cut(traced.grads, boundary)
    carry_slots = [(n, 0) for n in traced.carry_ct]
    per_iteration, invariants, keys = cut.split(reads, carry_slots)
    xs, residuals = [], []
    for m, i in per_iteration:
        role = cut.roles.get(id(m))
        if role is not None and role[0] in ("x", "ct"):
            xs.append(role)
        else:  # a forward activation, or the iteration's incoming carry: the forward loop stacks it
            xs.append(("res", len(residuals)))
            residuals.append((m, i))
    counts = (len(carry_slots), len(per_iteration), len(invariants), len(keys))
    name = _register(order, carry_slots + per_iteration + invariants + keys, traced.grads, counts, True, device)
    n_carry = len(carry_slots)
    loop = Loop(
        name=name,
        n_carry=n_carry,
        xs=xs,
        invariants=[_held(v) for v in invariants],
        keys=[cut.key(m) for m, _ in keys],
        carry_avals=tuple(n.avals[0] for n in traced.carry_ct),
        stacked_avals=tuple(m.avals[i] for m, i in traced.grads[n_carry:]),
    )
    return loop, residuals
