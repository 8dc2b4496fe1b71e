"""``torch_xla.distributed.fsdp.XlaFullyShardedDataParallel`` on lazyxla: FSDP over replicas (ZeRO-3).

Each replica (an ``xmp.spawn`` process) keeps 1/N of every parameter of a wrapped unit: the parameter is
flattened (or, with ``shard_param_on_dim_0``, left whole), padded to a multiple of N (times 128 when flattened,
as torch_xla pads), and only this replica's slice is registered, as ``_fsdp_shard...``. The optimizer therefore
sees, and keeps state for, the shards only.

How a step runs (all of it recorded into the step's one XLA program):

* forward: the unit all-gathers its shards (``xm.all_gather``, one coalesced collective per unit), binds the full
  tensors to the wrapped modules' attributes and runs the module; units other than the root drop them after
  their forward (``reshard_after_forward``);
* backward: the all-gather is differentiable, its backward is ``xm.reduce_scatter`` of the gradient with torch_xla's
  pre/post division by the replica count, so each shard's ``.grad`` is its slice of the replicas' mean gradient;
  a unit whose forward is recomputed (gradient checkpointing) gathers its shards again first;
* ``optimizer.step()`` (not ``xm.optimizer_step``, which would all-reduce again) updates the shards.

What differs from torch_xla, and why: torch_xla keeps one leaf tensor per full parameter and swaps its XLA data
between the gathered value and a placeholder (``_replace_xla_tensor``), with hooks that reduce-scatter its
``.grad``; here autograd carries the gradient from the gathered tensors to the shards through the all-gather's own
backward, which needs no private tensor surgery and gives the same numbers. ``optimization_barrier_*`` options
are accepted and have no effect (lazyxla has no optimization barrier); ``pin_layout_in_collective_ops``,
``reduce_scatter_bucket_size_mb``, ``coalesce_all_gather_ops`` and ``_use_xla_patched_linear`` need nothing
(lazyxla coalesces each unit's collectives and its linear layers' backward never holds a stale weight).

Example::

    from torch_xla.distributed.fsdp import XlaFullyShardedDataParallel as FSDP
    model = FSDP(MyModel())                          # before the optimizer: it must see the shards
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss = model(x).sum(); loss.backward()
    opt.step()                                       # not xm.optimizer_step(opt)
    xm.mark_step()
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from enum import Enum, auto
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import lazyxla
from lazyxla.compat._common import missing_attribute, unsupported
from lazyxla.compat.torch_xla.core import xla_model as xm
from lazyxla.compat.torch_xla.distributed.fsdp._support import (
    _DEBUG_DUMMIES,
    _UNIT_OPTIONS,
    _cast_floating,
    _defines_forward,
    _EndOfBackward,
    _GatherFull,
    _materialize_module,
    _tensors_in,
)
from lazyxla.compat.torch_xla.distributed.fsdp.wrap import recursive_wrap
from lazyxla.compat.torch_xla.distributed.fsdp.xla_flatten_params_wrapper import XlaFlattenParamsWrapper

FLOAT_DTYPES = [torch.float32, torch.float16, torch.bfloat16]
_SEPARATOR = "_FSDP_SHARD_SEPARATOR_"  # replaces the dots of an original name in its shard's name


class TrainingState(Enum):
    """Where a unit is in a step (``XlaFullyShardedDataParallel.training_state``).

    Example::

        assert model.training_state == TrainingState.IDLE
    """

    IDLE = auto()
    FORWARD = auto()
    BACKWARD_PRE = auto()
    BACKWARD_POST = auto()


class XlaFullyShardedDataParallel(nn.Module):
    """Shards ``module``'s parameters over the replicas (see the module docstring for how a step runs).

    Arguments are torch_xla's, with its defaults. Those that change what is computed: ``reshard_after_forward``,
    ``flatten_parameters``, ``execute_sharding_on_init``, ``sync_on_finalization``, ``disable_reshard_on_root``,
    ``compute_dtype``, ``buffer_dtype``, ``fp32_reduce_scatter``, ``sharding_groups``/``sharding_rank``/
    ``sharding_world_size``, ``shard_param_on_dim_0``, ``auto_wrap_policy``, ``auto_wrapper_callable``,
    ``param_init_fn`` and ``_shard_size_multiple``. The others are accepted for compatibility (see above).

    Checkpoints: save ``model.state_dict()`` (this replica's shards) with ``model.get_shard_metadata()`` from every
    replica; ``consolidate_sharded_model_checkpoints`` stitches them into the unwrapped model's state dict.

    Example::

        policy = partial(transformer_auto_wrap_policy, transformer_layer_cls={Block})
        checkpointed = lambda m, *args, **kwargs: FSDP(checkpoint_module(m), *args, **kwargs)
        model = FSDP(GPT(), auto_wrap_policy=policy, auto_wrapper_callable=checkpointed)
        opt = torch.optim.AdamW(model.parameters())
        model(x).mean().backward(); opt.step(); xm.mark_step()
        xm.save({"model": model.state_dict(), "shard_metadata": model.get_shard_metadata()},
                f"ckpt_rank-{xr.global_ordinal()}.pth", master_only=False)
    """

    def __init__(
        self,
        module: nn.Module,
        reshard_after_forward: bool = True,
        flatten_parameters: bool = False,
        execute_sharding_on_init: bool = True,
        optimization_barrier_in_forward: bool = True,
        optimization_barrier_in_backward: bool = True,
        sync_on_finalization: bool = False,
        disable_reshard_on_root: bool = True,
        compute_dtype: torch.dtype | None = None,
        buffer_dtype: torch.dtype | None = None,
        fp32_reduce_scatter: bool = False,
        sharding_groups: list[list[int]] | None = None,
        sharding_rank: int | None = None,
        sharding_world_size: int | None = None,
        shard_param_on_dim_0: bool = False,
        pin_layout_in_collective_ops: bool = True,
        reduce_scatter_bucket_size_mb: int | None = 0,
        coalesce_all_gather_ops: bool = False,
        auto_wrap_policy: Callable | None = None,
        auto_wrapper_callable: Callable | None = None,
        param_init_fn: Callable[[nn.Module], None] | None = None,
        _shard_size_multiple: int = 128,
        _use_xla_patched_linear: bool = True,
        _debug_dummy_forward_pass: bool = False,
        _debug_msg: str = "xla_fsdp",
        _debug_print: bool = False,
        _debug_dummy_all_gather_op: bool = False,
        _debug_dummy_all_reduce_op: bool = False,
        _debug_dummy_reduce_scatter_op: bool = False,
        _debug_dummy_optimization_barrier_op: bool = False,
    ):
        # every argument but the module and the auto-wrapping ones: what auto-wrapped units are built with
        options = {k: v for k, v in locals().items() if k in _UNIT_OPTIONS}
        if isinstance(module, XlaFullyShardedDataParallel):
            raise RuntimeError(
                "Cannot wrap a module that is already wrapped with FSDP. For nested FSDP, first wrap the inner "
                "child modules before wrapping the outer parent module."
            )
        if not _defines_forward(module):
            raise RuntimeError(
                "The module wrapped by FSDP must define a `forward` method and be called through it: do not wrap "
                "`nn.ModuleList` or `nn.ModuleDict`, and call the FSDP-wrapped module itself."
            )
        for name in _DEBUG_DUMMIES:
            if options[name]:
                unsupported(f"XlaFullyShardedDataParallel({name}=True)", "the real collectives and forward")
        super().__init__()
        if auto_wrap_policy is not None:
            self._auto_wrap(module, auto_wrap_policy, auto_wrapper_callable or XlaFullyShardedDataParallel, options)

        self.reshard_after_forward = self._orig_reshard_after_forward = reshard_after_forward
        self.disable_reshard_on_root = disable_reshard_on_root
        self.flatten_parameters = flatten_parameters
        self.optimization_barrier_in_forward = optimization_barrier_in_forward
        self.optimization_barrier_in_backward = optimization_barrier_in_backward
        self.sync_on_finalization = sync_on_finalization
        for name, dtype in (("compute_dtype", compute_dtype), ("buffer_dtype", buffer_dtype)):
            if dtype is not None and dtype not in FLOAT_DTYPES:
                raise ValueError(f"{name} must be one of {FLOAT_DTYPES}, not {dtype}")
        self.compute_dtype = compute_dtype or torch.float32
        self.buffer_dtype = buffer_dtype or self.compute_dtype
        self.fp32_reduce_scatter = fp32_reduce_scatter
        self._shard_param_on_dim_0 = shard_param_on_dim_0 and not flatten_parameters
        self._shard_size_multiple = 1 if shard_param_on_dim_0 else _shard_size_multiple
        self._set_sharding(sharding_groups, sharding_rank, sharding_world_size)
        self.coalesce_all_gather_ops = coalesce_all_gather_ops
        self._debug_msg, self._debug_print = _debug_msg, _debug_print
        self.gradient_predivide_factor = self._get_gradient_predivide_factor(self.world_size)
        self.gradient_postdivide_factor = self.world_size / self.gradient_predivide_factor
        self._reduce_scatter_scale = 1.0

        _materialize_module(module, param_init_fn)
        params = [p for p in module.parameters() if not hasattr(p, "_is_sharded")]
        groups = []
        if flatten_parameters:  # trainable and frozen parameters flattened apart; then nothing is left unflattened
            trainable, frozen = [p for p in params if p.requires_grad], [p for p in params if not p.requires_grad]
            groups = [g for g in (trainable, frozen) if g]
            params = []
        self._fsdp_wrapped_module = XlaFlattenParamsWrapper(module, param_list=groups, auto_unflatten_state_dict=False)
        del module
        self.xla_device = xm.xla_device()
        self._shard_parameters_(list(self._fsdp_wrapped_module.flat_params) + params)
        self._cast_buffers(self.buffer_dtype)

        self._reset_lazy_init()
        self._require_backward_grad_sync = True
        self.training_state = TrainingState.IDLE
        self.has_full_params = False
        self._full_params_track_grad = False
        self._no_sync_grads: list[torch.Tensor | None] = [None] * len(self.sharded_params)
        if execute_sharding_on_init:
            xm.mark_step()  # materialize the shards: the full parameters can go

    # --- construction ------------------------------------------------------------------------------

    def _auto_wrap(self, module: nn.Module, policy: Callable, wrapper_cls: Callable, options: dict) -> None:
        for name, m in module.named_modules():
            if isinstance(m, XlaFullyShardedDataParallel):
                raise ValueError(f"Expected {name} to NOT be FullyShardedDataParallel if using an `auto_wrap_policy`")
        recursive_wrap(module, policy, wrapper_cls, set(), set(), only_wrap_children=True, **options)

    def _set_sharding(self, groups, rank, world_size) -> None:
        self.sharding_groups = groups
        if groups is None:
            self.rank, self.world_size = lazyxla.runtime.global_ordinal(), lazyxla.runtime.world_size()
            return
        if rank is None or world_size is None:
            raise ValueError("sharding_rank and sharding_world_size must be provided when sharding_groups is specified")
        self.rank, self.world_size = rank, world_size

    @staticmethod
    def _get_gradient_predivide_factor(world_size: int) -> float:
        factor = 1
        while world_size % factor == 0 and world_size / factor > factor:
            factor *= 2
        return float(factor)

    @torch.no_grad()
    def _shard_parameters_(self, params_to_shard: list[nn.Parameter]) -> None:
        """Replace each parameter by this replica's shard, registered on this unit; the module attribute that
        held it holds a 1-element placeholder until the unit gathers the full value."""
        self._placeholder = torch.zeros(1, dtype=self.compute_dtype, device=self.xla_device)
        wanted = {id(p) for p in params_to_shard}
        bindings: dict[int, list[tuple[nn.Module, str]]] = {}
        aliases: dict[int, list[str]] = {}
        infos = []
        for module_name, m in self.named_modules():
            for n, p in m.named_parameters(recurse=False):
                if id(p) not in wanted:
                    continue
                if p.dtype != torch.float32:
                    raise TypeError("only fp32 parameters are supported")
                if id(p) not in bindings:
                    infos.append((module_name, n, p))
                    bindings[id(p)], aliases[id(p)] = [], []
                else:  # a parameter shared by two modules (tied weights): one shard, bound to both
                    aliases[id(p)].append(f"{module_name}.{n}")
                bindings[id(p)].append((m, n))
        if len(infos) != len(wanted):
            raise AssertionError("there are parameters in params_to_shard not belonging to this module")
        self.sharded_params: list[nn.Parameter] = []
        self._bindings: list[list[tuple[nn.Module, str]]] = []
        self._aliases: list[list[str]] = []  # the other names of each shard's parameter, as bound
        for module_name, n, p in infos:
            shard = nn.Parameter(self._get_shard(p.detach()).to(self.xla_device), requires_grad=p.requires_grad)
            shard._is_sharded = True
            shard._orig_size = p.size()
            shard._orig_name = f"{module_name}.{n}"
            shard._name = f"_fsdp_shard.{shard._orig_name}".replace(".", _SEPARATOR)
            self.register_parameter(shard._name, shard)
            self.sharded_params.append(shard)
            self._bindings.append(bindings[id(p)])
            self._aliases.append(aliases[id(p)])
            for m, attr in bindings[id(p)]:
                delattr(m, attr)
                object.__setattr__(m, attr, self._placeholder)
        if self._fsdp_wrapped_module.is_flattened:
            self._fsdp_wrapped_module._bind_views(self._placeholder)

    def _flatten_and_pad_to_world_size(self, tensor: torch.Tensor, world_size: int) -> torch.Tensor:
        """``tensor`` flattened (or, with ``shard_param_on_dim_0``, as it is) and zero-padded along dim 0 to a
        multiple of ``world_size``."""
        if not self._shard_param_on_dim_0:
            tensor = tensor.flatten()
        pad = -tensor.size(0) % world_size
        return F.pad(tensor, [0, 0] * (tensor.dim() - 1) + [0, pad]) if pad else tensor

    def _get_shard(self, tensor: torch.Tensor) -> torch.Tensor:
        """This replica's slice of ``tensor`` (flattened and padded)."""
        padded = self._flatten_and_pad_to_world_size(tensor, self.world_size * self._shard_size_multiple)
        size = padded.size(0) // self.world_size
        return padded[self.rank * size : (self.rank + 1) * size].clone()

    @torch.no_grad()
    def _cast_buffers(self, dtype: torch.dtype | None = None, memo: set | None = None) -> None:
        """Floating buffers to ``dtype`` (each nested unit casts its own) and every buffer to the device."""
        memo = set() if memo is None else memo
        for module in self.modules():
            if module is not self and isinstance(module, XlaFullyShardedDataParallel):
                module._cast_buffers(dtype, memo)
            elif module not in memo:
                memo.add(module)
                for name, buf in module.named_buffers(recurse=False):
                    if buf is None:
                        continue
                    cast = dtype or self.buffer_dtype
                    orig_dtype = buf.dtype
                    buf = buf.to(self.xla_device)
                    if torch.is_floating_point(buf) and orig_dtype != cast:
                        buf = buf.to(cast)
                        buf._orig_dtype = orig_dtype  # after the move, which would make a tensor without it
                    setattr(module, name, buf)

    # --- attributes --------------------------------------------------------------------------------

    @property
    def module(self) -> XlaFlattenParamsWrapper:
        """The wrapped module, inside its ``XlaFlattenParamsWrapper`` (as torch_xla's ``.module``).

        Example::

            inner = model.module.module      # the module given to FSDP
        """
        return self._fsdp_wrapped_module

    @property
    def params_with_grad(self) -> list[nn.Parameter]:
        """The shards that have a gradient.

        Example::

            grads = [p.grad for p in model.params_with_grad]
        """
        return [p for p in self.parameters() if p.grad is not None]

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "_fsdp_wrapped_module":  # not set yet (during __init__): no module to ask
                raise
            return getattr(self.module, name)

    def __getitem__(self, key):
        return self.module.__getitem__(key)

    def extra_repr(self) -> str:
        return (
            f"world_size={self.world_size}, rank={self.rank}, compute_dtype={self.compute_dtype}, "
            f"buffer_dtype={self.buffer_dtype}, flatten_parameters={self.flatten_parameters}, "
            f"reshard_after_forward={self.reshard_after_forward}, sharding_groups={self.sharding_groups}"
        )

    def assert_state(self, state: TrainingState | list[TrainingState]) -> None:
        """Raise ``ValueError`` unless the unit is in ``state`` (one of a list).

        Example::

            model.assert_state(TrainingState.IDLE)
        """
        states = [state] if isinstance(state, TrainingState) else state
        if self.training_state not in states:
            raise ValueError(f"expected to be in states {states} but current state is {self.training_state}")

    def set_gradient_divide_factors(self, pre: float, post: float, recursive: bool) -> None:
        """Divide gradients by ``pre`` before the reduce-scatter and by ``post`` after it (torch_xla's default
        splits the replica count between the two); ``(1, 1)`` scales the reduce-scatter by 1/N instead.

        Example::

            model.set_gradient_divide_factors(1.0, 1.0, recursive=True)
        """
        self.assert_state(TrainingState.IDLE)
        if recursive:
            for m in self.modules():
                if isinstance(m, XlaFullyShardedDataParallel) and m is not self:
                    m.set_gradient_divide_factors(pre, post, False)
        self.gradient_predivide_factor, self.gradient_postdivide_factor = pre, post
        self._reduce_scatter_scale = 1.0 / self.world_size if (pre, post) == (1, 1) else 1.0

    # --- collectives -------------------------------------------------------------------------------

    def _all_gather(self, shards) -> list[torch.Tensor]:
        """The padded full tensors of ``shards``, in the compute dtype: one coalesced all-gather."""
        shards = [s.to(self.compute_dtype) if s.dtype != self.compute_dtype else s for s in shards]
        return list(xm.all_gather(shards, dim=0, groups=self.sharding_groups, pin_layout=False))

    def _reduce_scatter(self, grads) -> list[torch.Tensor | None]:
        """The shards' gradients from the full ones (None where a full tensor got none): torch_xla's pre-division,
        one coalesced reduce-scatter (summing), post-division; under ``no_sync`` the full gradients are kept and
        added to the next synchronized backward's."""
        self.training_state = TrainingState.BACKWARD_POST
        grads = list(grads)
        for i, pending in enumerate(self._no_sync_grads):
            if pending is not None and self._require_backward_grad_sync:
                grads[i] = pending if grads[i] is None else grads[i] + pending
                self._no_sync_grads[i] = None
        if not self._require_backward_grad_sync:
            for i, g in enumerate(grads):
                if g is not None:
                    held = self._no_sync_grads[i]
                    self._no_sync_grads[i] = g if held is None else held + g
            return [None] * len(grads)
        todo = [i for i, g in enumerate(grads) if g is not None]
        if not todo:
            return [None] * len(grads)
        full = [grads[i] for i in todo]
        if self.gradient_predivide_factor > 1:
            full = [g / self.gradient_predivide_factor for g in full]
        if self.fp32_reduce_scatter:
            full = [g.float() for g in full]
        reduced = xm.reduce_scatter(
            xm.REDUCE_SUM, full, self._reduce_scatter_scale, 0, self.world_size, groups=self.sharding_groups
        )
        out: list[torch.Tensor | None] = [None] * len(grads)
        for i, r in zip(todo, reduced):
            r = r.float()
            out[i] = r / self.gradient_postdivide_factor if self.gradient_postdivide_factor > 1 else r
        return out

    # --- full parameters ---------------------------------------------------------------------------

    def _full_from_padded(self, padded: torch.Tensor, shard: nn.Parameter) -> torch.Tensor:
        if self._shard_param_on_dim_0:
            return padded[: shard._orig_size[0]]
        return padded[: shard._orig_size.numel()].view(shard._orig_size)

    def _rebuild_full_params(self) -> None:
        """Gather the full parameters and bind them to the wrapped modules' attributes. A no-op when they are
        gathered already, unless autograd must now track them and did not when they were gathered."""
        tracking = torch.is_grad_enabled()
        if self.has_full_params and (self._full_params_track_grad or not tracking):
            return
        sources = [self._alias.get(id(s), s) for s in self.sharded_params]
        trainable = [i for i, s in enumerate(sources) if tracking and s.requires_grad]
        padded: list[torch.Tensor | None] = [None] * len(sources)
        if trainable:
            for i, t in zip(trainable, _GatherFull.apply(self, *(sources[i] for i in trainable))):
                padded[i] = t
        frozen = [i for i in range(len(sources)) if padded[i] is None]
        if frozen:
            with torch.no_grad():
                for i, t in zip(frozen, self._all_gather([sources[i] for i in frozen])):
                    padded[i] = t
        self._bind([self._full_from_padded(p, s) for p, s in zip(padded, self.sharded_params)])
        self.has_full_params, self._full_params_track_grad = True, tracking

    def _bind(self, fulls: list[torch.Tensor]) -> None:
        """Bind the full tensors to the attributes that held the parameters (and views of flat ones to the
        attributes of their pieces)."""
        self._bind_slots(fulls)
        if self._fsdp_wrapped_module.is_flattened:
            self._fsdp_wrapped_module._unflatten_params_as_views()

    def _bind_slots(self, values: list[torch.Tensor]) -> None:
        for value, slots in zip(values, self._bindings):
            for m, attr in slots:
                object.__setattr__(m, attr, value)

    def _free_full_params(self) -> None:
        """Drop the gathered full parameters (the attributes hold the placeholder again)."""
        if not self.has_full_params:
            return
        self._bind_slots([self._placeholder] * len(self._bindings))
        if self._fsdp_wrapped_module.is_flattened:
            self._fsdp_wrapped_module._bind_views(self._placeholder)
        self.has_full_params = False

    # --- forward and backward ----------------------------------------------------------------------

    def _reset_lazy_init(self) -> None:
        self._is_root: bool | None = None
        self._alias: dict[int, torch.Tensor] = {}
        self.reshard_after_forward = self._orig_reshard_after_forward

    def _units(self) -> list[XlaFullyShardedDataParallel]:
        # found each time, not kept: a list holding the root would make a reference cycle, which lazyxla's
        # gc.freeze() at the first sync would keep alive after the model is dropped
        return [m for m in self.modules() if isinstance(m, XlaFullyShardedDataParallel)]

    def _lazy_init(self) -> None:
        """At the first forward: the outermost unit called becomes the root of the units under it."""
        if self._is_root is None:
            self._is_root = True
            for unit in self._units()[1:]:
                if unit._is_root is None:
                    unit._is_root = False
            if self._debug_print:
                xm.master_print(f"root FSDP got {len(list(self.parameters()))} total params ({self._debug_msg})")
        if self._is_root and self.disable_reshard_on_root:
            self.reshard_after_forward = False

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self._lazy_init()
        self.training_state = TrainingState.FORWARD
        if self.compute_dtype != torch.float32:
            args, kwargs = _cast_floating(self.compute_dtype, args, kwargs)
        tracking_root = self._is_root and torch.is_grad_enabled()
        if tracking_root:
            self._begin_root_forward()
        try:
            self._rebuild_full_params()
            outputs = self.module(*args, **kwargs)
        finally:
            if tracking_root:
                self._alias.clear()  # a recomputed forward (checkpointing) gathers from the shards themselves
        if self.reshard_after_forward:
            self._free_full_params()
        self._register_pre_backward_hooks(outputs)
        self.training_state = TrainingState.IDLE
        return outputs

    def _begin_root_forward(self) -> None:
        shards = [p for unit in self._units() for p in unit.sharded_params if p.requires_grad]
        if shards:
            for unit in self._units():
                unit._alias = self._alias
            self._alias.update(zip(map(id, shards), _EndOfBackward.apply(self, *shards)))

    def _register_pre_backward_hooks(self, outputs: Any) -> None:
        """Before the backward reaches this unit: gather again what the forward dropped (a recomputed forward
        reads it)."""
        if not torch.is_grad_enabled():
            return

        def pre_backward(grad: torch.Tensor) -> None:
            if self.training_state == TrainingState.IDLE:
                self.training_state = TrainingState.BACKWARD_PRE
            if not self.has_full_params:
                with torch.enable_grad():
                    self._rebuild_full_params()

        for t in _tensors_in(outputs):
            if t.requires_grad:
                t.register_hook(pre_backward)

    def _finish_backward(self) -> None:
        """The root's end of backward: every unit drops its full parameters and is idle again."""
        for unit in self._units():
            unit._free_full_params()
            unit.training_state = TrainingState.IDLE
        if self.sync_on_finalization:
            xm.mark_step()

    @contextlib.contextmanager
    def no_sync(self):
        """Inside, backward passes keep each unit's full gradients instead of reduce-scattering them; the first
        backward after the block reduce-scatters their sum (gradient accumulation with one exchange).

        Example::

            with model.no_sync():
                model(x1).sum().backward()
            model(x2).sum().backward()          # reduce-scatters the gradients of both
            opt.step()
        """
        self._lazy_init()
        if not self._is_root:
            raise AssertionError("no_sync on inner FSDP is not supported")
        self.assert_state(TrainingState.IDLE)
        previous = [(m, m._require_backward_grad_sync) for m in self._units()]
        for m, _ in previous:
            m._require_backward_grad_sync = False
        try:
            yield
        finally:
            for m, flag in previous:
                m._require_backward_grad_sync = flag

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0, groups=None) -> torch.Tensor:
        """Scale the shards' gradients so that the norm of the whole model's gradient (over every replica's
        shards, all-reduced over ``groups``) is at most ``max_norm``; returns that norm. Call it on the root, on
        every replica.

        Example::

            loss.backward()
            model.clip_grad_norm_(1.0)
            opt.step()
        """
        if not self._is_root:
            raise AssertionError("clip_grad_norm should only be called on the root (parent) instance")
        self.assert_state(TrainingState.IDLE)
        max_norm, norm_type = float(max_norm), float(norm_type)
        grads = [p.grad.detach() for p in self.params_with_grad]
        if not grads:
            local = torch.zeros((), device=self.xla_device)
        elif norm_type == math.inf:
            local = torch.stack([g.abs().max() for g in grads]).max()
        else:
            norms = torch.stack([torch.linalg.vector_norm(g, norm_type) for g in grads])
            local = torch.linalg.vector_norm(norms, norm_type)
        if norm_type == math.inf:
            total = xm.all_reduce(xm.REDUCE_MAX, local, groups=groups)
        else:
            total = xm.all_reduce(xm.REDUCE_SUM, local**norm_type, groups=groups) ** (1.0 / norm_type)
        coef = torch.clip(max_norm / (total + 1e-6), 0.0, 1.0)
        for g in grads:
            g.mul_(coef)
        return total

    # --- checkpoints -------------------------------------------------------------------------------

    def get_original_names_and_sharded_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """``(original name, shard)`` for every shard of this unit and the units under it, the names as the
        unwrapped model would have them.

        Example::

            decay = [p for n, p in model.get_original_names_and_sharded_parameters() if not n.endswith("bias")]
        """
        out = []
        for module_name, m in self.named_modules():
            if isinstance(m, XlaFullyShardedDataParallel):
                prefix = f"{module_name}." if module_name else ""
                for p in m.sharded_params:
                    out.append((_clean_name(prefix + p._orig_name), p))
        return out

    def get_shard_metadata(self) -> dict:
        """What ``consolidate_sharded_state_dicts`` needs besides the replicas' state dicts: each unit's shards
        (original name and size), the flattened parameters' pieces, the buffers' original dtypes, this replica's
        rank and the replica count. Save it with ``state_dict()``.

        Example::

            ckpt = {"model": model.state_dict(), "shard_metadata": model.get_shard_metadata()}
        """
        shard_info, flatten_info = {}, {}
        for module_name, m in self.named_modules(remove_duplicate=False):
            module_name = module_name.replace("_fpw_module.", "")
            if isinstance(m, XlaFullyShardedDataParallel):
                shard_info[module_name] = {
                    p._name: {"_orig_size": p._orig_size, "_orig_name": p._orig_name} for p in m.sharded_params
                }
            if isinstance(m, XlaFlattenParamsWrapper):
                for i in range(len(m.flat_param_names)):
                    key = f"{module_name}.flat_param_{i}" if module_name else f"flat_param_{i}"
                    flatten_info[key] = m.metadata(i)
        shared_info = {
            _clean_name(prefix + name): [_clean_name(prefix + alias) for alias in aliases]
            for prefix, name, aliases in self._shared_names()
        }
        buffer_info = {
            name.replace("_fpw_module.", ""): {"_orig_dtype": buf._orig_dtype}
            for name, buf in self.named_buffers()
            if buf is not None and hasattr(buf, "_orig_dtype")
        }
        return {
            "shard_info": shard_info,
            "flatten_info": flatten_info,
            "buffer_info": buffer_info,
            "shared_info": shared_info,
            "world_size": self.world_size,
            "rank": self.rank,
        }

    def _shared_names(self) -> Iterator[tuple[str, str, list[str]]]:
        """(unit prefix, name, other names) of every parameter bound under several names (tied weights), in this
        unit and the units under it; the names relative to the unit."""
        for module_name, m in self.named_modules():
            if not isinstance(m, XlaFullyShardedDataParallel):
                continue
            prefix = f"{module_name}." if module_name else ""
            for p, aliases in zip(m.sharded_params, m._aliases):
                if aliases:
                    yield prefix, p._orig_name, aliases
            wrapper = m._fsdp_wrapped_module
            for _, shared, _, _ in wrapper._flat_meta:
                for module_name_, first_name, _, n, _, first_n in shared:
                    yield f"{prefix}_fsdp_wrapped_module.", f"{first_name}.{first_n}", [f"{module_name_}.{n}"]


def _clean_name(name: str) -> str:
    return name.replace("_fsdp_wrapped_module.", "").replace("_fpw_module.", "")


def __getattr__(name: str):
    raise missing_attribute(__name__, name)
