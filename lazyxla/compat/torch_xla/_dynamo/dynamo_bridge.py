"""``torch_xla._dynamo.dynamo_bridge`` on lazyxla: how ``torch.compile(backend='openxla')`` reaches lazyxla.

PyTorch registers the backends ``openxla`` (AOTAutograd: forward, backward and inference graphs of ATen ops)
and ``openxla_eval`` (Dynamo's graph as it is) itself; both hand each graph, at its first call, to
:func:`extract_compiled_graph` here. So with the compatibility layer installed both names are lazyxla's
``torch.compile`` backend (``lazyxla.dynamo``): an ATen graph becomes one op of the lazy IR
(``lazyxla.dynamo.CompiledGraph``), traced once per input signature; Dynamo's own graph goes through
``lazyxla.dynamo.openxla_backend`` (AOTAutograd there, which also writes the function's in-place updates of its
arguments back). As in torch_xla, a call compiles its graph's program unless the compile cache holds it
(``CompileTime`` has a sample when the first call returns); as with ``backend='lazyxla'``, a call records one op,
whose values are computed at the next sync with the rest of the step (at once in eager mode), where torch_xla runs
the graph at the call.

Example::

    model = torch.compile(model, backend="openxla")
    loss = loss_fn(model(x), y); loss.backward(); opt.step()
    torch_xla.sync()                                # forward, backward and optimizer step: one program
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence

import torch

from lazyxla import torch_private
from lazyxla.dynamo import CompiledGraph, openxla_backend

__all__ = ["extract_compiled_graph"]

_ATEN_OP_TYPES = (torch_private.OpOverload, torch_private.OpOverloadPacket)


def _is_aten_graph(gm: torch.fx.GraphModule) -> bool:
    """Whether ``gm`` calls only ATen operators (AOTAutograd's output), not torch functions or modules."""
    for n in gm.graph.nodes:
        if n.op in ("call_module", "call_method"):
            return False
        if n.op == "call_function" and not (isinstance(n.target, _ATEN_OP_TYPES) or n.target is operator.getitem):
            return False
    return True


def extract_compiled_graph(xla_model: torch.fx.GraphModule, xla_args: Sequence) -> Callable:
    """The function that runs the FX graph ``xla_model`` on lazyxla tensors like ``xla_args`` (the first
    call's arguments), each call recording it as one program piece of the step.

    Example::

        compiled = extract_compiled_graph(torch.fx.symbolic_trace(module), (x, y))
        out = compiled(x, y)
    """
    if _is_aten_graph(xla_model):
        graph = CompiledGraph(xla_model, "openxla", compile_at_call=True)
        return lambda *args: graph(*args)
    gm, single = _with_tuple_output(xla_model)
    compiled = openxla_backend(gm, list(xla_args))
    return (lambda *args: compiled(*args)[0]) if single else compiled


def _with_tuple_output(gm: torch.fx.GraphModule) -> tuple[torch.fx.GraphModule, bool]:
    """``gm``, or a graph module sharing its modules and parameters whose output is ``gm``'s in a 1-tuple (what
    AOTAutograd takes: a module traced by ``torch.fx.symbolic_trace`` may return one tensor); and whether it
    was wrapped."""
    output = next(n for n in gm.graph.nodes if n.op == "output")
    if isinstance(output.args[0], (tuple, list)):
        return gm, False
    graph = torch.fx.Graph()
    graph.output((graph.graph_copy(gm.graph, {}),))
    return torch.fx.GraphModule(gm, graph), True
