"""Where a captured step's tensors live (``lazy/capture.py``): its world of modules and optimizers, their tensor
locations, and the guards a replay checks.

Example::

    world = World(modules, optimizers, step_fn)
    locations = world.locations(flat_args)      # {("grad", 3): <p.grad>, ("state", 0, 3, "exp_avg"): ...}
    guards = world.guards(flat_args, spec, step_fn)
"""

from __future__ import annotations

import functools
import itertools
import operator
import sys
import types

import torch

from lazyxla import torch_private
from lazyxla.config import config
from lazyxla.device import devices, processes
from lazyxla.device.meshes import Mesh
from lazyxla.lazy import rng

_parameters = torch_private.module_parameters
_buffers = torch_private.module_buffers


class NotCapturable(Exception):
    """A recorded call that cannot become a candidate; the message says why, in the user's terms."""


# ---- where tensors live ----------------------------------------------------------------------------------


class _Attr:
    """``obj.name`` (a parameter's ``.grad``, a module's tensor attribute)."""

    __slots__ = ("obj", "name")

    def __init__(self, obj, name: str) -> None:
        self.obj, self.name = obj, name

    def get(self, flat):
        return getattr(self.obj, self.name, None)

    def getter(self):
        """``get`` as a C-level callable of no arguments (a replay reads every input location per call)."""
        return functools.partial(getattr, self.obj, self.name, None)

    def clearer(self):
        """``set(None)`` as a C-level callable of no arguments."""
        return functools.partial(setattr, self.obj, self.name, None)

    def set(self, value) -> None:
        setattr(self.obj, self.name, value)


class _Item:
    """``d[key]`` (a module's buffer, an optimizer's state entry)."""

    __slots__ = ("d", "key")

    def __init__(self, d: dict, key) -> None:
        self.d, self.key = d, key

    def get(self, flat):
        return self.d.get(self.key)

    def getter(self):
        return functools.partial(self.d.get, self.key)

    def clearer(self):
        return functools.partial(operator.setitem, self.d, self.key, None)

    def set(self, value) -> None:
        self.d[self.key] = value


class _Fixed:
    """A parameter itself: its tensor is changed in place, never replaced."""

    __slots__ = ("obj",)

    def __init__(self, obj) -> None:
        self.obj = obj

    def get(self, flat):
        return self.obj

    def getter(self):
        return itertools.repeat(self.obj).__next__

    def clearer(self):
        return functools.partial(self.set, None)

    def set(self, value) -> None:
        raise NotCapturable("the step replaces a parameter object")


class _Cell:
    """A closure cell of the step function."""

    __slots__ = ("cell",)

    def __init__(self, cell) -> None:
        self.cell = cell

    def get(self, flat):
        try:
            return self.cell.cell_contents
        except ValueError:  # emptied
            return None

    def set(self, value) -> None:
        self.cell.cell_contents = value

    def getter(self):
        return functools.partial(self.get, None)

    def clearer(self):
        return functools.partial(self.set, None)


class _Arg:
    """The ``i``-th tensor among the call's arguments (flattened)."""

    __slots__ = ("i",)

    def __init__(self, i: int) -> None:
        self.i = i

    def get(self, flat):
        return flat[self.i]

    def getter(self):
        return None  # (read from each call's arguments)

    def clearer(self):
        return functools.partial(self.set, None)

    def set(self, value) -> None:
        raise NotCapturable("the step replaces an argument")


def is_lazyxla(v) -> bool:
    return isinstance(v, torch.Tensor) and devices.on_device(v)


# ---- objects that hold a step's state (a KV cache passed as an argument) ----------------------------------------

_HOLDERS: list[type] = []  # classes whose instances, passed as arguments, are walked (``register_holder``)
_MAX_DEPTH = 4  # how deep a holder's attributes are walked (a cache, its sub-caches, their layers, a dict)


