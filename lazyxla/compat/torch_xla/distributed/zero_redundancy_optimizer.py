"""``torch_xla.distributed.zero_redundancy_optimizer`` on lazyxla: ZeRO-1 (optimizer state sharded over replicas).

``ZeroRedundancyOptimizer(params, optimizer_class, **defaults)`` keeps the model replicated but gives each replica
(``xmp.spawn`` process) the optimizer for 1/N of every parameter: at construction each parameter is padded along
dim 0 to a multiple of N and this replica's slice becomes a master copy (in ``optimizer_dtype``) that
``optimizer_class`` (built on the slices: ``base_optimizer``) updates, so its state is 1/N of the usual. A step:

1. each gradient is reduce-scattered over the replicas (mean): the replica gets its slice's gradient;
2. with ``grad_clipping`` (default on, ``max_norm`` 1.0), the slices' gradients are scaled so that the global
   2-norm (all-reduced over the replicas) is at most ``max_norm``;
3. ``base_optimizer.step()`` updates the slices, which are then all-gathered back into the full parameters.

Everything is recorded into the step's XLA program; lazyxla coalesces the collectives of a step, so the bucket
sizes (``bucket_cap_mb_*``) and ``pin_layout`` need nothing.

Example::

    from torch_xla.distributed.zero_redundancy_optimizer import ZeroRedundancyOptimizer
    opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3, max_norm=1.0)
    loss.backward()
    opt.step()                  # not xm.optimizer_step(opt): the gradients are reduced here
    opt.zero_grad(); xm.mark_step()
"""

from __future__ import annotations

import copy
import logging
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim import Optimizer

from lazyxla.compat._common import missing_attribute
from lazyxla.compat.torch_xla import runtime as xr
from lazyxla.compat.torch_xla.core import xla_model as xm


