"""sync(): turn pending tensors into device data by compiling (once) and running their graph."""

from __future__ import annotations

import dataclasses
import gc
import math
import os
import time
import weakref

from lazyxla.config import config
from lazyxla.device import devices, processes
from lazyxla.device.devices import x64
from lazyxla.device.meshes import ask, layouts, uneven_constraint
from lazyxla.ir import Leaf, Node, digest, leaf, op_hash, raise_if_error, rewired, wiring
from lazyxla.lazy import pieces, rebase, views
from lazyxla.lazy.cut import Cut, holds_no_work, left_over, remember
from lazyxla.lazy.session import session
from lazyxla.lazy.tensor import LazyTensor, live_tensors, retarget, set_value
from lazyxla.lowering import cache
from lazyxla.observe import diagnostics, metrics, profiler
from lazyxla.util import atomic_write

# how a program's output leaves name their origin (``Node.source``), which ``made_by_program`` reads back
OUTPUT_SOURCE = "an output of graph"


def _walk(roots):
    """Post-order of computation nodes, leaves in first-visit order, and the graph's sharing events.

    Root hashes fix the graph up to sharing; the events (edge number -> earlier node) make the key
    exact: two graphs with equal hashes and equal events are the same program.
    """
    order, leaves, events = [], [], []
    ref: dict[int, int] = {}
    edge = 0
    stack = [(m, False, -1) for m, _ in reversed(roots)]
    while stack:
        n, expanded, e = stack.pop()
        if expanded:
            order.append(n)
            continue
        k = id(n)
        if k in ref:
            events.append((e, ref[k]))
            continue
        ref[k] = len(ref)
        if n.op.__class__ is Leaf:
            leaves.append(n)
            continue
        stack.append((n, True, -1))
        for m, _ in reversed(n.inputs):
            edge += 1
            stack.append((m, False, edge))
    return order, leaves, tuple(events)


def plan(tensors: list[LazyTensor]) -> tuple[list, list, list, tuple]:
    """The graph computing ``tensors``: its roots (distinct values, in hash order), computation nodes in
    post-order, leaves, and sharing events (see ``_walk``)."""
    return plan_values([t._value for t in tensors])


def plan_values(values_: list[tuple]) -> tuple[list, list, list, tuple]:
    """``plan`` for IR values ``(node, output index)`` rather than tensors."""
    values = {}
    for v in values_:
        values.setdefault((id(v[0]), v[1]), v)
    roots = sorted(values.values(), key=lambda v: (v[0].hash, v[1]))
    return (roots, *_walk(roots))