def register_holder(cls: type) -> None:
    """Make an instance of ``cls`` (or of a subclass) passed to a captured step a holder of the step's state: the
    device tensors among its attributes, and those of the objects, lists and dicts it holds (``_walk``), are known
    locations (read as inputs, changed in place or replaced by results, as a module's buffers), and its numbers are
    guards. Used for Hugging Face's KV caches (``frontend/generation.py``), which keep their tensors in plain
    Python objects that are no modules.

    Example::

        register_holder(transformers.Cache)
        step(input_ids, cache=cache)      # cache.layers[i].keys is read, and written in place, by a replay
    """
    global _PLAIN
    if cls not in _HOLDERS:
        _HOLDERS.append(cls)
        # (a holder among the arguments keeps ``flatten``'s fast path: it is one leaf)
        _PLAIN = (torch.Tensor, *NUMBERS, *_HOLDERS)


def is_holder(v) -> bool:
    return bool(_HOLDERS) and isinstance(v, tuple(_HOLDERS))


class _Held:
    """A tensor inside a holder (``register_holder``) passed as the ``i``-th argument: reached from each call's own
    argument along ``path`` (attribute names, dict keys, list indices), so a replay reads and writes the holder of
    the call (a new cache object per ``generate()`` call), not the one the step was verified with."""

    __slots__ = ("i", "path")

    def __init__(self, i: int, path: tuple) -> None:
        self.i, self.path = i, path

    def _owner(self, flat):
        obj = flat[self.i]
        for kind, key in self.path[:-1]:
            obj = getattr(obj, key) if kind == "attr" else obj[key]
        return obj

    def get(self, flat):
        kind, key = self.path[-1]
        owner = self._owner(flat)
        return getattr(owner, key, None) if kind == "attr" else owner.get(key)

    def getter(self):
        return None  # (read from each call's arguments, as ``_Arg``)

    def clearer(self):
        raise NotCapturable(f"the step empties tensor {_path_name(self.path)} of argument {self.i}")

    def set(self, value) -> None:  # (never called: a candidate that replaces or empties one is refused, ``written``)
        raise NotCapturable(f"the step replaces tensor {_path_name(self.path)} of argument {self.i}")


def _path_name(path: tuple) -> str:
    return ".".join(str(key) for _, key in path)


def _walk(obj, path: tuple, depth: int, places: list, guard: list, seen: dict) -> None:
    """The tensor places under ``obj`` into ``places`` ((path, tensor)) and what a guard compares into ``guard``:
    each object's class, each device tensor's dtype and shape and which earlier place holds the same tensor (a
    replay reads each place of the call's own holder), numbers by value (a flag such as a cross-attention cache's
    ``is_updated`` changes the program), CPU tensors as ``_describe``. Objects, dicts and lists are walked
    ``_MAX_DEPTH`` deep."""
    guard.append(type(obj))
    if type(obj) is dict:
        items, kind = obj.items(), "item"
    elif type(obj) in (list, tuple):
        items, kind = enumerate(obj), "index"
        guard.append(len(obj))
    else:
        items, kind = vars(obj).items(), "attr"
    for key, v in items:
        step = (*path, (kind, key))
        if isinstance(v, torch.Tensor):
            if is_lazyxla(v):
                guard.append((key, v.dtype, tuple(v.shape), seen.setdefault(id(v), len(places))))
                places.append((step, v))
            else:
                guard.append((key, _describe(v)))
        elif type(v) in NUMBERS:
            guard.append((key, type(v), v))
        elif depth < _MAX_DEPTH and (type(v) in (dict, list, tuple) or (hasattr(v, "__dict__") and not callable(v))):
            guard.append(key)
            _walk(v, step, depth + 1, places, guard, seen)
        else:
            guard.append((key, _describe(v)))


def held(obj) -> tuple[list, tuple]:
    """A holder's tensor places ((path, tensor)) and its guard (``_walk``)."""
    places: list = []
    guard: list = []
    _walk(obj, (), 0, places, guard, {})
    return places, tuple(guard)


