"""Graph -> jax function: interpret the nodes in post-order with the rule table, inside ``jax.jit``."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import torch

from lazyxla.device import devices
from lazyxla.device.devices import np_dtype
from lazyxla.ir import Aval, In, Leaf, Node, slot
from lazyxla.lowering.registry import PACKED, RULES, Ctx
from lazyxla.lowering.rules.foreach import GROUPS, split


class LoweringError(RuntimeError):
    pass


def _subst(x, ins):
    if type(x) is tuple:
        return tuple(_subst(e, ins) for e in x)
    if type(x) is In:
        return ins[x.i]
    return x


def _relist(x):
    # templates store lists as tuples; rules receive lists where PyTorch passes lists
    return list(x) if type(x) is tuple else x


def _scalar_dtype(n: Node, integer: bool = False):
    """Dtype for Python scalars (graph inputs) used by node ``n``, as PyTorch converts them.

    The first floating tensor input's dtype, or the output's when that is a wider float
    (``full_like(half, v, dtype=torch.float64)`` keeps v's float64 digits); with no floating input, an
    integer output's dtype (PyTorch truncates the scalar: ``int_tensor.fill_(2.7)`` fills 2), else the
    default float dtype. A Python int (``integer``) in an op computed in integers takes the integer
    tensors' dtype instead, wrapping as PyTorch's casts do (``uint8_tensor < 300`` compares with 44), or
    int64 (``bool_tensor == 5``). A rule may ask for its own (``Rule.scalars``).
    """
    if n.op in GROUPS:
        return _group_scalar_dtype(n, integer)
    wanted = RULES[n.op].scalars
    if wanted is not None:
        if wanted is PACKED:
            return np.int64 if integer else np.float64
        return wanted
    if not integer and RULES[n.op].opmath == "float32" and _opmath(n):
        return np.dtype(np.float32)
    out = n.avals[0].dtype if n.avals else torch.bool
    ints = []
    for m, i in n.inputs:
        if m.op is not Leaf.SCALAR and m.op is not Leaf.RNG:
            dt = m.avals[i].dtype
            if dt.is_floating_point or dt.is_complex:
                if (out.is_floating_point or out.is_complex) and out.itemsize > dt.itemsize:
                    return np_dtype(out)
                return np_dtype(dt)
            if dt != torch.bool:
                ints.append(dt)
    if out != torch.bool:
        return np_dtype(out)
    if not integer:
        return np_dtype(torch.get_default_dtype())
    return np_dtype(functools.reduce(torch.promote_types, ints, torch.int64 if not ints else ints[0]))


_HALF = (torch.bfloat16, torch.float16)


def _opmath(n: Node) -> bool:
    """Whether ``n`` computes in float32, as PyTorch's CPU kernel does: a half-precision op whose rule is marked
    ``opmath`` (``registry.opmath_scalars``) with a Python float operand."""
    return (
        RULES[n.op].opmath
        and bool(n.avals)
        and n.avals[0].dtype in _HALF
        and any(m.op is Leaf.SCALAR and not _is_int(m) for m, _ in n.inputs)
    )


_F32_HALF = {torch.bfloat16: torch.float32, torch.float16: torch.float32}
_HALF_NP = (np_dtype(torch.bfloat16), np_dtype(torch.float16))


def _is_int(m: Node) -> bool:
    """Whether a scalar leaf holds a Python int (packed as int64) rather than a float."""
    return m.avals[0].dtype == torch.int64


def scalar_constant(n: Node, m: Node):
    """The value of scalar leaf ``m`` as a constant of node ``n``'s computation (a trace that bakes its scalars
    in): in ``_scalar_dtype``, an int wrapping around as PyTorch's casts do."""
    if _is_int(m):
        return jax.lax.convert_element_type(np.int64(m.payload), _scalar_dtype(n, True))
    return jnp.asarray(m.payload, _scalar_dtype(n))


def scalar_as(n: Node, m: Node, value):
    """Scalar leaf ``m``'s value, an array packed as float64 (or int64 for an int), as node ``n`` takes it: in
    ``_scalar_dtype(n)``, an int wrapping around as PyTorch's casts do (inside a loop's body, whose rule
    receives its scalars packed: ``registry.PACKED``)."""
    return jax.lax.convert_element_type(value, _scalar_dtype(n, _is_int(m)))


