"""The ``lazyxla`` backend of ``torch.distributed``: its collectives are lazyxla's in-graph collectives.

``dist.init_process_group("lazyxla")`` (``env://``: the variables torchrun sets, which ``lazyxla.spawn``
sets too) gives a process group whose collectives on lazyxla tensors are recorded into the step's
graph like ``lazyxla.all_reduce``, so ``DistributedDataParallel`` and plain ``dist.all_reduce`` run
inside the compiled step. Collectives on CPU tensors (small metadata some libraries exchange) go
through the run's coordination service on the host, in lazyxla's wire encoding (never pickled). Each
call returns a completed ``Work``: the result is a lazy value, computed with the rest of the step.

``send``/``recv`` are not recorded: the two processes meet at once (the others take no part), agree on the
tensor's shape and dtype through the coordination service, and run XLA's collective permute in a program of
their two devices (device tensors; its pending work is computed first) or pass the value through the service
(CPU tensors). The received value is written into the receiver's tensor.

A group of some replicas (``dist.new_group(ranks)``, the per-dimension groups of
``init_device_mesh("lazyxla", (2, 2))``) records its collectives with XLA's replica groups: a partition of
every replica, each replica running the same collective. So every rank must call the collective at the same
point, each on its own group of that partition (as SPMD code over a DeviceMesh does), and the groups must
split the replicas into equal parts. The partition is learnt at the first collective on device tensors: every
process says its group's ranks through the coordination service.
"""

from __future__ import annotations

import json

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from lazyxla import torch_private
from lazyxla.device import devices, processes, wire
from lazyxla.ir import Leaf, leaf
from lazyxla.lazy import subclass_relay
from lazyxla.lazy.graph import sync, sync_tensors
from lazyxla.lazy.special import SPECIAL, SPECIAL_BY_NAME
from lazyxla.lazy.tensor import LazyTensor, unwrap, wrap
from lazyxla.lowering.replica import permute_pair
from lazyxla.parallel import fsdp_ops
from lazyxla.parallel.collectives import ReduceOp, all_gather, all_reduce, all_to_all, broadcast, reduce_scatter

_OPS = {
    dist.ReduceOp.SUM: ReduceOp.SUM,
    dist.ReduceOp.PRODUCT: ReduceOp.MUL,
    dist.ReduceOp.MIN: ReduceOp.MIN,
    dist.ReduceOp.MAX: ReduceOp.MAX,
    dist.ReduceOp.BAND: ReduceOp.AND,
    dist.ReduceOp.BOR: ReduceOp.OR,
}


def _op(reduce_op) -> tuple[ReduceOp, bool]:
    """lazyxla's op for a torch.distributed ReduceOp, and whether it is AVG (a SUM scaled by 1/world)."""
    if reduce_op == dist.ReduceOp.AVG:
        return ReduceOp.SUM, True
    for theirs, ours in _OPS.items():
        if reduce_op == theirs:
            return ours, False
    raise NotImplementedError(
        f"the lazyxla process group has no reduce op {reduce_op}; use SUM, AVG, PRODUCT, MIN, MAX, BAND or BOR"
    )


def done(result) -> object:
    """A completed ``Work`` holding ``result`` (every collective here completes at the call)."""
    fut = torch.futures.Future()
    fut.set_result(result)
    return torch_private.work_from_future(fut)


def _on_device(tensors) -> bool:
    kinds = {t.device.type for t in tensors}
    if len(kinds) > 1:
        raise ValueError(f"the lazyxla process group got tensors on several devices ({sorted(kinds)}) in one call")
    return kinds == {devices.torch_name()}


def _copy_into(outputs, results) -> None:
    with torch.no_grad():
        for o, r in zip(outputs, results):
            o.copy_(r)