def _run(device: int, tensors: list[LazyTensor], keep: set | None, site: str, report: SyncReport) -> None:
    """Compute ``tensors`` on ``device``. ``keep``: None, or donate the inputs that no live tensor holds
    afterwards and that are not in ``keep`` (ids of leaves that graphs left pending still read)."""
    with metrics.timer("trace"):
        roots, order, leaves, events = plan(tensors)
        donate = _donatable(leaves, tensors, keep) if keep is not None and config.donate else ()
        key = _key(device, roots, leaves, events, donate)
    for region in diagnostics.active_regions():
        region.saw(key, order, leaves)
    if devices.spmd_enabled() and config.spmd_check_programs:
        _check_same_program(roots, leaves, site)
    missed = not cache.holds(key)
    if missed and config.explain_recompiles:
        diagnostics.explain_miss(site, order, leaves, donate)
    started = time.perf_counter()
    try:
        compiled = cache.get(key, order, leaves, roots, device, donate)
        built_s = time.perf_counter() - started
        if missed and config.dump_dir:
            _dump(key, order, leaves, roots, device)
        args = arguments(compiled, leaves, device)
    except BaseException:
        # Lowering, compiling or the argument check failed: nothing ran, so nothing changes. Every tensor
        # keeps its recorded value; the tensors that need a failing op raise again when read, and once the
        # user drops them the next sync runs the rest (DESIGN.md, decision 10).
        tensors = None  # noqa: F841  (the traceback keeps this frame: it must not keep the tensors alive)
        raise
    try:
        outs = launch(compiled, args, [m.avals[i] for m, i in roots])
    except BaseException as e:
        _failed_while_running(tensors, order, leaves, compiled, e, device)
        tensors = args = None  # noqa: F841  (as above)
        raise
    metrics.inc("executions")
    metrics.inc("nodes_executed", len(order))
    metrics.inc("device_buffers", devices.buffers(outs))
    donated = sum(_nbytes(leaves[i].avals[0]) for i in compiled.donated)
    report.programs.append(
        ProgramReport(
            graph=graph_id(key),
            compiled=missed,
            build_ms=built_s * 1e3 if missed else 0.0,
            nodes=len(order),
            inputs=len(compiled.layout.data),
            donated_bytes=donated,
            new_bytes=sum(_nbytes(m.avals[i]) for m, i in roots) - donated,
            trigger=site,
        )
    )
    for i in compiled.donated:  # the buffer now belongs to an output; nothing may read it again
        leaves[i].payload = None
    made_by = f"{OUTPUT_SOURCE} {report.programs[-1].graph}"  # names the buffers' origin in errors
    made = output_leaves(compiled, outputs_of(roots, compiled), outs, device, made_by)
    new = {(id(m), i): (out, 0) for (m, i), out in zip(roots, made)}
    retarget(tensors, [new[(id(t._value[0]), t._value[1])] for t in tensors])
    for observe in session.observers:
        observe(Ran(key, compiled, leaves, roots, made, device))


def launch(compiled, args: list, avals: list) -> list:
    """Run a compiled program on its checked arguments; its output arrays, one per root (``avals``: theirs), this
    process's blocks of them in a program over the replicas."""
    with metrics.timer("execute"), x64():
        outs = compiled.executable(*args)
    if compiled.replicas is not None:
        outs = compiled.replicas.localize(outs, avals)
    return outs


def outputs_of(roots: list, compiled) -> list[tuple]:
    """What ``output_leaves`` needs of each root: its aval, its device-data leaf's hash, and in SPMD its uneven
    layout (or None)."""
    return [
        (m.avals[i], op_hash(Leaf.DATA, m.avals[i], m.device), uneven_constraint(m) if compiled.spmd else None)
        for m, i in roots
    ]


def output_leaves(compiled, outputs: list[tuple], outs: list, device: int, made_by: str) -> list:
    """Device-data leaves for a program's output arrays (``outputs``: from ``outputs_of``); ``made_by`` names
    them in errors."""
    made = []
    for (aval, h, uneven), arr in zip(outputs, outs):
        out = Node(Leaf.DATA, (), None, (aval,), h, arr, device)  # (ir.leaf, with the hash computed once)
        out.source = made_by
        if uneven:  # its buffer has the even layout: remember this one
            ask(out, *uneven)
        made.append(out)
    return made


@dataclasses.dataclass
class Ran:
    """A program a sync ran, as ``observers`` see it: its cache key, the compiled program, the leaves it read
    (donated ones now without payload), its roots and the device-data leaves it made for them (in roots' order)."""

    key: tuple
    compiled: object
    leaves: list
    roots: list
    made: list
    device: int


def _key(device: int, roots, leaves, events, donate) -> tuple:
    """The compile cache's key of a walked graph (``plan``) run with ``donate``."""
    return (
        device,
        tuple((m.hash, i) for m, i in roots),
        tuple(leaf.avals[0] for leaf in leaves),
        events,
        tuple(donate),  # a program donates buffers: one compiled for other donations would free held data
        layouts(leaves) if devices.spmd_enabled() else None,
        config.compile_key(),
    )