class World:
    """The modules a step calls and the optimizers it steps, and the tensor locations they hold."""

    def __init__(self, modules, optimizers, fn) -> None:
        self.fn = getattr(fn, "__func__", fn)
        every: dict[int, torch.nn.Module] = {}
        for m in modules:
            for sub in m.modules():
                every.setdefault(id(sub), sub)
        self.modules = list(every.values())
        self.optimizers = list(optimizers)
        params: dict[int, torch.Tensor] = {}
        for m in self.modules:
            for p in _parameters(m).values():
                if p is not None:
                    params.setdefault(id(p), p)
        for o in self.optimizers:
            for group in o.param_groups:
                for p in group["params"]:
                    params.setdefault(id(p), p)
        self.params = list(params.values())
        # where the numbers the step's Python reads live: the step function's closure and globals, and those of the
        # functions it reaches by name (``_number_places``), taken when the world is learned (a recorded call)
        self.number_places = _number_places(self.fn, self.modules)
        # id(optimizer) -> its last state guard and what it was taken from (``_states_guard``)
        self._states: dict[int, tuple] = {}

    def same_as(self, other: World) -> bool:
        return [id(m) for m in self.modules] == [id(m) for m in other.modules] and [id(o) for o in self.optimizers] == [
            id(o) for o in other.optimizers
        ]

    def locations(self, flat: list) -> dict[tuple, object]:
        """Every location of a lazyxla tensor (or of a gradient, which may be None), by a name that is the same
        from call to call."""
        locs: dict[tuple, object] = {}
        for i, v in enumerate(flat):
            if isinstance(v, torch.Tensor):
                locs[("argument", i)] = _Arg(i)
            elif _HOLDERS and is_holder(v):  # (a KV cache: register_holder)
                for path, _ in held(v)[0]:
                    locs[("held", i, *(key for _, key in path))] = _Held(i, path)
        for k, cell in enumerate(getattr(self.fn, "__closure__", None) or ()):
            if is_lazyxla(_Cell(cell).get(flat)):
                locs[("closure", k)] = _Cell(cell)
        glob = getattr(self.fn, "__globals__", {})
        for name in getattr(getattr(self.fn, "__code__", None), "co_names", ()):
            if is_lazyxla(glob.get(name)):
                locs[("global", name)] = _Item(glob, name)
        for j, p in enumerate(self.params):
            locs[("parameter", j)] = _Fixed(p)
            locs[("grad", j)] = _Attr(p, "grad")
        for k, m in enumerate(self.modules):
            for name in _buffers(m):
                locs[("buffer", k, name)] = _Item(_buffers(m), name)
            for name, v in vars(m).items():
                if is_lazyxla(v) and not isinstance(v, torch.nn.Parameter):
                    locs[("attribute", k, name)] = _Attr(m, name)
        for k, o in enumerate(self.optimizers):
            for g, group in enumerate(o.param_groups):
                for key, v in group.items():
                    if is_lazyxla(v):  # a learning rate as a tensor (an LR scheduler fills it between steps)
                        locs[("group", k, g, key)] = _Item(group, key)
            for j, p in enumerate(_params_of(o)):
                state = o.state.get(p)
                for key, v in (state or {}).items():
                    if isinstance(v, torch.Tensor):
                        locs[("state", k, j, key)] = _Item(state, key)
        return locs

    def guards(self, flat: list, spec, fn) -> tuple:
        """What a call starts from that must equal a verified step's for it to be replayed.

        Per call, so each part is taken with C-level bulk operations (``map``, ``chain``) over all modules or
        states at once rather than a Python loop per object: a replayed GPT step's guards cost ~30 us, not ~100."""
        dev = devices.torch_name()
        g: list = [
            spec,
            torch.is_grad_enabled(),
            torch.is_autocast_enabled(dev),
            torch.get_autocast_dtype(dev),
            config.compile_key(),
            devices.spmd_enabled(),
            # (fixed in a run; a verified step is this process's, built for this world size and rank)
            processes.process_count(),
            processes.process_index(),
            rng.get_state()[0],
        ]
        g += [_describe_argument(v) for v in flat]
        g.append(_modules_guard(self.modules))
        for o in self.optimizers:
            for group in o.param_groups:
                g.append(tuple((k, _describe(v)) for k, v in group.items() if k != "params"))
                g.append(tuple(map(id, group["params"])))
            g.append(self._states_guard(o))
        g.append(tuple(map(_is, map(_grad, self.params), _NONES)))
        g += _closure_numbers(fn)
        g += [_place_number(place) for place in self.number_places]
        return tuple(g)

    def _states_guard(self, o) -> tuple:
        """An optimizer's state guard: per parameter None (no state yet), or its state's identity and entries'
        keys, device tensors by identity, anything else by value (``_state_entry``). The last guard is kept with
        the state dicts, keys and values it was taken from (kept alive, so an equal identity is the same object):
        while they are all still there and it holds no value but device tensors' identities, it is the guard
        again, without asking each tensor for its device."""
        states = list(map(o.state.get, _params_of(o)))
        memo = self._states.get(id(o))
        if None not in states:
            keys = list(_chain(map(dict.keys, states)))
            values = list(_chain(map(dict.values, states)))
            sizes = list(map(len, states))
            if (
                memo is not None
                and memo[4]
                and len(values) == len(memo[2])
                and sizes == memo[3]
                and all(map(_is, states, memo[0]))
                and keys == memo[1]
                and all(map(_is, values, memo[2]))
            ):
                return memo[5]
        else:
            keys = values = sizes = None
        g = tuple(None if s is None else (id(s), *((k, _state_entry(v)) for k, v in s.items())) for s in states)
        reusable = keys is not None and all(type(e[1]) is int for s in g for e in s[1:])
        self._states[id(o)] = (states, keys, values, sizes, reusable, g, o)
        return g