class LazyxlaProcessGroup(ProcessGroup):
    """torch.distributed's process group over lazyxla's replicas (created by ``init_process_group``)."""

    def __init__(self, rank: int, size: int) -> None:
        super().__init__(rank, size)
        self._rank, self._size = rank, size
        self._host_calls = 0
        self._name, self._desc = "", ""
        self._partition: list[list[int]] | None = None  # (a group of some replicas: _groups)

    def getBackendName(self) -> str:
        return "lazyxla"

    # PyTorch keeps a group's name and description on its backends (C++), and a process group written in Python
    # has none, so its own getters raise "ProcessGroup name not set" (DeviceMesh reads ``group_name``): this
    # group keeps them itself.
    def _set_group_name(self, name: str) -> None:
        self._name = name

    def _set_group_desc(self, desc: str) -> None:
        self._desc = desc

    @property
    def group_name(self) -> str:
        return self._name

    @property
    def group_desc(self) -> str:
        return self._desc

    def size(self) -> int:
        return self._size

    def _groups(self) -> list[list[int]] | None:
        """The replica groups of the collectives (None: every replica in one group, this group); for a group
        of some replicas, the partition of every replica it belongs to (learnt at the first call)."""
        if self._size == processes.world_size():
            return None
        if self._partition is None:
            self._partition = _partition_of(dist.get_process_group_ranks(self), self._desc or self._name)
        return self._partition

    def _host(self, what: str) -> None:
        """CPU tensors go through the host exchange, which spans every replica: not for a group of some."""
        if self._groups() is not None:
            raise NotImplementedError(f"{what} of CPU tensors in a process group of some replicas: use gloo")

    # -- host exchange for CPU tensors ---------------------------------------------------------------

    def _exchange(self, value) -> list:
        """Every rank's ``value`` (CPU tensors), in rank order, in lazyxla's wire encoding (never pickled)."""
        self._host_calls += 1
        tag = f"pg/{self._host_calls}"
        received = processes.rendezvous(tag, wire.encode(value, "a CPU tensor of a torch.distributed collective"))
        return [wire.decode(b, f"rank {i} in the lazyxla process group's {tag}") for i, b in enumerate(received)]

    # -- collectives ---------------------------------------------------------------------------------

    def allreduce(self, tensors, opts=None):
        op, avg = _op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        if _on_device(tensors):
            all_reduce(op, list(tensors), scale=1.0 / self._size if avg else 1.0, groups=self._groups())
            return done(tensors)
        self._host("all_reduce")
        values = self._exchange([t.clone() for t in tensors])
        for i, t in enumerate(tensors):
            stack = torch.stack([v[i] for v in values])
            reduced = (
                {
                    ReduceOp.SUM: lambda s: s.sum(0),
                    ReduceOp.MUL: lambda s: s.prod(0),
                    ReduceOp.MIN: lambda s: s.amin(0),
                    ReduceOp.MAX: lambda s: s.amax(0),
                }[op](stack)
                if op in (ReduceOp.SUM, ReduceOp.MUL, ReduceOp.MIN, ReduceOp.MAX)
                else _bitwise(op, stack)
            )
            t.copy_(reduced / self._size if avg else reduced)
        return done(tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def allgather(self, output_lists, input_tensors, opts=None):
        for outputs, x in zip(output_lists, input_tensors):
            if _on_device([x, *outputs]):
                gathered = all_gather(x.unsqueeze(0), 0, groups=self._groups())
                _copy_into(outputs, list(gathered.unbind(0)))
            else:
                self._host("all_gather")
                _copy_into(outputs, self._exchange(x.clone()))
        return done(output_lists)

    def _allgather_base(self, output, x, opts=None):
        if _on_device([output, x]):
            gathered = all_gather(x.reshape(1) if x.dim() == 0 else x, 0, groups=self._groups())
            # all_gather_into_tensor takes the pieces concatenated (n * d0, ...) or stacked (n, d0, ...)
            _copy_into([output], [gathered.reshape(output.shape)])
        else:
            self._host("all_gather")
            _copy_into([output], [torch.cat(self._exchange(x.clone()))])
        return done([output])

    all_gather_single = _allgather_base

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        for o, x in zip(outputs, inputs):
            self._allgather_base(o, x, opts)
        return done(outputs)

    def broadcast(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        if _on_device(tensors) and self._groups() is not None:
            _copy_into(tensors, [_group_broadcast(t, self.rank() == root, self._groups()) for t in tensors])
        elif _on_device(tensors):
            broadcast(list(tensors), root=root)
        else:
            values = self._exchange([t.clone() for t in tensors])
            _copy_into(tensors, values[root])
        return done(tensors)

    def reduce_scatter(self, outputs, input_lists, opts=None):
        op, avg = _op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        for out, pieces in zip(outputs, input_lists):
            if not _on_device([out, *pieces]):
                raise NotImplementedError("reduce_scatter of CPU tensors on the lazyxla process group: use gloo")
            whole = torch.cat([p.reshape(-1) for p in pieces])
            mine = reduce_scatter(op, whole, 1.0 / self._size if avg else 1.0, 0, self._size, groups=self._groups())
            _copy_into([out], [mine.reshape(out.shape)])
        return done(outputs)

    def _reduce_scatter_base(self, output, x, opts=None):
        op, avg = _op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        if not _on_device([output, x]):
            raise NotImplementedError("reduce_scatter of CPU tensors on the lazyxla process group: use gloo")
        scale = 1.0 / self._size if avg else 1.0
        _copy_into([output], [reduce_scatter(op, x, scale, 0, self._size, groups=self._groups())])
        return done([output])

    reduce_scatter_single = _reduce_scatter_base

    def alltoall_base(self, output, x, output_split_sizes, input_split_sizes, opts=None):
        if output_split_sizes or input_split_sizes:
            raise NotImplementedError("all_to_all_single with uneven split sizes on the lazyxla process group")
        if not _on_device([output, x]):
            raise NotImplementedError("all_to_all of CPU tensors on the lazyxla process group: use gloo")
        _copy_into([output], [all_to_all(x, 0, 0, self._size, groups=self._groups())])
        return done([output])

    all_to_all_single = alltoall_base

    def alltoall(self, outputs, inputs, opts=None):
        """``dist.all_to_all``: input ``j`` goes to rank ``j``; output ``i`` comes from rank ``i``."""
        if not _on_device([*outputs, *inputs]):
            raise NotImplementedError("all_to_all of CPU tensors on the lazyxla process group: use gloo")
        stacked = all_to_all(torch.stack(list(inputs)), 0, 0, self._size, groups=self._groups())
        _copy_into(outputs, list(stacked.unbind(0)))
        return done(outputs)

    def _root(self, opts) -> bool:
        return self.rank() == (opts.rootRank if opts is not None else 0)

    def reduce(self, tensors, opts=None):
        """``dist.reduce``: every rank computes the reduction (one program for all); the root keeps it."""
        op, avg = _op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        if not _on_device(tensors):
            raise NotImplementedError("reduce of CPU tensors on the lazyxla process group: use gloo")
        results = [all_reduce(op, t, 1.0 / self._size if avg else 1.0, groups=self._groups()) for t in tensors]
        sync()  # the collective's program ends here: what follows differs between ranks
        if self._root(opts):
            _copy_into(tensors, results)
        return done(tensors)

    def gather(self, output_lists, inputs, opts=None):
        """``dist.gather``: every rank gathers (one program for all); the root's output lists take it."""
        if not _on_device(inputs):
            # CPU tensors (gather_object: torch.distributed.checkpoint's plans) go through the host exchange
            self._host("gather")
            values = self._exchange([x.clone() for x in inputs])
            if self._root(opts):
                for i, outputs in enumerate(output_lists):
                    _copy_into(outputs, [v[i] for v in values])
            return done(output_lists if self._root(opts) else [[]])
        gathered = [all_gather(x.unsqueeze(0), 0, groups=self._groups()) for x in inputs]
        sync()  # the collective's program ends here: what follows differs between ranks
        if not self._root(opts):
            return done([[]])
        for outputs, g in zip(output_lists, gathered):
            _copy_into(outputs, list(g.unbind(0)))
        return done(output_lists)

    def scatter(self, outputs, input_lists, opts=None):
        """``dist.scatter``: the root's piece ``j`` goes to rank ``j``: a sum over ranks where only the root
        contributes (the others' pieces are masked to zeros by a value, not by the program's shape, so every
        rank runs the same program)."""
        root = self._root(opts)
        if not _on_device(outputs):
            # CPU tensors (scatter_object_list: torch.distributed.checkpoint's plans) through the host exchange
            self._host("scatter")
            values = self._exchange([[p.clone() for p in pieces] for pieces in input_lists] if root else [])
            sent = next(v for v in values if v)  # the root's pieces (the others sent none)
            _copy_into(outputs, [pieces[self.rank()] for pieces in sent])
            return done(outputs)
        pieces = input_lists if root else [[out] * self._size for out in outputs]
        sync()  # every rank's pieces become plain device values: the same program on every rank
        for out, mine in zip(outputs, pieces):
            keep = torch.tensor(root, device=out.device)
            whole = torch.where(keep, torch.stack(list(mine)), 0).reshape(-1)
            got = reduce_scatter(ReduceOp.SUM, whole, 1.0, 0, self._size, groups=self._groups())
            _copy_into([out], [got.reshape(out.shape)])
        return done(outputs)

    def barrier(self, opts=None):
        sync()
        processes.rendezvous("pg/barrier")
        return done([])

    # -- point to point ------------------------------------------------------------------------------

    def _global_rank(self, group_rank: int) -> int:
        return group_rank if self is dist.group.WORLD else dist.get_global_rank(self, group_rank)

    def send(self, tensors, dst_rank, tag=0):
        me = processes.process_index()
        for t in tensors:
            _point_to_point(t, me, self._global_rank(dst_rank))
        return done(list(tensors))

    def recv(self, tensors, src_rank, tag=0):
        me = processes.process_index()
        for t in tensors:
            _point_to_point(t, self._global_rank(src_rank), me)
        return done(list(tensors))


def _point_to_point(t: torch.Tensor, src: int, dst: int) -> None:
    """``t``'s value from process ``src`` into ``t`` in process ``dst`` (this process is one of them; the other
    calls this too, with a tensor of the same shape, dtype and device kind, or both raise ``ValueError``)."""
    me = processes.process_index()
    if src == dst:
        raise ValueError(f"send/recv: process {me} cannot send a tensor to itself")
    if devices.spmd_enabled():
        raise RuntimeError("send/recv between processes do not mix with SPMD mode: lay tensors out with mark_sharding")
    on_device = _on_device([t])
    spec = {"shape": list(t.shape), "dtype": str(t.dtype), "device": "lazyxla" if on_device else str(t.device)}
    value = t if me == src and not on_device else None  # a CPU tensor travels with the handshake
    theirs = wire.decode(
        processes.exchange(dst if me == src else src, f"p2p/{src}->{dst}", wire.encode({**spec, "value": value})),
        f"process {dst if me == src else src}'s send/recv",
    )
    received = theirs.pop("value")
    if theirs != spec:
        role = "sends" if me == src else "receives into"
        raise ValueError(f"send/recv from process {src} to {dst}: process {me} {role} {spec}, its peer has {theirs}")
    if not t.numel():
        return
    if not on_device:
        if me == dst:
            t.copy_(received)
        return
    lt = unwrap(t)
    sync_tensors([lt], reason="torch.distributed send/recv")
    out = permute_pair(lt._value[0].payload, src, dst)
    if me == dst:
        got = LazyTensor((leaf(Leaf.DATA, out, lt._aval, lt._value[0].device), 0), lt._aval)
        with torch.no_grad():
            t.copy_(wrap(got))


def _partition_of(ranks: list[int], name: str) -> list[list[int]]:
    """The partition of every replica into groups that this process's group ``ranks`` belongs to: every process
    tells the others its own group of the same mesh dimension (a rendezvous: every process must get here at the
    same call, as SPMD code over a DeviceMesh does). Raises on every process alike where the groups do not split
    the replicas into equal parts."""
    try:
        told = processes.rendezvous("pg/partition", json.dumps(ranks).encode())
    except processes.DistributedError as e:
        raise RuntimeError(
            f"a collective on the lazyxla process group {name!r} over replicas {ranks}: XLA runs a collective "
            "over groups of replicas on every replica at once, so every process must call a collective on its "
            f"own group of the same partition at this point (as code over a DeviceMesh does); not all did ({e})"
        ) from e
    groups = [json.loads(b) for b in told]
    parts = sorted({tuple(g) for g in groups})
    world = len(groups)
    fits = all(i in g and all(groups[j] == g for j in g) for i, g in enumerate(groups))
    if not fits or len({len(p) for p in parts}) != 1:
        raise NotImplementedError(
            f"a collective on the lazyxla process group {name!r} over replicas {ranks}: the {world} processes' "
            f"groups at this call, {groups} by process, do not split the replicas into groups of equal size, each "
            "process in one; XLA's collectives over groups of replicas need such a partition (create every group "
            "of it on every rank, e.g. with init_device_mesh, and call the collective on each rank's own group)"
        )
    return [list(p) for p in parts]


def _group_broadcast(t: torch.Tensor, is_root: bool, groups: list[list[int]]) -> torch.Tensor:
    """Each group's root's ``t`` on every member: a sum where only the root contributes (masked by a value, not
    by the program's shape, so every rank runs the same program)."""
    keep = torch.tensor(is_root, device=t.device)
    if t.dtype == torch.bool:
        return all_reduce(ReduceOp.OR, torch.where(keep, t, False), groups=groups)
    return all_reduce(ReduceOp.SUM, torch.where(keep, t, 0), groups=groups)


def _bitwise(op: ReduceOp, stack: torch.Tensor) -> torch.Tensor:
    out = stack[0]
    for v in stack[1:]:
        out = (out & v) if op == ReduceOp.AND else (out | v)
    return out


# ---- functional collectives (torch.distributed._functional_collectives: what DTensor redistributes with) ----
#
# ``torch.ops._c10d_functional.*`` on lazyxla tensors name their group; on a lazyxla process group they are
# recorded as lazyxla's in-graph collectives (handlers in lazy/special.py's table, which get bare LazyTensors), and
# ``wait_tensor`` is the identity: the value is computed with the rest of the step.

_FUNCOL_OPS = {
    "sum": (ReduceOp.SUM, False),
    "avg": (ReduceOp.SUM, True),
    "product": (ReduceOp.MUL, False),
    "min": (ReduceOp.MIN, False),
    "max": (ReduceOp.MAX, False),
    "band": (ReduceOp.AND, False),
    "bor": (ReduceOp.OR, False),
}


def _funcol_group(group_name: str, what: str) -> LazyxlaProcessGroup:
    pg = torch_private.resolve_process_group(group_name)
    if not isinstance(pg, LazyxlaProcessGroup):
        raise RuntimeError(
            f"{what} of lazyxla tensors on the {pg.name()} process group {group_name!r}: lazyxla tensors take part "
            'in collectives of the lazyxla process group (dist.init_process_group("lazyxla"), '
            'init_device_mesh("lazyxla", ...))'
        )
    return pg


def _funcol_op(reduce_op: str, what: str) -> tuple[ReduceOp, bool]:
    if reduce_op.lower() not in _FUNCOL_OPS:
        raise NotImplementedError(f"{what}: the lazyxla process group has no reduce op {reduce_op!r}")
    return _FUNCOL_OPS[reduce_op.lower()]


def _funcol_all_reduce(x, reduce_op: str, group_name: str):
    pg = _funcol_group(group_name, "all_reduce")
    op, avg = _funcol_op(reduce_op, "all_reduce")
    return all_reduce(op, x, 1.0 / pg.size() if avg else 1.0, groups=pg._groups())


def _funcol_all_gather(x, group_size: int, group_name: str):
    """Every rank's ``x`` stacked along dim 0 (``all_gather_into_tensor``)."""
    pg = _funcol_group(group_name, "all_gather_into_tensor")
    return all_gather(x.reshape(1) if x.dim() == 0 else x, 0, groups=pg._groups())


def _funcol_reduce_scatter(x, reduce_op: str, group_size: int, group_name: str):
    pg = _funcol_group(group_name, "reduce_scatter_tensor")
    op, avg = _funcol_op(reduce_op, "reduce_scatter_tensor")
    return reduce_scatter(op, x, 1.0 / group_size if avg else 1.0, 0, group_size, groups=pg._groups())


def _funcol_all_to_all(x, output_split_sizes, input_split_sizes, group_name: str):
    pg = _funcol_group(group_name, "all_to_all_single")
    n = pg.size()
    for splits in (output_split_sizes, input_split_sizes):
        if splits and len(set(splits)) != 1:
            raise NotImplementedError(f"all_to_all_single with uneven split sizes {list(splits)} on lazyxla tensors")
    return all_to_all(x, 0, 0, n, groups=pg._groups())


def _funcol_broadcast(x, src: int, group_name: str):
    pg = _funcol_group(group_name, "broadcast")
    if pg._groups() is not None:
        return _group_broadcast(x, pg.rank() == src, pg._groups())
    return broadcast(x, root=src)


def _shard_dim_alltoall(x, gather_dim: int, shard_dim: int, group_name: str):
    """DTensor's Shard(gather_dim) -> Shard(shard_dim): piece ``j`` of ``x`` along ``shard_dim`` goes to rank ``j``,
    the pieces received are concatenated along ``gather_dim`` (an all-to-all; an all-gather and this rank's
    ``torch.chunk`` where ``shard_dim`` does not split evenly, as DTensor's own fallback)."""
    pg = _funcol_group(group_name, "DTensor's shard_dim_alltoall")
    n = pg.size()
    if x.shape[shard_dim] % n == 0:
        return all_to_all(x, shard_dim, gather_dim, n, groups=pg._groups())
    whole = all_gather(x, gather_dim, groups=pg._groups())
    pieces = torch.chunk(whole, n, dim=shard_dim)
    return pieces[pg.rank()].contiguous() if pg.rank() < len(pieces) else whole.narrow(shard_dim, 0, 0)


def _same_value(x):
    """``wait_tensor``: the value (computed with the step); a new tensor, as the op's schema promises."""
    return x.clone()


def _funcol_handlers() -> dict:
    funcol = torch.ops._c10d_functional
    return {
        funcol.all_reduce.default: _funcol_all_reduce,
        funcol.all_reduce_coalesced.default: lambda xs, op, g: [_funcol_all_reduce(x, op, g) for x in xs],
        funcol.all_gather_into_tensor.default: _funcol_all_gather,
        funcol.all_gather_into_tensor_coalesced.default: lambda xs, n, g: [_funcol_all_gather(x, n, g) for x in xs],
        funcol.reduce_scatter_tensor.default: _funcol_reduce_scatter,
        funcol.reduce_scatter_tensor_coalesced.default: (
            lambda xs, op, n, g: [_funcol_reduce_scatter(x, op, n, g) for x in xs]
        ),
        funcol.all_to_all_single.default: _funcol_all_to_all,
        funcol.broadcast.default: _funcol_broadcast,
        funcol.wait_tensor.default: _same_value,
    }


def check_world(rank: int, size: int, backend: str) -> None:
    """The world group's rank and size must be this process's replica ordinal and the replica count."""
    if size != processes.world_size() or rank != processes.global_ordinal():
        raise RuntimeError(
            f"init_process_group({backend!r}) was given rank {rank} of {size}, but this process is replica "
            f"{processes.global_ordinal()} of {processes.world_size()}: launch with lazyxla.spawn or "
            "torchrun, whose variables both agree"
        )


def _create(store, rank: int, size: int, timeout) -> LazyxlaProcessGroup:
    if dist.is_initialized():  # a group of some replicas (dist.new_group, a DeviceMesh's dimension): see _groups
        return LazyxlaProcessGroup(rank, size)
    check_world(rank, size, "lazyxla")
    subclass_relay.arm()  # (DTensor's local ops on lazyxla tensors, in this execution model: lazy/subclass_relay.py)
    fsdp_ops.install_replicas()  # (FSDP2 on lazyxla tensors: parallel/fsdp_ops.py)
    return LazyxlaProcessGroup(rank, size)


def register() -> None:
    """Make ``"lazyxla"`` a torch.distributed backend (done when lazyxla is imported).

    Example::

        import torch.distributed as dist
        dist.init_process_group("lazyxla")
    """
    SPECIAL.update(_funcol_handlers())
    SPECIAL_BY_NAME["_dtensor.shard_dim_alltoall.default"] = _shard_dim_alltoall
    # (funcol's _wrap_tensor_autograd still runs on the CPU, which syncs each funcol result: one collective per
    # program. Recorded as the value, the two-replica DTensor test hung: its step became one program of ~10
    # collectives whose post-order differed between the ranks (roots sorted by hash, and rank-specific slices make
    # rank-specific hashes), so rank 0 waited in an all-gather while rank 1 waited in a broadcast. With the
    # collectives put in recording order and chained, the programs agreed yet some runs still failed in gloo: open,
    # docs/architecture.md "DeviceMesh and DTensor over replicas".)
    if "lazyxla" not in dist.Backend.backend_list:
        dist.Backend.register_backend("lazyxla", _create, devices=[devices.torch_name()])