def cache_key(tensors: list[LazyTensor]) -> tuple:
    """The compile cache's key of the program that would compute ``tensors`` (donating nothing); nothing runs.

    Example::

        assert graph.cache_key([a]) == graph.cache_key([b])      # same graph, other values
    """
    roots, _, leaves, events = plan(tensors)
    return _key(roots[0][0].device, roots, leaves, events, ())


def made_by_program(n) -> bool:
    """Whether device-data leaf ``n`` holds an output of a program a sync ran (not a copy from the host, nor a
    layout ``mark_sharding`` made): in SPMD mode its layout is the one XLA's partitioner chose."""
    return isinstance(n.source, str) and n.source.startswith(OUTPUT_SOURCE)


def key_layouts(key: tuple) -> tuple | None:
    """The layouts of the leaves (by position, canonical: ``meshes.layouts``) a program's key (``_key``) was made
    for, in SPMD mode; None outside it."""
    return key[5]


def prepare(values: list[tuple]) -> bool:
    """Build (compile, or load from disk) the program of the nodes of the IR ``values`` alone, their inputs as its
    parameters: nothing runs and no tensor changes. Returns whether a program was built (False: the cache held it).

    A pending input stands in as device data of its shape (its own work is not part of this program); when every
    input already holds data, this is the very program that a read of ``values`` runs, so that read compiles
    nothing more. For ``torch.compile(backend='openxla')``, which compiles a graph when it is called, as torch_xla
    does (``frontend/dynamo.py``).

    Example::

        graph.prepare([(n, 0)])      # n's program is in the compile cache; n's value is still pending
    """
    stand_ins: dict[tuple[int, int], tuple] = {}

    def parameter(m, i) -> tuple:
        if m.op.__class__ is Leaf:
            return (m, i)
        if (id(m), i) not in stand_ins:
            stand_ins[(id(m), i)] = (leaf(Leaf.DATA, None, m.avals[i], m.device), 0)
        return stand_ins[(id(m), i)]

    alone = {}
    for n, _ in values:
        if id(n) not in alone:
            alone[id(n)] = rewired(n, tuple(parameter(m, i) for m, i in n.inputs))
    roots, order, leaves, events = plan_values([(alone[id(n)], i) for n, i in values])
    device = roots[0][0].device
    key = _key(device, roots, leaves, events, ())
    if cache.holds(key):
        return False
    cache.get(key, order, leaves, roots, device, ())
    return True


def arguments(compiled, leaves, device: int) -> list:
    """The program's arguments, checked against what it was compiled for (no mismatched buffer reaches XLA).
    The packed scalars and RNG keys go with the call on one device (jax copies them; counted, not timed apart),
    and are copied to every device first in SPMD mode (the same values in every process)."""
    layout = compiled.layout
    args = layout.arguments([payload_of(leaves[i]) for i in layout.data], leaves)
    n = len(layout.data)
    if compiled.replicas is not None:
        args = compiled.replicas.globalize(args)
    elif compiled.spmd and len(args) > n:
        args[n:] = devices.send(args[n:], device)
    elif len(args) > n:
        args[n:] = devices.passed(args[n:])
    compiled.check_arguments(args, leaves)
    return args


class ProgramFailedError(RuntimeError):
    """A program failed while running after it had taken (been donated) the buffers of its inputs."""


def _failed_while_running(tensors, order, leaves, compiled, error: BaseException, device: int) -> None:
    """The program was launched and failed. Inputs it did not consume are intact, so tensors that need
    none of the consumed ones keep their recorded values (a later sync computes them again); the others
    can never be computed: they are marked, and raise ``ComputeError`` when read or used."""
    consumed = [leaves[i] for i in compiled.donated if leaves[i].payload is not None and leaves[i].payload.is_deleted()]
    if not consumed:
        return
    lost = {id(n) for n in consumed}
    for n in order:  # post-order: a node is lost when one of its inputs is
        if any(id(m) in lost for m, _ in n.inputs):
            lost.add(id(n))
    for n in consumed:
        n.payload = None
    lines = str(error).strip().splitlines() or [""]
    brief = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"  # (a callback's error holds a traceback)
    why = ProgramFailedError(
        f"the program computing it failed while running ({type(error).__name__}: {brief}), after it had taken "
        f"the buffers of {len(consumed)} input(s) donated to it, so the values it needed are gone (restore them, "
        "e.g. from a checkpoint). lazyxla.config.donate = False keeps every input through such a failure, at "
        "the cost of memory"
    )
    why.__cause__ = error
    for t in tensors:
        m, i = t._value
        if id(m) in lost:
            set_value(t, (leaf(Leaf.ERROR, why, m.avals[i], device), 0))


