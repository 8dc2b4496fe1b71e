"""``torch_xla.distributed.spmd.debugging`` on lazyxla: how a tensor is laid out over the devices, as text and as
a ``rich`` table.

``construct_v1_sharding_str(t)`` gives XLA's (V1) HLO sharding text of ``t``'s annotation, worked out from
lazyxla's ``(mesh, partition_spec)``: ``{devices=[tiles per dimension]device ids}``, with one more tile
dimension and `` last_tile_dim_replicate`` when some mesh axes do not split the tensor, ``{replicated}`` when
none do (and for a program's output XLA's partitioner left replicated, as torch_xla), ``''`` for a tensor
without annotation. ``visualize_sharding(text)`` draws the first two tile
dimensions as a table whose cells name the devices holding that tile (``CPU 3``, or ``CPU [0, 1]`` for
replicas), as torch_xla draws them; ``visualize_tensor_sharding(t)`` does both. Needs ``rich``.

Example::

    import torch_xla.distributed.spmd as xs
    from torch_xla.distributed.spmd.debugging import visualize_tensor_sharding
    xs.mark_sharding(t, xs.Mesh(np.arange(4), (2, 2)), (0, 1))
    construct_v1_sharding_str(t)          # '{devices=[2,2]0,1,2,3}'
    visualize_tensor_sharding(t)          # prints a 2 x 2 table: CPU 0 | CPU 1 / CPU 2 | CPU 3
"""

from __future__ import annotations

import math
import re

import numpy as np
import torch

import lazyxla
from lazyxla.compat._common import missing_attribute, platform_name
from lazyxla.config import foreign_env
from lazyxla.ir import Leaf
from lazyxla.lazy import graph
from lazyxla.lazy.tensor import unwrap
from lazyxla.parallel.spmd import is_annotated

try:  # optional dependency: only the tables need it
    import rich.align
    import rich.box
    import rich.console
    import rich.padding
    import rich.style
    import rich.table

    RICH_ENABLED = True
except ImportError:
    RICH_ENABLED = False

_TILED = re.compile(r"^\{devices=\[([\d,]+)\]([\d,]+)( last_tile_dim_replicate)?\}$")


def construct_v1_sharding_str(t: torch.Tensor) -> str:
    """XLA's V1 HLO sharding text of ``t``'s annotation (see the module's doc).

    Example::

        xs.mark_sharding(t, xs.Mesh(np.arange(4), (2, 2)), (0, None))
        construct_v1_sharding_str(t)     # '{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}'
    """
    t = getattr(t, "global_tensor", t)
    found = lazyxla.spmd.get_sharding(t)
    if found is None:  # replicated: annotated so (on a mesh), chosen so by XLA's partitioner, or a plain tensor
        return "{replicated}" if is_annotated(t) or _partitioned(t) else ""
    mesh, spec = found
    if mesh is None:  # a layout XLA chose that matches no mesh: lazyxla knows only its description
        raise ValueError(f"construct_v1_sharding_str: the tensor's layout {spec[0]} is on no mesh built here")
    return _v1_text(np.asarray(mesh.device_ids).reshape(mesh.mesh_shape), list(mesh.axis_names), spec)


def _partitioned(t: torch.Tensor) -> bool:
    """Whether ``t`` holds an output of a program that XLA's partitioner laid out (SPMD mode): torch_xla gives
    every such output the layout it got, ``{replicated}`` included, where a copy from the host has none."""
    node = unwrap(t)._value[0]
    return lazyxla.spmd.is_enabled() and node.op is Leaf.DATA and graph.made_by_program(node)


def _v1_text(logical: np.ndarray, names: list[str], spec: tuple) -> str:
    """The V1 text of ``spec`` (axis names, tuples of them, None) over the device array ``logical``."""
    order, tiles = [], []
    for entry in spec:
        axes = [] if entry is None else [entry] if isinstance(entry, str) else list(entry)
        order += [names.index(a) for a in axes]
        tiles.append(math.prod(logical.shape[names.index(a)] for a in axes))
    rest = [k for k in range(logical.ndim) if k not in order]
    replicas = math.prod(logical.shape[k] for k in rest)
    if math.prod(tiles) == 1:
        return "{replicated}"
    ids = ",".join(str(int(i)) for i in logical.transpose(order + rest).reshape(-1))
    if replicas == 1:
        return f"{{devices=[{','.join(map(str, tiles))}]{ids}}}"
    return f"{{devices=[{','.join(map(str, tiles + [replicas]))}]{ids} last_tile_dim_replicate}}"


def _cells(sharding: str) -> tuple[int, int, dict]:
    """(rows, columns, (row, column) -> the device id, or the ids of the replicas) of a V1 sharding text."""
    if sharding in ("", "{replicated}"):
        return 1, 1, {(0, 0): list(range(lazyxla.spmd.device_count()))}
    match = _TILED.match(sharding)
    if match is None:
        raise ValueError(f"sharding {sharding!r} is not organized as expected")
    dims = [int(d) for d in match.group(1).split(",")]
    ids = [int(d) for d in match.group(2).split(",")]
    replicas = dims.pop() if match.group(3) else 1
    rows, cols = (dims[0], dims[1]) if len(dims) > 1 else (1, dims[0])
    if len(ids) != math.prod(dims) * replicas:
        raise ValueError(f"sharding {sharding!r} is not organized as expected: {len(ids)} device ids")
    cells = {}
    for k in range(rows * cols):  # the first two tile dimensions only
        group = ids[k * replicas : (k + 1) * replicas]
        cells[(k // cols, k % cols)] = group if match.group(3) else group[0]
    return rows, cols, cells


def visualize_sharding(
    sharding: str, use_color: bool = True, scale: float = 1.0, min_width: int = 9, max_width: int = 80
):
    """Print (and return) a ``rich`` table of a V1 sharding text's first two tile dimensions: each cell names
    the device kind (``PJRT_DEVICE``) and the device, or the list of replicas, holding that tile.
    ``scale``/``min_width`` are accepted for torch_xla's signature (its table ignores them too).

    Example::

        visualize_sharding("{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}")   # rows: CPU [0, 1] / CPU [2, 3]
    """
    if not RICH_ENABLED:
        raise ValueError("`visualize_sharding` requires `rich` to be installed.")
    print(f"Visualizing {sharding} (showing up to the first two dimensions)")
    rows, cols, cells = _cells(sharding)
    console = rich.console.Console(width=max_width)
    plain = not (use_color and console.color_system is not None)
    table = rich.table.Table(
        show_header=False,
        show_lines=plain,
        padding=0,
        highlight=plain,
        pad_edge=False,
        box=rich.box.SQUARE if plain else None,
    )
    kind = foreign_env("PJRT_DEVICE") or platform_name()
    for i in range(rows):
        table.add_row(*(_cell(f"{kind} {cells[i, j]}") for j in range(cols)))
    console.print(table, end="\n\n")
    return table


def _cell(text: str):
    centered = rich.align.Align(text, "center", vertical="middle")
    return rich.padding.Padding(centered, (1, 1, 1, 1), style=rich.style.Style(bgcolor=None, color=None))


def visualize_tensor_sharding(t: torch.Tensor, **kwargs):
    """:func:`visualize_sharding` of ``t``'s annotation (keyword arguments passed on).

    Example::

        visualize_tensor_sharding(model.fc.weight, use_color=False)
    """
    return visualize_sharding(construct_v1_sharding_str(t), **kwargs)


def __getattr__(name: str):
    raise missing_attribute(__name__, name)


__all__ = ["construct_v1_sharding_str", "visualize_sharding", "visualize_tensor_sharding"]
