"""``torch.compile(model, backend="lazyxla")``: Dynamo graphs as single ops of lazyxla's lazy IR.

Example::

    model = GPT().to(lazyxla.device())
    step = torch.compile(lambda x, y: loss_fn(model(x), y), backend="lazyxla")
    loss = step(x, y); loss.backward(); opt.step(); opt.zero_grad()
    lazyxla.sync()                  # forward, backward and the optimizer step: one XLA program

Design
------
Dynamo captures graphs of the user's code; AOTAutograd turns each into functional ATen graphs: one for
inference, or a forward and a backward for training. Its decompositions are the core-ATen ones of ops
that have no lowering rule (what lazy mode would decompose). Each FX graph becomes a
:class:`CompiledGraph`, the function AOTAutograd calls at run time with lazyxla tensors
(functionalization wrappers around ``LazyTensor`` objects).

The first call for an input signature (the tensors' shapes and dtypes, the numbers' values) *traces*
the FX graph through lazy mode itself: it runs on placeholder tensors, so every ATen op goes through
the recorder (the same special cases, meta kernels, decompositions and rule table as lazy mode), and
the IR it records, from the placeholders to the outputs, is registered with the op's lowering rule
(``lazyxla/lowering/rules/compiled_graph.py``), which interprets those nodes with
:func:`lazyxla.lowering.to_jax.apply` inside one ``jax.jit``.

Every call (the first included) then records ONE node: the op ``torch.ops.lazyxla.compiled_graph(inputs,
digest)``, whose inputs are the call's tensors, the trace's constant device arrays and one fresh RNG key
per random op, and whose outputs are the graph's results (an output that is an input is returned as
that input). Its lowering rule calls the trace's jitted function, so at ``lazyxla.sync()`` the forward,
the backward, the optimizer step (lazy mode, outside the compiled function) and all else pending still
become one XLA program, cached by graph key like any lazy step. The op's constant argument is the traced IR's
``ir.digest`` (ops, constant arguments, shapes, wiring; its scalars baked in, its inputs by number), the
same in every process, so the node hashes, and the in-memory and disk compile caches, hit from the third step on. A
call records no ATen op (``ops_recorded`` does not move); it counts ``dynamo_calls``.

The optimizer step: ``torch.compile(opt.step, backend="lazyxla")``, or a whole step function (Dynamo breaks the
graph at ``loss.backward()`` and ``opt.zero_grad()``; each piece is one node). Dynamo traces the foreach
implementation into an inference graph; PyTorch marks fused steps ``torch.compiler.disable``, so those run in lazy
mode (one node for the update, one ``add`` per step counter). When Dynamo starts tracing an optimizer over lazyxla
parameters (``torch_private.before_dynamo_traces_optimizer``), the optimizer is made ``capturable`` (Dynamo does so
for CUDA only): its step counters become device tensors, else each call would write them back to the CPU, a host
read per parameter. A learning rate an LR scheduler drives (Adam, AdamW, SGD) becomes a 0-d device tensor the
scheduler fills in place, as PyTorch advises for compiled optimizers: Dynamo bakes a Python float lr into the graph
(``alpha=-lr`` specializes it) and would recompile for every value, up to its recompile limit (8), then run the step
in lazy mode. A float lr the user assigns every step (``group["lr"] = f(step)``) still recompiles per value: assign
into the tensor instead (``group["lr"].fill_(f(step))``) or pass ``lr=torch.tensor(...)``. Inference graphs keep
their input writes (``keep_inference_input_mutations``): the trace turns each ``copy_`` into its input into an
output, and a call gives those inputs their new values by three C calls each (functionalization's replace, commit,
sync: views see them) instead of AOTAutograd's epilogue of one dispatched ``copy_`` per written tensor (an AdamW step
writes four per parameter); a written input that is not a lazyxla tensor is copied into.

Inputs: Python floats inside a graph are its constants (Dynamo specializes on them) and are baked into
the trace; a float Dynamo passes as a 0-d CPU tensor goes to the device each call, as lazy mode takes
0-d CPU tensors. Graphs with symbolic sizes (after a shape change Dynamo recompiles with dynamic
shapes) are traced per concrete shape, up to ``_MAX_SIGNATURES`` per graph. Random ops draw from the
same stream as lazy mode (``torch.manual_seed``): a new key per random op per call.

Collectives: ``lazyxla.all_reduce`` & co. (and torch_xla's ``xm.all_reduce`` & co. through the compatibility
layer) are registered with :func:`allow_in_graph`, so a compiled function calls them without a graph break
(``fullgraph=True`` holds): Dynamo puts each call in its graph, AOTAutograd traces it into its
``torch.ops.lazyxla`` collective op, and a graph holding one is recorded as ``compiled_graph_collective``,
whose program spans the run's replicas (``lowering/replica.py``) with the collectives inside, as in lazy mode.

Compiling at the call (``openxla_backend``: torch_xla's ``openxla`` and ``openxla_eval`` backends only): torch_xla
compiles a graph when Dynamo first calls it, so its users read ``CompileTime`` right after that call. Graphs made
through ``openxla_backend`` record their node as above and then build the program of that node alone, its inputs as
parameters (``lazy.graph.prepare``), unless the compile cache holds it; nothing runs until the sync. When the inputs
hold device data (inference on a model's parameters and a batch) that is the very program a read of the results
runs, so the read compiles nothing more; in a training step (the backward graph takes the forward's pending outputs,
the optimizer follows) the sync still runs one fused program, a different one, so the first step compiles the forward
and backward graphs once more on their own (later steps hit the cache; torch_xla compiles them once each, and runs
them as separate programs). ``backend="lazyxla"`` does not compile at the call: its first step builds only the fused
program, with no compile a run never uses.

Fallback: a graph that cannot be one op runs op by op in lazy mode instead (the FX graph module called
on the lazyxla tensors; warned once per graph, counted as ``dynamo_op_by_op_calls``): an op with no
rule and no decomposition (lazy mode runs it on the CPU), a host read, tensors off the device. Graph breaks
are Dynamo's: the code between graphs runs eagerly, that is in lazy mode. Tensors a failed trace leaves
alive are made error leaves, which syncs skip.

PyTorch integration (private APIs, from ``lazyxla.torch_private``): lazyxla tensors are fakified as
XLA's are (``_install_fakification``), and lazyxla's and jax's files are in Dynamo's skip list, since the
code run eagerly at a graph break calls lazyxla's Python recorder and Dynamo must not trace it.
``torch.compile``'s default backend (Inductor, which has no code generator for this device) is wrapped so that a
graph with lazyxla inputs raises an error naming ``backend="lazyxla"`` before Inductor starts.
``register()`` puts the backend in Dynamo's registry and the skip list, at once if ``torch._dynamo`` is
loaded, else when it is (importing it costs ~1 s that lazy-mode programs do not pay). Installed packages
also name the backend in the ``torch_dynamo_backends`` entry-point group (pyproject.toml).
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable
from typing import Any

import torch

from lazyxla import torch_private
from lazyxla.config import config
from lazyxla.device import devices
from lazyxla.device.devices import on_device
from lazyxla.ir import IN, Leaf, canonical, digest, node, op_hash
from lazyxla.lazy import eager, rng
from lazyxla.lazy.graph import plan_values, prepare
from lazyxla.lazy.placeholders import disarm, placeholder
from lazyxla.lazy.record import status_of
from lazyxla.lazy.special import SPECIAL_OPS, cpu_to_lazy
from lazyxla.lazy.step_world import make_compilable
from lazyxla.lazy.tensor import LazyTensor, unwrap, wrap
from lazyxla.lowering.registry import RULES
from lazyxla.lowering.rules import compiled_graph
from lazyxla.lowering.rules.compiled_graph import OP, OP_COLLECTIVE
from lazyxla.observe import diagnostics, metrics
from lazyxla.ops import COLLECTIVE_OPS
from lazyxla.util import after_import, warn_once

BACKEND = "lazyxla"  # the backend's name in torch.compile (the device may be named "xla": devices.torch_name)

# ---- fakification of lazyxla tensors --------------------------------------------------------------------


def _install_fakification() -> None:
    """Describe lazyxla tensors to PyTorch's fake-tensor converter as XLA tensors are: by their own
    metadata, not as a functional wrapper around an inner tensor (checked on the torch versions
    ``torch_private`` accepts).

    PyTorch's ``MetaConverter`` builds a fake functional tensor for a functional tensor of any device
    type but ``xla`` and ``lazy``, mirroring its autograd metadata; for a parameter (a leaf that
    requires grad) the mirror is not a leaf and Dynamo fails with ``AssertionError: True != False``.
    """
    describer = torch_private.MetaTensorDescriber
    original = describer.describe_tensor
    if getattr(original, "_lazyxla", False):
        return

    is_functional = torch_private.is_functional

    def not_functional_here(t) -> bool:
        return is_functional(t) and not on_device(t)

    @functools.wraps(original)
    def describe_tensor(self, t, *, recurse=True, trace=False):
        if not on_device(t) or not is_functional(t):
            return original(self, t, recurse=recurse, trace=trace)
        # described by its own metadata (views included: their base is described the same way)
        with torch_private.is_functional_replaced(not_functional_here):
            return original(self, t, recurse=recurse, trace=trace)

    describe_tensor._lazyxla = True
    describer.describe_tensor = describe_tensor


# ---- tracing an FX graph into lazy IR -----------------------------------------------------------------


class _NotOneOp(Exception):
    """This graph (for these inputs) cannot become one IR op; it runs op by op. The message says why."""


@dataclasses.dataclass
class _Trace:
    """An FX graph traced for one input signature, as its calls record it (its IR is registered with the
    op's rule, ``rules.compiled_graph``, under ``digest``)."""

    digest: str  # stable name of the traced IR: the op's constant argument, part of the node hash
    used: tuple[int, ...]  # graph inputs the outputs depend on (positions in the call's arguments)
    consts: list  # LazyTensors holding the constant device arrays the graph reads (kept: never donated)
    n_keys: int  # random ops: one fresh key each per call
    outputs: list  # per graph output: ("result", k) | ("input", i) | ("const", value)
    mutated: tuple[int, ...]  # graph inputs it writes in place (copy_): the last len(mutated) outputs are their values
    avals: tuple  # the op's output avals
    device: int
    op: Any = OP  # OP_COLLECTIVE when the graph holds replica collectives

    def __post_init__(self) -> None:
        n = len(self.used) + len(self.consts) + self.n_keys
        self.template = ((tuple(IN[:n]), self.digest), ())
        self.base = op_hash(self.op, canonical(self.template), self.device)  # the node hash's op part


def _leaf_kind(n, placeholders: dict[int, int]) -> str:
    if id(n) in placeholders:
        return "input"
    if n.op is Leaf.SCALAR:
        return "scalar"
    if n.op is Leaf.RNG:
        return "key"
    if n.op is Leaf.DATA and n.payload is not None:
        return "const"
    raise _NotOneOp(f"the graph reads a value that is not computed ({n!r})")


def _mutated(args: list, holders: list) -> list[tuple[int, torch.Tensor]]:
    """The graph inputs the trace wrote in place (an inference graph's ``copy_`` into its input: AOTAutograd's
    ``keep_inference_input_mutations``), with the tensor holding each one's new value."""
    mutated = []
    for i, (a, h) in enumerate(zip(args, holders)):
        if type(h) is LazyTensor:
            torch_private.functional_sync(a)
            inner = torch_private.from_functional(a)
            if inner._value != h._value:
                mutated.append((i, wrap(LazyTensor(inner._value, inner._aval))))
    return mutated


def _run_on_placeholders(gm, holders: list, placeholders: dict[int, int]) -> tuple[list, list, tuple]:
    """The graph's outputs (("value", k) | ("input", i) | ("const", x)), then the new values of the inputs it
    wrote in place; the IR values it computed; the positions of those inputs."""
    syncs = metrics.counters()["syncs"]
    args = [wrap(h) if type(h) is LazyTensor else h for h in holders]
    try:
        # (autocast off: the graph holds the casts autocast made when it was captured)
        with config.scoped(strict=True, eager=False), torch.no_grad(), torch_private.disable_autocast():
            out = gm(*args)
            mutated = _mutated(args, holders)
    except Exception as e:
        raise _NotOneOp(f"tracing it failed with {type(e).__name__}: {e}") from None
    if metrics.counters()["syncs"] != syncs:
        raise _NotOneOp("tracing it synced (a host read or a CPU fallback)")
    outputs: list = []
    values: list = []
    out = list(out) if isinstance(out, (list, tuple)) else [out]
    for o in out + [t for _, t in mutated]:
        if not isinstance(o, torch.Tensor):
            outputs.append(("const", o))
            continue
        if not on_device(o):
            raise _NotOneOp(f"an output is on {o.device}")
        value = unwrap(o)._value
        if id(value[0]) in placeholders:
            outputs.append(("input", placeholders[id(value[0])]))
        else:
            outputs.append(("value", len(values)))
            values.append(value)
    return outputs, values, tuple(i for i, _ in mutated)


def _trace(gm: torch.fx.GraphModule, lazies: list, device: int) -> _Trace:
    """Run ``gm`` on placeholder lazyxla tensors shaped like ``lazies`` (numbers as they are) and keep
    the IR it records."""
    holders = [placeholder(t._aval, device) if type(t) is LazyTensor else t for t in lazies]
    placeholders = {id(h._value[0]): i for i, h in enumerate(holders) if type(h) is LazyTensor}
    state = rng.get_state()
    try:
        outputs, values, mutated = _run_on_placeholders(gm, holders, placeholders)
    finally:
        rng.set_state(state)  # the trace's keys are never used: calls draw their own
        disarm(placeholders)
    results, order, leaves, _ = plan_values(values)
    kinds = [_leaf_kind(n, placeholders) for n in leaves]
    # the op's inputs: the used graph inputs, the constants, the keys (scalars are baked in)
    arg_leaves = [n for n, k in zip(leaves, kinds) if k == "input"]
    arg_leaves += [n for n, k in zip(leaves, kinds) if k == "const"]
    arg_leaves += [n for n, k in zip(leaves, kinds) if k == "key"]
    arg_leaves += [n for n, k in zip(leaves, kinds) if k == "scalar"]
    position = {(id(m), i): k for k, (m, i) in enumerate(results)}
    outputs = [("result", position[(id(values[x][0]), values[x][1])]) if w == "value" else (w, x) for w, x in outputs]
    # named by what the trace bakes in: its scalars' values, which leaf is which graph input, the device
    name = digest(order, arg_leaves, results, extra=(device,), baked_scalars=True, inputs=placeholders, size=16)
    compiled_graph.register(name, order, arg_leaves, results)
    return _Trace(
        digest=name,
        used=tuple(placeholders[id(n)] for n, k in zip(leaves, kinds) if k == "input"),
        consts=[LazyTensor((n, 0), n.avals[0]) for n, k in zip(leaves, kinds) if k == "const"],
        n_keys=kinds.count("key"),
        outputs=outputs,
        mutated=mutated,
        avals=tuple(m.avals[i] for m, i in results),
        device=device,
        op=OP_COLLECTIVE if any(n.op in COLLECTIVE_OPS for n in order) else OP,
    )


# ---- the function AOTAutograd calls ---------------------------------------------------------------------


_NUMBERS = (int, float, bool)
_NOT_AN_INPUT = object()


def _lazy_input(t):
    """The LazyTensor inside a lazyxla tensor argument; a 0-d CPU tensor or a Python number as it is;
    else ``_NOT_AN_INPUT``."""
    if type(t) is LazyTensor or type(t) in _NUMBERS:
        return t
    if isinstance(t, torch.Tensor):
        if on_device(t) and torch_private.is_functional(t):
            torch_private.functional_sync(t)
            inner = torch_private.from_functional(t)
            if type(inner) is LazyTensor:
                return inner
        elif t.device.type == "cpu" and t.dim() == 0 and not torch_private.is_functional(t):
            return t
    return _NOT_AN_INPUT


_MAX_SIGNATURES = 64  # traces per graph; more input signatures run op by op (shapes that never settle)


class CompiledGraph:
    """An AOTAutograd FX graph (forward, backward or inference) as a lazyxla op.

    Called with the graph's inputs (a list: AOTAutograd's boxed calling convention), it records one
    ``lazyxla.compiled_graph`` node and returns lazyxla tensors of its outputs, pending until the next
    ``lazyxla.sync()``. The first call for an input signature traces the graph (see the module doc).

    ``compile_at_call`` (the ``openxla`` backends): a call also builds the program of its node alone, unless the
    compile cache holds it (see the module doc, "Compiling at the call").

    Example::

        compiled = CompiledGraph(gm, "forward")          # what the backend hands AOTAutograd
        outs = compiled([x, w])                          # one IR node; values at lazyxla.sync()
    """

    def __init__(self, gm: torch.fx.GraphModule, kind: str, compile_at_call: bool = False) -> None:
        # an instance attribute: Dynamo's ``disable`` wrapper copies ``__dict__`` (not class attributes)
        self._boxed_call = True
        self.gm = gm
        self.kind = kind
        self.compile_at_call = compile_at_call
        self.traces: dict[tuple, _Trace | str] = {}  # input signature -> trace, or why it runs op by op
        self.why_op_by_op = self._static_reason(gm)
        self.warned = False

    @staticmethod
    def _static_reason(gm: torch.fx.GraphModule) -> str | None:
        """Why ``gm`` cannot be one op whatever its inputs, or None. (0-d CPU tensors are allowed inside:
        Dynamo passes a Python float that changes between calls as one, and lazy mode takes them. Symbolic
        sizes too: each call's concrete sizes are part of its signature, so a dynamic graph is traced per
        shape, as lazy mode records per shape.)"""
        for n in gm.graph.nodes:
            val = n.meta.get("val")
            vals = val if isinstance(val, (list, tuple)) else [val]
            for v in vals:
                if isinstance(v, torch.Tensor) and not on_device(v) and (v.dim() or n.op == "output"):
                    return f"{n.format_node()} makes a tensor on {v.device}"
            if (
                n.op == "call_function"
                and isinstance(n.target, torch_private.OpOverload)
                and status_of(n.target) == "fallback"
            ):
                return f"{n.target} has no lowering rule nor decomposition (lazy mode runs it on the CPU)"
        return None

    def __call__(self, *args) -> list:
        # boxed (one list: AOTAutograd's convention) or, through Dynamo's ``disable`` wrapper, unboxed
        args = list(args[0]) if len(args) == 1 and type(args[0]) is list else list(args)
        if self.why_op_by_op is not None:
            return self._op_by_op(args, self.why_op_by_op)
        lazies = [_lazy_input(a) for a in args]
        device = next((t._value[0].device for t in lazies if type(t) is LazyTensor), None)
        if device is None or any(t is _NOT_AN_INPUT for t in lazies):
            return self._op_by_op(args, "an input is not a lazyxla tensor (nor a 0-d CPU tensor or a number)")
        sig = [device]
        for i, t in enumerate(lazies):
            if type(t) is LazyTensor:
                sig.append(t._aval)
            elif type(t) in _NUMBERS:  # a symbolic size (or scalar): this call's value is a constant of its trace
                sig.append((type(t), t))
            else:  # a 0-d CPU tensor (a Python float Dynamo made an input)
                lazies[i] = cpu_to_lazy(t, device)
                sig.append(lazies[i]._aval)
        sig = tuple(sig)
        trace = self.traces.get(sig)
        if trace is None:
            trace = self._trace(lazies, device)
            if len(self.traces) < _MAX_SIGNATURES:
                self.traces[sig] = trace
        if type(trace) is str:
            return self._op_by_op(args, trace)
        return self._record(trace, args, lazies, device)

    def _trace(self, lazies: list, device: int) -> _Trace | str:
        if any(type(t) is LazyTensor and t._value[0].device != device for t in lazies):
            return "its inputs are on several lazyxla devices"
        if len(self.traces) >= _MAX_SIGNATURES:
            return f"it was called with more than {_MAX_SIGNATURES} input signatures (shapes or sizes)"
        try:
            trace = _trace(self.gm, lazies, device)
        except _NotOneOp as e:
            metrics.inc("dynamo_op_by_op_graphs")
            return str(e)
        metrics.inc("dynamo_traces")
        return trace

    def _record(self, trace: _Trace, args: list, lazies: list[LazyTensor], device: int) -> list:
        inputs = [lazies[i]._value for i in trace.used]
        inputs += [c._value for c in trace.consts]
        inputs += [(rng.next_key_leaf(device), 0) for _ in range(trace.n_keys)]
        n = node(trace.op, tuple(inputs), trace.template, trace.avals, device, trace.base)
        if config.explain_recompiles:
            diagnostics.note_recorded(n)
        metrics.inc("dynamo_calls")
        if self.compile_at_call and not config.eager:  # (eager mode computes the node at once: compiled there)
            prepare([(n, x) for x in range(len(trace.avals))])
        results = eager.computed([LazyTensor((n, x), a) for x, a in enumerate(trace.avals)])  # now, in eager mode
        out = []
        for how, x in trace.outputs:
            if how == "result":  # (a tensor of its own per output: in-place updates rebind one tensor only)
                out.append(LazyTensor(results[x]._value, trace.avals[x]))
            elif how == "input":
                out.append(LazyTensor(lazies[x]._value, lazies[x]._aval))
            else:
                out.append(x)
        if trace.mutated:
            _write_inputs([args[i] for i in trace.mutated], out[-len(trace.mutated) :])
            del out[-len(trace.mutated) :]
        return [wrap(t) if type(t) is LazyTensor else t for t in out]

    def _op_by_op(self, args: list, why: str) -> list:
        """The fallback: run the FX graph on the call's tensors, each op recorded as in lazy mode."""
        if not self.warned:
            self.warned = True
            warnings.warn(
                f"torch.compile(backend='lazyxla'): the compiled {self.kind} graph runs op by op in lazy mode "
                f"(each call records every op; results are the same) because {why}",
                stacklevel=2,
            )
        metrics.inc("dynamo_op_by_op_calls")
        with torch.no_grad(), torch_private.disable_autocast():
            out = self.gm(*args)
        return list(out) if isinstance(out, (list, tuple)) else [out]


def _write_inputs(targets: list, values: list[LazyTensor]) -> None:
    """Give the graph inputs a call wrote in place their new values, as the graph's ``copy_`` would: a lazyxla
    tensor by three C calls each (its functionalization wrapper takes the value, as after an in-place op, so
    its views see it), instead of one dispatched ``copy_`` each (AOTAutograd's epilogue: an optimizer step
    writes 3-4 tensors per parameter); any other tensor (a CPU step counter) by ``copy_``, a read."""
    for t, v in zip(targets, values):
        if on_device(t) and torch_private.is_functional(t):
            torch_private.functional_replace(t, v)
            torch_private.functional_commit_update(t)
            torch_private.functional_sync(t)
        else:
            with torch.no_grad():
                t.copy_(wrap(v))


# ---- the backend ----------------------------------------------------------------------------------------


@functools.cache
def _decompositions() -> dict:
    """Core-ATen decompositions of the ops lazy mode would decompose (no rule, not special-cased)."""
    table = torch_private.core_aten_decompositions()
    return {op: fn for op, fn in table.items() if op not in RULES and op not in SPECIAL_OPS}


def _compiler(kind: str, compile_at_call: bool) -> Callable:
    def compile_graph(gm: torch.fx.GraphModule, example_inputs) -> CompiledGraph:
        metrics.inc("dynamo_graphs")
        return CompiledGraph(gm, kind, compile_at_call)

    compile_graph.__name__ = f"lazyxla_{kind}_compiler"
    return compile_graph


@functools.cache
def _aot_backend(compile_at_call: bool):
    return torch_private.aot_autograd(
        fw_compiler=_compiler("forward", compile_at_call),
        bw_compiler=_compiler("backward", compile_at_call),
        inference_compiler=_compiler("inference", compile_at_call),
        decompositions=_decompositions(),
        # an inference graph (an optimizer step) writes its inputs with copy_ nodes, which the trace turns into
        # outputs that a call writes back by C calls (_write_inputs), not one dispatched copy_ each
        keep_inference_input_mutations=True,
    )


def _warn_once(key: str, message: str) -> None:
    warn_once("dynamo:" + key, message, stacklevel=4)  # (from _backend: the user's frame is 4 up)


def _uses_autocast(gm: torch.fx.GraphModule) -> bool:
    """Whether autocast for lazyxla is on around the graph or entered inside it."""
    if torch.is_autocast_enabled(devices.torch_name()):
        return True
    name = devices.torch_name()
    return any(
        n.op == "call_function" and getattr(n.target, "__name__", "") == "_enter_autocast" and name in n.args
        for n in gm.graph.nodes
    )


def lazyxla_backend(gm: torch.fx.GraphModule, example_inputs: list, **kwargs: Any) -> Callable:
    """The ``torch.compile`` backend ``"lazyxla"``: AOTAutograd, each forward/backward graph one lazy op.

    Put the model and its inputs on the lazyxla device first; the compiled function's results are
    lazy like any lazyxla tensor (computed at ``lazyxla.sync()``, or when read).

    Example::

        model = MyModel().to(lazyxla.device())
        step = torch.compile(model, backend="lazyxla")
        loss = loss_fn(step(x), y); loss.backward(); opt.step(); opt.zero_grad()
        lazyxla.sync()                      # forward, backward and optimizer: one XLA program
    """
    return _backend(gm, example_inputs, False, **kwargs)


def openxla_backend(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
    """:func:`lazyxla_backend` whose graphs also compile when called (torch_xla's ``openxla`` backends, through
    ``torch_xla._dynamo.dynamo_bridge``): a call builds the program of its graph unless the cache holds it, so
    ``CompileTime`` has its sample when the first call returns; values are still computed at the next sync.

    Example::

        forward = torch.compile(model, backend=openxla_backend)
        out = forward(x)           # compiled now; out is computed at lazyxla.sync() (or when read)
    """
    return _backend(gm, example_inputs, True)


def _backend(gm: torch.fx.GraphModule, example_inputs: list, compile_at_call: bool, **kwargs: Any) -> Callable:
    if kwargs.get("options"):
        raise TypeError(
            f"torch.compile(backend='lazyxla') takes no options (got {kwargs['options']!r}); remove options=. "
            "lazyxla's settings are lazyxla.config flags."
        )
    tensors = [x for x in example_inputs if isinstance(x, torch.Tensor)]
    if tensors and not any(on_device(t) for t in tensors):
        _warn_once(
            "cpu",
            f"torch.compile(backend='lazyxla'): a graph has no lazyxla tensor (its inputs are on "
            f"{sorted({str(t.device) for t in tensors})}); it runs eagerly there. Move the model and inputs "
            "to the device first: model.to(lazyxla.device()), x.to(lazyxla.device()).",
        )
        return gm.forward
    if _uses_autocast(gm):
        # AOTAutograd's functionalization does not carry PrivateUse1's autocast key: its graphs would
        # miss autocast's casts. The captured graph runs as Python code instead, i.e. in lazy mode.
        _warn_once(
            "autocast",
            "torch.compile(backend='lazyxla'): graphs under torch.autocast('lazyxla') run in lazy mode, op by "
            "op (the same results as without torch.compile); AOTAutograd does not apply autocast on this device.",
        )
        metrics.inc("dynamo_autocast_graphs")
        return gm.forward
    return _aot_backend(compile_at_call)(gm, example_inputs)


# ---- registration ----------------------------------------------------------------------------------------

# Packages whose Python code Dynamo must never trace: lazyxla's recorder runs in Python (as
# ``__torch_dispatch__`` and device kernels), so the code a compiled function runs eagerly at a graph
# break calls into it, and into jax; Dynamo would otherwise try to compile those frames.
_SKIPPED_PACKAGES = ("lazyxla", "jax", "jaxlib", "ml_dtypes", "opt_einsum", "flatbuffers")


def _refuse_lazyxla_inputs(call: Callable) -> Callable:
    """``torch.compile``'s default backend (Inductor) with a check first: a graph whose inputs are lazyxla
    tensors raises an error naming ``backend="lazyxla"``. Inductor generates CPU/GPU kernels and has no code
    generator for this device: it would fail deep inside its code generation (``KeyError: 'lazyxla'``), after
    seconds of lowering, with nothing saying what to do."""

    @functools.wraps(call)
    def checked(self, model_, inputs_, *args, **kwargs):
        if any(isinstance(t, torch.Tensor) and on_device(t) for t in inputs_):
            name = devices.torch_name()
            raise RuntimeError(
                f"torch.compile's default backend (inductor) cannot compile for {name} tensors: it has no code "
                f'generator for this device. Use torch.compile(model, backend="{BACKEND}"), which runs the '
                f"compiled graph as part of lazyxla's program (or call the model without torch.compile)."
            )
        return call(self, model_, inputs_, *args, **kwargs)

    return checked


def _register_in(registry) -> None:
    torch_private.register_dynamo_backend(registry, BACKEND, lazyxla_backend)


def _skip_in(trace_rules) -> None:
    for name in _SKIPPED_PACKAGES:
        torch_private.skip_in_dynamo(trace_rules, name)


# Functions Dynamo puts in its graph as one call each although their files are skipped (allow_in_graph).
_IN_GRAPH: list[Callable] = []
_dynamo_loaded = [False]


def allow_in_graph(*fns: Callable) -> None:
    """Let ``torch.compile``'d code call ``fns`` (lazyxla functions, whose files Dynamo skips) without a graph
    break: Dynamo puts each call in its graph whole and AOTAutograd traces the torch ops it runs (the
    collectives' ``torch.ops.lazyxla`` ops), now if Dynamo is loaded, else when it is. For functions of tensors
    and constants whose results are tensors, lists of them, or their in-place updated arguments.

    Example::

        allow_in_graph(lazyxla.all_reduce, lazyxla.all_gather)
    """
    _IN_GRAPH.extend(fns)
    if _dynamo_loaded[0]:
        for fn in fns:
            torch.compiler.allow_in_graph(fn)


def _prepare_optimizer(opt: torch.optim.Optimizer) -> None:
    """Dynamo is about to trace ``opt``'s step: on lazyxla parameters, make its step counters device tensors
    (``capturable``, which Dynamo does for CUDA only) and a scheduler-driven learning rate a device tensor
    (``make_compilable``). Else the compiled step writes the counters back to the CPU every call (a host read per
    parameter) and a learning rate that changes every step recompiles every step."""
    if any(on_device(p) for g in opt.param_groups for p in g["params"]):
        make_compilable(opt)


def _optimizers_in(module) -> None:
    torch_private.before_dynamo_traces_optimizer(module, _prepare_optimizer)


def _allow_in(dynamo) -> None:
    _dynamo_loaded[0] = True
    for fn in _IN_GRAPH:
        torch.compiler.allow_in_graph(fn)


_ON_IMPORT = {
    torch_private.DYNAMO_BACKEND_REGISTRY: _register_in,
    torch_private.DYNAMO_TRACE_RULES: _skip_in,
    torch_private.DYNAMO_OPTIMIZER: _optimizers_in,
    torch_private.DYNAMO: _allow_in,  # (after the package's own import: allow_in_graph needs all of it)
}


def register() -> None:
    """Make ``torch.compile(..., backend="lazyxla")`` available (done when lazyxla is imported).

    Adds the backend to Dynamo's registry and lazyxla and jax to the files Dynamo never traces, now if
    ``torch._dynamo`` is loaded, else when it is (so lazy-mode programs do not pay its import).

    Example::

        import lazyxla, torch
        assert "lazyxla" in torch._dynamo.list_backends()
    """
    _install_fakification()
    torch_private.wrap_default_compile_backend(_refuse_lazyxla_inputs)
    after_import(_ON_IMPORT)


register()
