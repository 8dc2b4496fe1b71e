"""Programs that span the run's replicas: one XLA program over a mesh of one device per process.

A sync whose graph holds a collective, in a run of several replicas, is lowered as ``shard_map`` over
a 1-D mesh (axis ``"replica"``) of every process's device: each process passes its own arrays, seen by
the program as its block of a global array concatenated along the first dimension (0-d values travel
as shape ``(1,)``), and gets its own block of each result back. Collectives inside are XLA's.
"""

from __future__ import annotations

import functools

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from lazyxla.device import devices, processes

AXIS = "replica"


class Replicas:
    """The mesh of a multi-replica program and how arrays cross between local and global."""

    def __init__(self) -> None:
        self.devices = processes.replica_devices()
        self.world = len(self.devices)
        self.mesh = jax.sharding.Mesh(np.array(self.devices), (AXIS,))
        self.sharding = NamedSharding(self.mesh, P(AXIS))
        self.local = self.devices[processes.process_index()]

    def global_spec(self, spec: jax.ShapeDtypeStruct) -> jax.ShapeDtypeStruct:
        shape = (self.world * spec.shape[0], *spec.shape[1:]) if spec.shape else (self.world,)
        return jax.ShapeDtypeStruct(shape, spec.dtype, sharding=self.sharding)

    def wrap(self, fn, local_specs: list, n_out: int):
        """``fn`` (of local arrays) as a function of global arrays, each process computing its block."""
        scalar_in = [not s.shape for s in local_specs]

        def body(*blocks):
            outs = fn(*[b.reshape(()) if s else b for b, s in zip(blocks, scalar_in)])
            return tuple(o.reshape((1,)) if o.ndim == 0 else o for o in outs)

        specs = (P(AXIS),) * len(local_specs)
        return jax.shard_map(body, mesh=self.mesh, in_specs=specs, out_specs=(P(AXIS),) * n_out)

    def globalize(self, args: list) -> list:
        """This process's arguments as its blocks of the program's global arguments."""
        out = []
        with devices.x64():
            for a in args:
                if not isinstance(a, jax.Array):  # the packed scalars and RNG keys
                    a = devices.send_to(a, self.local)
                if a.ndim == 0:
                    a = a.reshape((1,))
                shape = (self.world * a.shape[0], *a.shape[1:])
                out.append(jax.make_array_from_single_device_arrays(shape, self.sharding, [a]))
        return out

    @staticmethod
    def localize(outs, avals) -> list:
        """This process's block of each global result, with the result's own shape."""
        local = []
        for o, aval in zip(outs, avals):
            block = o.addressable_data(0)
            local.append(block.reshape(()) if not aval.shape else block)
        return local


_replicas: Replicas | None = None


def replicas() -> Replicas:
    """The run's replica mesh (built once)."""
    global _replicas
    if _replicas is None:
        _replicas = Replicas()
    return _replicas


@functools.cache
def _pair_program(src: int, dst: int):
    """XLA's collective permute from process ``src`` to process ``dst`` over a mesh of their two devices (the other
    processes take no part), and the layout of its global argument."""
    every = processes.replica_devices()
    mesh = jax.sharding.Mesh(np.array([every[src], every[dst]]), (AXIS,))
    body = jax.shard_map(lambda b: jax.lax.ppermute(b, AXIS, [(0, 1)]), mesh=mesh, in_specs=P(AXIS), out_specs=P(AXIS))
    return jax.jit(body), NamedSharding(mesh, P(AXIS))


def permute_pair(block: jax.Array, src: int, dst: int) -> jax.Array:
    """Send ``block`` from replica ``src`` to replica ``dst`` in one program of those two processes (both call it,
    with blocks of one shape and dtype, on their own device); returns this process's block of the result: ``src``'s
    values in ``dst``, zeros in ``src``. torch.distributed's ``send``/``recv`` on the device.

    Example::

        got = permute_pair(mine, src=0, dst=1)       # in process 0 and in process 1
    """
    fn, sharding = _pair_program(src, dst)
    with devices.x64():
        flat = block.reshape((1,)) if block.ndim == 0 else block
        shape = (2 * flat.shape[0], *flat.shape[1:])
        out = fn(jax.make_array_from_single_device_arrays(shape, sharding, [flat])).addressable_data(0)
    return out.reshape(block.shape)
