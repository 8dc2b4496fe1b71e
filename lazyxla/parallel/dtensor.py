"""DTensor in SPMD mode: a DTensor's placements are the XLA layout of one global tensor.

In SPMD mode (``lazyxla.spmd.enable()``) one process drives every device, so PyTorch's "one rank per device"
does not hold. This module makes PyTorch's own ``init_device_mesh("lazyxla", ...)``, ``distribute_tensor``,
DTensor ops, ``redistribute`` and ``full_tensor`` run in that model without per-device Python:

- **The world**: a ``DeviceMesh`` of device type ``lazyxla`` made when no process group exists gets one made
  for it (:class:`SpmdWorld`, backend ``"lazyxla_spmd"``): one rank per global device, this process being rank
  "its first device" (0 in a single process). It stands for every rank at once; its collectives keep the
  global view below (an all-reduce or broadcast of a global value is that value), and the ones that move
  per-rank parts (all-gather, reduce-scatter, scatter, all-to-all) raise, naming the path that ran per rank.
- **The global view**: a DTensor's local tensor (``to_local()``) is the whole global tensor, laid out over the
  mesh's devices as its placements say (``Shard(d)`` on mesh dimension ``i``: tensor dimension ``d`` split over
  mesh axis ``i``; ``Replicate`` and ``Partial``: not split). DTensor's sharding propagation still computes
  every output's placements and global metadata; the op itself runs once, on the global tensors, recorded
  into the step's graph, and XLA's partitioner (with the layouts as inputs and constraints) splits it.
  A ``Partial`` value is held reduced: reducing it is free, and making one (``Replicate -> Partial``) keeps
  the value.
- **The conversions**: where DTensor turns a global tensor into a rank's part or back, this module puts a
  layout instead (``torch_private.replace_dtensor_conversions`` names each place): ``distribute_tensor``'s
  per-placement split/replicate/partition, ``redistribute``'s (and an op's implicit) redistribution,
  ``from_local``'s global shape and tensor (the user's tensor is the global value, laid out as the placements
  say; ``to_local()`` hands back a user's tensor holding it), and the global-to-local rewrite of view and factory
  ops' shape arguments. So ``parallelize_module``'s styles (column/row-wise, sequence parallel) run unchanged.
  Each checks the mesh and leaves every other mesh (CPU, CUDA, the multi-process ``lazyxla`` backend) alone.

Example::

    lazyxla.spmd.enable()
    mesh = init_device_mesh("lazyxla", (2, 4), mesh_dim_names=("dp", "tp"))
    w = distribute_tensor(torch.randn(16, 32), mesh, [Replicate(), Shard(1)])   # columns over "tp"
    y = (x @ w).sum()                                # one partitioned program at the sync
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Callable, Iterator, Sequence

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from lazyxla import torch_private
from lazyxla.device import devices, processes
from lazyxla.lazy.tensor import LazyTensor, unwrap, wrap
from lazyxla.ops import ops
from lazyxla.parallel import fsdp_ops, spmd
from lazyxla.parallel.process_group import done

BACKEND = "lazyxla_spmd"
_installed = {"done": False}


def is_global(mesh) -> bool:
    """Whether ``mesh`` (a ``DeviceMesh``) is one whose DTensors hold global tensors: a ``lazyxla`` mesh in SPMD
    mode.

    Example::

        assert is_global(init_device_mesh("lazyxla", (8,)))
    """
    return mesh is not None and mesh.device_type == devices.torch_name() and spmd.is_enabled()


# --- the world -------------------------------------------------------------------------------------


class SpmdWorld(ProcessGroup):
    """The process group of a process that stands for several ranks (SPMD mode): one rank per device.

    Under the global view every rank holds the same (global) value, so a reduction or a broadcast returns its
    input; a collective that moves per-rank parts cannot be expressed that way and raises.
    """

    def __init__(self, rank: int, size: int) -> None:
        super().__init__(rank, size)
        self._rank, self._size = rank, size

    def getBackendName(self) -> str:
        return BACKEND

    def size(self) -> int:
        return self._size

    def allreduce(self, tensors, opts=None):
        # the sum over ranks of a value every rank holds whole is that value, under the global view
        return done(list(tensors))

    def allreduce_coalesced(self, tensors, opts=None):
        return done(list(tensors))

    def broadcast(self, tensors, opts=None):
        return done(list(tensors))

    def barrier(self, opts=None):
        return done([])

    def _per_rank(self, what: str):
        raise NotImplementedError(
            f"a {what} ran on the SPMD world (lazyxla.spmd.enable()): there the process stands for every rank and "
            "a DTensor holds its global tensor, so per-rank parts do not exist. The code that called it works on "
            "a rank's part; use DTensor operations (redistribute, full_tensor), or run one process per device "
            "(lazyxla.spawn / torchrun with init_process_group('lazyxla')) for it"
        )

    def allgather(self, output_lists, input_tensors, opts=None):
        self._per_rank("all_gather")

    def _allgather_base(self, output, x, opts=None):
        self._per_rank("all_gather_into_tensor")

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        self._per_rank("all_gather_into_tensor")

    def reduce_scatter(self, outputs, input_lists, opts=None):
        self._per_rank("reduce_scatter")

    def _reduce_scatter_base(self, output, x, opts=None):
        self._per_rank("reduce_scatter_tensor")

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        self._per_rank("reduce_scatter_tensor")

    def alltoall_base(self, output, x, output_split_sizes, input_split_sizes, opts=None):
        self._per_rank("all_to_all")

    def scatter(self, outputs, input_lists, opts=None):
        self._per_rank("scatter")

    def gather(self, output_lists, inputs, opts=None):
        self._per_rank("gather")


def _create(common, backend_options) -> SpmdWorld:
    pg = SpmdWorld(common.group_rank, common.group_size)
    # torch.distributed names only the groups it wraps, and a group's name lives in its backends: a Python group
    # that DeviceMesh and the functional collectives find by name needs one (it does no communication)
    torch_private.name_python_group(pg, common.group_id, [devices.torch_name(), "cpu"])
    return pg


def _ensure_world() -> None:
    """Make the SPMD world the default process group, unless one exists."""
    if dist.is_initialized():
        return
    if BACKEND not in dist.Backend.backend_list:
        dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=[devices.torch_name(), "cpu"])
    # this process is the rank of its first device: ranks of a mesh are global device positions
    first = len(devices.local_devices()) * processes.global_ordinal()
    dist.init_process_group(BACKEND, store=dist.HashStore(), rank=first, world_size=spmd.device_count())


# --- placements as layouts ---------------------------------------------------------------------------


@functools.lru_cache(maxsize=64)
def _lazyxla_mesh(ids: tuple[int, ...], shape: tuple[int, ...], names: tuple[str, ...]) -> spmd.Mesh:
    return spmd.Mesh(ids, shape, names)


def _axis_names(root) -> tuple[str, ...]:
    names = root.mesh_dim_names
    return tuple(names) if names else tuple(f"dim{i}" for i in range(root.ndim))


def mesh_of(mesh) -> tuple[spmd.Mesh, tuple[str, ...]]:
    """The lazyxla mesh a ``DeviceMesh`` stands for (its root mesh's, made once), and the axis name of each of
    ``mesh``'s dimensions on it (a sub-mesh's dimensions are some of its root's; others are replicated over).

    Example::

        m, axes = mesh_of(init_device_mesh("lazyxla", (2, 4), mesh_dim_names=("dp", "tp"))["tp"])   # axes == ("tp",)
    """
    root = torch_private.root_mesh(mesh)
    names = _axis_names(root)
    if root.mesh.numel() != spmd.device_count():
        # one program spans every device of the run, so each array's layout does too (XLA's partitioner has no
        # "these 2 of 8 devices"); a mesh over some devices would be a sub-mesh of a mesh over all of them
        raise ValueError(
            f"DTensor in SPMD mode: the DeviceMesh {root} has {root.mesh.numel()} devices, but a lazyxla mesh in "
            f"SPMD mode spans all {spmd.device_count()} devices of the run. Make a mesh over all of them and use one "
            f"of its dimensions, e.g. init_device_mesh('lazyxla', (dp, tp), mesh_dim_names=('dp', 'tp'))['tp'] "
            f"with dp * tp == {spmd.device_count()}"
        )
    m = _lazyxla_mesh(tuple(root.mesh.reshape(-1).tolist()), tuple(root.mesh.shape), names)
    if root is mesh:
        return m, names
    if not mesh.mesh_dim_names or not set(mesh.mesh_dim_names) <= set(names):
        raise NotImplementedError(
            f"DTensor in SPMD mode: the sub-mesh {mesh} is not named by its root's dimensions {names}; slice "
            "meshes by their names (mesh['tp']); flattened meshes are not supported yet"
        )
    return m, tuple(mesh.mesh_dim_names)


def spec_of(mesh, placements: Sequence, ndim: int) -> tuple[spmd.Mesh, tuple]:
    """The lazyxla mesh and partition spec of a tensor of ``ndim`` dimensions placed as ``placements`` on
    ``mesh``: ``Shard(d)`` on mesh dimension ``i`` puts axis ``i`` on tensor dimension ``d`` (several on one
    dimension split it over their product, outer mesh dimension first, as DTensor does); ``Replicate`` and
    ``Partial`` put none.

    Example::

        spec_of(mesh_2x4, [Replicate(), Shard(1)], 2)     # (lazyxla mesh, (None, "tp"))
    """
    m, axes = mesh_of(mesh)
    entries: list[list[str]] = [[] for _ in range(ndim)]
    inner: list[list[str]] = [[] for _ in range(ndim)]
    for i, (axis, p) in enumerate(zip(axes, placements)):
        if type(p).__name__ == "_StridedShard":  # (not a Shard, nor is_shard(), in torch 2.13)
            _check_strided(mesh, placements, i, p)
            inner[p.dim % ndim].append(axis)
        elif p.is_shard():
            entries[p.dim % ndim].append(axis)
    return m, tuple(_entry(e + s) for e, s in zip(entries, inner))


def _entry(names: list[str]):
    return None if not names else names[0] if len(names) == 1 else tuple(names)


def _check_strided(mesh, placements: Sequence, i: int, p) -> None:
    """A ``_StridedShard(d, split_factor=f)`` on mesh dimension ``i`` (FSDP2's placement over TP's ``Shard(d)``)
    splits each part that the later mesh dimensions sharding ``d`` make: its axis comes after theirs on ``d``
    (inner), which a partition spec says when ``f`` is the product of their sizes."""
    later = [j for j in range(i + 1, len(placements)) if getattr(placements[j], "dim", None) == p.dim]
    if p.split_factor != _product(mesh.size(j) for j in later):
        raise NotImplementedError(
            f"DTensor in SPMD mode: placement {p} on mesh dimension {i} of {tuple(placements)}: only a split "
            "factor equal to the later mesh dimensions sharding the same tensor dimension is supported"
        )


def _product(sizes) -> int:
    out = 1
    for n in sizes:
        out *= n
    return out


def laid_out(t: torch.Tensor, m: spmd.Mesh, spec: tuple) -> torch.Tensor:
    """A new tensor holding ``t``'s value laid out over ``m`` as ``spec`` (``t`` keeps its own layout): its buffer
    re-laid out now if computed, else a sharding constraint in the graph. The result is a bare ``LazyTensor``, not
    the functionalization wrapper users hold: DTensor runs its local ops below the dispatch keys it passed
    (functionalization among them), where a wrapper's op would reach the device with unwrapped arguments.

    Example::

        w8 = laid_out(w, mesh, ("fsdp", None))
    """
    lt = unwrap(t)
    out = LazyTensor(lt._value, lt._aval)
    if all(e is None for e in spec) and not spmd.is_annotated(out):
        return out  # a plain device tensor is replicated already
    return spmd.mark_sharding(out, m, spec)


def _current_spec(t: torch.Tensor, m: spmd.Mesh) -> list:
    """``t``'s partition spec over ``m`` as a list (all None when it is laid out otherwise)."""
    got = spmd.get_sharding(t)
    if got is None or got[0] is not m:
        return [None] * t.dim()
    return list(got[1])


def _with_axis(spec: list, axis: str, dim: int | None) -> tuple:
    """``spec`` with mesh axis ``axis`` taken off every dimension and, if ``dim`` is given, put last on it."""
    out = []
    for d, entry in enumerate(spec):
        names = [] if entry is None else [entry] if isinstance(entry, str) else list(entry)
        names = [n for n in names if n != axis] + ([axis] if d == dim else [])
        out.append(None if not names else names[0] if len(names) == 1 else tuple(names))
    return tuple(out)


# --- the conversions DTensor makes, for global meshes ----------------------------------------------


def _make_shard_tensor(original: Callable) -> Callable:
    def make_shard_tensor(cls, dim, tensor, mesh, mesh_dim, src_data_rank=0, *args, **kwargs):
        if not is_global(mesh):
            return original(dim, tensor, mesh, mesh_dim, src_data_rank, *args, **kwargs)
        m, axes = mesh_of(mesh)
        return laid_out(tensor, m, _with_axis(_current_spec(tensor, m), axes[mesh_dim], dim))

    return make_shard_tensor


def _make_replicate_tensor(original: Callable) -> Callable:
    def make_replicate_tensor(cls, tensor, mesh, mesh_dim, src_data_rank=0, *args, **kwargs):
        if not is_global(mesh):
            return original(tensor, mesh, mesh_dim, src_data_rank, *args, **kwargs)
        m, axes = mesh_of(mesh)
        spec = _current_spec(tensor, m)
        return laid_out(tensor, m, _with_axis(spec, axes[mesh_dim], None))

    return make_replicate_tensor


def _partition_value(original: Callable) -> Callable:
    def partition_value(self, tensor, mesh, mesh_dim, *args, **kwargs):
        if not is_global(mesh):
            return original(self, tensor, mesh, mesh_dim, *args, **kwargs)
        return tensor  # a Partial is held reduced: making one keeps the value

    return partition_value


def _redistribute_local_tensor(original: Callable) -> Callable:
    def redistribute_local_tensor(local_tensor, current_spec, target_spec, *args, **kwargs):
        if not is_global(current_spec.mesh):
            return original(local_tensor, current_spec, target_spec, *args, **kwargs)
        if current_spec.mesh != target_spec.mesh:
            raise NotImplementedError("DTensor in SPMD mode: redistributing to another device mesh")
        m, spec = spec_of(target_spec.mesh, target_spec.placements, local_tensor.dim())
        return laid_out(local_tensor, m, spec)

    return redistribute_local_tensor


def _adjust_shape_and_stride_args(original: Callable) -> Callable:
    def adjust_shape_and_stride_args(self, out_tensor_meta, schema, spec):
        if not is_global(spec.mesh):
            return original(self, out_tensor_meta, schema, spec)
        return schema  # the op runs on the global tensor: its shape arguments stay global

    return adjust_shape_and_stride_args


def _compute_global_tensor_info(original: Callable) -> Callable:
    def compute_global_tensor_info(tensor, mesh, placements):
        if not is_global(mesh):
            return original(tensor, mesh, placements)
        return list(tensor.shape), list(tensor.stride())  # from_local is given the global tensor

    return compute_global_tensor_info


def _setup_world_group_and_device(original: Callable) -> Callable:
    def setup_world_group_and_device(self):
        if not is_global(self):
            return original(self)
        _ensure_world()
        world = dist.get_world_size()
        if self.size() > world:
            raise RuntimeError(
                f"init_device_mesh: a mesh of {self.size()} devices, but the run has {world} "
                "(lazyxla.spmd.device_count())"
            )
        return None  # one device stands for all: nothing to select

    return setup_world_group_and_device


# --- optimizer step counters of DTensor parameters ------------------------------------------------------------
#
# AdamW with capturable=True or fused=True keeps each parameter's step counter on the parameter's device, a plain
# tensor (``torch.zeros((), device=p.device)``), and meets it with the DTensor states in in-place foreach ops and
# the fused kernel. On CUDA DTensor treats a plain scalar tensor as replicated; on lazyxla functionalization sees
# the user's tensor (a functionalization wrapper) first and refuses to write a DTensor with it ("mutating a
# non-functional tensor with a functional tensor"). On a global mesh the counter is made a replicated DTensor of
# the parameter's mesh (where the state is made, and where a loaded state's counter first meets its parameter).


def _adam_init_group(original: Callable) -> Callable:
    def init_group(self, group, params_with_grad, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps):
        has_complex = original(
            self, group, params_with_grad, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps
        )
        for i, (p, step) in enumerate(zip(params_with_grad, state_steps)):
            if _plain_on_global(p, step):
                state_steps[i] = self.state[p]["step"] = _replicated(step, p.device_mesh)
        return has_complex

    return init_group


def _plain_on_global(param, step) -> bool:
    """Whether ``step`` is a plain lazyxla tensor beside ``param``, a DTensor on a global mesh."""
    mesh = getattr(param, "device_mesh", None)
    return type(step) is torch.Tensor and step.device.type == devices.torch_name() and is_global(mesh)


def _replicated(t: torch.Tensor, mesh):
    """``t`` (a user's lazyxla tensor) as a DTensor replicated over ``mesh``."""
    # imported here: torch.distributed.tensor is loaded only by runs that use SPMD mode (see install)
    from torch.distributed.tensor import DTensor, Replicate

    return DTensor.from_local(t, mesh, [Replicate()] * mesh.ndim, run_check=False)


# --- from_local / to_local: between the user's tensors and a DTensor's bare local tensor -----------------------
#
# A DTensor's local tensor is a bare LazyTensor (DTensor's local ops run with functionalization excluded); the
# user's tensors are functionalization wrappers. ``from_local`` (and so the gradient of ``to_local``, which
# PyTorch makes a DTensor by ``from_local``) takes the global value out of the wrapper and lays it out as the
# placements say; ``to_local`` (and the gradient of ``from_local``) hands the user a wrapper, as every other
# lazyxla tensor the user holds is, so it mixes with the user's own tensors. Each is differentiable, as
# PyTorch's is: the autograd functions stay PyTorch's, only the tensors crossing them change kind.


def _as_user(t: torch.Tensor | None) -> torch.Tensor | None:
    """A DTensor's bare local tensor as a user's tensor (a functionalization wrapper around the same value)."""
    return wrap(t) if isinstance(t, LazyTensor) else t


def _from_local_forward(original: Callable) -> Callable:
    def forward(ctx, input, device_mesh, placements, *args, **kwargs):
        if not is_global(device_mesh) or input.device.type != devices.torch_name():
            return original(ctx, input, device_mesh, placements, *args, **kwargs)
        lt = unwrap(input)
        out = original(ctx, LazyTensor(lt._value, lt._aval), device_mesh, placements, *args, **kwargs)
        # the global value, laid out as the placements say (after PyTorch's fresh view of it, which would hide a
        # layout given to its input)
        m, partition = spec_of(device_mesh, placements, input.dim())
        out._local_tensor = laid_out(out._local_tensor, m, partition)
        return out

    return forward


def _from_local_backward(original: Callable) -> Callable:
    def backward(ctx, grad_output):
        grads = original(ctx, grad_output)
        if not is_global(ctx.forward_input_device_mesh):
            return grads
        return (_as_user(grads[0]), *grads[1:])  # the gradient of the user's tensor is a user's tensor

    return backward


def _to_local_forward(original: Callable) -> Callable:
    def forward(ctx, input, grad_placements):
        local = original(ctx, input, grad_placements)
        return _as_user(local) if is_global(input.device_mesh) else local

    return forward


# --- FSDP2 over tensor-parallel parameters (2-D meshes) ----------------------------------------------------------
#
# FSDP2 copies a TP parameter's local tensor into its sharded buffer through a view (done on a user's tensor
# here, as only those keep views), and makes its unsharded form a DTensor (of the TP placements) over a view of
# its all-gather output, once, and relies on that aliasing: each later all-gather writes the output, and the
# parameter sees it. A DTensor here holds a bare LazyTensor, which no view keeps, so the DTensor's local tensor
# is made again from the all-gather output at every all-gather (FSDP calls ``init_unsharded_param`` for each),
# laid out as its placements say.


def _fsdp_init_sharded_param(original: Callable) -> Callable:
    def init_sharded_param(self, param, *args, **kwargs):
        spec = getattr(param, "_spec", None)
        if spec is None or not is_global(spec.mesh) or not isinstance(param._local_tensor, LazyTensor):
            return original(self, param, *args, **kwargs)
        # FSDP copies the TP parameter's local tensor into a slice of a new padded buffer: an in-place write
        # through a view, which only a user's (functionalization) tensor keeps
        local = param._local_tensor
        param._local_tensor = wrap(local)
        try:
            return original(self, param, *args, **kwargs)
        finally:
            param._local_tensor = local

    return init_sharded_param


def _fsdp_init_unsharded_param(original: Callable) -> Callable:
    def init_unsharded_param(self) -> None:
        original(self)
        param, size, stride = torch_private.fsdp_unsharded_parts(self)
        spec = getattr(param, "_spec", None)
        if spec is None or not is_global(spec.mesh) or len(self.all_gather_outputs) != 1:
            return
        value = unwrap(self.all_gather_outputs[0]).as_strided(size, stride, 0)
        m, partition = spec_of(spec.mesh, spec.placements, len(size))
        param._local_tensor = laid_out(value, m, partition)

    return init_unsharded_param


# --- FSDP2 (fully_shard) on a global mesh ----------------------------------------------------------------
#
# FSDP2 cuts each parameter into ``world size`` chunks, keeps this rank's, and all-gathers (forward) and
# reduce-scatters (backward) per rank. Under the global view the process holds every rank's part at once, so
# FSDP's own arithmetic is that of a world of one: the shard group is one rank (FSDP's world-size-1 paths: no
# chunking, the all-gather and reduce-scatter are copies, no gradient division, which the global loss does not
# need), while the parameter's DTensor keeps the mesh and ``Shard(0)``, so its (whole) local tensor is laid out
# over the mesh's devices. The all-gather is a "replicated" sharding constraint on that local tensor, the
# reduce-scatter the ``Shard(0)`` layout of the gradient: XLA's partitioner turns both into its collectives.


class _OneRank(SpmdWorld):
    """The shard group FSDP2 sees on a global mesh: one rank, this process, which holds every device's part."""


def _fsdp_mesh_info(original: Callable) -> Callable:
    def post_init(self) -> None:
        original(self)
        if not is_global(self.mesh):
            return
        self.shard_mesh_size, self.shard_mesh_rank, self.shard_process_group = 1, 0, _OneRank(0, 1)
        if hasattr(self, "replicate_process_group"):  # HSDP: the replicas are one global tensor too
            self.replicate_mesh_size, self.replicate_mesh_rank, self.replicate_process_group = 1, 0, _OneRank(0, 1)

    return post_init


def _fsdp_to_sharded_dtensor(original: Callable) -> Callable:
    def to_sharded_dtensor(self, tensor: torch.Tensor):
        mesh, placements, _, _ = torch_private.fsdp_param_parts(self)
        if not is_global(mesh):
            return original(self, tensor)
        # the parameter (or its reduced gradient) whole, laid out as FSDP's placements say: the reduce-scatter
        m, spec = spec_of(mesh, placements, tensor.dim())
        return original(self, laid_out(tensor, m, spec))

    return to_sharded_dtensor


def _fsdp_all_gather_inputs(original: Callable) -> Callable:
    def all_gather_inputs(self) -> list[torch.Tensor]:
        mesh, _, local, _ = torch_private.fsdp_param_parts(self)
        if not is_global(mesh) or self.sharded_state.name != "SHARDED" or hasattr(local, "fsdp_pre_all_gather"):
            return original(self)
        # FSDP's flat shard buffer aliases the local tensor only through a view, which a bare LazyTensor (what a
        # DTensor holds here) does not keep: the all-gather starts from the DTensor's local tensor, constrained
        # to be replicated (XLA all-gathers it inside the step's program)
        m, _ = mesh_of(mesh)
        gathered = ops.shard(LazyTensor(local._value, local._aval), m.key, json.dumps([None] * local.dim()))
        if self.param_dtype is not None:
            gathered = gathered.to(self.param_dtype)
        return [gathered.reshape(-1)]

    return all_gather_inputs


def _fsdp_free_unsharded_param(original: Callable) -> Callable:
    def free_unsharded_param(self) -> None:
        mesh, placements, local, extended = torch_private.fsdp_param_parts(self)
        if not is_global(mesh) or extended:
            return original(self)
        # A lazy tensor's storage cannot be resized (FSDP frees it so); what freeing means here is that the
        # gathered (replicated) value is not kept: the all-gather output is given the parameter's value again, so
        # a sync holds it laid out as the parameter (1/N per device), and the next all-gather overwrites it.
        # Autograd's saved copies of the unsharded parameter are views of it: the write must not bump their
        # version (FSDP's all-gather copy-out does the same).
        m, spec = spec_of(mesh, placements, local.dim())
        for out in self.all_gather_outputs:
            flat = ops.shard(local.reshape(-1).to(out.dtype), m.key, json.dumps([spec[0]]))
            with torch.no_grad(), torch_private.preserve_version_counter(out):
                out.copy_(flat)

    return free_unsharded_param


def _fsdp_post_backward(original: Callable) -> Callable:
    def post_backward(self, *unused):
        # FSDP adds a new reduced gradient to one it holds (accumulation without set_requires_gradient_sync(False),
        # zero_grad(set_to_none=False)) by ``grad._local_tensor += new``: the held one is a bare LazyTensor, the new
        # one a user's tensor (made in backward), which functionalization refuses to mix. It adds to the held one as
        # a user's tensor, then gets it back bare, laid out as its placements say.
        held = [g for g in (fp.sharded_param.grad for fp in self.fsdp_params) if _global_bare(g)]
        for grad in held:
            grad._local_tensor = wrap(grad._local_tensor)
        try:
            return original(self, *unused)
        finally:
            for grad in held:
                m, spec = spec_of(grad.device_mesh, grad.placements, grad.dim())
                grad._local_tensor = laid_out(grad._local_tensor, m, spec)

    return post_backward


def _global_bare(grad) -> bool:
    """Whether ``grad`` is a DTensor on a global mesh holding a bare LazyTensor."""
    local = getattr(grad, "_local_tensor", None)
    return isinstance(local, LazyTensor) and is_global(grad.device_mesh)


def _ensure_stream_api() -> None:
    """FSDP2 orders its copies and collectives with the device module's streams and events. Where the device module
    has none (``torch.lazyxla`` gets them with the device module's own streams), give it ones that only order:
    every op is recorded in program order, so each wait is satisfied already."""
    module = torch.get_device_module(devices.torch_name())
    if hasattr(module, "Stream"):
        return
    module.Stream, module.Event = _Stream, _Event
    module.current_stream = module.default_stream = lambda device=None: _DEFAULT_STREAM
    module.stream = _use_stream


class _Event:
    """An event on a lazy device: recorded work is in program order, so it is always complete when waited on."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def record(self, stream=None) -> _Event:
        return self

    def wait(self, stream=None) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


class _Stream:
    """A stream on a lazy device: an ordering, not concurrency (all work is one program, in program order)."""

    def __init__(self, device=None, priority: int = 0, **kwargs) -> None:
        self.priority = priority

    def wait_stream(self, other) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def record_event(self, event=None) -> _Event:
        return event if event is not None else _Event()

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


_DEFAULT_STREAM = _Stream()


@contextlib.contextmanager
def _use_stream(stream) -> Iterator[None]:
    yield  # one program order for every stream


# --- random ops ------------------------------------------------------------------------------------
#
# On CUDA, DTensor's ``OffsetBasedRNGTracker`` moves each rank's Philox offset to its shard's place in the whole
# tensor's stream, so the shards of one draw differ and replicas agree. Under the global view one program draws the
# whole tensor once, which is that already: the tracker leaves a global mesh's draws alone (no state sync over the
# world, no offsets), and the lazyxla generator advances as for any draw.


def _rng_tracker_init(original: Callable) -> Callable:
    def init(self, device_mesh, run_state_sync: bool = True, *args, **kwargs):
        # one process holds every rank's state: nothing to synchronize
        original(self, device_mesh, False if is_global(device_mesh) else run_state_sync, *args, **kwargs)
        self._lazyxla_global = is_global(device_mesh)

    return init


def _rng_distribute_region(original: Callable) -> Callable:
    @contextlib.contextmanager
    def distribute_region(self, spec, generator=None):
        if getattr(self, "_lazyxla_global", False) and is_global(spec.mesh):
            yield  # the op draws the global tensor, with the generator's own advance
            return
        with original(self, spec, generator):
            yield

    return distribute_region


def install() -> None:
    """Make DTensors on ``lazyxla`` meshes hold global tensors in SPMD mode (``lazyxla.spmd.enable()`` calls it).

    Example::

        lazyxla.parallel.dtensor.install()
    """
    if _installed["done"]:
        return
    torch_private.replace_dtensor_conversions(
        {
            "make_shard_tensor": _make_shard_tensor,
            "make_replicate_tensor": _make_replicate_tensor,
            "partition_value": _partition_value,
            "redistribute_local_tensor": _redistribute_local_tensor,
            "adjust_shape_and_stride_args": _adjust_shape_and_stride_args,
            "compute_global_tensor_info": _compute_global_tensor_info,
            "setup_world_group_and_device": _setup_world_group_and_device,
            "from_local_forward": _from_local_forward,
            "from_local_backward": _from_local_backward,
            "to_local_forward": _to_local_forward,
            "fsdp_init_sharded_param": _fsdp_init_sharded_param,
            "fsdp_init_unsharded_param": _fsdp_init_unsharded_param,
            "fsdp_mesh_info": _fsdp_mesh_info,
            "fsdp_to_sharded_dtensor": _fsdp_to_sharded_dtensor,
            "fsdp_all_gather_inputs": _fsdp_all_gather_inputs,
            "fsdp_free_unsharded_param": _fsdp_free_unsharded_param,
            "rng_tracker_init": _rng_tracker_init,
            "rng_distribute_region": _rng_distribute_region,
            "fsdp_post_backward": _fsdp_post_backward,
            "adam_init_group": _adam_init_group,
        }
    )
    _ensure_stream_api()
    fsdp_ops.functionalize()  # (FSDP2's copy ops: parallel/fsdp_ops.py)
    _installed["done"] = True


spmd.on_enable(install)  # torch.distributed.tensor is loaded then, only by runs that use SPMD mode