def _modules_guard(modules: list) -> tuple:
    """The modules' part of the guards: each one's ``training`` flag, parameters and buffers (by identity, with
    their counts per module) and counts of forward, forward-pre and backward hooks."""
    params = torch_private.modules_parameters(modules)
    buffers = torch_private.modules_buffers(modules)
    return (
        tuple(map(_training, modules)),
        tuple(map(len, params)),
        tuple(map(id, _chain(map(dict.values, params)))),
        tuple(map(len, buffers)),
        tuple(map(id, _chain(map(dict.values, buffers)))),
        tuple(map(len, torch_private.modules_hook_dicts(modules))),
    )


_chain = itertools.chain.from_iterable
_training = operator.attrgetter("training")
_grad = operator.attrgetter("grad")
_NONES = itertools.repeat(None)


_is = operator.is_


def _params_of(o) -> list:
    return [p for group in o.param_groups for p in group["params"]]


NUMBERS = (int, float, bool, str, type(None), torch.dtype, torch.device)


def _describe(v):
    """A guard's view of a value: numbers by value, device tensors by identity, shape and dtype, CPU numbers by
    value, anything else by identity (the guard keeps no reference: identities are compared while the objects
    the guard was taken from are alive)."""
    if type(v) in NUMBERS:
        return (type(v), v)
    if isinstance(v, torch.Tensor):
        if v.device.type == "cpu":
            return ("cpu", v.dtype, tuple(v.shape), v.item() if v.numel() == 1 else id(v))
        return ("tensor", id(v), v.dtype, tuple(v.shape))
    if type(v) in (tuple, list):
        return (type(v), tuple(_describe(e) for e in v))
    return ("object", id(v))


def _state_entry(v):
    """A guard's view of an optimizer state entry: a device tensor by identity (its shape and dtype are checked
    with the program's inputs), anything else as ``_describe``."""
    if isinstance(v, torch.Tensor) and v.device.type != "cpu":
        return id(v)
    return _describe(v)


def _describe_argument(v):
    """A guard's view of an argument: tensors (a new batch every call) by dtype and shape only."""
    if isinstance(v, torch.Tensor) and v.device.type != "cpu":
        return ("tensor", v.dtype, tuple(v.shape), v.requires_grad)
    if _HOLDERS and is_holder(v):  # (its tensors by identity, its numbers by value: ``_walk``)
        return ("holder", held(v)[1])
    return _describe(v)


_PLAIN = (torch.Tensor, *NUMBERS)