def evaluate(order: list[Node], env: dict, scalar, axis: str | None = None, world: int = 1) -> dict:
    """Lower the nodes of ``order`` (post-order) into ``env`` (``id(node)`` -> its output arrays), which
    holds the leaves' arrays on entry; ``scalar(n, m)`` gives scalar leaf ``m``'s value as node ``n``
    takes it. Returns ``env``.

    Example::

        env = {id(x): (x_array,)}
        evaluate(order, env, scalar_constant)[id(order[-1])][0]     # the last node's first output
    """
    for n in order:
        ins = [scalar(n, m) if m.op is Leaf.SCALAR else env[id(m)][i] for m, i in n.inputs]
        env[id(n)] = apply(n, ins, axis, world)
    return env


def apply(n: Node, ins: list, axis: str | None = None, world: int = 1):
    """Lower one node given its input arrays (Python scalars already in ``_scalar_dtype(n)``); returns
    the list of its output arrays."""
    element = GROUPS.get(n.op)
    if element is not None:
        return _apply_group(n, element, ins, axis, world)
    rule = RULES[n.op]
    ctx = Ctx(n.avals, axis=axis, world=world)
    if rule.opmath and _opmath(n):  # the rule computes in float32; the result is rounded once, below
        ctx = Ctx(tuple(Aval(a.shape, _F32_HALF.get(a.dtype, a.dtype)) for a in n.avals), axis=axis, world=world)
        ins = [x.astype(np.float32) if getattr(x, "dtype", None) in _HALF_NP else x for x in ins]
    if rule.random:
        ctx.key = jax.random.wrap_key_data(ins[-1], impl="threefry2x32")
        ins = ins[:-1]
    targs, tkw = n.template
    args = [_relist(a) for a in _subst(targs, ins)]
    kwargs = {k: _relist(v) for k, v in _subst(tkw, ins)}
    try:
        out = rule.fn(ctx, *args, **kwargs)
    except Exception as e:
        raise LoweringError(_failed(n, e)) from e
    outs = [o for o in out if o is not None] if isinstance(out, (tuple, list)) else [out]
    if len(outs) != len(n.avals):
        raise LoweringError(f"the rule for {n.op} returned {len(outs)} outputs; PyTorch's op has {len(n.avals)}")
    result = []
    for o, aval in zip(outs, n.avals):
        if tuple(o.shape) != aval.shape:
            raise LoweringError(
                f"the rule for {n.op} produced shape {tuple(o.shape)}; PyTorch's meta kernel says {aval.shape}"
            )
        want = np_dtype(aval.dtype)
        result.append(o if o.dtype == want else o.astype(want))
    return result


def _apply_group(n: Node, element, ins: list, axis: str | None, world: int) -> list:
    """A foreach group (``rules/foreach.py``): per tensor, the node its element op would have had (the group's
    inputs that element reads, its template renumbered, its output aval), lowered with the element's rule; the
    group's Python numbers arrive as ``_scalar_dtype(n)`` gives them and are converted as that node converts them
    (once per number and dtype)."""
    outs = []
    converted: dict = {}  # (input position, dtype) -> that number in that dtype: one conversion, shared by elements
    for one, used in _elements(n, element):
        one_ins = [
            _number(one, m, ins[g], g, converted) if m.op is Leaf.SCALAR else ins[g]
            for g, (m, _) in zip(used, one.inputs)
        ]
        outs.extend(apply(one, one_ins, axis, world))
    return outs


def _elements(n: Node, element) -> list[tuple[Node, list[int]]]:
    """Group ``n``'s element nodes, each with the positions of the group's inputs it reads."""
    targs, tkw = n.template
    found = []
    for i, (pos, kw) in enumerate(split(n.op, targs, dict(tkw), lists=(tuple,))):
        used = sorted({x.i for x in _slots((pos, kw))})
        local = {g: j for j, g in enumerate(used)}
        template = (tuple(_renumber(a, local) for a in pos), tuple((k, _renumber(kw[k], local)) for k in sorted(kw)))
        one = Node(element, tuple(n.inputs[g] for g in used), template, (n.avals[i],), 0, None, n.device)
        found.append((one, used))
    return found