def _check_same_program(roots, leaves, site: str) -> None:
    """Multi-process SPMD: every process must run this program now (``config.spmd_check_programs``)."""
    if processes.process_count() == 1:
        return
    program = digest(None, leaves, roots, size=8)  # by the roots' hashes: O(roots), at every sync
    try:
        seen = processes.rendezvous("spmd program", f"{program} {site}".encode())
    except processes.DistributedError as e:
        raise processes.DistributedError(
            f"lazyxla SPMD: this process is about to run a program ({site}) that another process did not reach "
            f"within {config.distributed_timeout_s} s. In multi-process SPMD every process runs every program: "
            "read values (.item(), print) on every process, not on the master only, and sync at the same places"
        ) from e
    mine = processes.process_index()
    others = [(i, p.decode().split(" ", 1)) for i, p in enumerate(seen)]
    if any(prog != program for _, (prog, _) in others):
        where = "; ".join(f"process {i}: {w}" for i, (_, w) in others)
        raise processes.DistributedError(
            f"lazyxla SPMD: the processes are about to run different programs ({where}); this is process {mine}. "
            "In multi-process SPMD every process runs the same programs: record the same ops and read values "
            "(.item(), print) on every process, not on the master only"
        )


def _nbytes(aval) -> int:
    return math.prod(aval.shape) * aval.dtype.itemsize


def graph_id(key) -> str:
    """A short name for a program: 16 hex digits of its cache key's hash (stable within a process)."""
    return f"{hash(key) & 0xFFFFFFFFFFFFFFFF:016x}"


def _dump(key, order, leaves, roots, device) -> None:
    """``config.dump_dir``: write the program's StableHLO and lazy IR, named by its graph id."""
    folder = os.path.expanduser(config.dump_dir)
    os.makedirs(folder, exist_ok=True)
    name = os.path.join(folder, graph_id(key))
    texts = {
        ".stablehlo.mlir": cache.lower(order, leaves, roots, device).as_text(),
        ".ir.txt": ir_text(order, leaves, roots),
    }
    for suffix, text in texts.items():
        atomic_write(name + suffix, text.encode())


def ir_text(order, leaves, roots) -> str:
    """The lazy IR of a graph, one node per line (leaves first, with the recording line if kept)."""
    nodes = [*leaves, *order]
    edges, outs = wiring(order, leaves, roots)

    def ref(k, i):
        return f"%{k}" + (f"[{i}]" if len(nodes[k].avals) > 1 else "")

    lines = [f"%{k} = {n.op.value} {list(n.avals[0].shape)} {n.avals[0].dtype}" for k, n in enumerate(leaves)]
    for k, (n, ins) in enumerate(zip(order, edges), len(leaves)):
        args = ", ".join(ref(p, i) for p, i in ins)
        outputs = ", ".join(f"{list(a.shape)} {a.dtype}" for a in n.avals)
        where = f"  # {n.source}" if n.source else ""
        lines.append(f"%{k} = {n.op}({args}) -> {outputs}{where}")
    lines.append("return " + ", ".join(ref(p, i) for p, i in outs))
    return "\n".join(lines)


