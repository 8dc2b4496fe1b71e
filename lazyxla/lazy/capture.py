"""Whole-step capture: ``lazyxla.compile(step, capture=True)`` runs a warm step without running its Python.

Example::

    @lazyxla.compile(capture=True)
    def train_step(x, y):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    for x, y in loader:                  # device tensors
        loss = train_step(x, y)          # from the third call on: guards, then one program, no recording

Why
---
Recording a step costs host time in proportion to its ops (a small GPT: ~30 ms of Python per step), while an
accelerator computes it in a few milliseconds. A warm step's recorded graph is nearly always the previous one,
so recording it again only finds the same program. Capture records the step as lazy mode does, learns from the
recording where each program input comes from and where each result goes, and then *replays*: it reads the
inputs' device buffers, runs the cached program and puts the results where recording would have.

How a step becomes replayable (``StepCapture``)
-----------------------------------------------
Every call that is not replayed is recorded, in a ``lazyxla.compile`` region (sync before and after). While it
runs, PyTorch's global hooks name the modules it calls and the optimizers it steps: its *world*. From the next
recorded call on, the world's tensor *locations* are known: the arguments, each parameter and its ``.grad``, the
modules' buffers and tensor attributes, and each optimizer state entry. A recorded call then yields a
*candidate* (``_build``): the program its closing sync ran, which location each program input was read from,
which location each result was put in (the same tensor changed in place, a new tensor, or ``None``), the Python
numbers the program takes, the random keys it draws, and the *guards*: what the call started from (argument
shapes, dtypes and numbers; grad mode, autocast, config; each module's ``training`` flag, parameters, buffers
and hooks; each optimizer's hyperparameters, parameters and state entries, with the values of CPU numbers in
its state; which parameters had a gradient; the numbers, and the SPMD meshes (by key), that the step function
reads from its closure and globals, and that the functions it reaches by name read from theirs:
``step_world._number_places``).

A candidate equal in everything to the previous recorded call's is *verified*: two recordings from the same
guards gave the same program with the same numbers, so the step's Python computed nothing that changes from
call to call. From then on a call whose guards equal the verified ones is replayed (``_Entry.replay``); one
whose guards differ is recorded, which counts ``capture_guard_misses``, and may become a second entry. A call
whose guards equal an entry's but whose inputs the replay finds otherwise (``capture_input_misses``) is recorded,
and once it verifies, its step replaces that entry. ``.capture_status`` keeps why a call was recorded until the
step verifies again.

SPMD (``lazyxla.spmd``): the program takes its inputs in the layouts it was built for (its key
holds them, ``meshes.layouts``: canonical, with an uneven split that a leaf asks for). A replay checks each
input's layout against the verified call's, except the buffers the previous replay made (the program's outputs,
in the layouts the verified calls read back); a different one (a weight laid out anew with ``mark_sharding``, a
batch annotated otherwise) is recorded, saying "an input's sharding differs". The packed numbers and random keys
are sent to every device, as a recorded sync sends them; results split unevenly remember their layout as a
sync's do (``graph.output_leaves``), and a quiet replay keeps each reused node's.

Replicas (several processes, collectives in the step: ``lazyxla.optimizer_step``, ``all_reduce``), and SPMD over
several processes (every process runs each program): a replica program takes this process's blocks of its global
arguments and gives back its own block of each result (``replicas.globalize``/``localize``, as a recorded sync).
A replay in one process while another records would run the program's collectives against other ones, so every
call of such a step is agreed among the processes (``_Agreement``, ``processes.meet``): it is replayed only when
every process replays the same program, else every process records it ("another process records this call").
The process count and index, and lists of integers the step reads from its closure and globals (replica groups),
are guards.

What stops a call from being captured (the reason is in ``.capture_status``, counted as ``capture_refusals``):
a host read or another sync inside the step (it is several programs), a read of a device tensor that is not in
a known location (a tensor in a list: make it a buffer or an argument), a result kept anywhere else, a CPU
tensor argument, a step through DistributedDataParallel (its reducer keeps its
gradient buckets, which the step reads, in C++: use ``lazyxla.optimizer_step`` instead), a ``mark_sharding`` or
``clear_sharding`` of device data inside the step (annotate the arguments, parameters and buffers before the
call; annotating a pending value inside the step is a constraint in the program, and replays). Python numbers
that change every call (a CPU step counter, SGD's learning rate under a scheduler) make every candidate differ,
so such steps are recorded every time: correct, not faster.

Optimizers: as ``torch.compile`` does for an optimizer step it compiles, optimizers that offer ``capturable``
are switched to ``capturable=True`` (their step counters move to the device), so their bias corrections are
device math rather than Python numbers that change every step. An Adam or AdamW learning rate that an LR
scheduler drives (it set ``initial_lr``) becomes a 0-d device tensor, as PyTorch advises for a compiled step
under a scheduler: the scheduler fills it in place between steps and a replay reads it as an input. A lazy-mode
run with ``capturable=True`` (and that tensor learning rate) computes exactly what a replayed step does.

Quiet replays: after a replay, the LazyTensors that hold the values it changed in place (parameters, optimizer
state, buffers) are watched (``session.watched``, lazy/session.py): the first op that reads or writes one (a view
read, an in-place update, a host read of a parameter), or a rebinding of one (``tensor.set_value``), counts in
``session.touched``. A replay with no such op and no other replay since the last one is *quiet*: the results that
replace a location's value go into the node that held it (``_Entry._reused``), with no functionalization call.
Work between two steps that does not touch those tensors (the next batch moved to the device, a loss accumulator,
an LR scheduler's ``fill_`` of a tensor learning rate) keeps the next replay quiet; when anything was recorded
(``session.recorded`` changed), the pending work is run first and the buffers the program takes over are checked
for new holders (one scan of the live tensors). More than ``session.WATCH_OPS`` ops between two steps (an
evaluation loop) end the watch, as a touch does. Otherwise the replay takes the full path, which puts every result
through functionalization, so views and aliases read since the last replay see it.

Not replayed: the step's Python side effects (prints, counters, appends) happen in recorded calls only, as
in ``jax.jit``; returned tensors carry no autograd history; values the step reads from other Python objects
than those guarded (an attribute of an object that is not a module, a module not called through ``forward``)
must not change the program between calls — a change there is seen only at the next recorded call.
"""