def _group_scalar_dtype(n: Node, integer: bool):
    """The dtype a group's numbers arrive in: the one every element converts them to when they agree (no
    conversion then), else packed (float64 / int64), each element converting its own."""
    wanted = {np.dtype(_scalar_dtype(one, integer)) for one, _ in _elements(n, GROUPS[n.op])}
    if len(wanted) == 1:
        return wanted.pop()
    return np.int64 if integer else np.float64


def _number(one: Node, m: Node, value, g: int, converted: dict):
    dtype = _scalar_dtype(one, _is_int(m))
    key = (g, np.dtype(dtype))
    if key not in converted:
        converted[key] = jax.lax.convert_element_type(value, dtype)  # as ``scalar_as``
    return converted[key]


def _slots(x):
    if type(x) is In:
        yield x
    elif isinstance(x, (tuple, list)):
        for e in x:
            yield from _slots(e)
    elif isinstance(x, dict):
        for e in x.values():
            yield from _slots(e)


def _renumber(x, local: dict):
    if type(x) is In:
        return slot(local[x.i])
    if type(x) is tuple:
        return tuple(_renumber(e, local) for e in x)
    return x


def _failed(n: Node, e: Exception) -> str:
    """What a rule's failure tells the user: the op, its inputs, where it was recorded, what still works."""
    ins = ", ".join(
        "scalar" if m.op is Leaf.SCALAR else f"{str(m.avals[i].dtype)[6:]}{list(m.avals[i].shape)}" for m, i in n.inputs
    )
    where = (
        f"recorded at {n.source}"
        if n.source
        else "set lazyxla.config.explain_recompiles = True (LAZYXLA_EXPLAIN_RECOMPILES=1) to see the line that "
        "recorded it"
    )
    return (
        f"lowering {n.op} on ({ins}) failed: {type(e).__name__}: {e} ({where}). Nothing ran and every tensor "
        "keeps its value: the tensors computed from this op raise this error when read; drop them (del) and the "
        "next sync runs the rest"
    )


def traces(n: Node) -> bool:
    """Whether ``n``'s rule lowers for its inputs' avals (``jax.eval_shape``: nothing is compiled or run).

    Example: a ``bitwise_and`` node on float32 inputs gives False (jax's ``and`` takes no floats).
    """
    structs = []
    for m, i in n.inputs:
        if m.op is Leaf.SCALAR:
            structs.append(jax.ShapeDtypeStruct((), _scalar_dtype(n, _is_int(m))))
        else:
            aval = m.avals[i]
            structs.append(jax.ShapeDtypeStruct(aval.shape, np_dtype(aval.dtype)))
    if RULES[n.op].random:
        structs.append(jax.ShapeDtypeStruct((2,), np.uint32))
    try:
        with devices.x64():
            jax.eval_shape(lambda *ins: apply(n, list(ins)), *structs)
    except Exception:
        return False
    return True


