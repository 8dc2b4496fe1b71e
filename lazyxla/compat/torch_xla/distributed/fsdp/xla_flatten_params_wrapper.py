"""``torch_xla.distributed.fsdp.xla_flatten_params_wrapper`` on lazyxla: one flat parameter for many.

``XlaFullyShardedDataParallel(flatten_parameters=True)`` puts the parameters of each unit (trainable and frozen
apart) into one flat vector, which it then shards: fewer, larger collectives, and one optimizer entry per unit.
The wrapper keeps which (module, attribute) each piece belongs to; before the wrapped module runs it binds views
of the current flat tensor to those attributes. Its state dict drops the ``_fpw_module.`` level, as torch_xla's.

Example::

    wrapper = XlaFlattenParamsWrapper(nn.Linear(4, 2))
    assert [n for n, _ in wrapper.named_parameters()] == ["flat_param_0"]      # 4*2 + 2 = 10 elements
    names, shapes, numels = wrapper.metadata(0)       # ['weight', 'bias'], [(2, 4), (2,)], [8, 2]
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch import nn

from lazyxla.compat._common import missing_attribute

_PREFIX = "_fpw_module."


class FlatParameter(nn.Parameter):
    """A parameter made of the concatenation of ``params``, flattened, with their sizes kept for unflattening.

    Example::

        flat = FlatParameter([nn.Parameter(torch.ones(2, 2)), nn.Parameter(torch.zeros(3))])
        assert flat.shape == (7,) and [v.shape for v in flat.get_param_views()] == [(2, 2), (3,)]
    """

    def __new__(cls, params: Sequence[torch.Tensor], requires_grad: bool = True):
        if not isinstance(params, (list, tuple)) or not params:
            raise ValueError("FlatParameter needs a non-empty list or tuple of parameters")
        if any(isinstance(p, FlatParameter) for p in params):
            raise ValueError("FlatParameter cannot hold another FlatParameter")
        data = torch.cat([p.detach().reshape(-1) for p in params])
        return super().__new__(cls, data, requires_grad=requires_grad)

    def __init__(self, params: Sequence[torch.Tensor], requires_grad: bool = True) -> None:
        self._param_numels = [p.numel() for p in params]
        self._param_shapes = [p.size() for p in params]
        self._param_infos: list[tuple[str, nn.Module, str]] = []  # (module name, module, attribute)
        self._shared_param_infos: list[tuple[str, str, nn.Module, str, nn.Module, str]] = []

    def get_param_views(self, external_data: torch.Tensor | None = None) -> Iterator[torch.Tensor]:
        """Views of ``external_data`` (default: this parameter) shaped as the original parameters.

        Example::

            weight, bias = flat.get_param_views()
        """
        return _views(self if external_data is None else external_data, self._param_numels, self._param_shapes)

    def metadata(self) -> tuple[list[str], list[torch.Size], list[int]]:
        """(names, shapes, numels) of the original parameters, names relative to the flattened module.

        Example::

            names, shapes, numels = flat.metadata()
        """
        names = [f"{m}.{n}" if m else n for m, _, n in self._param_infos]
        return names, list(self._param_shapes), list(self._param_numels)


def _views(data: torch.Tensor, numels: list[int], shapes: list[torch.Size]) -> Iterator[torch.Tensor]:
    if data.numel() != sum(numels):
        raise ValueError(f"flat data of {data.numel()} elements does not hold parameters of {sum(numels)}")
    start = 0
    for numel, shape in zip(numels, shapes):
        yield data[start : start + numel].view(shape)
        start += numel


class XlaFlattenParamsWrapper(nn.Module):
    """Wraps ``module`` and replaces the parameters of each list in ``param_list`` (default: all of them, in one
    list) by one flat parameter ``flat_param_<i>``; the module sees views of it as its attributes.

    ``auto_unflatten_state_dict=True`` makes ``state_dict()`` list the original parameters (views of the flat
    one) and ``load_state_dict`` accept them; with False it lists ``flat_param_<i>``.

    Example::

        wrapper = XlaFlattenParamsWrapper(model)
        opt = torch.optim.SGD(wrapper.parameters(), lr=0.1)     # one flat tensor
        loss = wrapper(x).sum()
    """

    def __init__(
        self,
        module: nn.Module,
        param_list: list | None = None,
        flat_param_names: list[str] | None = None,
        auto_unflatten_state_dict: bool = True,
    ) -> None:
        super().__init__()
        self._fpw_module = module
        self.is_flattened = False
        self._auto_unflatten_state_dict = auto_unflatten_state_dict
        groups = _param_groups(module, param_list)
        self.num_params_managed = sum(len(g) for g in groups)
        names = flat_param_names if flat_param_names is not None else [str(i) for i in range(len(groups))]
        if len(names) != len(groups) or len(set(names)) != len(names):
            raise ValueError("flat_param_names must give each parameter list its own name")
        self.flat_param_names = [f"flat_param_{n}" for n in names]
        # (infos, shared infos, numels, shapes) per flat parameter: kept here because XlaFullyShardedDataParallel
        # replaces the flat parameters themselves by shards
        self._flat_meta: list[tuple[list, list, list[int], list[torch.Size]]] = []
        flat_params = [self._make_flat(group) for group in groups]
        self._flatten_params(flat_params)
        self.register_state_dict_post_hook(_post_state_dict_hook)
        self.register_load_state_dict_pre_hook(_pre_load_state_dict_hook)

    @property
    def module(self) -> nn.Module:
        """The wrapped module (as DDP's ``.module``).

        Example::

            inner = wrapper.module
        """
        return self._fpw_module

    @property
    def flat_params(self) -> list[torch.Tensor]:
        """The flat parameters (or, under FSDP, the tensors bound in their place).

        Example::

            sizes = [p.numel() for p in wrapper.flat_params]
        """
        return [getattr(self, n) for n in self.flat_param_names] if self.is_flattened else []

    @property
    def flat_param(self) -> torch.Tensor:
        """The only flat parameter (an error when there are several).

        Example::

            flat = wrapper.flat_param
        """
        if len(self.flat_params) != 1:
            raise AssertionError(f"flat_param: there are {len(self.flat_params)} flat parameters")
        return self.flat_params[0]

    def _make_flat(self, group: set) -> FlatParameter:
        infos, shared, params, memo = [], [], [], {}
        for module_name, m in self.named_modules():
            for n, p in m.named_parameters(recurse=False):
                if (m, n) not in group:
                    continue
                if id(p) in memo:  # a parameter shared by two modules: stored once, bound to both
                    first_name, first_m, first_n = memo[id(p)]
                    shared.append((module_name, first_name, m, n, first_m, first_n))
                else:
                    memo[id(p)] = (module_name, m, n)
                    infos.append((module_name, m, n))
                    params.append(p)
        if len({p.dtype for p in params}) != 1 or len({p.requires_grad for p in params}) != 1:
            raise ValueError("the parameters flattened together must share dtype and requires_grad")
        flat = FlatParameter(params, params[0].requires_grad)
        flat._param_infos, flat._shared_param_infos = infos, shared
        self._flat_meta.append((infos, shared, flat._param_numels, flat._param_shapes))
        return flat

    def _flatten_params(self, flat_params: list[FlatParameter]) -> None:
        self.is_flattened = True
        for name, flat in zip(self.flat_param_names, flat_params):
            self.register_parameter(name, flat)
        for infos, shared, _, _ in self._flat_meta:
            for _, m, n in infos:
                delattr(m, n)
            for _, _, m, n, _, _ in shared:
                delattr(m, n)
        self._unflatten_params_as_views()

    def _unflatten_params_as_views(self) -> None:
        """Bind views of the current flat tensors to the original attributes."""
        for name, (infos, shared, numels, shapes) in zip(self.flat_param_names, self._flat_meta):
            views = list(_views(getattr(self, name), numels, shapes))
            for (_, m, n), view in zip(infos, views):
                object.__setattr__(m, n, view)
            for _, _, m, n, shared_m, shared_n in shared:
                object.__setattr__(m, n, getattr(shared_m, shared_n))

    def _bind_views(self, value: torch.Tensor) -> None:
        """Bind ``value`` (FSDP's placeholder for freed parameters) to every original attribute."""
        for infos, shared, _, _ in self._flat_meta:
            for _, m, n in infos:
                object.__setattr__(m, n, value)
            for _, _, m, n, _, _ in shared:
                object.__setattr__(m, n, value)

    def get_param_views(self, external_data_list: list | None = None) -> Iterator[torch.Tensor]:
        """Views shaped as the original parameters, of the flat tensors or of ``external_data_list``.

        Example::

            originals = list(wrapper.get_param_views())
        """
        data = external_data_list or [None] * len(self.flat_param_names)
        for name, (_, _, numels, shapes), d in zip(self.flat_param_names, self._flat_meta, data):
            yield from _views(getattr(self, name) if d is None else d, numels, shapes)

    def metadata(self, flat_param_idx: int) -> tuple[list[str], list[torch.Size], list[int]]:
        """(names, shapes, numels) of the parameters in flat parameter ``flat_param_idx``; the names are relative
        to the wrapped module, as ``get_shard_metadata()['flatten_info']`` records them.

        Example::

            names, shapes, numels = wrapper.metadata(0)
        """
        infos, _, numels, shapes = self._flat_meta[flat_param_idx]
        return [_original_name(m, n) for m, _, n in infos], list(shapes), list(numels)

    def forward(self, *inputs, **kwinputs):
        if self.is_flattened:
            self._unflatten_params_as_views()
        return self.module(*inputs, **kwinputs)

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.module, name)

    def __getitem__(self, key):
        return self.module.__getitem__(key)


def _param_groups(module: nn.Module, param_list) -> list[set]:
    """``param_list`` (None: every parameter; a list of parameters; a list of lists) as sets of (module, name)."""
    if param_list is None:
        param_list = [list(module.parameters())]
    elif param_list and isinstance(param_list[0], nn.Parameter):
        param_list = [param_list]
    groups, seen = [], set()
    for params in param_list:
        wanted_ids = {id(p) for p in params}
        if wanted_ids & seen:
            raise ValueError("a parameter cannot be flattened into two flat parameters")
        seen |= wanted_ids
        slots = {(m, n) for m in module.modules() for n, p in m.named_parameters(recurse=False) if id(p) in wanted_ids}
        if slots:
            groups.append(slots)
    return groups


def _post_state_dict_hook(module, state_dict, prefix, local_metadata) -> None:
    _replace_prefix(state_dict, prefix + _PREFIX, prefix)
    if not (module._auto_unflatten_state_dict and module.is_flattened):
        return
    for name, (infos, _, numels, shapes) in zip(module.flat_param_names, module._flat_meta):
        flat = state_dict.pop(prefix + name, None)
        if flat is None:  # FSDP has taken the flat parameter over (its shard is FSDP's)
            continue
        for (m, _, n), view in zip(infos, _views(flat, numels, shapes)):
            state_dict[prefix + _original_name(m, n)] = view


def _pre_load_state_dict_hook(module, state_dict, prefix, local_metadata, strict, missing, unexpected, errors) -> None:
    if module.is_flattened:
        for name, (infos, _, _, _) in zip(module.flat_param_names, module._flat_meta):
            keys = [prefix + _original_name(m, n) for m, _, n in infos]
            if prefix + name not in state_dict and keys and all(k in state_dict for k in keys):
                state_dict[prefix + name] = torch.cat([state_dict.pop(k).reshape(-1) for k in keys])
    flat_keys = {prefix + n for n in module.flat_param_names}
    for key in [k for k in state_dict if k.startswith(prefix) and k not in flat_keys]:
        state_dict[prefix + _PREFIX + key[len(prefix) :]] = state_dict.pop(key)


def _original_name(module_name: str, name: str) -> str:
    """A flattened parameter's name relative to the wrapped module: ('_fpw_module.fc1', 'weight') -> 'fc1.weight'."""
    return f"{module_name}.{name}".removeprefix(_PREFIX) if module_name else name


def _replace_prefix(state_dict, old: str, new: str) -> None:
    for key in [k for k in state_dict if k.startswith(old)]:
        state_dict[new + key[len(old) :]] = state_dict.pop(key)


def __getattr__(name: str):
    raise missing_attribute(__name__, name)