from __future__ import annotations

import collections
import itertools
import operator
import warnings
import weakref

import numpy as np
import torch
import torch.nn.modules.module as torch_module
import torch.optim.optimizer as torch_optimizer

from lazyxla import torch_private
from lazyxla.config import config
from lazyxla.device import devices, meshes, processes
from lazyxla.ir import Leaf, digest, leaf
from lazyxla.lazy import graph, known, rng
from lazyxla.lazy.session import session
from lazyxla.lazy.step_world import NUMBERS, NotCapturable, World, flatten, is_lazyxla, make_capturable, unflatten
from lazyxla.lazy.tensor import LazyTensor, live_tensors, set_value, unwrap, wrap
from lazyxla.observe import metrics

_replace = torch_private.functional_replace
_commit = torch_private.functional_commit_update
_sync = torch_private.functional_sync
_from_functional = torch_private.from_functional
_DATA = Leaf.DATA
MISS = object()  # a replay that did not happen (an input or a buffer check failed): the call is recorded instead
_NO_CACHE = collections.defaultdict(lambda: None)  # (no input is known to be where the last replay put it)
_SAME, _NEW, _NONE = "same", "new", "none"  # how a location's tensor changes in a step
_MAX_ENTRIES = 8  # verified steps kept per function (e.g. train and eval), oldest dropped first
_MAX_CONSTANT_BYTES = 1 << 20  # a tensor made inside the step from host values is compared between calls up to this


# ---- recorded calls ------------------------------------------------------------------------------------------


def _none():
    return None


_PLAIN_DISPATCH = torch.Tensor.__torch_dispatch__  # (a plain tensor's and a Parameter's: no subclass dispatch)


def _ref(v):
    """A weak reference to ``v`` (a call returns None when ``v`` is None or gone)."""
    return _none if v is None else weakref.ref(v)


class _Start:
    """What a recorded call started from: each location's tensor, and which location holds each device buffer."""

    def __init__(self, world: World, flat: list, spec, fn) -> None:
        for i, v in enumerate(flat):
            if isinstance(v, torch.Tensor) and not is_lazyxla(v):
                raise NotCapturable(f"argument tensor {i} is on {v.device}: pass lazyxla tensors to a captured step")
        self.guards = world.guards(flat, spec, fn)
        self.locations = world.locations(flat)
        # each location's tensor, weakly: a snapshot must not keep a tensor the step drops alive (zero_grad's
        # gradients would be held through the step's sync, and change its program)
        self.objects = {name: _ref(loc.get(flat)) for name, loc in self.locations.items()}
        self.present = {name for name, ref in self.objects.items() if ref is not _none}
        self.named: dict[int, tuple] = {}  # id(device-data node) -> the location it was read from
        self.node_at: dict[tuple, int] = {}  # location -> id(its device-data node) (one node may be at several)
        self.nodes = []  # keeps those nodes alive, so their ids stay theirs
        for name, ref in self.objects.items():
            t = ref()
            if t is not None and is_lazyxla(t):
                if type(t).__torch_dispatch__ is not _PLAIN_DISPATCH:
                    raise NotCapturable(
                        f"{_say(name)} is a {type(t).__name__} (FSDP2, tensor parallel): capture does not replay "
                        "steps over tensor subclasses yet; the step is recorded (lazy mode's numbers)"
                    )
                n = unwrap(t)._value[0]
                if n.op is _DATA:
                    # Known values (lazy/known.py): ops on small integer tensors whose values the host has (a
                    # batch's token ids and targets, up to config.known_values_limit elements) would be computed
                    # on the host, from values a replay does not have; the tensors a captured step reads forget
                    # them, so those ops are device ops. (Lazy mode's program takes them as inputs instead: its
                    # float results may differ from a captured step's in the last bits.)
                    known.forget(n)
                    self.named.setdefault(id(n), name)
                    self.node_at[name] = id(n)
                    self.nodes.append(n)
        held = [t._value[0] for t in live_tensors()]
        self.held: dict[int, int] = {}  # id(node) -> how many live tensors hold it (device data before the call)
        for n in held:
            self.held[id(n)] = self.held.get(id(n), 0) + 1
        self.nodes += held
        self.rng = rng.get_state()


def _build(world: World, start: _Start, ran: list, flat: list, out) -> _Candidate:
    """The candidate of a recorded call that started from ``start`` and ran the programs ``ran``."""
    if len(ran) != 1:
        raise NotCapturable(
            f"the step ran {len(ran)} programs: it reads values on the host (.item(), .cpu(), print) or syncs "
            "inside, so it is not one program"
        )
    r = ran[0]
    cand = _Candidate(r, start)
    cand.read_leaves(r, start, world)
    cand.rng(r, start)
    cand.written(r, world, start, flat)
    cand.returned(out, r, flat)
    return cand


