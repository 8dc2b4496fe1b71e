"""PyTorch's distributed checkpoint (``torch.distributed.checkpoint``, DCP) on lazyxla.

Over replicas (one process per device, ``init_process_group("lazyxla")``) DCP runs unchanged: each rank writes its
DTensors' local shards and rank 0 the metadata, exchanged through the process group's object collectives.

In SPMD mode (``lazyxla.spmd.enable()``) one process holds every rank's part: a DTensor's local tensor is the whole
global tensor (``parallel/dtensor.py``, "the global view"), and the process group is the SPMD world, which stands
for every rank and cannot gather per-rank objects. So, for DTensors on a global mesh:

- a save or load over the SPMD world runs as one process (DCP's own single-process path, as with no process
  group): this process plans, writes and commits for every rank;
- a DTensor writes one item, its whole (global) tensor, and reads into its whole tensor (DCP computes a rank's
  chunk from its mesh coordinate and local shape, which would name rank 0's part while the data is the whole);
- DCP's default load planner copies each read item into a view of the state dict's tensor; a DTensor's local
  tensor here keeps no views (a bare ``LazyTensor``), so the copies go into a user's tensor holding its value, which
  is then laid out as the placements say and made the local tensor's value (``commit_tensor``).

A checkpoint so written is an ordinary DCP checkpoint: it loads at another mesh size, over replicas, or into a
plain CPU model (``dcp.load`` with no process group, or ``torch.distributed.checkpoint.format_utils.
dcp_to_torch_save``). :class:`AtomicFileSystemWriter` writes a checkpoint so that a save killed half-way leaves
the previous one whole.

Example::

    lazyxla.spmd.enable()
    ...   # fully_shard(model, mesh=init_device_mesh("lazyxla", (8,))), a few steps
    model_sd, optim_sd = get_state_dict(model, opt)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id="ckpt")
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from lazyxla import torch_private
from lazyxla.device import processes
from lazyxla.lazy.tensor import LazyTensor, set_value, unwrap, wrap
from lazyxla.parallel import dtensor, spmd

_installed = {"done": False}


def _is_global_dtensor(t) -> bool:
    mesh = getattr(t, "device_mesh", None)
    return isinstance(getattr(t, "_local_tensor", None), LazyTensor) and dtensor.is_global(mesh)


def _refuse_partial(t, fqn: str) -> None:
    if any(p.is_partial() for p in t.placements):
        raise ValueError(
            f"distributed checkpoint of {fqn!r}: its placements {tuple(t.placements)} hold a Partial, which DCP does "
            "not save; redistribute it to Replicate() or Shard(d) first (as PyTorch requires)"
        )


# --- saving: one item per DTensor, its whole tensor -----------------------------------------------------------


def _write_items(original: Callable) -> Callable:
    def create_write_items(self, fqn: str, object):
        if not _is_global_dtensor(self):
            return original(self, fqn, object)
        # A public-API import: torch.distributed.checkpoint is loaded only by runs that checkpoint.
        from torch.distributed.checkpoint.metadata import MetadataIndex, TensorProperties
        from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType

        _refuse_partial(self, fqn)
        chunk = _whole_chunk(self)
        # DCP's writer reads the data with __get_tensor_shard__, which is to_local(): the global tensor
        return [
            WriteItem(
                index=MetadataIndex(fqn, chunk.offsets),
                type=WriteItemType.SHARD,
                tensor_data=TensorWriteData(
                    chunk=chunk,
                    properties=TensorProperties(dtype=self.dtype, requires_grad=self.requires_grad),
                    size=self.size(),
                ),
            )
        ]

    return create_write_items


def _whole_chunk(t):
    # A public-API import: torch.distributed.checkpoint is loaded only by runs that checkpoint.
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

    return ChunkStorageMetadata(offsets=torch.Size([0] * t.dim()), sizes=t.size())


def _chunk_list(original: Callable) -> Callable:
    def create_chunk_list(self):
        if not _is_global_dtensor(self):
            return original(self)
        _refuse_partial(self, "a DTensor")
        return [_whole_chunk(self)]  # the process reads every part: the whole tensor

    return create_chunk_list


# --- the SPMD world: one process for every rank ---------------------------------------------------------------


def _dist_wrapper_init(original: Callable) -> Callable:
    def init(self, group, use_dist: bool, coordinator_rank: int) -> None:
        if use_dist and _over_spmd_world(group):
            use_dist = False  # this process is every rank: plan, write and commit alone
        original(self, group, use_dist, coordinator_rank)

    return init


def _over_spmd_world(group) -> bool:
    g = group if group is not None else dist.group.WORLD
    if not isinstance(g, dtensor.SpmdWorld):
        return False
    if processes.process_count() > 1:
        raise NotImplementedError(
            "torch.distributed.checkpoint in multi-process SPMD mode is not supported yet: each process holds only "
            "its devices' parts of the global tensors. Save from one process per host with lazyxla.spmd "
            "(single process), or run one process per device (init_process_group('lazyxla'))"
        )
    return True


# --- loading: copies into the whole tensor, then made the DTensor's value -------------------------------------


def _global_target(planner, read_item):
    """The state dict's DTensor a read item loads into, if it holds a global tensor (else None)."""
    state_dict = getattr(planner, "state_dict", None)
    t = state_dict.get(read_item.dest_index.fqn) if isinstance(state_dict, dict) else None
    return t if _is_global_dtensor(t) else None