class ZeroRedundancyOptimizer(Optimizer):
    """ZeRO-1: ``optimizer_class`` runs on this replica's 1/N slice of each parameter (see the module docstring).

    Arguments are torch_xla's: ``optimizer_dtype`` (the slices' dtype, default float32), ``grad_clipping`` and
    ``max_norm``, ``sharding_groups`` (replica groups the slices are taken over; default every replica),
    ``grad_norm_groups`` (an extra all-reduce of the norm, e.g. over model-parallel groups), ``lazy_init`` (shard
    later, in :meth:`init_zero`), ``use_grad_acc_hook`` (accumulate gradients into ``main_grad`` in
    ``optimizer_dtype``), ``save_master_weights`` (put the slices into ``state_dict()``), ``higher_cc_precision``
    (reduce-scatter in ``optimizer_dtype``); ``pin_layout`` and the bucket sizes have no effect here. The other
    keywords go to ``optimizer_class``.

    Example::

        opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.SGD, lr=0.1, momentum=0.9,
                                      grad_clipping=False, save_master_weights=True)
    """

    def __init__(
        self,
        params,
        optimizer_class: type[Optimizer],
        optimizer_dtype: Any | None = None,
        grad_clipping: bool = True,
        max_norm: float | None = None,
        pin_layout: bool = True,
        sharding_groups: Any | None = None,
        grad_norm_groups: Any | None = None,
        lazy_init: bool = False,
        bucket_cap_mb_all_gather: int = 0,
        bucket_cap_mb_reduce_scatter: int = 0,
        use_grad_acc_hook: bool = False,
        save_master_weights: bool = False,
        higher_cc_precision: bool = False,
        **defaults: Any,
    ):
        if not save_master_weights:
            logging.warning("Not saving master weights may have accuracy issues when resuming training!")
        super().__init__(params, defaults)
        self.global_world_size = xr.global_device_count()
        self.global_rank = xr.global_ordinal()
        self._sharding_groups = [list(range(self.global_world_size))] if sharding_groups is None else sharding_groups
        self._grad_norm_groups = grad_norm_groups
        self.optimizer_class = optimizer_class
        self.defaults = defaults
        self.optimizer_dtype = optimizer_dtype if optimizer_dtype is not None else torch.float32
        self.grad_clipping = grad_clipping
        self.max_norm = max_norm if max_norm is not None else 1.0
        self.pin_layout = pin_layout
        self.bucket_cap_mb_all_gather = bucket_cap_mb_all_gather
        self.bucket_cap_mb_reduce_scatter = bucket_cap_mb_reduce_scatter
        self.save_master_weights = save_master_weights
        self.higher_cc_precision = higher_cc_precision
        self.use_grad_acc_hook = use_grad_acc_hook
        self.grad_acc_hooks: list = []
        self._grad_norm: torch.Tensor | None = None
        self.inited = False
        if not lazy_init:
            self.init_zero()

    # --- sharding ----------------------------------------------------------------------------------

    def init_zero(self) -> None:
        """Slice the parameters and build ``base_optimizer`` on the slices (called by the constructor unless
        ``lazy_init``).

        Example::

            opt = ZeroRedundancyOptimizer(params, torch.optim.AdamW, lazy_init=True, lr=1e-3)
            opt.sharding_groups = [[0, 1], [2, 3]]
            opt.init_zero()
        """
        self.remove_hooks()
        self.local_world_size = len(self.sharding_groups[0])
        self.local_rank = None
        for group in self.sharding_groups:
            if self.global_rank in group:
                self.local_rank = list(group).index(self.global_rank)
        if self.local_rank is None:
            raise ValueError(
                f"Current rank {self.global_rank} is missing from the sharding_groups {self.sharding_groups}"
            )
        self.base_optimizer = self.optimizer_class(self._shard_parameters(), **self.defaults)
        self._sync_param_groups(self.param_groups, self.base_optimizer.param_groups)
        self.inited = True

    @property
    def grad_norm(self) -> torch.Tensor | None:
        """The global gradient norm the last clipping computed.

        Example::

            opt.step(); print(opt.grad_norm)
        """
        return self._grad_norm

    @property
    def sharding_groups(self):
        """The replica groups the slices are taken over (settable before :meth:`init_zero`).

        Example::

            print(opt.sharding_groups)       # [[0, 1]]
        """
        return self._sharding_groups

    @sharding_groups.setter
    def sharding_groups(self, groups) -> None:
        if self.inited:
            raise AssertionError("already inited, cannot change sharding_groups")
        self._sharding_groups = groups

    @staticmethod
    def _sync_param_groups(src: list[dict], dst: list[dict]) -> None:
        """Copy every setting but the parameters (lr, schedules, ...) from ``src``'s groups to ``dst``'s."""
        if len(src) != len(dst):
            raise AssertionError("Mismatch between number of source and destination parameter groups")
        for s, d in zip(src, dst):
            d.update({k: v for k, v in s.items() if k != "params"})

    def _pad_to_world_size(self, tensor: torch.Tensor, world_size: int) -> torch.Tensor:
        pad = -tensor.size(0) % world_size
        return F.pad(tensor, [0, 0] * (tensor.dim() - 1) + [0, pad]) if pad else tensor

    def _shard_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        return self._pad_to_world_size(tensor, self.local_world_size).chunk(self.local_world_size)[self.local_rank]

    def _shard_parameters(self) -> list[dict]:
        """The parameter groups of ``base_optimizer``: this replica's slice of each parameter, a new ``Parameter``
        in ``optimizer_dtype`` (sliced on the device, where torch_xla goes through the CPU)."""
        params = [p for group in self.param_groups for p in group["params"]]
        devices = {p.device for p in params}
        if len(devices) != 1:
            raise AssertionError("Params should on the same device.")
        self.device = devices.pop()
        if not xm.is_xla_tensor(params[0]):
            raise AssertionError(f"ZeroRedundancyOptimizer: the parameters must be on the device, not {self.device}")
        groups = []
        for group in self.param_groups:
            shards = []
            for param in group["params"]:
                data = self._shard_tensor(param.detach()).to(self.optimizer_dtype).clone()
                shard = nn.Parameter(data, requires_grad=param.requires_grad)
                if self.use_grad_acc_hook:
                    self.grad_acc_hooks.append(param.register_post_accumulate_grad_hook(self._accumulator(shard)))
                shards.append(shard)
            groups.append({**group, "params": shards})
        return groups

    def _accumulator(self, shard: nn.Parameter):
        """``use_grad_acc_hook``: each backward's gradient is added to ``main_grad`` (full size, in
        ``optimizer_dtype``) and the parameter's own ``.grad`` dropped."""

        def accumulate(param: torch.Tensor) -> None:
            if param.grad is None:
                return
            if not hasattr(shard, "main_grad"):
                shard.main_grad = torch.zeros(param.shape, dtype=self.optimizer_dtype, device=self.device)
                param.main_grad = shard.main_grad
            with torch.no_grad():
                shard.main_grad.add_(param.grad.to(self.optimizer_dtype))
            param.grad = None

        return accumulate

    def remove_hooks(self) -> None:
        """Remove the gradient-accumulation hooks of ``use_grad_acc_hook``.

        Example::

            opt.remove_hooks()
        """
        for hook in self.grad_acc_hooks:
            hook.remove()
        self.grad_acc_hooks = []

    # --- the step ----------------------------------------------------------------------------------

    def _pairs(self):
        """(parameter, slice) for every parameter that has a gradient to apply."""
        for group, base_group in zip(self.param_groups, self.base_optimizer.param_groups):
            for param, shard in zip(group["params"], base_group["params"]):
                if param.grad is not None or (self.use_grad_acc_hook and hasattr(shard, "main_grad")):
                    yield param, shard

    def _get_sharding_scheme(self, kwargs: dict) -> list[dict]:
        return kwargs.get("sharding_scheme") or [
            {"scale_factor": 1.0, "sharding_group": self.sharding_groups, "group_size": self.local_world_size}
        ]

    def _reduce_gradients(self, **kwargs) -> None:
        """Each slice's ``.grad``: its part of the replicas' mean gradient (one coalesced reduce-scatter per
        stage of the sharding scheme)."""
        scheme = self._get_sharding_scheme(kwargs)
        self._sync_param_groups(self.param_groups, self.base_optimizer.param_groups)
        pairs = list(self._pairs())
        if not pairs:
            return
        grads = []
        for param, shard in pairs:
            grad = self._pad_to_world_size(
                shard.main_grad if self.use_grad_acc_hook else param.grad, self.local_world_size
            )
            grads.append(grad.to(self.optimizer_dtype) if self.higher_cc_precision else grad)
        for stage in scheme:
            grads = xm.reduce_scatter(
                xm.REDUCE_SUM,
                grads,
                stage["scale_factor"] / stage["group_size"],
                0,
                stage["group_size"],
                groups=stage["sharding_group"],
                pin_layout=False,
            )
        for (_, shard), grad in zip(pairs, grads):
            shard.grad = grad.to(self.optimizer_dtype) if grad.dtype != self.optimizer_dtype else grad

    @torch.no_grad()
    def _calc_grad_norm(self, norm_type: float = 2.0) -> torch.Tensor:
        if norm_type != 2.0:
            raise RuntimeError(f"only norm type 2 is supported, getting {norm_type}")
        total = torch.zeros([], dtype=self.optimizer_dtype, device=self.device)
        for group in self.base_optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    total = total + (p.grad * p.grad).sum()
        total = xm.all_reduce(xm.REDUCE_SUM, [total], groups=self._sharding_groups)[0]
        if self._grad_norm_groups is not None:
            total = xm.all_reduce(xm.REDUCE_SUM, [total], groups=self._grad_norm_groups)[0]
        return torch.pow(total, 1.0 / norm_type)

    @torch.no_grad()
    def _clip_grad_norm(self, max_norm: float, norm_type: float = 2.0) -> None:
        """Scale the slices' gradients so that the global norm is at most ``max_norm``."""
        self._grad_norm = self._calc_grad_norm(float(norm_type))
        coeff = torch.tensor(float(max_norm), device=self.device, dtype=self.optimizer_dtype) / (self._grad_norm + 1e-6)
        clip = torch.where(coeff < 1, coeff, torch.ones_like(coeff))
        for group in self.base_optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.grad.detach().mul_(clip)

    def _update_parameters(self, **kwargs) -> None:
        scheme = self._get_sharding_scheme(kwargs)
        kwargs.pop("sharding_scheme", None)
        self.base_optimizer.step(closure=None, **kwargs)
        self.base_optimizer.zero_grad(set_to_none=True)
        self.allgather_weights_and_update_full_parameter(scheme)
        self._sync_param_groups(self.base_optimizer.param_groups, self.param_groups)

    @torch.no_grad()
    def step(self, closure=None, **kwargs):
        """Reduce-scatter the gradients, clip them (``grad_clipping``), step ``base_optimizer`` on the slices and
        all-gather them into the parameters; returns ``closure()``'s loss if given.

        Example::

            loss.backward(); opt.step(); opt.zero_grad()
        """
        if not self.inited:
            raise AssertionError("must call init_zero() first")
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._reduce_gradients(**kwargs)
        if self.grad_clipping:
            self._clip_grad_norm(max_norm=self.max_norm)
        self._update_parameters(**kwargs)
        return loss

    @torch.no_grad()
    def allgather_weights_and_update_full_parameter(self, sharding_scheme: list[dict] | None = None) -> None:
        """Write the slices back into the full parameters (those with a gradient): one coalesced all-gather per
        stage of the sharding scheme, padding cut.

        Example::

            opt.allgather_weights_and_update_full_parameter()
        """
        scheme = sharding_scheme or self._get_sharding_scheme({})
        pairs = list(self._pairs())
        if not pairs:
            return
        gathered = [shard.detach().to(param.dtype) for param, shard in pairs]
        for stage in reversed(scheme):
            gathered = xm.all_gather(gathered, dim=0, groups=stage["sharding_group"], pin_layout=False)
        for (param, _), full in zip(pairs, gathered):
            # into the parameter itself (no_grad): an alias (.data, .detach()) would keep one more full-size buffer
            param.copy_(full[: param.size(0)])

    def zero_grad(self, set_to_none: bool = False) -> None:
        """The parameters' gradients zeroed (or dropped), and ``main_grad`` zeroed with ``use_grad_acc_hook``.

        Example::

            opt.zero_grad(set_to_none=True)
        """
        super().zero_grad(set_to_none=set_to_none)
        if self.use_grad_acc_hook:
            for group in self.base_optimizer.param_groups:
                for shard in group["params"]:
                    if hasattr(shard, "main_grad"):
                        shard.main_grad.zero_()

    # --- checkpoints -------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """The wrapper's state dict plus ``base_state`` (this replica's slice of the optimizer state),
        ``shape_info`` (the parameters' shapes) and, with ``save_master_weights``, ``sharded_master_weights``.
        Each replica saves its own.

        Example::

            xm.save(opt.state_dict(), f"opt_rank{xr.global_ordinal()}.pt", master_only=False)
        """
        state = super().state_dict()
        state["base_state"] = self.base_optimizer.state_dict()["state"]
        state["shape_info"] = self.get_shape_info()
        if self.save_master_weights:
            shards = [s for group in self.base_optimizer.param_groups for s in group["params"]]
            state["sharded_master_weights"] = {i: s.data for i, s in enumerate(shards)}
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        """Load what :meth:`state_dict` gave on this replica: the settings, the slices' optimizer state and, when
        saved, the master weights (then all-gathered into the parameters).

        Example::

            opt.load_state_dict(torch.load(f"opt_rank{xr.global_ordinal()}.pt"))
        """
        state_dict = copy.deepcopy(state_dict)
        base_state = state_dict.pop("base_state")
        super().load_state_dict(state_dict)
        self.init_zero()  # the slices again, of the current parameters
        base = self.base_optimizer.state_dict()
        base["state"], base["param_groups"] = base_state, state_dict["param_groups"]
        self.base_optimizer.load_state_dict(base)
        if "sharded_master_weights" in state_dict:
            self._load_master_weights(state_dict)

    @torch.no_grad()
    def _load_master_weights(self, state_dict: dict) -> None:
        weights = state_dict["sharded_master_weights"]
        for group, base_group, loaded in zip(
            self.param_groups, self.base_optimizer.param_groups, state_dict["param_groups"]
        ):
            for param, shard, index in zip(group["params"], base_group["params"], loaded["params"]):
                shard.copy_(weights[index])
                if self.use_grad_acc_hook:  # a gradient marks the parameter for the all-gather below
                    shard.main_grad = torch.zeros(param.shape, dtype=self.optimizer_dtype, device=self.device)
                    param.main_grad = shard.main_grad
                else:
                    param.grad = torch.zeros_like(param.data)
        xm.mark_step()
        self.allgather_weights_and_update_full_parameter()
        xm.mark_step()

    def get_shape_info(self) -> dict[int, torch.Size]:
        """The shape of every parameter, by its index in the parameter groups.

        Example::

            shapes = opt.get_shape_info()        # {0: torch.Size([64, 32]), ...}
        """
        params = [p for group in self.param_groups for p in group["params"]]
        return {i: p.shape for i, p in enumerate(params)}


def __getattr__(name: str):
    raise missing_attribute(__name__, name)