class _Candidate:
    """A recorded call, described so that two calls can be compared and a verified one replayed."""

    def __init__(self, ran, start: _Start) -> None:
        self.ran = ran
        self.guards = start.guards
        self.held = start.held
        self.inputs: list[tuple] = []  # (leaf position, location name, node hash)
        self.constants: list[tuple] = []  # (leaf position, content) of device data made inside the step
        self.keys: list[tuple] = []  # (leaf position, key offset from the call's first)
        self.outputs: list[tuple] = []  # (location name, _SAME/_NEW/_NONE, result number or -1)
        # (location name, the location name its tensor was read from): a location left holding the tensor another
        # location holds, which the program read from that other one; a replay checks they still share it
        self.aliases: list[tuple] = []
        self.ret: tuple = ()
        self.locations = start.locations

    def read_leaves(self, r, start: _Start, world: World) -> None:
        for pos, n in enumerate(r.leaves):
            if n.op is _DATA:
                name = start.named.get(id(n))
                if name is not None:
                    self.inputs.append((pos, name, n.hash))
                elif meshes.is_relaid(n):  # device data laid out anew inside the step: not a constant
                    raise NotCapturable(
                        "the step lays out a computed tensor anew (lazyxla.spmd.mark_sharding or clear_sharding of "
                        "device data inside the step): annotate the arguments (e.g. DeviceLoader(input_sharding=...)), "
                        "parameters and buffers before the call"
                    )
                elif id(n) in start.held:
                    if any(isinstance(m, _DDP) for m in world.modules):
                        raise NotCapturable(_DDP_BUCKETS)
                    raise NotCapturable(
                        f"the step reads a device tensor ({list(n.avals[0].shape)} {n.avals[0].dtype}) that is not an "
                        "argument, a variable of the step function (closure or global), a parameter, a gradient, a "
                        "buffer or tensor attribute of a module it calls, or an optimizer's state: register it as a "
                        "buffer or pass it as an argument"
                    )
                else:
                    self.constants.append((pos, _content(n)))
        self.scalars = tuple((pos, type(n.payload), n.payload) for pos, n in enumerate(r.leaves) if n.op is Leaf.SCALAR)

    def rng(self, r, start: _Start) -> None:
        seed, counter = rng.get_state()
        seed0, counter0 = start.rng
        if seed != seed0 or counter < counter0:
            raise NotCapturable("the step seeds the random number generator")
        self.drawn = counter - counter0
        for pos, n in enumerate(r.leaves):
            if n.op is Leaf.RNG:
                self.keys.append((pos, (int(n.payload[1]) - counter0) & 0xFFFFFFFF))

    def written(self, r, world: World, start: _Start, flat: list) -> None:
        made = {id(m): j for j, m in enumerate(r.made)}
        self.locations = world.locations(flat)
        claimed = set()
        for name, loc in self.locations.items():
            after, before = loc.get(flat), start.objects.get(name, _none)()
            if after is None:
                if name in start.present and name[0] == "held":
                    raise NotCapturable(f"the step empties {_say(name)}")
                if name in start.present:
                    self.outputs.append((name, _NONE, -1))
                continue
            if not is_lazyxla(after):
                continue
            n = unwrap(after)._value[0]
            j = made.get(id(n))
            if j is not None:
                if after is not before and name[0] == "held":  # (a replay writes a holder's tensors in place only)
                    raise NotCapturable(f"the step replaces {_say(name)}: use a cache that it updates in place")
                self.outputs.append((name, _SAME if after is before else _NEW, j))
                claimed.add(j)
            elif n.op is not _DATA:
                raise NotCapturable(f"the step leaves {_say(name)} pending")
            elif after is not before or start.node_at.get(name) != id(n):
                # (a location left as it was is no write, though another location holds the same tensor: a
                # processor and a stopping criterion of generate() share the EOS ids, and the criterion rebinds
                # them to themselves, ``self.eos_token_id = self.eos_token_id.to(device)``)
                raise NotCapturable(f"the step puts a tensor it did not compute in {_say(name)}")
            elif start.named.get(id(n)) != name:  # (the program reads it from the other: they must still share it)
                self.aliases.append((name, start.named[id(n)]))
        self.claimed = claimed
        rebound = {name for name, _, _ in self.outputs}
        for pos in r.compiled.donated:
            name = next((nm for p, nm, _ in self.inputs if p == pos), None)
            if name not in rebound:
                raise NotCapturable("the step's program takes a buffer that stays in use")

    def returned(self, out, r, flat: list) -> None:
        made = {id(m): j for j, m in enumerate(r.made)}
        where = {}  # id(tensor) -> its location, after the call
        for name, loc in self.locations.items():
            v = loc.get(flat)
            if v is not None:
                where.setdefault(id(v), name)
        values, spec = flatten(out)
        desc = []
        for v in values:
            if isinstance(v, torch.Tensor):
                if not is_lazyxla(v):
                    raise NotCapturable("the step returns a tensor that is not on the lazyxla device")
                if id(v) in where:
                    desc.append(("location", where[id(v)]))
                    continue
                j = made.get(id(unwrap(v)._value[0]))
                if j is None:
                    raise NotCapturable("the step returns a tensor that its program does not compute")
                desc.append(("result", j))
                self.claimed.add(j)
            elif type(v) in NUMBERS:
                desc.append(("value", type(v), v))
            else:
                raise NotCapturable(f"the step returns a {type(v).__name__}: return tensors and numbers")
        unclaimed = len(r.made) - len(self.claimed)
        if unclaimed:
            raise NotCapturable(
                f"the step keeps {unclaimed} computed tensor(s) where capture cannot find them again (outside the "
                "arguments, modules, gradients and optimizer state): return them, or store them in a module buffer"
            )
        self.ret = (spec, tuple(desc))

    def signature(self) -> tuple:
        """Equal for two recorded calls that ran the same program from the same guards with the same numbers."""
        r = self.ran
        consts = tuple((pos, c[0], c[1], c[2].tobytes()) for pos, c in self.constants)
        return (
            r.key,
            self.guards,
            tuple(self.inputs),
            consts,
            self.scalars,
            tuple(self.keys),
            self.drawn,
            tuple(self.outputs),
            tuple(self.aliases),
            self.ret,
        )