def flatten(tree) -> tuple[list, object]:
    """``tree_flatten`` for the usual arguments and results (tensors and numbers, in a tuple, list or dict of
    them), without its per-call cost (~70 us); anything else through PyTorch's pytree."""
    if isinstance(tree, _PLAIN):
        return [tree], "leaf"
    if type(tree) is tuple and len(tree) == 2 and type(tree[1]) is dict:  # (args, kwargs)
        args, kwargs = tree
        keys = tuple(kwargs)
        flat = [*args, *kwargs.values()]
        if all(isinstance(v, _PLAIN) for v in flat):
            return flat, ("call", len(args), keys)
    elif type(tree) in (tuple, list) and all(isinstance(v, _PLAIN) for v in tree):
        return list(tree), (type(tree), len(tree))
    return torch_private.tree_flatten(tree)


def unflatten(values: list, spec):
    if spec == "leaf":
        return values[0]
    if type(spec) is tuple and spec[0] in (tuple, list):
        return spec[0](values)
    return torch_private.tree_unflatten(values, spec)


def _closure_numbers(fn) -> list:
    """The numbers the step function reads from its closure cells and its module's globals, the SPMD meshes it
    reads there (by key: a sharding constraint the step records names its mesh), and its lists of integers (by
    value: the replica groups of its collectives, e.g. ``groups=[[0, 1], [2, 3]]``)."""
    fn = getattr(fn, "__func__", fn)
    code = getattr(fn, "__code__", None)
    if code is None:
        return []
    out = [_guarded(c.cell_contents) for c in (fn.__closure__ or ()) if _cell_guarded(c)]
    glob = fn.__globals__
    out += [(name, _guarded(glob[name])) for name in code.co_names if _is_guarded(glob.get(name))]
    return out


_MAX_REACH = 4  # calls deep: the step, the helpers it calls by name, theirs, ...
# functions whose module globals hold no number of the user's step (their modules' constants)
_LIBRARIES = ("torch", "lazyxla", "jax", "jaxlib", "numpy", *sys.stdlib_module_names)


def _number_places(fn, modules: list) -> list[tuple]:
    """The places of numbers (and meshes, replica groups) that the functions a step reaches may read: a global a
    function names (in its code or a lambda's inside it), a closure cell. Reached: the step function, the Python
    functions its globals and closure cells hold (the helpers it calls by name: ``loss_of(x)`` reading a module's
    ``SCALE``), theirs in turn, and each module's ``forward``, up to ``_MAX_REACH`` calls deep; library code is
    not followed. A place is kept when it holds a guarded value when the world is learned; the step function's own
    are ``_closure_numbers``'. Not reached: functions held in objects' attributes or containers."""
    seen: set = set()
    places: list = []

    def visit(f, depth: int) -> None:
        f = getattr(f, "__func__", f)  # a bound method: its function
        if type(f) is not types.FunctionType or id(f) in seen or depth > _MAX_REACH:
            return
        if (f.__module__ or "").split(".")[0] in _LIBRARIES:
            return
        seen.add(id(f))
        glob = f.__globals__
        for name in _names(f.__code__):
            v = glob.get(name)
            if depth and _is_guarded(v):
                places.append((glob, name))
            visit(v, depth + 1)
        for cell in f.__closure__ or ():
            if depth and _cell_guarded(cell):
                places.append((cell,))
            visit(_contents(cell), depth + 1)

    visit(fn, 0)
    for m in modules:
        visit(type(m).forward, 1)
    return places


def _names(code) -> set:
    """The global names ``code`` and the code objects inside it (lambdas, nested functions) read."""
    names = set(code.co_names)
    for c in code.co_consts:
        if type(c) is types.CodeType:
            names |= _names(c)
    return names


def _contents(cell):
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return None


def _place_number(place: tuple):
    if len(place) == 1:
        v = _contents(place[0])
    else:
        glob, name = place
        v = glob.get(name)
    return _guarded(v) if _is_guarded(v) else ("not a number", type(v))


_GUARDED = (*NUMBERS[:4], Mesh)
_MAX_GROUPS = 256  # integers in a list the guard compares by value (replica groups), at most


def _guarded(v) -> tuple:
    if type(v) is Mesh:
        return ("mesh", v.key)
    if type(v) in (list, tuple):
        return ("groups", _groups(v))
    return (type(v), v)