@dataclasses.dataclass
class ProgramReport:
    """One program a sync ran."""

    graph: str  # the program's id (the dump files' name)
    compiled: bool  # built now (compiled, or loaded from the disk cache) rather than found in memory
    build_ms: float  # time to build it, when it was built
    nodes: int  # IR nodes in its graph
    inputs: int  # device buffers it read
    donated_bytes: int  # input buffers its outputs took over
    new_bytes: int  # output bytes in new buffers
    trigger: str  # what caused the sync, and where

    def __str__(self) -> str:
        how = f"compiled in {self.build_ms:.0f} ms" if self.compiled else "cache hit"
        return (
            f"graph {self.graph}: {how}, {self.nodes} nodes, {self.inputs} inputs, "
            f"{_mb(self.donated_bytes)} donated, {_mb(self.new_bytes)} new ({self.trigger})"
        )


def _mb(n: int) -> str:
    return f"{n / 2**20:.2f} MB" if n >= 2**16 else f"{n} B"


@dataclasses.dataclass
class SyncReport:
    """What one ``lazyxla.sync()`` did: the programs it ran and the host-to-device transfers since the
    previous sync (``str()`` gives one line per program)."""

    programs: list = dataclasses.field(default_factory=list)
    host_to_device: int = 0

    @property
    def compiled(self) -> bool:
        """Whether any program had to be built."""
        return any(p.compiled for p in self.programs)

    def __str__(self) -> str:
        lines = [str(p) for p in self.programs] or ["nothing to compute"]
        lines.append(f"{self.host_to_device} host-to-device transfers since the previous sync")
        return "\n".join(lines)


def payload_of(n):
    """A data leaf's device array (scalars and RNG keys travel packed: see ``to_jax.ArgLayout``)."""
    raise_if_error(n)
    if n.payload is None:
        raise RuntimeError("lazyxla internal error: a donated buffer was used again")
    return n.payload


# Device data whose jax.Array the user holds too (``lazyxla.to_jax``, ``lazyxla.from_jax``): never donated, since
# donation deletes the array (a weak set: an entry leaves with its node)
SHARED: weakref.WeakSet = weakref.WeakSet()


def _donatable(leaves, pending, keep: set) -> list[int]:
    """Inputs no live tensor holds after this step, nor a graph left pending (``keep``), nor the user as a jax.Array
    (``SHARED``): their buffers can be donated to its outputs."""
    pending_ids = {id(t) for t in pending}
    held = {id(t._value[0]) for t in live_tensors() if id(t) not in pending_ids}
    return tuple(
        i
        for i, n in enumerate(leaves)
        if n.op is Leaf.DATA and id(n) not in held and id(n) not in keep and (not SHARED or n not in SHARED)
    )


def _run_groups(pending: list, keep: set | None, trigger: str, report: SyncReport) -> None:
    """Run each device's program for the ``pending`` tensors (the list is emptied).

    A failure's traceback keeps the frames it passed (a logged exception keeps it for long), and they
    must not keep the tensors alive: the user drops the tensor that needs a failing op and syncs again.
    So no frame here holds them once their program has failed (``_run`` drops its own reference).
    """
    groups = _group(pending)
    pending.clear()
    for device in list(groups):
        _run(device, groups.pop(device), keep, trigger, report)


def _group(tensors):
    by_device: dict[int, list] = {}
    for t in tensors:
        by_device.setdefault(t._value[0].device, []).append(t)
    return by_device