_DDP = torch.nn.parallel.DistributedDataParallel
# (its reducer copies the gradients into flat bucket tensors, held in C++ and kept from step to step: a replay
# could neither find them nor put the step's new bucket values back)
_DDP_BUCKETS = (
    "the step runs DistributedDataParallel, whose gradient buckets (device tensors its C++ reducer keeps between "
    "steps) the step reads, where capture cannot find them: for a captured step, average the gradients with "
    "lazyxla.optimizer_step(opt) or lazyxla.reduce_gradients(opt) (torch_xla: xm.optimizer_step) on the plain "
    "module instead of wrapping it in DistributedDataParallel"
)


def _content(n) -> tuple:
    """Device data made inside the step (an upload of host values): its values, to compare between calls."""
    aval = n.avals[0]
    size = int(np.prod(aval.shape)) * aval.dtype.itemsize
    if size > _MAX_CONSTANT_BYTES:
        raise NotCapturable(
            f"the step copies a {list(aval.shape)} tensor from the host each call: pass it as an argument"
        )
    values = np.asarray(n.host if n.host is not None else n.payload)
    return (str(aval.dtype), tuple(aval.shape), values)


def _say(name: tuple) -> str:
    kind = name[0]
    if kind == "state":
        return f"optimizer {name[1]}'s state {name[3]!r} of parameter {name[2]}"
    if kind in ("buffer", "attribute"):
        return f"{kind} {name[2]!r} of module {name[1]}"
    if kind == "held":  # (a tensor of an object passed as argument name[1]: step_world.register_holder)
        return f"tensor {'.'.join(map(str, name[2:]))} of argument {name[1]}"
    return f"{kind} {name[1]}"


# ---- replay --------------------------------------------------------------------------------------------------


