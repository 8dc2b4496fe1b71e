"""``torch_xla.distributed.xla_backend`` on lazyxla: the ``"xla"`` torch.distributed backend and the
``xla://`` init method.

Importing it registers backend ``"xla"``, whose groups are :class:`ProcessGroupXla`: lazyxla's process
group (its collectives on device tensors are recorded into the step's program, so
``DistributedDataParallel`` works) with torch_xla's group meshes, and the ``xla://`` rendezvous, which
takes the rank and world size from the runtime and the store address from ``MASTER_ADDR``/``MASTER_PORT``
(set by ``xmp.spawn`` and torchrun).

Groups of some ranks: as in torch_xla, importing this module wraps ``torch.distributed.new_group`` so that a
group of ``ProcessGroupXla`` gets a *mesh* (``pg._mesh``): the replica groups its collectives run over.
Every rank of the world runs a collective together (XLA's replica groups), so the mesh lists the group and
the groups like it that split the world: ``ranks=[1, 5, 9]`` of 12 with ``pg_options={'xla_pg_options':
{'spmd': True}}`` gives ``[[0, 4, 8], [1, 5, 9], [2, 6, 10], [3, 7, 11]]``; ``{'mesh': [...]}`` gives it
explicitly; without options a group of some ranks is its own only group, a group of one rank a mesh of
singletons and the whole world one group.

Example::

    import torch.distributed as dist
    import torch_xla.distributed.xla_backend  # noqa: F401
    dist.init_process_group("xla", init_method="xla://")
    model = DDP(model.to(xm.xla_device()), gradient_as_bucket_view=True)
"""

from __future__ import annotations

import importlib
import logging
import urllib.parse

import torch
import torch.distributed as dist

import lazyxla
from lazyxla import torch_private
from lazyxla.compat._common import missing_attribute
from lazyxla.config import foreign_env
from lazyxla.device.devices import torch_name
from lazyxla.parallel.process_group import LazyxlaProcessGroup, done

# the module (torch.distributed.rendezvous is also the name of a function there)
_rendezvous = importlib.import_module("torch.distributed.rendezvous")


def rendezvous_handler(url: str, timeout=None, **kwargs):
    """The ``xla://`` init method's handler: ``(store, rank, world_size)`` from lazyxla's runtime (the
    replica's ordinal and the replica count) and ``MASTER_ADDR``/``MASTER_PORT``; one replica without them gets an
    in-memory store. torch_xla names it ``torch_xla._internal.rendezvous.pjrt_rendezvous_handler``.

    Example::

        store, rank, world = next(rendezvous_handler("xla://"))
    """
    rank, world = lazyxla.runtime.global_ordinal(), lazyxla.runtime.world_size()
    if world == 1 and not (foreign_env("MASTER_ADDR") and foreign_env("MASTER_PORT")):
        yield (dist.HashStore(), 0, 1)
        return
    query = urllib.parse.urlencode({"rank": rank, "world_size": world})
    env_kwargs = {} if timeout is None else {"timeout": timeout}
    yield from _rendezvous.rendezvous(f"env://?{query}", **env_kwargs)


class ProcessGroupXla(LazyxlaProcessGroup):
    """torch_xla's process group of backend ``"xla"``: lazyxla's process group over the replica groups of
    its mesh (``_mesh``; ``[]``: the whole world), made by ``dist.init_process_group("xla")`` and
    ``dist.new_group``. ``broadcast`` roots are group ranks, turned into global ones. ``send``/``recv`` move a
    tensor between two processes at the call, by XLA's collective permute (torch_xla's too), warning at each call
    as torch_xla does. As in torch_xla, ``allreduce_coalesced``, ``recv_anysource``, ``monitored_barrier`` and
    ``Options`` raise ``NotImplementedError``; ``barrier`` only ends the step's program.

    Example::

        dist.init_process_group("xla", init_method="xla://")
        dist.all_reduce(t)                                         # over every replica
        pairs = dist.new_group(ranks=[0, 1], pg_options={"xla_pg_options": {"spmd": True}})
        dist.all_reduce(t, group=pairs)                            # over [[0, 1], [2, 3], ...]
    """

    def __init__(self, prefix_store, rank: int, size: int, timeout) -> None:
        super().__init__(rank, size)
        self.prefix_store = prefix_store  # kept as torch_xla does; the collectives need no store
        self.timeout = timeout
        self._mesh: list[list[int]] = []

    def getBackendName(self) -> str:
        return "xla"

    def _groups(self) -> list[list[int]] | None:
        whole = [list(range(lazyxla.runtime.world_size()))]
        return None if not self._mesh or self._mesh == whole else self._mesh

    def broadcast(self, tensors, opts=None):
        root = dist.get_global_rank(self, opts.rootRank) if opts is not None else 0
        tensors = [tensors[opts.rootTensor]] if opts is not None else list(tensors)
        if self.size() == 1:  # a group of one: its values are already the root's
            return done(tensors)
        if self._groups() is None:
            return super().broadcast(tensors, opts)
        # within replica groups: a sum where only the root contributes (a value mask: one program for all ranks)
        keep = torch.tensor(lazyxla.runtime.global_ordinal() == root, device=tensors[0].device)
        with torch.no_grad():
            for t in tensors:
                t.copy_(lazyxla.all_reduce(lazyxla.ReduceOp.SUM, torch.where(keep, t, 0), groups=self._groups()))
        return done(tensors)

    def barrier(self, opts=None):
        return super().barrier(opts) if self._groups() is None else done([])

    def allgather_coalesced(self, output_lists, inputs, opts=None):
        return self.allgather(output_lists, inputs, opts)

    def reduce_scatter_coalesced(self, outputs, input_lists, opts=None):
        return self.reduce_scatter(outputs, input_lists, opts)

    def send(self, tensors, dst_rank, tag=0):
        logging.warning(_ONE_PAIR)  # (torch_xla warns at every call)
        return super().send(tensors, dst_rank, tag)

    def recv(self, out_tensors, src_rank, tag=0):
        logging.warning(_ONE_PAIR)
        return super().recv(out_tensors, src_rank, tag)

    # torch_xla's ProcessGroupXla raises NotImplementedError for these four too
    def allreduce_coalesced(self, *args):
        raise NotImplementedError(
            "ProcessGroupXla.allreduce_coalesced: torch_xla does not offer it either; use dist.all_reduce"
        )

    def recv_anysource(self, *args):
        raise NotImplementedError(
            "ProcessGroupXla.recv_anysource: torch_xla does not offer it either (XLA's collectives name their "
            "source); use dist.recv(tensor, src)"
        )

    def monitored_barrier(self, *args):
        raise NotImplementedError(
            "ProcessGroupXla.monitored_barrier: torch_xla does not offer it either; use dist.barrier"
        )

    def Options(self, *args):
        raise NotImplementedError("ProcessGroupXla.Options: torch_xla does not offer it either")