def sync(wait: bool = False, reason: str = "lazyxla.sync()") -> SyncReport:
    """Compile (once per graph) and run every pending lazyxla computation; returns a :class:`SyncReport`.

    Returns as soon as the work is queued on the device; host reads (``.item()``, ``.cpu()``) wait
    for it. ``wait=True`` blocks until the device has finished.

    Example::

        loss = model(x).sum(); loss.backward(); opt.step()
        report = lazyxla.sync()          # one XLA program for the whole step
        print(report)                    # graph id, cache hit or compile time, nodes, bytes donated
    """
    metrics.inc("syncs")
    session.new_epoch()
    report = SyncReport()
    with profiler.step():
        pending = [t for t in live_tensors() if t._value[0].op.__class__ is not Leaf]
        session.left_pending.clear()
        session.quiet_at = None
        if pending:
            site = diagnostics.note_sync(reason)
            pending, derived, keep = rebase.split(pending)  # a view's base is not an output too: lazy/rebase.py
            pending, views, bases, reads = pieces.split(pending)  # nor an iterated tensor's pieces: lazy/pieces.py
            _run_groups(pending, keep | reads, f"{reason} at {site}", report)
            rebase.rederive(derived)
            pieces.repoint(views, bases)
    transfers = metrics.counters()["host_to_device"]
    report.host_to_device = transfers - session.transfers_at_last_sync
    session.transfers_at_last_sync = transfers
    _freeze_gc_once()
    if wait:
        wait_device_ops()
    return report


_gc_frozen = False


def sync_but_concatenations(reason: str) -> None:
    """``sync()``, except that a pending concatenation stays pending with its pieces computed, and so do views of
    device data (as a host read with ``host_read_computes="all"`` leaves them): the pending work before a replayed
    captured step, whose program reads none of them (its inputs are device data in known locations, checked).

    Why: a generation loop grows its ids by one ``torch.cat`` per token, which it reads only at its end; computing
    that concatenation before each token's step would be a program of a new shape, compiled, at every token.

    Example::

        sync_but_concatenations("a captured step")
    """
    if not any(views.is_concatenation(t._value[0].op) for t in live_tensors()):
        sync(reason=reason)  # nothing to leave pending: the region's own sync, the programs lazy mode runs
        return
    want = _all_pending_but_concatenations()
    if want:
        metrics.inc("syncs")
        session.new_epoch()
        _compute(want, True, f"{reason} at {diagnostics.note_sync(reason)}")


def _freeze_gc_once() -> None:
    """``config.freeze_gc``: the first full sync freezes what is alive then (see the flag's help)."""
    global _gc_frozen
    if not _gc_frozen and config.freeze_gc:
        _gc_frozen = True
        gc.collect()  # garbage still in reference cycles would be frozen with the rest, and never freed
        gc.freeze()


def sync_tensors(tensors: list[LazyTensor], reason: str = "host read", host_read: bool = False) -> None:
    """Compute these tensors, with every live tensor whose value their program computes on the way, and the
    values that tensors left pending take from that work.

    Those become device data too: a later read that needs one starts from it instead of computing it again in
    a graph that grows with every read. (LBFGS reads the host several times per iteration while its history,
    gradients and parameters stay live: each read's graph held all earlier iterations, every read compiled a
    new, larger program, and the default LBFGS exhausted the process's memory maps inside its first step.
    A generation loop reads whether to stop after each token while the cache position, the position ids and
    the generated ids get their next values from the token's work: ``lazy/cut.py``.)

    ``host_read``: a read of values by the host (``.item()``, ``.cpu()``, ``print``). Work that the previous
    host read left pending and this one does not need is computed too, in a program of its own (a loop whose
    reads need none of its work would otherwise pile it all up until something reads it). With
    ``config.host_read_computes == "all"`` the read computes every pending tensor, as ``sync()`` does, except
    pending concatenations (their pieces are computed), donating what no tensor holds afterwards.

    In a multi-process run a read computes what it needs and the live tensors on the way, nothing more, and
    leaves the other graphs as they are: a read on one process only (``if rank == 0: print(loss.item())``)
    must neither run collectives the other processes do not, nor reshape the graphs of the step they all run
    next (with a cut on rank 0 only, the two ranks' step programs, built from differently cut graphs, met in
    gloo with mismatched all-reduce sizes and the run aborted).
    """
    policy = ReadPolicy.of(host_read)
    if policy.counts_epoch:
        session.new_epoch()
    want = [t._value for t in tensors if t._value[0].op.__class__ is not Leaf]
    if not want:
        if policy.left_over:
            _read_needing_nothing(reason, policy)
        return
    metrics.inc("syncs")
    trigger = f"{reason} at {diagnostics.note_sync(reason)}"
    if policy.everything:
        want += _all_pending_but_concatenations()
    _compute(want, policy.donates, trigger, cut=policy.cuts)
    if policy.left_over:
        _compute_left_over(trigger)