class _Entry:
    """A verified step: its program, and where its inputs come from and its results go."""

    def __init__(self, cand: _Candidate, signature: tuple) -> None:
        r = cand.ran
        self.signature = signature  # (the verified calls' ``_Candidate.signature``)
        self.compiled, self.device = r.compiled, r.device
        self.made_by = f"an output of graph {graph.graph_id(r.key)} (replayed)"  # names the buffers in errors
        # per input: weak references to the (inner tensor, node) the last replay left in its location, or None
        self._cache = _NO_CACHE
        self._quiet = None  # _quiet_key() after the last replay
        self._made = None  # _made() after the last replay
        # per input the step rewrites: ids of the LazyTensors its location holds after the last replay (the
        # functional value and the one ``_put`` set), watched until the next replay (``session.watched``)
        self._watch: dict[int, tuple] = {}
        self._watch_ids = None  # the ids in ``_watch``, as one set (None: to be taken again)
        self._resident = None  # the packed Python numbers on the device (``_arguments``)
        # the Python numbers, packed once (``ArgLayout``): the verified call's are every replay's
        self.packed = r.compiled.layout.packed_scalars(r.leaves)
        self.guards = cand.guards
        self.outputs_of = graph.outputs_of(r.roots, r.compiled)
        self.template = list(r.leaves)  # scalars and constants; inputs and keys are put in per call
        locs = cand.locations
        # per input: (leaf position, location, node hash, layout): in SPMD the layout the program was built for
        # (canonical, with an uneven split asked for: ``meshes.layouts``), else None
        shaped = graph.key_layouts(r.key)
        self.inputs = [(pos, locs[name], h, shaped and shaped[pos]) for pos, name, h in cand.inputs]
        self.names = [name for _, name, _ in cand.inputs]  # (to say which input a replay missed at)
        self.aliases = [(locs[a], locs[b]) for a, b in cand.aliases]  # (``_Candidate.aliases``: checked per replay)
        # per input: a C-level callable giving its location's tensor (``getter``; None for an argument, read from
        # the call's flattened arguments), and the arguments' (input, position among them)
        getters = [loc.getter() for _, loc, _, _ in self.inputs]
        self._getters = [g or _none for g in getters]
        self._from_arguments = [
            (k, self.inputs[k][1].i) for k, g in enumerate(getters) if g is None and self.names[k][0] == "argument"
        ]
        # (and the tensors inside an argument, e.g. a KV cache's: step_world.register_holder)
        self._from_holders = [
            (k, self.inputs[k][1]) for k, g in enumerate(getters) if g is None and self.names[k][0] != "argument"
        ]
        # per program data argument: the input it is read from; and those that are not inputs (constants)
        at = {pos: k for k, (pos, _, _) in enumerate(cand.inputs)}
        data = r.compiled.layout.data
        self._data_of = {at[i]: d for d, i in enumerate(data) if i in at}
        self._constant_data = [d for d, i in enumerate(data) if i not in at]
        self._fast = None  # the quiet path's plan over ``_cache`` (``_fast_plan``), None: to be made again
        for pos, _, _ in cand.inputs:
            self.template[pos] = None
        self.keys = cand.keys
        for pos, _ in cand.keys:
            self.template[pos] = None
        self.drawn = cand.drawn
        read_at = {name: k for k, (_, name, _) in enumerate(cand.inputs)}
        # (location, how it changes, result number, the input it is read from next step or None)
        self.writes = [(locs[name], kind, j, read_at.get(name)) for name, kind, j in cand.outputs]
        # how many inputs the last replay left in place (a quiet replay finds them all where it left them)
        self.written_inputs = sum(1 for _, kind, _, k in self.writes if kind is _SAME and k is not None)
        self.ret_spec, self.ret = cand.ret[0], [(d[0], locs[d[1]]) if d[0] == "location" else d for d in cand.ret[1]]
        self.donated = r.compiled.donated
        # how many tensors held each donated input when the verified call started: a replay's are held as often
        self.holders = [cand.held[id(r.leaves[pos])] for pos in self.donated]
        self.avals = [m.avals[0] for m in r.made]
        # a program over the replicas: its name in every process (``ir.digest``), which the processes agree on
        # before each replay (``_Agreement``)
        self.program = digest(None, r.leaves, r.roots, size=8) if _spans(r.compiled) else None
        self._reuse_plan()

    def _reuse_plan(self) -> None:
        """Which results a quiet replay puts into the node of the input it replaces (``reuse``: (result, input)
        pairs): a location's tensor changed in place and read again next step, whose result goes nowhere else.
        Such a location's tensor, its LazyTensor and its node then stay the same objects from step to step;
        only the node's buffer changes (``replay``)."""
        returned = {d[1] for d in self.ret if d[0] == "result"}
        uses = collections.Counter(j for _, _, j, _ in self.writes)
        self.reuse, taken = [], set()
        for _, kind, j, k in self.writes:
            if kind is _SAME and k is not None and j not in returned and uses[j] == 1 and k not in taken:
                self.reuse.append((j, k))
                taken.add(k)
        self._reuse_inputs = frozenset(taken)
        self._reuse_lists = ([j for j, _ in self.reuse], [self.inputs[k][0] for _, k in self.reuse])
        reused = {j for j, _ in self.reuse}
        self.fresh = [j for j in range(len(self.avals)) if j not in reused]
        self.fresh_outputs = [self.outputs_of[j] for j in self.fresh]
        others = [w for w in self.writes if w[2] not in reused]
        # (a quiet replay empties the locations that the step leaves without a tensor, a gradient after
        # ``zero_grad``, with C-level calls; then puts the other results)
        self._emptied = [loc.clearer() for loc, kind, _, _ in others if kind is _NONE]
        self.other_writes = [w for w in others if w[1] is not _NONE]

    def replay(self, flat: list, agree: _Agreement | None = None):
        """Run the step's program on the current buffers and put its results in place; ``MISS`` when an input
        is not device data of the shape, dtype and layout the program was built for, or a buffer it would take
        over is still held elsewhere, or (``agree``: a program over the replicas) another process records this
        call."""
        # Quiet: no op touched the tensors this entry's last replay changed in place, and no other replay ran; so
        # no view of them was read since and no op made another holder of their buffers. Busy: something was
        # recorded meanwhile (a loss accumulator, a scheduler's fill): it runs first, and the buffers the program
        # takes over are checked for holders as on the full path.
        quiet = self._quiet == _quiet_key()
        busy = quiet and self._made != _made()
        settled = graph.nothing_left()  # (then the replay leaves nothing for the next host read to compute either)
        if not quiet or busy:
            # as the region would: pending work first; but a pending concatenation (generate()'s growing ids)
            # stays pending: the verified program read none of it (its inputs are device data, checked below),
            # and computing it would be a program of a new shape each call
            graph.sync_but_concatenations(reason="a captured step")
        for a, b in self.aliases:  # (the program reads one tensor for both: a tensor in ``a`` of its own is not read)
            if a.get(flat) is not b.get(flat):
                return _miss("two places that held one tensor in the verified call now hold different ones")
        leaves = list(self.template)
        inner = {}  # per input: the LazyTensor read from its location
        checked = self._inputs(flat, leaves, inner, quiet)
        if checked is MISS:
            return MISS
        # an input the last replay wrote that is not where it left it (a .data swap): its buffer's holders are
        # not known, so they are counted
        busy = busy or (quiet and len(self.inputs) - len(checked) < self.written_inputs)
        if self.donated and (busy or not quiet) and not _free(leaves, self.donated, self.holders):
            return _miss("a buffer the program takes over is still held elsewhere")
        if agree is not None and not agree(self.program):  # nothing changed yet: the call can still be recorded
            return _miss(_ELSEWHERE)
        counter = rng.get_state()[1]
        for pos, offset in self.keys:
            leaves[pos] = rng.key_leaf(counter + offset, self.device)
        rng.advance(self.drawn)
        args = self._arguments(leaves, checked)
        try:
            outs = graph.launch(self.compiled, args, self.avals)
        except BaseException as e:
            _lost(leaves, self.donated, e)
            raise
        for i in self.donated:
            leaves[i].payload = None
        metrics.inc("executions")
        metrics.inc("capture_replays")
        session.replays += 1
        metrics.inc("device_buffers", devices.buffers(outs))
        metrics.inc("syncs")  # a replayed step is one step's sync
        if quiet and self.reuse and self._reuse_inputs.isdisjoint(checked):
            made = self._reused(leaves, outs)
            collections.deque(map(_call, self._emptied), maxlen=0)
            out = self._put(made, flat, inner, self.other_writes, self._cache)
        else:  # every location is written again: the cache and the watch start afresh
            made = graph.output_leaves(self.compiled, self.outputs_of, outs, self.device, self.made_by)
            self._watch, self._watch_ids = {}, None
            self._fast = None
            out = self._put(made, flat, inner, self.writes, [None] * len(self.inputs))
        self._made = _made()
        ids = self._watch_ids
        if ids is None:  # (a quiet replay that rebinds no location watches what the last one did)
            ids = self._watch_ids = frozenset(i for ids in self._watch.values() for i in ids)
        session.arm_watch(ids)
        self._quiet = _quiet_key()
        if settled:  # its results are device data: the loss's .item() need not walk the live tensors for left-overs
            graph.made_only_data()
        return out

    def _reused(self, leaves: list, outs: list) -> list:
        """The result nodes of a quiet replay: ``reuse``'s are their inputs' nodes, holding the new buffers.

        Why this is exact: the last full replay left each such location's tensor holding that node and synced
        its functionalization (its views were marked stale, and are regenerated from it when next read, by an op
        on a watched LazyTensor); since then no op touched those LazyTensors (quiet), so no view of them was read
        and no op made another holder of the node. The location then reads the new buffer as after an in-place
        update, without the four functionalization calls per tensor (~5 us each) that ``_put`` makes otherwise."""
        results, positions = self._reuse_lists
        nodes = _gather(positions, leaves)
        # (each node takes its new buffer, in C: a program's output, of which no CPU copy exists, lazy/known.py)
        collections.deque(map(setattr, nodes, _PAYLOADS, _gather(results, outs)), maxlen=0)
        made = dict(zip(results, nodes))  # result number -> its node
        fresh = graph.output_leaves(
            self.compiled, self.fresh_outputs, _gather(self.fresh, outs), self.device, self.made_by
        )
        made.update(zip(self.fresh, fresh))
        return made

    def _inputs(self, flat: list, leaves: list, inner: dict, quiet: bool):
        """Each input's node from its location into ``leaves`` (and its LazyTensor into ``inner``), checked against
        the program's; ``MISS`` if one differs. Returns the inputs that were checked: on a quiet replay, those
        still where the last replay put them (``_cache``: weak references to the LazyTensor and node it left
        there) need no check, and are recognised in bulk (``_found``)."""
        ts = list(map(_call, self._getters))
        for k, i in self._from_arguments:
            ts[k] = flat[i]
        for k, loc in self._from_holders:
            ts[k] = loc.get(flat)
        if quiet and self._cache is not _NO_CACHE:
            fast = self._fast or self._fast_plan()
            if self._found(fast, ts, leaves, inner):
                return self._check(fast[4], ts, leaves, inner)
        return self._check(range(len(ts)), ts, leaves, inner)

    def _fast_plan(self) -> tuple:
        """The inputs ``_cache`` knows, as lists for ``_found``: their numbers, weak references to their
        LazyTensors and nodes, their leaf positions; and the other inputs' numbers."""
        known = [k for k, c in enumerate(self._cache) if c is not None]
        cached = [self._cache[k] for k in known]
        others = [k for k in range(len(self.inputs)) if self._cache[k] is None]
        positions = [self.inputs[k][0] for k in known]
        self._fast = (known, [c[0] for c in cached], [c[1] for c in cached], positions, others)
        return self._fast

    def _found(self, fast: tuple, ts: list, leaves: list, inner: dict) -> bool:
        """Whether every input ``_cache`` knows holds the LazyTensor and node the last replay left there (then
        put in ``leaves`` and ``inner``): C-level passes over all of them at once."""
        known, lts, nodes, positions, _ = fast
        if not known:
            return True
        ts = _gather(known, ts)
        if any(map(_is, ts, _NONES)):
            return False
        try:
            held = list(map(_from_functional, ts))
        except (RuntimeError, TypeError):  # (not a functional tensor: the checked path says what it is)
            return False
        lts, nodes = list(map(_call, lts)), list(map(_call, nodes))
        if not (all(map(_is, held, lts)) and all(map(_is, map(_first, map(_VALUE, held)), nodes))):
            return False
        for pos, n in zip(positions, nodes):
            leaves[pos] = n
        inner.update(zip(known, held))
        return True

    def _check(self, ks, ts: list, leaves: list, inner: dict):
        """Inputs ``ks`` (their tensors: ``ts``) checked against what the program takes, into ``leaves`` and
        ``inner``; ``MISS`` at the first that differs, else ``ks`` as a list."""
        for k in ks:
            t = ts[k]
            if t is None:
                return _miss("an input location holds no tensor")
            pos, _, h, layout = self.inputs[k]
            lt = unwrap(t)
            n = lt._value[0]
            if n.op is not _DATA or n.hash != h:
                return _miss("an input is pending, or not of the shape, dtype and layout the program takes")
            if layout is not None and meshes.layout_key(n) != layout:  # (a node's hash does not hold its layout)
                return _miss(f"an input's sharding differs from the verified call's ({_say(self.names[k])})")
            leaves[pos] = n
            inner[k] = lt
        return list(ks)

    def forget(self) -> None:
        """Drop what the last replay left (its locations' tensors): a recorded call comes next."""
        self._cache = _NO_CACHE
        self._fast = None
        self._quiet = None
        self._watch = {}
        self._watch_ids = None

    def _arguments(self, leaves: list, checked: list) -> list:
        """The program's arguments. The buffers the previous replay made (the inputs not ``checked``) are what
        the program returns, so only the others are checked against what it takes (``Compiled.check_argument``: a
        mismatched buffer given to XLA can abort the process); the packed Python numbers are the verified call's."""
        compiled = self.compiled
        data = compiled.layout.data
        replicas = compiled.replicas
        args = list(map(_PAYLOAD, _gather(data, leaves)))
        of = self._data_of
        recheck = [of[k] for k in checked if k in of] + self._constant_data
        for d in recheck:
            args[d] = graph.payload_of(leaves[data[d]])
        keys = [np.stack([leaves[i].payload for i in compiled.layout.keys])] if self.keys else []
        if replicas is not None:  # this process's blocks of the global arguments (as graph.arguments sends them)
            args = replicas.globalize(args + self.packed + keys)
        for d in recheck:
            compiled.check_argument(d, args[d], leaves)
        if replicas is not None:
            return args
        if self.packed:
            args += self._packed_on_device(len(args), leaves)
        if compiled.spmd:  # global arguments: the same numbers on every device (as graph.arguments sends them)
            return args + devices.send(keys, self.device) if keys else args
        return args + devices.passed(keys) if keys else args

    def _packed_on_device(self, first: int, leaves: list) -> list:
        """The packed Python numbers as device arrays, sent once: they are the verified call's in every replay,
        and the program only reads them (it takes over data inputs' buffers alone, ``Compiled.donated``). Passing
        host arrays would copy them in every call (and on XLA's CPU client keep a small program from running
        inline: its inputs would not be ready)."""
        if self._resident is None:
            resident = devices.send(self.packed, self.device)
            for k, a in enumerate(resident):
                self.compiled.check_argument(first + k, a, leaves)
            self._resident = resident
        return self._resident

    def _put(self, made, flat: list, inner: dict, writes: list, cache: list):
        """Put the results ``made`` where ``writes`` say; ``cache`` (kept as the next replay's) learns where
        each input will be found, and ``_watch`` which LazyTensors hold them."""
        new = {}
        self._cache = cache
        for loc, kind, j, k in writes:
            if kind is _SAME:
                t = loc.get(flat)
                lt = inner.get(k)
                if lt is None:
                    lt = unwrap(t)
                set_value(lt, (made[j], 0))
                _replace(t, lt)  # as an in-place op: views of the tensor see the new value
                _commit(t)
                _sync(t)  # its functionalization base takes the value now, as after a recorded step
                if k is not None:  # weakly: the cache must not keep a tensor, or a buffer, alive
                    held = _from_functional(t)
                    cache[k] = (weakref.ref(held), weakref.ref(made[j]))
                    self._fast = None
                    self._watch[k] = (id(held), id(lt))
                    self._watch_ids = None
            elif kind is _NEW:
                loc.set(_fresh(new, made, j, self.avals))
                if k is not None:
                    self._watch[k] = (id(new[j][1]),)
                    self._watch_ids = None
            else:
                loc.set(None)
        values = []
        for d in self.ret:
            if d[0] == "location":
                values.append(d[1].get(flat))
            elif d[0] == "result":
                values.append(_fresh(new, made, d[1], self.avals))
            else:
                values.append(d[2])
        return unflatten(values, self.ret_spec)