def _groups(v):
    """A list or tuple of integers, or of lists or tuples of integers (replica groups), as nested tuples; None for
    anything else, or for more than ``_MAX_GROUPS`` integers."""
    if type(v) not in (list, tuple) or len(v) > _MAX_GROUPS:
        return None
    if all(type(e) is int for e in v):
        return tuple(v)
    if not all(type(e) in (list, tuple) and all(type(i) is int for i in e) for e in v):
        return None
    return tuple(map(tuple, v)) if sum(map(len, v)) <= _MAX_GROUPS else None


def _is_guarded(v) -> bool:
    return type(v) in _GUARDED or (type(v) in (list, tuple) and _groups(v) is not None)


def _cell_guarded(cell) -> bool:
    try:
        return _is_guarded(cell.cell_contents)
    except ValueError:  # an empty cell
        return False


# ---- optimizers --------------------------------------------------------------------------------------------


_PLAIN_DISPATCH = torch.Tensor.__torch_dispatch__  # (a plain tensor's and a Parameter's: no subclass dispatch)


def make_capturable(opt: torch.optim.Optimizer) -> None:
    """Switch ``opt`` to ``capturable=True`` where it offers it (as ``torch.compile`` does for an optimizer step
    it compiles), moving its step counters to the parameters' device: its bias corrections become device math
    instead of Python numbers that change every step. An Adam or AdamW learning rate that an LR scheduler drives
    becomes a 0-d device tensor too (``_lr_as_tensor``).

    Example::

        make_capturable(torch.optim.AdamW(model.parameters()))
    """
    if "capturable" not in opt.defaults:
        return
    for group in opt.param_groups:
        if not group["params"] or not all(is_lazyxla(p) for p in group["params"]):
            continue
        if any(type(p).__torch_dispatch__ is not _PLAIN_DISPATCH for p in group["params"]):
            # (a tensor subclass's parameters, DTensor's under FSDP2: their states are DTensors too, and device step
            # counters of plain lazyxla tensors would meet their local tensors in one foreach op, which
            # functionalization refuses; such a step is recorded, its bias corrections Python numbers)
            continue
        _lr_as_tensor(opt, group)
        if group.get("capturable") or group.get("fused"):  # (a fused step's counters are on the device already)
            continue
        group["capturable"] = True
        for p in group["params"]:
            state = opt.state.get(p)
            step = None if state is None else state.get("step")
            if isinstance(step, torch.Tensor) and step.device.type == "cpu":
                state["step"] = step.to(p.device)


def make_compilable(opt: torch.optim.Optimizer) -> None:
    """Ready ``opt`` for a step that Dynamo traces (``torch.compile(opt.step, backend="lazyxla")``): as
    :func:`make_capturable` (device step counters: else each compiled call writes them back to the CPU, a host
    read per parameter per step), and an SGD learning rate that an LR scheduler drives becomes a device tensor
    too (SGD's compiled step multiplies by a tensor learning rate; a Python number there is baked into the graph,
    so each new value would recompile).

    Example::

        make_compilable(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    """
    make_capturable(opt)
    if isinstance(opt, torch.optim.SGD):
        for group in opt.param_groups:
            if group["params"] and all(is_lazyxla(p) for p in group["params"]) and not group.get("fused"):
                _lr_as_tensor(opt, group, (torch.optim.SGD,))


def _lr_as_tensor(opt: torch.optim.Optimizer, group: dict, kinds: tuple = ()) -> None:
    """An Adam or AdamW group's learning rate (or one of ``kinds``') becomes a device tensor when an LR scheduler
    drives it (the scheduler set ``initial_lr``), as PyTorch advises for a compiled optimizer step under a
    scheduler: a Python number that changes every step would make every captured call differ, while the scheduler
    fills a tensor in place (``LRScheduler`` does for a tensor learning rate), and a replay reads it like any other
    input."""
    lr = group.get("lr")
    if "initial_lr" not in group or type(lr) is not float or not isinstance(opt, _TENSOR_LR + kinds):
        return
    group["lr"] = torch.tensor(lr, dtype=torch.float32, device=group["params"][0].device)


_TENSOR_LR = (torch.optim.Adam, torch.optim.AdamW)  # their capturable steps take a tensor learning rate
