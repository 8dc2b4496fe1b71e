"""FSDP2's custom copy ops on lazyxla tensors, for both of DTensor's execution models.

FSDP2 (``torch.distributed.fsdp.fully_shard``) copies parameters into and out of its flat communication buffers with
two custom ops, ``fsdp::chunk_cat`` and ``fsdp::split_with_sizes_copy``, that write their ``out`` argument.
Functionalization (every lazyxla user tensor is a functionalization wrapper) refuses custom ops with written
arguments; written as the same copies in ATen ops, they are functionalized as any other write. Installed when a
lazyxla process group is made (one process per device: ``process_group``) and when SPMD mode's DTensor support is
(``dtensor.install``); the kernels may be registered before FSDP2 defines the ops (the dispatcher keeps them).

Over replicas (one process per device) FSDP2 also "frees" each all-gather output after resharding by resizing its
storage to 0, which a lazy value has none of (``install_replicas``): the output is instead given a value that holds
no buffer (an error leaf, which syncs skip and a read reports), so between steps a rank keeps only its shard; the
next all-gather's copy-out replaces it whole. AdamW with ``capturable=True`` or ``fused=True`` keeps each
parameter's step counter on its device as a plain tensor and meets it with the DTensor states in in-place foreach ops
and the fused kernel; functionalization (above DTensor's Python key) meets the user's tensor first and refuses to
write a DTensor with it ("mutating a non-functional tensor with a functional tensor"), where CUDA's DTensor treats a
plain scalar as replicated: the counter is made a DTensor replicated over the parameter's mesh (as SPMD mode's
``dtensor`` does for a global mesh).

Example::

    functionalize()      # then fully_shard(module, mesh=init_device_mesh("lazyxla", (n,))) runs its copies
    install_replicas()   # (done when a lazyxla process group is made)
"""

from __future__ import annotations

import torch

from lazyxla import torch_private
from lazyxla.device import devices
from lazyxla.ir import Leaf, leaf
from lazyxla.lazy.tensor import LazyTensor, unwrap, wrap

_library: list[torch.library.Library] = []
_replicas_installed: list[bool] = []


def _chunk_cat(tensors, dim: int, num_chunks: int, out: torch.Tensor) -> None:
    out.copy_(torch_private.chunk_cat(tensors, dim, num_chunks))


def _split_with_sizes_copy(all_gather_output, all_gather_input_split_sizes, dim: int = 0, *, out) -> None:
    for target, part in zip(out, torch.split(all_gather_output, all_gather_input_split_sizes, dim=dim)):
        target.copy_(part)


def functionalize() -> None:
    """Give ``fsdp::chunk_cat`` and ``fsdp::split_with_sizes_copy`` Functionalize kernels made of ATen copies (once).

    Example::

        functionalize()
    """
    if _library:
        return
    lib = torch.library.Library("fsdp", "IMPL")
    lib.impl("chunk_cat", _chunk_cat, "Functionalize")
    lib.impl("split_with_sizes_copy", _split_with_sizes_copy, "Functionalize")
    _library.append(lib)


class FreedByFSDP(RuntimeError):
    """The value of an FSDP2 all-gather output between its reshard and its next all-gather."""


def _freed(out: torch.Tensor) -> torch.Tensor:
    """A tensor of ``out``'s shape and dtype whose value holds no buffer (an error leaf: syncs skip it)."""
    lt = unwrap(out)
    why = FreedByFSDP(
        "FSDP2 freed this all-gather output when it resharded its parameters (free_unsharded_param): read the "
        "parameter after its module's next forward, or call unshard() first"
    )
    return wrap(LazyTensor((leaf(Leaf.ERROR, why, lt._aval, lt._value[0].device), 0), lt._aval))


def _free_unsharded_param(original):
    def free_unsharded_param(self) -> None:
        outs = list(self.all_gather_outputs)
        extended = torch_private.fsdp_param_parts(self)[3]
        if devices.spmd_enabled() or extended or not all(torch_private.is_functional(o) for o in outs):
            return original(self)
        # Autograd's saved copies of the unsharded parameter are views of the output: the write must not bump their
        # version (FSDP's all-gather copy-out does the same).
        for out in outs:
            with torch.no_grad(), torch_private.preserve_version_counter(out):
                out.copy_(_freed(out))

    return free_unsharded_param


def _adam_init_group(original):
    def init_group(self, group, params_with_grad, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps):
        has_complex = original(
            self, group, params_with_grad, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps
        )
        if not devices.spmd_enabled():  # (SPMD mode's dtensor.install replaces this too, for global meshes)
            for i, (p, step) in enumerate(zip(params_with_grad, state_steps)):
                if _plain_beside_dtensor(p, step):
                    state_steps[i] = self.state[p]["step"] = _replicated(step, p.device_mesh)
        return has_complex

    return init_group


def _plain_beside_dtensor(param, step) -> bool:
    """Whether ``step`` is a plain lazyxla tensor beside ``param``, a DTensor (it has a device mesh)."""
    on_mesh = getattr(param, "device_mesh", None) is not None
    return on_mesh and type(step) is torch.Tensor and step.device.type == devices.torch_name()


def _replicated(t: torch.Tensor, mesh):
    """``t`` (a user's lazyxla tensor) as a DTensor replicated over ``mesh``."""
    # imported here: torch.distributed.tensor is loaded only by runs whose optimizer steps DTensors
    from torch.distributed.tensor import DTensor, Replicate

    return DTensor.from_local(t, mesh, [Replicate()] * mesh.ndim, run_check=False)


def install_replicas() -> None:
    """FSDP2 over lazyxla replicas: the copy ops' kernels (``functionalize``), the all-gather outputs' freeing
    without storage resizes and AdamW's device step counters as replicated DTensors (see the module docstring), once.

    Example::

        install_replicas()
    """
    functionalize()
    if not _replicas_installed:
        torch_private.replace_dtensor_conversions(
            {"fsdp_free_unsharded_param": _free_unsharded_param, "adam_init_group": _adam_init_group}
        )
        _replicas_installed.append(True)