def _resolve_tensor(original: Callable) -> Callable:
    def resolve_tensor(self, read_item):
        target = _global_target(self, read_item)
        if target is None:
            return original(self, read_item)
        # a user's tensor over the DTensor's value: it keeps views, so the reader's copy into the read item's region
        # reaches it (several read items of one tensor go into the same one)
        loading = self.__dict__.setdefault("_lazyxla_loading", {})
        fqn = read_item.dest_index.fqn
        if fqn not in loading:
            local = target._local_tensor
            loading[fqn] = wrap(LazyTensor(local._value, local._aval))
        return _narrow(loading[fqn], read_item.dest_offsets, read_item.lengths)

    return resolve_tensor


def _narrow(t: torch.Tensor, offsets, lengths) -> torch.Tensor:
    for dim, (offset, length) in enumerate(zip(offsets, lengths)):
        if length < t.size(dim):
            t = t.narrow(dim, offset, length)
    return t


def _commit_tensor(original: Callable) -> Callable:
    def commit_tensor(self, read_item, tensor: torch.Tensor) -> None:
        original(self, read_item, tensor)
        target = _global_target(self, read_item)
        if target is None:
            return
        value = self.__dict__["_lazyxla_loading"][read_item.dest_index.fqn]
        m, spec = dtensor.spec_of(target.device_mesh, target.placements, target.dim())
        # the DTensor's own local tensor takes the loaded value (every holder of it sees the load), laid out as
        # its placements say
        set_value(target._local_tensor, dtensor.laid_out(unwrap(value), m, spec)._value)

    return commit_tensor


def install() -> None:
    """Make ``torch.distributed.checkpoint`` save and load DTensors on global meshes (SPMD mode); called when SPMD
    mode is turned on.

    Example::

        lazyxla.parallel.checkpoint.install()
    """
    if _installed["done"]:
        return
    torch_private.replace_dtensor_conversions(
        {
            "dcp_write_items": _write_items,
            "dcp_chunk_list": _chunk_list,
            "dcp_dist_wrapper_init": _dist_wrapper_init,
            "dcp_resolve_tensor": _resolve_tensor,
            "dcp_commit_tensor": _commit_tensor,
        }
    )
    _installed["done"] = True


spmd.on_enable(install)  # after parallel/dtensor.py's hook (imported first): DCP is loaded then, in SPMD runs only