def _gather(indices: list, values: list) -> list:
    """``[values[i] for i in indices]``, in C."""
    return list(map(values.__getitem__, indices))


_call = operator.call
_is = operator.is_
_NONES = itertools.repeat(None)
_first = operator.itemgetter(0)
_VALUE = operator.attrgetter("_value")
_PAYLOAD = operator.attrgetter("_payload")
_PAYLOADS = itertools.repeat("_payload")


def _quiet_key() -> tuple:
    """What changes when an op reads or writes a tensor the last replay put in place (``session.touched``), or
    another replay runs (``session.replays``)."""
    return (session.touched, session.replays)


def _made() -> int:
    """How many LazyTensors were made other than fresh uploads and factory results (``session.recorded``, counted
    under the session's lock: a DeviceLoader's thread makes tensors too): when it changed since the last replay,
    something was recorded (pending work, maybe a new holder of a buffer the program takes over)."""
    return session.recorded


def _miss(why: str):
    session.last_miss = why
    metrics.inc("capture_input_misses")
    return MISS


def _fresh(new: dict, made: list, j: int, avals: list) -> torch.Tensor:
    """The user-visible tensor of result ``j`` (one per result, shared by every place it goes)."""
    t = new.get(j)
    if t is None:
        lt = LazyTensor((made[j], 0), avals[j])
        t = new[j] = (wrap(lt), lt)
    return t[0]