_ONE_PAIR = (
    "Individual send/recv ops are inefficient on an XLA device: each is a program of its own. Consider "
    "xm.collective_permute() with every source-target pair."
)


def _create(prefix_store, rank: int, size: int, timeout) -> ProcessGroupXla:
    """The process group of backend ``"xla"``; as in torch_xla, not in SPMD mode (one process drives every
    device there: shardings, not replica collectives, say how values move)."""
    if lazyxla.spmd.is_enabled():
        raise AssertionError("the XLA backend of torch.distributed is not supported in SPMD mode")
    return ProcessGroupXla(prefix_store, rank, size, timeout)


def _infer_mesh(ranks: list[int], world: int) -> list[list[int]]:
    """The rectangular mesh of which ``ranks`` is one row (consecutive ranks, starting at a multiple of its
    length) or one column (ranks ``world / len`` apart, starting in the first row); ValueError otherwise.

    Example::

        _infer_mesh([4, 5, 6, 7], 12)     # [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
        _infer_mesh([1, 5, 9], 12)        # [[0, 4, 8], [1, 5, 9], [2, 6, 10], [3, 7, 11]]
    """
    n = len(ranks)
    if world % n:
        raise ValueError(f"a group of {n} ranks cannot be a side of a rectangular mesh of {world} ranks")
    start, step = ranks[0], ranks[1] - ranks[0]
    if ranks != list(range(start, start + step * n, step)):
        raise ValueError(f"the group's ranks are not evenly spaced: {ranks}")
    rows = world // n
    if step == 1:
        if start % n or start >= world:
            raise ValueError(f"the row {ranks} does not start a row of a mesh of {world} ranks, {n} per row")
        return [list(range(r * n, (r + 1) * n)) for r in range(rows)]
    if start >= rows or step != rows:
        raise ValueError(f"the column {ranks} is not a column of a mesh of {world} ranks, {n} per column")
    return [list(range(c, world, rows)) for c in range(rows)]


def _mesh_of(ranks: list[int], world: int, pg_options) -> list[list[int]] | None:
    """torch_xla's mesh for a new group of ``ranks`` (None: keep the default, the whole world)."""
    options = pg_options.get("xla_pg_options", {}) if isinstance(pg_options, dict) else {}
    if ranks == list(range(world)):
        return [ranks]
    if len(ranks) == 1:
        if ranks[0] not in range(world):
            raise ValueError(f"rank {ranks[0]} is not in the world of {world} ranks")
        return [[r] for r in range(world)]
    if 1 < len(ranks) < world:
        if options.get("mesh") is not None:
            return options["mesh"]
        return _infer_mesh(ranks, world) if options.get("spmd", False) else [ranks]
    logging.warning("cannot infer a process group mesh from ranks %s: the group uses the whole world", ranks)
    return None


_torch_new_group = dist.new_group


def new_xla_process_group(ranks=None, timeout=None, backend=None, pg_options=None, **kwargs):
    """``torch.distributed.new_group``, and for a ``ProcessGroupXla`` its mesh (see the module's doc).

    Example::

        rows = dist.new_group(ranks=[0, 1], pg_options={"xla_pg_options": {"spmd": True}})
    """
    pg = _torch_new_group(ranks=ranks, timeout=timeout, backend=backend, pg_options=pg_options, **kwargs)
    if isinstance(pg, ProcessGroupXla) and ranks is not None:
        world = dist.group.WORLD
        if not isinstance(world, ProcessGroupXla):
            raise RuntimeError("the xla backend needs the default process group to be a ProcessGroupXla")
        mesh = _mesh_of(list(ranks), world.size(), pg_options)
        if mesh is not None:
            pg._mesh = mesh
    return pg


def _register() -> None:
    if "xla" not in dist.Backend.backend_list:
        dist.Backend.register_backend("xla", _create, devices=[torch_name()])
    if not torch_private.has_rendezvous_handler("xla"):
        _rendezvous.register_rendezvous_handler("xla", rendezvous_handler)
    dist.new_group = new_xla_process_group  # as torch_xla does: groups of ProcessGroupXla get their mesh


_register()


def __getattr__(name: str):
    raise missing_attribute(__name__, name)