@dataclasses.dataclass(frozen=True)
class ReadPolicy:
    """What one read of values computes besides the values it needs, decided once per read (``ReadPolicy.of``).

    Example::

        ReadPolicy.of(host_read=True)    # one process: cuts, counts the epoch, computes left-over work
    """

    everything: bool  # every pending tensor but concatenations (``config.host_read_computes == "all"``)
    donates: bool  # what no tensor holds afterwards, as a sync does (only when computing everything)
    cuts: bool  # the graphs it leaves pending take their values from its work (lazy/cut.py)
    counts_epoch: bool  # the read starts a new epoch (lazy/positions.py)
    left_over: bool  # the work the previous host read left pending, in a program of its own

    @staticmethod
    def of(host_read: bool) -> ReadPolicy:
        """The policy of a read: ``host_read``, a read of values by the host (``.item()``, ``.cpu()``), or a
        read the runtime needs (a fallback's arguments, a collective's, a data-dependent shape).

        In a multi-process run a read computes what it needs and the live tensors on the way, nothing more (see
        ``sync_tensors``): no cut, no epoch, no left-over work, never everything.
        """
        alone = processes.process_count() == 1
        everything = host_read and alone and _computes_all()
        return ReadPolicy(
            everything=everything, donates=everything, cuts=alone, counts_epoch=alone, left_over=host_read and alone
        )


def compute_now(tensors: list[LazyTensor], trigger: str) -> None:
    """Compute the pending ones of ``tensors`` at once and rebind them to their results, donating nothing and
    marking no step: eager mode's execution of one op (``lazy/eager.py``). ``executions`` counts the program as
    any. A failure raises here, at the op, and changes nothing (the failure model of a sync)."""
    pending = [t for t in tensors if t._value[0].op.__class__ is not Leaf]
    if pending:
        _run_groups(pending, None, trigger, SyncReport())


def _compute(want: list[tuple], donate: bool, trigger: str, cut: bool = True) -> None:
    """Run the program of the values ``want``, rebinding every live tensor it computes and (``cut``) cutting the
    others at its work (``lazy/cut.py``); ``donate``: as a sync does, keeping what the pending graphs read."""
    computed = {id(n) for n in plan_values(want)[1]}
    pending, others = [], []
    for t in live_tensors():
        n = t._value[0]
        if id(n) in computed:
            pending.append(t)
        elif n.op.__class__ is not Leaf:
            others.append(t)
    frontier = Cut([t._value for t in others] if cut else [], computed)
    pending += frontier.holders  # the values other pending tensors take from this work: computed with it
    try:
        _run_groups(pending, frontier.leaves if donate else None, trigger, SyncReport())
    finally:
        frontier.rebind(others)
        others = None  # noqa: F841  (a failure's traceback keeps this frame: see _run_groups)


def _read_needing_nothing(reason: str, policy: ReadPolicy) -> None:
    """A host read of values that are already there (device data, or known values: ``lazy/known.py``) is
    still a host read: it computes the work the previous read left pending (with ``host_read_computes="all"``,
    every pending tensor), so a loop whose reads need nothing of its work (generation without an
    end-of-sequence token: the max-length criterion's flags are known values) does not pile it all up."""
    trigger = f"{reason} at {diagnostics.user_frame(3)}"
    if policy.everything:
        want = _all_pending_but_concatenations()
        if want:
            _compute(want, policy.donates, trigger)
    _compute_left_over(trigger)