def _free(leaves: list, donated: tuple, expected: list) -> bool:
    """Whether the buffers the program takes over are held by as many tensors as in the verified call (the
    locations the step rewrites, and their functionalization bases), and read by no pending graph."""
    taken = {id(leaves[i]): k for k, i in enumerate(donated)}
    counts = [0] * len(donated)
    pending = []
    for t in live_tensors():
        n = t._value[0]
        k = taken.get(id(n))
        if k is not None:
            counts[k] += 1
        elif n.op.__class__ is not Leaf:
            pending.append(t._value)
    if counts != expected:
        return False
    return not pending or not any(id(m) in taken for m in graph.plan_values(pending)[2])


def _lost(leaves: list, donated: tuple, error: BaseException) -> None:
    """The program failed after taking its donated buffers: every tensor that held one (the locations, their
    functionalization bases, aliases) has no value now, and raises when read (as after a recorded step's failure:
    ``graph.ProgramFailedError``); the buffers are dropped, so waiting for the device skips them."""
    consumed = [leaves[i] for i in donated if leaves[i].payload is not None and leaves[i].payload.is_deleted()]
    if not consumed:
        return
    gone = {id(n) for n in consumed}
    for n in consumed:
        n.payload = None
    why = graph.ProgramFailedError(
        f"the captured step's program failed while running ({type(error).__name__}: {error}), after it had taken "
        "the buffers of its donated inputs, so their values are gone (restore them, e.g. from a checkpoint)"
    )
    why.__cause__ = error
    for lt in live_tensors():
        if id(lt._value[0]) in gone:
            set_value(lt, (leaf(Leaf.ERROR, why, lt._aval, lt._value[0].device), 0))


def _spans(compiled) -> bool:
    """Whether a program runs in every process at once: over the replicas, or SPMD over several processes."""
    return compiled.replicas is not None or (compiled.spmd and processes.process_count() > 1)


_ELSEWHERE = "another process records this call (its guards or inputs differ there), so every process records it"