class ArgLayout:
    """How a program's arguments carry a graph's leaves.

    Device data is one argument per leaf, in leaf order; the Python scalars (often hundreds per step:
    an optimizer's hyperparameters for every tensor) travel packed, floats in one float64 vector and ints in
    one int64 vector (a float64 holds every int64 only up to 2**53), and the RNG keys in one ``(n, 2)`` uint32
    array, so a step makes at most three host transfers for them, not hundreds.
    """

    __slots__ = ("data", "scalars", "ints", "keys")

    def __init__(self, leaves: list[Node]) -> None:
        self.data = [i for i, n in enumerate(leaves) if n.op is not Leaf.SCALAR and n.op is not Leaf.RNG]
        self.scalars = [i for i, n in enumerate(leaves) if n.op is Leaf.SCALAR and not _is_int(n)]
        self.ints = [i for i, n in enumerate(leaves) if n.op is Leaf.SCALAR and _is_int(n)]
        self.keys = [i for i, n in enumerate(leaves) if n.op is Leaf.RNG]

    def _vectors(self) -> list[tuple[list[int], type]]:
        """The packed Python-scalar vectors the program takes, in order: (leaf indices, dtype)."""
        return [(idx, dt) for idx, dt in ((self.scalars, np.float64), (self.ints, np.int64)) if idx]

    def specs(self, leaves: list[Node], sharding, data_shardings: list | None = None) -> list:
        """The program's argument shapes and dtypes, laid out as ``sharding`` (the data leaves as
        ``data_shardings`` when given)."""
        data_shardings = data_shardings or [sharding] * len(self.data)
        out = [
            jax.ShapeDtypeStruct(leaves[i].avals[0].shape, np_dtype(leaves[i].avals[0].dtype), sharding=s)
            for i, s in zip(self.data, data_shardings)
        ]
        out += [jax.ShapeDtypeStruct((len(idx),), dt, sharding=sharding) for idx, dt in self._vectors()]
        if self.keys:
            out.append(jax.ShapeDtypeStruct((len(self.keys), 2), np.uint32, sharding=sharding))
        return out

    def packed_scalars(self, leaves: list[Node]) -> list[np.ndarray]:
        """The Python-scalar arguments: the float64 vector, then the int64 one (each only if used)."""
        return [np.array([leaves[i].payload for i in idx], dt) for idx, dt in self._vectors()]

    def arguments(self, data: list, leaves: list[Node]) -> list:
        """The program's arguments: ``data`` (the data leaves' arrays, in order) and the packed rest."""
        out = list(data) + self.packed_scalars(leaves)
        if self.keys:
            out.append(np.stack([leaves[i].payload for i in self.keys]))
        return out

    def describe(self, k: int) -> str:
        """What packed argument ``k`` (counted after the data leaves) carries, for error messages."""
        names = [f"Python {'ints' if dt is np.int64 else 'floats'}" for _, dt in self._vectors()]
        names += ["RNG keys"] if self.keys else []
        return names[k - len(self.data)]

    def positions(self, leaf_indices) -> tuple[int, ...]:
        """Argument positions of data leaves given by their leaf indices."""
        where = {i: k for k, i in enumerate(self.data)}
        return tuple(where[i] for i in leaf_indices)


def graph_fn(order: list[Node], leaves: list[Node], roots: list[tuple], layout: ArgLayout, axis=None, world=1):
    """A function of the program's arguments (see ``ArgLayout``) returning the roots' arrays.

    ``axis``/``world``: the replica mesh axis and its size when the function runs inside ``shard_map``
    over the run's replicas (collectives lower to XLA collectives over it).
    """

    def fn(*args):
        env = {id(leaves[i]): (a,) for i, a in zip(layout.data, args)}
        rest = len(layout.data)
        scalars = _Scalars()
        for idx, _ in layout._vectors():
            scalars.add(args[rest], [leaves[i] for i in idx])
            rest += 1
            for i in idx:
                env[id(leaves[i])] = None  # read through ``scalars``, in the dtype of the op that uses it
        if layout.keys:
            keys = args[rest]
            for k, i in enumerate(layout.keys):
                env[id(leaves[i])] = (keys[k],)
        for n in order:
            if any(m.op is Leaf.SCALAR for m, _ in n.inputs):
                ins = [
                    scalars.get(m, _scalar_dtype(n, _is_int(m))) if m.op is Leaf.SCALAR else env[id(m)][i]
                    for m, i in n.inputs
                ]
            else:
                ins = [env[id(m)][i] for m, i in n.inputs]
            env[id(n)] = apply(n, ins, axis, world)
        return tuple(
            scalars.get(m, np_dtype(m.avals[0].dtype)) if env[id(m)] is None else env[id(m)][i] for m, i in roots
        )

    return fn


class _Scalars:
    """The packed Python scalars inside a traced program: each vector converted once per dtype and split once
    (two XLA ops per dtype instead of a slice, a reshape and a convert per scalar use)."""

    __slots__ = ("vectors", "where", "pieces")

    def __init__(self) -> None:
        self.vectors: list = []
        self.where: dict[int, tuple[int, int]] = {}  # id(scalar leaf) -> (its vector, its position there)
        self.pieces: dict = {}

    def add(self, vector, leaves: list[Node]) -> None:
        v = len(self.vectors)
        self.vectors.append(vector)
        for k, n in enumerate(leaves):
            self.where[id(n)] = (v, k)

    def get(self, leaf: Node, dtype):
        v, k = self.where[id(leaf)]
        pieces = self.pieces.get((v, dtype))
        if pieces is None:
            vector = self.vectors[v]
            parts = jax.lax.split(jax.lax.convert_element_type(vector, dtype), [1] * vector.shape[0])
            pieces = self.pieces[(v, dtype)] = [jax.lax.reshape(p, ()) for p in parts]
        return pieces[k]
