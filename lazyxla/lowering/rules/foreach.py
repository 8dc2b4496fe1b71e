"""``_foreach_*`` ops: one node per call, lowered as its element op applied to each tensor.

Why
---
An optimizer step is mostly foreach ops (AdamW: ``_foreach_lerp_``, ``_foreach_addcmul_``, ``_foreach_addcdiv_``,
... over every parameter), and recording each tensor's op as a node of its own costs the recorder a dispatch, a
signature, a node and its hash per tensor: ~70% of the ops a small GPT's AdamW step recorded. Here a functional
foreach call whose element op has a rule is *one* node with one output per tensor (``lazy.decompose.foreach``
records it, its equal Python numbers sharing inputs as before); its lowering builds, per tensor, the node the
element op would have had (same inputs, template and output aval) and lowers that with the element op's own rule,
Python numbers converted as that node converts them (``to_jax.scalar_as``: the group's rule takes them packed,
``registry.PACKED``). The program computes exactly what one node per tensor computes.

Example::

    out = torch._foreach_mul(tensors, 0.5)      # one node ``_foreach_mul.Scalar`` with len(tensors) outputs
"""

from __future__ import annotations

import functools

import torch

from lazyxla.lowering.registry import PACKED, RULES, Rule
from lazyxla.torch_private import all_schemas

aten = torch.ops.aten

# the element op's overloads to try, by the foreach op's overload name
_ELEMENT_OVERLOADS = {
    "Scalar": ("Scalar", "Tensor_Scalar", "default", "Tensor"),
    "ScalarList": ("Scalar", "Tensor_Scalar", "default", "Tensor"),
    "List": ("Tensor", "default", "Tensor_Tensor"),
    "Tensor": ("Tensor", "default", "Tensor_Tensor"),
    "default": ("default",),
    "ScalarAndTensor": ("Scalar",),
}
_FOREACH_CLAMPS = {"maximum": aten.clamp_min.default, "minimum": aten.clamp_max.default}

# foreach op -> its element op, for the ops recorded as one node (``register``)
GROUPS: dict = {}


@functools.cache
def element_op(func):
    """``aten._foreach_x.ov`` -> the per-tensor op ``aten.x.<matching overload>`` (or None).

    Example::

        element_op(aten._foreach_add.List)      # aten.add.Tensor
    """
    name = func._schema.name.split("::")[1][len("_foreach_") :].rstrip("_")
    if name == "norm":
        return aten.linalg_vector_norm.default
    if name in _FOREACH_CLAMPS and func._overloadname in ("Scalar", "ScalarList"):
        return _FOREACH_CLAMPS[name]  # aten.maximum takes no number: a tensor's maximum with one is clamp_min
    packet = getattr(aten, name, None)
    if packet is None:
        return None
    names = [ov for ov in _ELEMENT_OVERLOADS.get(func._overloadname, ()) if ov in packet.overloads()]
    candidates = [getattr(packet, ov) for ov in names]
    # the first whose arguments take one element of each foreach argument: pow.Tensor_Scalar for
    # _foreach_pow.Scalar (pow.Scalar takes the number first), clamp_min.default for _foreach_clamp_min.Scalar
    types = [a.type for a in func._schema.arguments]
    want = [str(t.getElementType() if isinstance(t, torch.ListType) else t) for t in types]
    for op in candidates:
        have = [str(a.type) for a in op._schema.arguments]
        if have[: len(want)] == want:
            return op
    return candidates[0] if candidates else None


def split(func, args, kwargs: dict, lists=(list, tuple)) -> list[tuple[list, dict]]:
    """Per tensor of foreach call ``func(*args, **kwargs)``: the element op's ``(args, kwargs)``, each foreach
    argument matched to the element op's by schema position (a list gives its i-th entry, anything else itself).
    ``lists``: the types that are per-tensor lists (a template holds tuples where the call had lists).

    Example::

        split(aten._foreach_add.Scalar, ([a, b], 2.0), {})    # [([a, 2.0], {}), ([b, 2.0], {})]
    """
    op = element_op(func)
    fnames = [a.name for a in func._schema.arguments]
    bound = list(args) + [kwargs[n] for n in fnames[len(args) :] if n in kwargs]
    if op is aten.linalg_vector_norm.default:  # (self, ord, dtype) -> (self, ord, dim, keepdim, dtype)
        bound = bound[:2] + [None, False] + bound[2:]
    params = op._schema.arguments[: len(bound)]
    count = len(next(b for b in bound if isinstance(b, lists)))
    calls = []
    for i in range(count):
        pos, kw = [], {}
        for p, b in zip(params, bound):
            v = b[i] if isinstance(b, lists) else b
            if p.kwarg_only:
                kw[p.name] = v
            else:
                pos.append(v)
        calls.append((pos, kw))
    return calls


def _grouped(func) -> bool:
    """Whether functional foreach op ``func`` is recorded as one node: its element op has a deterministic rule
    with one tensor output, and it returns a list of tensors."""
    if func._schema.name.endswith("_") or func._schema.is_mutable:
        return False
    op = element_op(func)
    if op is None or op is aten.linalg_vector_norm.default or op not in RULES or RULES[op].random:
        return False
    rets = func._schema.returns
    if len(rets) != 1 or str(rets[0].type) != "List[Tensor]" or len(op._schema.returns) != 1:
        return False
    # a tensor that packs one number per element (``_foreach_addcmul.Tensor``'s ``scalars``, a CPU tensor PyTorch
    # reads on the host) is not the element op's argument: those overloads take the per-tensor path
    pairs = zip(func._schema.arguments, op._schema.arguments)
    return not any(str(f.type) == "Tensor" and str(e.type) != "Tensor" for f, e in pairs)


def _lowered_by_to_jax(ctx, *args, **kwargs):
    raise AssertionError("a foreach group is lowered by to_jax.apply, element by element")


def register() -> None:
    """Give every groupable functional foreach op a rule (its Python numbers packed) and its element op."""
    for schema in all_schemas():
        if not schema.name.startswith("aten::_foreach_"):
            continue
        func = getattr(getattr(aten, schema.name[len("aten::") :]), schema.overload_name or "default")
        if func not in RULES and _grouped(func):
            RULES[func] = Rule(_lowered_by_to_jax, scalars=PACKED)
            GROUPS[func] = element_op(func)