class _Agreement:
    """Whether every process replays this call of a step whose program spans the replicas: a replay in one process
    while another records would run the program's collectives against other ones (a hang, or wrong numbers).

    Every call of such a step meets the other processes' same call once (``processes.meet``, over jax's
    coordination service: host messages, nothing waits for the device; ~1.5 ms of wall and 0.2 ms of CPU time
    per call between 2 processes on a loaded 2-core machine). Each process says which program it is
    about to replay, or that it records; the call is replayed only when all name the same program. Why every
    process takes part in every call: the processes call a step with collectives in lockstep (each call runs
    them), and whether the step spans the replicas is learnt from its first call, which every process records, so
    every process meets the same calls in the same order."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.done = False

    def __call__(self, program: str | None) -> bool:
        """Say this process replays ``program`` (None: records); whether every process replays it."""
        self.done = True
        mine = f"replay {program}" if program is not None else "record"
        try:
            said = processes.meet("capture", f"{mine} {self.name}".encode())
        except processes.DistributedError as e:
            raise processes.DistributedError(
                f"lazyxla.compile(capture=True) of {self.name}: process {processes.process_index()} called the "
                f"step, whose program has collectives, and another process did not within "
                f"{config.distributed_timeout_s} s. Every process must call such a step the same number of times, "
                "in the same order"
            ) from e
        return program is not None and all(p.decode() == f"{mine} {self.name}" for p in said)


class StepCapture:
    """Capture and replay for one ``lazyxla.compile(fn, capture=True)`` function (see the module docstring)."""

    def __init__(self, fn) -> None:
        self.fn = fn
        self.world: World | None = None
        self.entries: dict[tuple, _Entry] = {}
        self.last: dict[tuple, tuple] = {}  # guards -> the signature of the last recorded call from them
        self.status = "not called yet"
        self._warned = False
        self.spans = False  # its program spans the replicas (collectives in a multi-process run): _Agreement

    def __call__(self, region, args: tuple, kwargs: dict):
        flat, spec = flatten((args, kwargs))
        world = self.world
        missed = ""  # why this call, from a known world, is recorded rather than replayed
        agree = _Agreement(getattr(self.fn, "__qualname__", "the step")) if self.spans else None
        if world is not None and self.entries:
            entry = self.entries.get(world.guards(flat, spec, self.fn))
            if entry is not None:
                out = entry.replay(flat, agree)
                if out is not MISS:
                    session.new_epoch()
                    return out
                missed = self.status = f"recorded this call: {session.last_miss}"
            else:
                missed = self.status = "recorded this call: its guards differ from every verified step's"
            metrics.inc("capture_guard_misses")
        if agree is not None and not agree.done:  # this process records: the others must know
            agree(None)
        return self._record(region, args, kwargs, flat, spec, missed)

    def _record(self, region, args, kwargs, flat, spec, missed: str = ""):
        metrics.inc("capture_records")
        for entry in self.entries.values():  # their caches hold tensors, which would keep buffers from donation
            entry.forget()
        # pending work from before the call (an LR scheduler's fill of a tensor learning rate) is not the step's:
        # it runs first, as the region would run it, and the step starts from device data
        graph.sync(reason="a captured step")
        start, why = None, "its first call (the modules and optimizers it uses are not known yet)"
        if self.world is not None:
            try:
                start = _Start(self.world, flat, spec, self.fn)
            except NotCapturable as e:
                why = str(e)
        modules, optimizers, ran = {}, {}, []

        def saw_module(m, _args):
            modules.setdefault(id(m), m)

        def saw_optimizer(o, _args, _kwargs):
            optimizers.setdefault(id(o), o)
            make_capturable(o)

        hooks = [
            torch_module.register_module_forward_pre_hook(saw_module),
            torch_optimizer.register_optimizer_step_pre_hook(saw_optimizer),
        ]
        session.observers.append(ran.append)
        try:
            with region:
                out = self.fn(*args, **kwargs)
        finally:
            for h in hooks:
                h.remove()
            session.observers.remove(ran.append)
        # (every process records a step's first call, and runs the same programs in a recorded call)
        self.spans = self.spans or any(_spans(r.compiled) for r in ran)
        world = World(list(modules.values()), list(optimizers.values()), self.fn)
        if start is not None and not world.same_as(self.world):
            start, why = None, "it called other modules or optimizers than in its previous call"
        self.world = world
        if start is not None:
            try:
                self._verify(_build(world, start, ran, flat, out), missed)
                return out
            except NotCapturable as e:
                why = str(e)
        self._refused(why)
        return out

    def _verify(self, cand: _Candidate, missed: str = "") -> None:
        """Keep ``cand``'s signature, or make it an entry when the last recorded call from its guards had the same;
        ``missed``: why this call was recorded rather than replayed (kept in the status until it verifies)."""
        sig = cand.signature()
        last = self.last.get(cand.guards)
        if last == sig:
            entry = self.entries.get(cand.guards)
            # a verified entry from the same guards that differs (an input laid out anew, a .data swap: what a
            # replay checks beyond the guards) is replaced: the step now runs this one
            if entry is None or entry.signature != sig:
                if entry is None and len(self.entries) >= _MAX_ENTRIES:
                    self.entries.pop(next(iter(self.entries)))
                self.entries[cand.guards] = _Entry(cand, sig)
                metrics.inc("capture_verified")
            self.status = "replaying"
        else:
            self.last[cand.guards] = sig
            while len(self.last) > _MAX_ENTRIES:
                self.last.pop(next(iter(self.last)))
            then = "recorded once from these guards: the next equal call verifies it"
            self.status = f"{missed}; {then}" if missed else then

    def _refused(self, why: str) -> None:
        self.status = f"recorded, not captured: {why}"
        metrics.inc("capture_refusals")
        if not self._warned and not why.startswith("its first call"):
            self._warned = True
            warnings.warn(
                f"lazyxla.compile(capture=True) of {getattr(self.fn, '__qualname__', self.fn)}: a call was recorded "
                f"and cannot be replayed: {why}",
                stacklevel=4,
            )
