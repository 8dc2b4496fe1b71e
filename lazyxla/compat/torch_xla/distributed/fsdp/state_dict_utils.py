"""``torch_xla.distributed.fsdp.state_dict_utils`` on lazyxla: sharded FSDP checkpoints to one state dict.

Every replica saves ``{"model": model.state_dict(), "shard_metadata": model.get_shard_metadata(), ...}``; these
functions concatenate the replicas' shards of each parameter (in rank order), cut the padding, give each
parameter its original shape (splitting flattened ones) and name, and restore the buffers' original dtypes.
The result loads into the unwrapped model. The file format is torch_xla's.

Example::

    from torch_xla.distributed.fsdp import consolidate_sharded_model_checkpoints
    state, path = consolidate_sharded_model_checkpoints("/tmp/ckpt", "_rank-*-of-*.pth")
    MyModel().load_state_dict(state)
"""

from __future__ import annotations

import glob
import math
from collections import OrderedDict

import torch

from lazyxla.compat._common import missing_attribute

_SHARD_MARK = "_fsdp_shard"  # the first part of a shard's name in a sharded state dict


def _consolidate_param(state_dicts: list, metadata: dict, key: str, prefix: str, suffix: str):
    """The full parameter behind the sharded ``key`` (its unit at ``prefix``), and its name."""
    info = metadata["shard_info"][prefix][suffix]
    orig_size, orig_name = info["_orig_size"], info["_orig_name"]
    full = torch.cat([sd[key] for sd in state_dicts], dim=0)
    # flattened (and padded) shards are 1-d; shard_param_on_dim_0 ones are padded along dim 0 only
    full = full[: math.prod(orig_size)].view(*orig_size) if full.dim() == 1 else full[: orig_size[0]]
    return full, f"{prefix}.{orig_name}" if prefix else orig_name


def _unflatten(flat: torch.Tensor, metadata, prefix: str):
    names, shapes, numels = metadata
    pieces = [t.view(s) for t, s in zip(flat.split(list(numels)), shapes)]
    return pieces, [f"{prefix}.{n}" if prefix else n for n in names]


def _split_shard_key(key: str) -> tuple[str, str] | None:
    """('unit prefix', 'shard name') for a sharded parameter's key, None for anything else (a buffer)."""
    parts = key.split(".")
    for i, part in enumerate(parts):
        if part.startswith(_SHARD_MARK):
            return ".".join(parts[:i]), ".".join(parts[i:])
    return None


def consolidate_sharded_state_dicts(state_dict_list: list, shard_metadata: dict) -> OrderedDict:
    """The unwrapped model's state dict from every replica's ``model.state_dict()`` (sorted by rank) and one
    replica's ``model.get_shard_metadata()``. Buffers are taken from rank 0. A tied parameter appears under each
    of its names.

    Example::

        full = consolidate_sharded_state_dicts([ckpt0["model"], ckpt1["model"]], ckpt0["shard_metadata"])
    """
    if len(state_dict_list) != shard_metadata["world_size"]:
        raise ValueError(
            f"{len(state_dict_list)} state dicts for a model sharded over {shard_metadata['world_size']} replicas"
        )
    buffer_info = shard_metadata.get("buffer_info", {})
    full = OrderedDict()
    for key, value in state_dict_list[0].items():
        if key in buffer_info:
            value = value.to(buffer_info[key]["_orig_dtype"])
        where = _split_shard_key(key)
        if where is None:
            full[key] = value
        else:
            tensor, name = _consolidate_param(state_dict_list, shard_metadata, key, *where)
            full[name] = tensor
    flatten_info = shard_metadata["flatten_info"]
    for name in [n for n in full if "_fsdp_wrapped_module.flat_param_" in n]:
        pieces, names = _unflatten(full.pop(name), flatten_info[name], name.rsplit(".", 1)[0])
        full.update(zip(names, pieces))
    full = OrderedDict((k.replace("_fsdp_wrapped_module.", "").replace("_fpw_module.", ""), v) for k, v in full.items())
    # lazyxla's addition (torch_xla's files lack it, and its own consolidation ignores it): a tied parameter under
    # each of its names, so that the state dict loads strictly into the tied model
    for name, aliases in shard_metadata.get("shared_info", {}).items():
        full.update((alias, full[name]) for alias in aliases)
    return full


def consolidate_sharded_model_checkpoints(
    ckpt_prefix: str, ckpt_suffix: str = "*.pth", save_path: str = "", save_model: bool = True
):
    """Load every checkpoint file matching ``ckpt_prefix + ckpt_suffix`` (each a dict with ``"model"`` and
    ``"shard_metadata"``), consolidate them and, with ``save_model``, save ``{"model": state_dict}`` to
    ``save_path`` (default ``ckpt_prefix + "_consolidated.pth"``). Returns ``(state_dict, path or None)``.
    The files load with ``weights_only=True``.

    Example::

        state, path = consolidate_sharded_model_checkpoints("/tmp/mnist/final_ckpt", "_rank-*-of-*.pth")
    """
    pattern = ckpt_prefix + ckpt_suffix
    paths = glob.glob(pattern)
    if not paths:
        raise FileNotFoundError(f"Cannot find any files matching {pattern}.")
    print(f"found {len(paths)} checkpoint files in {pattern}")
    loaded = sorted(
        ((torch.load(p, map_location="cpu", weights_only=True), p) for p in paths),
        key=lambda c: c[0]["shard_metadata"]["rank"],
    )
    for rank, (ckpt, path) in enumerate(loaded):
        meta = ckpt["shard_metadata"]
        if meta["world_size"] != len(loaded) or meta["rank"] != rank:
            raise ValueError(
                f"{path} is rank {meta['rank']} of {meta['world_size']} but {len(loaded)} files match {pattern}: "
                "check for missing or unexpected files"
            )
    full = consolidate_sharded_state_dicts([c["model"] for c, _ in loaded], loaded[0][0]["shard_metadata"])
    path = None
    if save_model:
        path = save_path or ckpt_prefix + "_consolidated.pth"
        torch.save({"model": full}, path)
        print(f"saved consolidated model to {path}")
    return full, path


def __getattr__(name: str):
    raise missing_attribute(__name__, name)
