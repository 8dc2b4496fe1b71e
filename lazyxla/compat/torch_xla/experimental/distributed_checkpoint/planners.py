"""``SPMDSavePlanner`` and ``SPMDLoadPlanner``: torch.distributed.checkpoint planners for SPMD tensors.

A state dict is flattened to dotted keys and split in two: values that are not split over devices go through
torch.distributed.checkpoint's default planning; split tensors (``XLAShardedTensor``s, or ``_CpuShards`` from
``_sharded_cpu_state_dict``) are written as one chunk per part this process's devices hold (copies of a part
once: replica 0 writes it), each chunk at its offsets in the global tensor. Loading asks for the chunks each
local part covers, whatever layout wrote them, fills host copies of the parts and puts them on the devices
when the last chunk of a tensor has arrived, in the tensor's own layout.

Example::

    dist_cp.save(state, storage_writer=dist_cp.FileSystemWriter(path), planner=SPMDSavePlanner())
    dist_cp.load(state, storage_reader=dist_cp.FileSystemReader(path), planner=SPMDLoadPlanner())
"""

from __future__ import annotations

import dataclasses
import io
import math
from collections import ChainMap
from typing import Any

import torch
from torch.distributed.checkpoint.default_planner import (
    create_default_global_load_plan,
    create_default_global_save_plan,
    create_default_local_load_plan,
    create_default_local_save_plan,
)
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, Metadata, MetadataIndex
from torch.distributed.checkpoint.planner import (
    LoadPlan,
    LoadPlanner,
    ReadItem,
    SavePlan,
    SavePlanner,
    TensorProperties,
    TensorWriteData,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

from lazyxla.compat.torch_xla.distributed.spmd import XLAShard, wrap_if_sharded
from lazyxla.compat.torch_xla.experimental.distributed_checkpoint._helpers import (
    _CpuShards,
    _is_sharded_tensor,
    _unwrap_xla_sharded_tensor,
    flatten_state_dict,
    narrow_tensor_by_index,
    set_element,
)

__all__ = ["SPMDLoadPlanner", "SPMDSavePlanner"]


def _split(state_dict: dict, keep_cpu_shards: bool) -> tuple[dict, dict, dict]:
    """(paths, split values, other values) of ``state_dict`` flattened."""
    flat, paths = flatten_state_dict(state_dict)
    flat = {k: wrap_if_sharded(v) for k, v in flat.items()}
    sharded = {
        k: v for k, v in flat.items() if _is_sharded_tensor(v) or (keep_cpu_shards and isinstance(v, _CpuShards))
    }
    others = {k: _unwrap_xla_sharded_tensor(v) for k, v in flat.items() if k not in sharded}
    return paths, sharded, others


def _chunk(indices: list[slice]) -> ChunkStorageMetadata:
    return ChunkStorageMetadata(
        offsets=torch.Size(s.start for s in indices), sizes=torch.Size(s.stop - s.start for s in indices)
    )


def _properties(dtype: torch.dtype) -> TensorProperties:
    return TensorProperties(dtype=dtype, layout=torch.strided, requires_grad=False)


class SPMDSavePlanner(SavePlanner):
    """A ``SavePlanner`` for state dicts holding SPMD tensors (split device tensors or ``_CpuShards``).

    ``sharded_state_dict`` holds the split values and ``unsharded_state_dict`` the others, both under flattened
    keys, once ``set_up_planner`` has run.

    Example::

        dist_cp.save(model.state_dict(), storage_writer=dist_cp.FileSystemWriter(path), planner=SPMDSavePlanner())
    """

    def __init__(self) -> None:
        self.is_coordinator = False
        self.mappings: dict | None = None
        self.sharded_state_dict: dict | None = None
        self.unsharded_state_dict: dict | None = None
        self._local_shards: dict[str, list[XLAShard | None]] = {}

    def set_up_planner(self, state_dict: dict, storage_meta: Any = None, is_coordinator: bool = False) -> None:
        # torch_xla's signature is (state_dict, is_coordinator): a bool second argument is that
        if isinstance(storage_meta, bool):
            storage_meta, is_coordinator = None, storage_meta
        self.is_coordinator = is_coordinator
        self.mappings, self.sharded_state_dict, self.unsharded_state_dict = _split(state_dict, keep_cpu_shards=True)
        self._local_shards = {}

    def _shards(self, fqn: str) -> list[XLAShard | None]:
        """This process's parts of the split value ``fqn`` (host copies made once)."""
        if fqn not in self._local_shards:
            value = self.sharded_state_dict[fqn]
            shards = value.shards if isinstance(value, _CpuShards) else value.local_shards
            self._local_shards[fqn] = list(shards)
        return self._local_shards[fqn]

    def create_local_plan(self) -> SavePlan:
        plan = create_default_local_save_plan(self.unsharded_state_dict, self.is_coordinator)
        items = list(plan.items)
        for fqn, value in self.sharded_state_dict.items():
            size = value.global_shape if isinstance(value, _CpuShards) else value.size()
            for position, shard in enumerate(self._shards(fqn)):
                if shard.replica_id != 0:  # another device writes the same part
                    continue
                chunk = _chunk(shard.indices)
                data = TensorWriteData(chunk=chunk, properties=_properties(shard.data.dtype), size=torch.Size(size))
                items.append(
                    WriteItem(
                        index=MetadataIndex(fqn, chunk.offsets, position), type=WriteItemType.SHARD, tensor_data=data
                    )
                )
        return dataclasses.replace(plan, items=items, planner_data=self.mappings)

    def create_global_plan(self, all_plans: list[SavePlan]) -> tuple[list[SavePlan], Metadata]:
        plans, metadata = create_default_global_save_plan(_dedup(all_plans), rewrite_index_hints=False)
        paths = dict(ChainMap(*[p.planner_data for p in plans]))
        return plans, dataclasses.replace(metadata, planner_data=paths)

    def finish_plan(self, new_plan: SavePlan) -> SavePlan:
        return new_plan

    def resolve_data(self, write_item: WriteItem) -> torch.Tensor | io.BytesIO:
        fqn = write_item.index.fqn
        if fqn in self.unsharded_state_dict:
            value = self.unsharded_state_dict[fqn]
            if write_item.type == WriteItemType.BYTE_IO:
                buffer = io.BytesIO()
                torch.save(value, buffer)
                return buffer
            return value.detach().cpu() if isinstance(value, torch.Tensor) else value
        shards = self._shards(fqn)
        shard = shards[write_item.index.index]
        if shard is None:
            raise RuntimeError(f"checkpoint: the part {write_item.index} was already written")
        if torch.Size(s.start for s in shard.indices) != write_item.index.offset:
            raise RuntimeError(f"checkpoint: the part {write_item.index} does not match this process's parts")
        shards[write_item.index.index] = None  # written: let the host copy go
        return shard.unpadded_data


def _dedup(plans: list[SavePlan]) -> list[SavePlan]:
    """``plans`` with every write item kept only in the first plan that has it (a replicated value is written
    by one process)."""
    seen: set = set()
    out = []
    for plan in plans:
        items = [item for item in plan.items if item.index not in seen]
        seen.update(item.index for item in items)
        out.append(dataclasses.replace(plan, items=items))
    return out


class SPMDLoadPlanner(LoadPlanner):
    """A ``LoadPlanner`` that loads a checkpoint in place into a state dict holding SPMD tensors (each split
    tensor keeps its layout; the checkpoint may come from any layout).

    Example::

        state = model.state_dict()
        dist_cp.load(state, storage_reader=dist_cp.FileSystemReader(path), planner=SPMDLoadPlanner())
    """

    def __init__(self) -> None:
        self.metadata: Metadata | None = None
        self.is_coordinator = False
        self.original_state_dict: dict | None = None
        self.mappings: dict | None = None
        self.sharded_state_dict: dict | None = None
        self.unsharded_state_dict: dict | None = None
        self._local_shards: dict[str, list[XLAShard]] = {}
        self._pending_elements: dict[str, int] = {}

    def set_up_planner(self, state_dict: dict, metadata: Metadata | None = None, is_coordinator: bool = False) -> None:
        self.metadata, self.is_coordinator, self.original_state_dict = metadata, is_coordinator, state_dict
        self.mappings, self.sharded_state_dict, self.unsharded_state_dict = _split(state_dict, keep_cpu_shards=False)
        self._local_shards, self._pending_elements = {}, {}

    def create_local_plan(self) -> LoadPlan:
        plan = create_default_local_load_plan(self.unsharded_state_dict, self.metadata)
        items = list(plan.items)
        for fqn in self.sharded_state_dict:
            chunks = [_chunk(s.indices) for s in self._shards(fqn)]
            items.extend(create_read_items_for_chunk_list(fqn, self.metadata.state_dict_metadata[fqn], chunks))
        return dataclasses.replace(plan, items=items)

    def _shards(self, fqn: str) -> list[XLAShard]:
        """Host copies of this process's parts of ``fqn`` (filled by the reads, then put on the devices)."""
        if fqn not in self._local_shards:
            self._local_shards[fqn] = self.sharded_state_dict[fqn].local_shards
            self._pending_elements[fqn] = sum(s.unpadded_data.numel() for s in self._local_shards[fqn])
        return self._local_shards[fqn]

    def create_global_plan(self, global_plan: list[LoadPlan]) -> list[LoadPlan]:
        return create_default_global_load_plan(global_plan)

    def finish_plan(self, central_plan: LoadPlan) -> LoadPlan:
        return central_plan

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        # non-tensor values load as torch.load loads weights: no arbitrary objects from the file
        set_element(
            self.original_state_dict, self.mappings[read_item.dest_index.fqn], torch.load(value, weights_only=True)
        )

    def resolve_tensor(self, read_item: ReadItem) -> torch.Tensor:
        index = read_item.dest_index
        if index.fqn in self.unsharded_state_dict:  # a view of the target (the checkpoint may hold it in parts)
            return narrow_tensor_by_index(self._unsharded_target(index), read_item.dest_offsets, read_item.lengths)
        shard = self._shards(index.fqn)[index.index]
        if torch.Size(s.start for s in shard.indices) != index.offset:
            raise RuntimeError(f"checkpoint: the read {index} does not match this process's parts")
        return narrow_tensor_by_index(shard.data, read_item.dest_offsets, read_item.lengths)

    def _unsharded_target(self, index: MetadataIndex) -> torch.Tensor:
        target = self.unsharded_state_dict[index.fqn]
        if not isinstance(target, torch.Tensor):
            raise TypeError(f"checkpoint: {index.fqn!r} holds a {type(target).__name__}, not a tensor")
        return target

    def commit_tensor(self, read_item: ReadItem, tensor: torch.Tensor) -> None:
        fqn = read_item.dest_index.fqn
        if fqn not in self.sharded_state_dict:
            return
        self._pending_elements[fqn] -= math.prod(read_item.lengths)
        if self._pending_elements[fqn] < 0:
            raise RuntimeError(f"checkpoint: more data was read for {fqn!r} than its parts hold")
        if self._pending_elements[fqn] == 0:  # every local part is complete: put them on the devices
            self.sharded_state_dict[fqn].load_local_shards_(self._local_shards.pop(fqn))