def _compute_left_over(trigger: str) -> None:
    """After a host read: compute the work that was pending already at the previous host read *at the same site*
    (not concatenations: ``lazy/view_reads.py`` reads their last piece without them), then remember, for this
    site, what is pending now.

    The rule is for a loop whose reads need none of its work (generation's stopping check, run each token at the
    same line): without it the work would pile up until something reads it. Keyed on the read's site, it leaves
    alone two reads at different lines of one pass (transformers' two reads of the padding mask a few ops into a
    forward: before, the second computed the embedding in a program of its own, cutting every SFTTrainer step).

    It runs in a program of its own, so the read's own program stays the same whatever was left over, and a
    failure in that work (a broken rule, a failed compile) changes nothing: its tensors keep their graphs and
    raise when they are read (DESIGN.md, decision 10). Such a failure is counted (``left_over_failures``) and kept
    in ``session.left_over_error`` for debugging, not raised here: the read that met it did not need that work.
    """
    if session.quiet_at == session.made:  # nothing made since a read that left nothing to compute
        return
    site = trigger.split(" (via ", 1)[0]  # the read and its line, whichever library frame made it
    values = [t._value for t in live_tensors() if t._value[0].op.__class__ is not Leaf]
    stale = left_over(values, session.left_pending.get(site, {}))
    if stale:
        try:
            _compute(stale, False, f"{trigger} (work the previous read left pending)")
        except Exception as e:  # nothing ran and nothing changed: the error comes back at their read
            metrics.inc("left_over_failures")
            session.left_over_error = e
        values = [t._value for t in live_tensors() if t._value[0].op.__class__ is not Leaf]
    session.left_pending[site] = remember(values)
    session.quiet_at = session.made if not left_over(values, session.left_pending[site]) else None
    session.quiet_recorded = session.recorded


def nothing_left() -> bool:
    """Whether nothing a host read would compute was recorded since a read that left nothing pending
    (``_compute_left_over``): only fresh uploads and factory results were made since (a loader's next batch; a
    pending factory result is left for a later read, which it costs nothing to wait for). Whole-step capture asks
    before a replay (``made_only_data``)."""
    return session.quiet_at is not None and session.quiet_recorded == session.recorded


def made_only_data() -> None:
    """Say that every LazyTensor made since ``nothing_left()`` was last true holds device data or a view of it (a
    replayed step's results): the next host read still has nothing to compute, and skips its walk over every live
    tensor (~250 of them after a small GPT's step: a third of a replayed step's own host time).

    Example::

        settled = nothing_left()
        ...  # run a program, put its results in place as device data
        if settled:
            made_only_data()
    """
    session.quiet_at = session.made
    session.quiet_recorded = session.recorded


_HOST_READ_COMPUTES = ("needed", "all")


def _computes_all() -> bool:
    mode = config.host_read_computes
    if mode not in _HOST_READ_COMPUTES:
        raise ValueError(f"lazyxla.config.host_read_computes is {mode!r}; expected one of {_HOST_READ_COMPUTES}")
    return mode == "all"


def _all_pending_but_concatenations() -> list[tuple]:
    """The values of every pending live tensor, where a pending ``cat`` stands for its pending pieces: the
    concatenation stays pending (``lazy/view_reads.py`` reads its last piece without it), and so do views of device
    data (``cut.holds_no_work``: ``lazy/view_reads.py`` reads through them)."""
    want, stack = [], [t._value for t in live_tensors()]
    while stack:
        n, i = stack.pop()
        if views.is_concatenation(n.op):
            stack.extend(n.inputs)
        elif n.op.__class__ is not Leaf and not holds_no_work(n):
            want.append((n, i))
    return want


def wait_device_ops() -> None:
    """Block until every device buffer that live tensors hold is computed.

    Example::

        lazyxla.sync(); lazyxla.wait_device_ops()   # e.g. before timing
    """
    for t in live_tensors():
        n = t._value[0]
        if n.op is Leaf.DATA and n.resident is not None:  # a known value not on the device has nothing to wait for
            n.resident.block_until_ready()
