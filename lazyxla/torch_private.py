"""Every private PyTorch name lazyxla uses, in one place, behind the torch version check.

A Python device backend needs parts of PyTorch that are not public API: the dispatcher's keys and
kernels, functionalization's wrappers, the PrivateUse1 device hooks, Dynamo's backend registry.
Private names change between releases without notice, so lazyxla reads them only here: each is bound
to a public name of this module, with a comment saying what lazyxla uses it for; every other lazyxla
module imports these (``tests/test_layering.py`` checks that no other module touches a ``torch._*``
name). Moving to a new torch release means checking this file, and the two private attributes of op objects
read where ops are routed, ``OpOverload._schema`` and ``_overloadname`` (``PRIVATE_ALLOWED`` there says why).

Checked against torch 2.13 and 2.14 (``SUPPORTED_TORCH``; pyproject.toml accepts ``torch>=2.13,<2.15``,
requirements.txt pins 2.13.0). Importing this module checks the installed version first, before any
private name is read, so an unsupported torch gets a clear ``ImportError`` at ``import lazyxla``.

Names read per op (by ``lazy.tensor``, ``frontend.kernels``, ``frontend.autocast``) are plain aliases of
PyTorch's functions, never wrappers: calling ``torch_private.to_functional`` costs what calling
``torch._to_functional_tensor`` did. Hot modules bind them to module globals.

Example::

    from lazyxla import torch_private
    t = torch_private.to_functional(lazy_tensor)   # the user-visible wrapper of a LazyTensor
    assert torch_private.is_functional(t)
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import itertools
import operator
from collections.abc import Callable, Iterator

import torch

from lazyxla.util import require_version

SUPPORTED_TORCH = ((2, 13), (2, 14))  # inclusive range of major.minor this module was checked against

# raises ImportError, with what to install, for a torch version outside SUPPORTED_TORCH: check_torch_version("2.12.1")
check_torch_version = functools.partial(require_version, "torch", supported=SUPPORTED_TORCH)
check_torch_version(torch.__version__)  # before any private name below is read

# Each import below is of a module `import torch` has already loaded: binding its names costs nothing.
import torch._decomp  # noqa: E402
import torch._ops  # noqa: E402
import torch._prims_common  # noqa: E402
import torch._tensor_str  # noqa: E402
import torch.autograd.graph  # noqa: E402
import torch.utils._pytree  # noqa: E402
from torch._subclasses import fake_tensor, meta_utils  # noqa: E402

_C = torch._C

# ---- the dispatcher ----------------------------------------------------------------------------------

# the keys lazyxla registers kernels at or asks about (PrivateUse1, AutogradPrivateUse1, Functionalize, ...)
DispatchKey = _C.DispatchKey
# autocast's kernels exclude their own key (a DispatchKeySet) while they call the op again
DispatchKeySet = _C.DispatchKeySet
ExcludeDispatchKeyGuard = _C._ExcludeDispatchKeyGuard
# per op (device kernels, autocast): whether this call runs below functionalization (inside lazyxla's own
# dispatch or a decomposition there), where kernels take and return bare LazyTensors and autocast never casts
below_functionalization = functools.partial(_C._dispatch_tls_is_dispatch_key_excluded, DispatchKey.Functionalize)


@contextlib.contextmanager
def functionalization_restored() -> Iterator[None]:
    """Inside: the Functionalize key is no longer excluded (the rest of the dispatcher's thread-local state is
    kept). A tensor subclass's ``__torch_dispatch__`` runs with every key above Python excluded, Functionalize
    too, so the ops it calls on lazyxla tensors (functionalization wrappers) would skip their unwrapping."""
    include = _C._dispatch_tls_local_include_set()
    exclude = _C._dispatch_tls_local_exclude_set().remove(DispatchKey.Functionalize)
    with _C._ForceDispatchKeyGuard(include, exclude):
        yield


# every registered op name with its overload ("aten::mm", "aten::add.Tensor"): the ops lazyxla relays
all_op_names = _C._dispatch_get_all_op_names
# lift_fresh: whether functionalization's mode is on (it wraps the lifted tensor itself)
functionalization_included = functools.partial(_C._dispatch_tls_is_dispatch_key_included, DispatchKey.Functionalize)
# every aten schema: lazyxla registers an AutogradPrivateUse1 kernel for each out= overload
all_schemas = _C._jit_get_all_schemas
# the ops PyTorch registers at a key ("AutocastCUDA"): autocast follows CUDA's lists
registrations_for = _C._dispatch_get_registrations_for_dispatch_key
# whether sdpa_kernel() allows the fused "overrideable" attention kernel lazyxla lowers as one op
overrideable_sdpa_enabled = _C._get_overrideable_sdp_enabled
# meta inference and the CPU checks run an op on plain meta/CPU tensors: no functorch, no __torch_dispatch__
disable_functorch = _C._DisableFuncTorch
disable_torch_dispatch = _C._DisableTorchDispatch
# what torch.Tensor.__torch_function__ runs an op under: subclasses' __torch_function__ are not called again
disable_torch_function_subclass = _C.DisableTorchFunctionSubclass
# torch.compile graphs hold the casts autocast made when they were captured: they run with autocast off
disable_autocast = _C._DisableAutocast


def computed_kernel(op_name: str, key: str | DispatchKey):
    """PyTorch's kernel of ``op_name`` ("aten::copy_") at dispatch key ``key``, to call from lazyxla's kernel
    that replaces it (taken before lazyxla registers its own); call it with ``.call_boxed(keyset, *args)``.

    Example::

        kernel = computed_kernel("aten::_to_copy", "Functionalize")
    """
    key = getattr(DispatchKey, key) if isinstance(key, str) else key
    return _C._dispatch_get_computed_kernel_for_dispatch_key(op_name, key)


def has_kernel(op_name: str, key: str) -> bool:
    """Whether ``op_name`` has a kernel at ``key``: decompositions use the CompositeImplicitAutograd kernel.

    Example::

        has_kernel("aten::linear", "CompositeImplicitAutograd")     # True
    """
    return _C._dispatch_has_kernel_for_dispatch_key(op_name, key)


# ---- tensors: the wrapper subclass and functionalization ----------------------------------------------

# LazyTensor is a wrapper subclass: a tensor with metadata and no storage
make_wrapper_subclass = torch.Tensor._make_wrapper_subclass
# LazyTensor handles ops in __torch_dispatch__ only
disabled_torch_function_impl = _C._disabled_torch_function_impl
# per op: every user-visible lazyxla tensor is a functionalization wrapper around a LazyTensor
to_functional = torch._to_functional_tensor
from_functional = torch._from_functional_tensor
is_functional = torch._is_functional_tensor
# applies a wrapper's pending view updates before its inner tensor is read. The C++ function itself:
# ``torch._sync`` wraps it in Python for ``FunctionalTensor`` (torch.compile's tracing subclass), which
# lazyxla tensors never are (``is_functional`` is False for it), at ~3 us per call (an import, a mode swap)
functional_sync = torch._functionalize_sync
# autograd's symbolic zeros have no storage: a transfer to the device makes real ones
is_zerotensor = torch.Tensor._is_zerotensor
# fake tensors (torch.compile's tracing) have no values: printing leaves them to PyTorch
is_fake = fake_tensor.is_fake
# fused optimizer steps copy each new list of tensors into the list it replaces
foreach_copy_ = torch._foreach_copy_


# a replayed step (lazy/capture.py) gives a tensor its new value as an in-place op does, per tensor of the step
functional_replace = torch._functionalize_replace
functional_commit_update = torch._functionalize_commit_update


def module_parameters(m: torch.nn.Module) -> dict:
    """The module's own parameters dict, by name (``m._parameters``: a whole-step capture guards and reads it
    per call, where ``named_parameters`` would cost a generator per module).

    Example::

        module_parameters(nn.Linear(2, 3)).keys()     # dict_keys(['weight', 'bias'])
    """
    return m._parameters


def module_buffers(m: torch.nn.Module) -> dict:
    """The module's own buffers dict, by name (``m._buffers``; a buffer may be None).

    Example::

        module_buffers(nn.BatchNorm1d(3)).keys()     # running_mean, running_var, num_batches_tracked
    """
    return m._buffers


def modules_parameters(modules: list) -> list[dict]:
    """``module_parameters`` of each module, in bulk (a captured step's guards take them per call).

    Example::

        modules_parameters([nn.Linear(2, 3)])[0].keys()     # dict_keys(['weight', 'bias'])
    """
    return list(map(_PARAMETERS, modules))


def modules_buffers(modules: list) -> list[dict]:
    """``module_buffers`` of each module, in bulk.

    Example::

        modules_buffers([nn.BatchNorm1d(3)])[0].keys()     # running_mean, running_var, num_batches_tracked
    """
    return list(map(_BUFFERS, modules))


def modules_hook_dicts(modules: list):
    """The forward, forward-pre and backward hook dicts of each module, one after another (a captured step's
    guard counts them).

    Example::

        list(map(len, modules_hook_dicts([nn.Linear(2, 3)])))    # [0, 0, 0]
    """
    return itertools.chain.from_iterable(map(_HOOK_DICTS, modules))


# (attribute getters run in C: a captured step's guards map them over every module per call)
_PARAMETERS = operator.attrgetter("_parameters")
_BUFFERS = operator.attrgetter("_buffers")
_HOOK_DICTS = operator.attrgetter("_forward_hooks", "_forward_pre_hooks", "_backward_hooks")


def replace_inner(t: torch.Tensor, inner: torch.Tensor) -> None:
    """Make the functional tensor ``t`` hold ``inner``, as an in-place op would: views of ``t`` see it too
    (``lazyxla.export`` puts the parameters' values back after tracing).

    Example::

        replace_inner(param, LazyTensor(old_value, aval))
    """
    torch._functionalize_replace(t, inner)
    torch._functionalize_commit_update(t)
    torch._functionalize_sync(t)


def restride_as(t: torch.Tensor, storage, storage_offset: int, size, stride) -> None:
    """Give the tensor subclass ``t`` (a wrapper with no data of its own) the shape ``size`` / ``stride`` over
    ``storage``, as ``t.set_(storage, ...)`` would, running only PyTorch's Meta kernel (metadata, no data).

    Example::

        restride_as(lazy, storage, 0, [20], [1])    # lazy.shape == (20,)
    """
    meta = _C.DispatchKeySet(_C.DispatchKey.Meta)
    torch.ops.aten.set_.source_Storage_storage_offset.redispatch(meta, t, storage, storage_offset, size, stride)


# ---- issue 26 (parameter identity, inference mode, optimizer state) ------------------------------------

# the C++ guard behind torch.inference_mode (torch.inference_mode(False) adds a Python class per use): lazy/tensor.py
# makes a view's LazyTensor under inference mode as a normal tensor inside InferenceMode(False)
InferenceMode = _C._InferenceMode


# Optimizer.load_state_dict's placement of each loaded state value (a staticmethod of Optimizer): lazyxla wraps it
# to keep non-fused optimizers' step counters on the host (frontend/optimizers.py)
def optimizer_value_policy() -> Callable:
    return torch.optim.Optimizer._process_value_according_to_param_policy


def set_optimizer_value_policy(fn: Callable) -> None:
    torch.optim.Optimizer._process_value_according_to_param_policy = staticmethod(fn)


# ---- ops -------------------------------------------------------------------------------------------------

OpOverload = torch._ops.OpOverload  # the type of torch.ops.aten.<op>.<overload>: rules are keyed by them
OpOverloadPacket = torch._ops.OpOverloadPacket  # torch.ops.aten.<op>: the coverage report lists its overloads
# the decompositions into core ATen lazy mode and torch.compile use for ops without a rule
core_aten_decompositions = torch._decomp.core_aten_decompositions
# flattening and rebuilding PyTorch containers (export's outputs, out= checks' arguments)
tree_flatten = torch.utils._pytree.tree_flatten
tree_unflatten = torch.utils._pytree.tree_unflatten
tree_leaves = torch.utils._pytree.tree_leaves
tree_map = torch.utils._pytree.tree_map
# a TreeSpec as a JSON string and back: torch_xla.stablehlo's .meta files hold a program's input and output specs
treespec_dumps = torch.utils._pytree.treespec_dumps
treespec_loads = torch.utils._pytree.treespec_loads


def exported_flat_inputs(program, args: tuple, kwargs: dict) -> list:
    """The flat inputs of a ``torch.export.ExportedProgram``'s graph module for a call with ``args`` and
    ``kwargs``: its parameters, buffers and constants, then the user's inputs, in ``graph_signature.input_specs``
    order (torch_xla.stablehlo runs the graph module on these).

    Example::

        flat = exported_flat_inputs(torch.export.export(model, (x,)), (x,), {})
    """
    return program._graph_module_flat_inputs(args, kwargs)



def elementwise_result_dtype(*operands) -> torch.dtype:
    """PyTorch's result dtype of an elementwise op on ``operands`` (tensors and Python numbers), with its
    default type promotion: the pointwise rules compute in it.

    Example::

        elementwise_result_dtype(torch.empty(2, dtype=torch.int32), 1.5)    # torch.float32
    """
    _, result = torch._prims_common.elementwise_dtypes(
        *operands, type_promotion_kind=torch._prims_common.ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT
    )
    return result


# ---- meta kernels -------------------------------------------------------------------------------------

# Functionalization checks every in-place op on meta tensors before it records the op's functional variant
# (``RegisterFunctionalization.cpp``: "run meta tensors through the original op"). For many in-place ops
# (``add_``, ``mul_``, ``addcmul_``, ``lerp_``, ...) PyTorch's Meta kernel is Python: ``torch._meta_registrations``
# registers its reference implementations over the C++ ones when it is imported (torch._decomp imports it).
import torch._meta_registrations  # noqa: E402

_INPLACE_VIEW_LIKE = frozenset(  # in-place ops that change their tensor's sizes or strides: meta returns no check
    "as_strided_ detach_ resize_ resize_as_ set_ squeeze_ swapaxes_ swapdims_ t_ transpose_ unsqueeze_ copy_".split()  # noqa: SIM905
)


def python_inplace_meta_kernels() -> list[tuple[torch._ops.OpOverload, Callable]]:
    """The in-place ops (``self`` written and returned) whose Meta kernel is PyTorch's Python one, with it:
    what ``frontend.inplace_checks`` memoizes. Ops that change their tensor's metadata are left out.

    Example::

        ops = dict(python_inplace_meta_kernels())   # {aten.add_.Tensor: <function add_ ...>, ...}
    """
    found, seen = [], set()
    for kind in ("meta", "post_autograd", "pre_autograd"):  # activate_meta()'s order: it registered these
        for op in torch._decomp.global_decomposition_table[kind]:
            fn = _python_meta_kernel(op)
            if fn is not None and op not in seen and _checks_inplace(op):
                seen.add(op)
                found.append((op, fn))
    return found


def _python_meta_kernel(op) -> Callable | None:
    if not isinstance(op, torch._ops.OpOverload) or DispatchKey.Meta not in op.py_kernels:
        return None
    registered = f"{op.namespace}/{op._schema.name.split('::')[1]}.{op._overloadname}/Meta"
    if registered.replace(".default/", "/") not in torch.library._impls:
        return None  # activate_meta() left it to C++ (a view, a composite, or one of its exceptions)
    return op.py_kernels[DispatchKey.Meta]


def _checks_inplace(op) -> bool:
    if op.is_view or op._schema.name.split("::")[1] in _INPLACE_VIEW_LIKE:
        return False
    args, rets = op._schema.arguments, op._schema.returns
    first = args[0].alias_info if args else None
    if first is None or not first.is_write or len(rets) != 1 or rets[0].alias_info is None:
        return False
    return rets[0].alias_info.before_set == first.before_set  # returns `self` (Tensor(a!) -> Tensor(a!))


def replace_meta_kernel(op: torch._ops.OpOverload, fn: Callable) -> None:
    """Make ``fn`` the Meta kernel of ``op`` in place of PyTorch's Python one (same registration library).

    Example::

        replace_meta_kernel(torch.ops.aten.add_.Tensor, memoized_add_)
    """
    torch._meta_registrations._meta_lib_dont_use_me_use_register_meta.impl(op, fn, allow_override=True)


# ---- the PrivateUse1 device --------------------------------------------------------------------------

# the C++ device guard a Python backend subclasses; PyTorch's autograd engine asks it for the device type
DeviceGuard = _C._acc.DeviceGuard
PRIVATEUSE1 = _C._autograd.DeviceType.PrivateUse1
# the name PrivateUse1 is registered under ("privateuseone" until a backend renames it)
privateuse1_backend_name = _C._get_privateuse1_backend_name


def storage_id(t: torch.Tensor) -> int:
    """The identity of ``t``'s storage, shared by every view of it. A lazyxla tensor's storage is
    functionalization's (views of one base share it) and has no data pointer, so its C++ object stands for one
    (torch_xla's tensor id, which transformers reads in place of a storage pointer).

    Example::

        assert storage_id(w.detach()) == storage_id(w.t())
    """
    return t.untyped_storage()._cdata


# PyTorch's C++ hooks of the PrivateUse1 backend (availability), which a Python backend subclasses
PrivateUse1Hooks = _C._acc.PrivateUse1Hooks


def legacy_storage_classes(name: str) -> dict[str, type]:
    """The legacy typed storage classes of the device ``name`` (``FloatStorage``, ``LongStorage``, ...), as
    ``torch.cuda`` defines its own: ``Tensor.storage_type()`` looks them up in ``torch.<name>``, and PyTorch takes
    a class's device from the last part of its module's name.

    Example::

        legacy_storage_classes("lazyxla")["FloatStorage"](3).device     # device(type='lazyxla', index=0)
    """
    classes = {}
    for dtype, storage_name in torch.storage._dtype_to_storage_type_map().items():
        classes[storage_name] = type(
            storage_name,
            (torch.storage._LegacyStorage,),
            {
                "_dtype": torch._utils.classproperty(lambda cls, d=dtype: d),
                "dtype": torch._utils.classproperty(lambda cls, d=dtype: d),
                "__module__": f"torch.{name}",
            },
        )
    return classes


def setup_python_backend(name: str, backend_module, device_guard, hooks) -> None:
    """Rename PrivateUse1 to ``name`` and install ``backend_module`` as ``torch.<name>``, ``device_guard`` as its
    device guard and ``hooks`` as its C++ hooks: PyTorch's set-up for a backend written in Python
    (``_setup_privateuseone_for_python_backend``), step by step, because its generator of ``Tensor`` methods
    refuses a name whose ``Tensor.is_<name>`` PyTorch defines itself (``is_xla``): such a name gets no generated
    methods (``Tensor.is_xla`` stays PyTorch's; torch_xla has no ``Tensor.xla()`` or ``Module.xla()`` either)."""
    torch.utils.rename_privateuse1_backend(name)
    if not hasattr(torch.Tensor, f"is_{name}"):
        torch.utils.generate_methods_for_privateuse1_backend()
    for storage_name, cls in legacy_storage_classes(name).items():  # torch.cuda.FloatStorage's counterparts
        setattr(backend_module, storage_name, cls)
    torch._register_device_module(name, backend_module)
    _C._acc.register_python_privateuseone_hook(hooks)
    _C._acc.register_python_privateuseone_device_guard(device_guard)


def wrap_engine_run_backward(wrap: Callable[[Callable], Callable]) -> None:
    """Replace the function every ``backward``/``autograd.grad`` calls to start the autograd engine with
    ``wrap(original)`` (lazyxla relays exceptions raised inside backward through it)."""
    run = wrap(torch.autograd.graph._engine_run_backward)
    torch.autograd.graph._engine_run_backward = run
    torch.autograd._engine_run_backward = run


# The function that formats a tensor's text for repr/print: lazyxla prints from one host copy.
def tensor_str() -> Callable:
    return torch._tensor_str._str


def set_tensor_str(fn: Callable) -> None:
    torch._tensor_str._str = fn


# nn.Module's conversion walk (.to, .cuda, .half, ...): lazyxla wraps it to keep tied parameters tied
def module_apply() -> Callable:
    return torch.nn.Module._apply


def set_module_apply(fn: Callable) -> None:
    torch.nn.Module._apply = fn


# Recurrent modules (nn.LSTM, nn.GRU, nn.RNN) keep weak references to their parameters (``_flat_weight_refs``),
# remade by their ``_apply``; a weak reference makes ``torch.utils.swap_tensors`` refuse the parameter.
def drop_rnn_weight_refs(m: torch.nn.RNNBase) -> None:
    m._flat_weight_refs = []


def refresh_rnn_weights(m: torch.nn.RNNBase) -> None:
    """Point the module's list of weights (and its weak references) at its current parameters."""
    m._init_flat_weights()


# ---- torch.compile (Dynamo) --------------------------------------------------------------------------

# describes real tensors to the fake-tensor converter: lazyxla patches it to describe lazyxla tensors as XLA's
MetaTensorDescriber = meta_utils.MetaTensorDescriber
# Dynamo's modules lazyxla hooks when they are first imported (importing Dynamo costs ~1 s)
DYNAMO = "torch._dynamo"
DYNAMO_BACKEND_REGISTRY = "torch._dynamo.backends.registry"
DYNAMO_TRACE_RULES = "torch._dynamo.trace_rules"
DYNAMO_OPTIMIZER = "torch._dynamo.variables.optimizer"  # how Dynamo traces an optimizer's step


@contextlib.contextmanager
def is_functional_replaced(check: Callable[[torch.Tensor], bool]) -> Iterator[None]:
    """Inside: PyTorch's own code that asks ``torch._is_functional_tensor(t)`` gets ``check(t)`` (the
    fake-tensor describer reads it from the module). lazyxla's modules keep their bound ``is_functional``."""
    previous, torch._is_functional_tensor = torch._is_functional_tensor, check
    try:
        yield
    finally:
        torch._is_functional_tensor = previous


def register_dynamo_backend(registry, name: str, compiler_fn: Callable) -> None:
    """Add ``compiler_fn`` to Dynamo's backend ``registry`` module (DYNAMO_BACKEND_REGISTRY) as ``name``,
    unless it is there already or its entry point names it (lookup_backend then loads it)."""
    if name in registry._COMPILER_FNS or registry._BACKENDS.get(name) is not None:
        return
    registry.register_backend(compiler_fn=compiler_fn, name=name)


def skip_in_dynamo(trace_rules, package: str) -> None:
    """Never let Dynamo trace ``package``'s files (``trace_rules`` is DYNAMO_TRACE_RULES's module); a package
    that is not installed is left out."""
    trace_rules.add(package)


def wrap_default_compile_backend(wrap: Callable[[Callable], Callable]) -> None:
    """Replace the call of ``torch.compile``'s default backend (``torch._TorchCompileInductorWrapper``, which
    ``torch.compile`` builds for ``backend="inductor"``, the default) by ``wrap(call)``; done once."""
    cls = torch._TorchCompileInductorWrapper
    if not getattr(cls.__call__, "_lazyxla", False):
        cls.__call__ = wrap(cls.__call__)
        cls.__call__._lazyxla = True


def before_dynamo_traces_optimizer(module, prepare: Callable[[torch.optim.Optimizer], None]) -> None:
    """Call ``prepare(optimizer)`` each time Dynamo starts tracing an optimizer's step, before it reads the
    optimizer's ``param_groups`` (``module`` is DYNAMO_OPTIMIZER's: ``OptimizerVariable._set_capturable``, where
    Dynamo switches CUDA optimizers to ``capturable``; it sets the traced copy of every group's ``capturable`` to
    True whatever the device). Done once."""
    cls = module.OptimizerVariable
    original = cls._set_capturable
    if getattr(original, "_lazyxla", False):
        return

    @functools.wraps(original)
    def _set_capturable(self, tx):
        prepare(self.value)
        return original(self, tx)

    _set_capturable._lazyxla = True
    cls._set_capturable = _set_capturable


def aot_autograd(**kwargs) -> Callable:
    """Dynamo's AOTAutograd backend factory (``torch._dynamo.backends.common.aot_autograd``)."""
    from torch._dynamo.backends.common import aot_autograd as make  # loads Dynamo (~1 s): only once torch.compile runs

    return make(**kwargs)


# ---- torch.distributed ---------------------------------------------------------------------------------


def resolve_process_group(group_name: str):
    """The process group named ``group_name`` (functional collectives name their group). Read at the call: a torch
    built without distributed has no such module."""
    return _C._distributed_c10d._resolve_process_group(group_name)


def work_from_future(future) -> object:
    """A completed ``torch.distributed`` ``Work`` for a ``torch.futures.Future`` (the lazyxla process group's
    collectives return one). Read at the call: a torch built without distributed has no such module."""
    return _C._distributed_c10d._create_work_from_future(future)


def has_rendezvous_handler(scheme: str) -> bool:
    """Whether ``torch.distributed`` has a rendezvous handler for ``scheme://`` (torch_xla's ``xla://``).
    Read at the call: a torch built without distributed has no such module."""
    # (the module by its name: the attribute torch.distributed.rendezvous is a function of the same name)
    return scheme in importlib.import_module("torch.distributed.rendezvous")._rendezvous_handlers


# DTensor's layout description (torch_xla's XLAShardedTensor builds one for its placements)
def dtensor_spec(mesh, placements: tuple, shape: torch.Size, stride: tuple, dtype: torch.dtype):
    """A ``DTensorSpec`` of a tensor of ``shape``/``stride``/``dtype`` laid out over ``mesh`` as ``placements``.

    Example::

        spec = dtensor_spec(DeviceMesh("xla", torch.arange(4)), (Shard(0),), t.shape, t.stride(), t.dtype)
    """
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta  # heavy: only when a spec is built

    meta = TensorMeta(shape=shape, stride=stride, dtype=dtype)
    return DTensorSpec(mesh=mesh, placements=placements, tensor_meta=meta)


def name_python_group(pg, name: str, device_types: list[str]) -> None:
    """Name a Python ``ProcessGroup`` as torch.distributed names the groups it wraps (it skips Python ones).

    A group's name is kept by its backends, and a Python group has none: each of ``device_types`` gets PyTorch's
    fake backend (no communication; the group's own Python methods are what its callers reach), which holds it.
    """
    fake = _C._distributed_c10d.FakeProcessGroup._create_internal(pg.rank(), pg.size())
    for device_type in device_types:
        pg._register_backend(torch.device(device_type), _C._distributed_c10d.ProcessGroup.BackendType.CUSTOM, fake)
    pg._set_group_name(name)


# an in-place write autograd does not count (saved tensors keep their version): FSDP2 refills parameters so
preserve_version_counter = torch.autograd._unsafe_preserve_version_counter


# FSDP2's reduce-scatter copy-in (each gradient cut in world-size chunks, chunk i of each laid side by side)
chunk_cat = torch._chunk_cat


def fsdp_param_parts(fsdp_param) -> tuple:
    """FSDP2's ``FSDPParam``: the mesh and placements of its sharded parameter, that DTensor's local tensor, and
    whether an all-gather extension (``fsdp_pre_all_gather``) made its unsharded tensors (None and False while
    ``FSDPParam.__init__`` makes the sharded parameter)."""
    spec = fsdp_param._sharding_spec
    sharded = getattr(fsdp_param, "sharded_param", None)
    local = None if sharded is None else sharded._local_tensor
    return spec.mesh, spec.placements, local, bool(getattr(fsdp_param, "_unsharded_inner_tensors", ()))


def fsdp_unsharded_parts(fsdp_param) -> tuple:
    """FSDP2's ``FSDPParam``: its unsharded parameter (None before the first all-gather), and that parameter's
    size and contiguous stride."""
    return getattr(fsdp_param, "_unsharded_param", None), fsdp_param._orig_size, fsdp_param._contiguous_orig_stride


def root_mesh(mesh):
    """The ``DeviceMesh`` ``mesh`` was sliced from (``mesh`` itself for a mesh made whole)."""
    return mesh._get_root_mesh()


# The places where DTensor (and FSDP2 over it) turns a global tensor into one rank's part, or a rank's part into
# the global tensor's metadata (parallel/dtensor.py gives each a global-view version for SPMD-mode meshes):
# (module, owner attribute path, kind) for each; kind says how the replacement is bound.
_DTENSOR_CONVERSIONS = {
    # distribute_tensor: split a tensor for a Shard placement, replicate it, make it Partial
    "make_shard_tensor": ("torch.distributed.tensor.placement_types", "Shard._make_shard_tensor", "classmethod"),
    "make_replicate_tensor": (
        "torch.distributed.tensor.placement_types",
        "Replicate._make_replicate_tensor",
        "classmethod",
    ),
    "partition_value": ("torch.distributed.tensor.placement_types", "Partial._partition_value", "method"),
    # redistribute() and an op's implicit redistribution of its inputs (two modules bind the function)
    "redistribute_local_tensor": ("torch.distributed.tensor._redistribute", "redistribute_local_tensor", "global"),
    # an op's shape arguments (view, reshape, new_empty, ...) rewritten from the global shape to a rank's part
    "adjust_shape_and_stride_args": (
        "torch.distributed.tensor._sharding_prop",
        "ShardingPropagator._adjust_shape_and_stride_args",
        "method",
    ),
    # from_local: the global shape from a rank's part
    "compute_global_tensor_info": ("torch.distributed.tensor._api", "compute_global_tensor_info", "global"),
    # from_local / to_local (and from_local's gradient): a user's tensor made a DTensor's local tensor, and back
    "from_local_forward": ("torch.distributed.tensor._api", "_FromTorchTensor.forward", "staticmethod"),
    "from_local_backward": ("torch.distributed.tensor._api", "_FromTorchTensor.backward", "staticmethod"),
    "to_local_forward": ("torch.distributed.tensor._api", "_ToTorchTensor.forward", "staticmethod"),
    # DeviceMesh: join (or start) the world's process group and select this rank's device
    "setup_world_group_and_device": (
        "torch.distributed.device_mesh",
        "DeviceMesh._setup_world_group_and_device",
        "method",
    ),
    # FSDP2 (fully_shard): the shard group's size and this process's rank in it (FSDPMeshInfo's), a parameter's
    # (or gradient's) shard made a DTensor, and the shard a parameter's all-gather starts from
    "fsdp_mesh_info": ("torch.distributed.fsdp._fully_shard._fsdp_common", "FSDPMeshInfo.__post_init__", "method"),
    "fsdp_to_sharded_dtensor": (
        "torch.distributed.fsdp._fully_shard._fsdp_param",
        "FSDPParam.to_sharded_dtensor",
        "method",
    ),
    # FSDP2 over TP parameters: the sharded buffer filled from the TP DTensor's local tensor, and the unsharded
    # parameter, a DTensor over a view of the all-gather output
    "fsdp_init_sharded_param": (
        "torch.distributed.fsdp._fully_shard._fsdp_param",
        "FSDPParam._init_sharded_param",
        "method",
    ),
    "fsdp_init_unsharded_param": (
        "torch.distributed.fsdp._fully_shard._fsdp_param",
        "FSDPParam.init_unsharded_param",
        "method",
    ),
    # FSDP2: "free" an all-gather output (resize its storage to 0) after the forward or backward
    "fsdp_free_unsharded_param": (
        "torch.distributed.fsdp._fully_shard._fsdp_param",
        "FSDPParam.free_unsharded_param",
        "method",
    ),
    "fsdp_all_gather_inputs": (
        "torch.distributed.fsdp._fully_shard._fsdp_param",
        "FSDPParam.all_gather_inputs",
        "property",
    ),
    # distributed checkpoint (parallel/checkpoint.py): the chunk of a DTensor this rank writes (its offsets and
    # sizes, from the mesh coordinate and local shape) and reads into; whether a save or load runs over the process
    # group (DCP's object collectives) or as one process
    "dcp_write_items": ("torch.distributed.tensor._api", "DTensor.__create_write_items__", "method"),
    "dcp_chunk_list": ("torch.distributed.tensor._api", "DTensor.__create_chunk_list__", "method"),
    "dcp_dist_wrapper_init": ("torch.distributed.checkpoint.utils", "_DistWrapper.__init__", "method"),
    # DCP's default load planner: the tensor a read item is copied into (a view of the state dict's tensor), and
    # what is done with it after the copy (nothing, for a view)
    "dcp_resolve_tensor": (
        "torch.distributed.checkpoint.default_planner",
        "DefaultLoadPlanner.resolve_tensor",
        "method",
    ),
    "dcp_commit_tensor": ("torch.distributed.checkpoint.default_planner", "DefaultLoadPlanner.commit_tensor", "method"),
    # DTensor's random ops: the tracker that moves each rank's generator offset to its shard's part of the stream
    "rng_tracker_init": ("torch.distributed.tensor._random", "OffsetBasedRNGTracker.__init__", "method"),
    "rng_distribute_region": ("torch.distributed.tensor._random", "OffsetBasedRNGTracker._distribute_region", "method"),
    # FSDP2: a parameter group's gradients after backward (reduced, or added to the sharded gradients held)
    "fsdp_post_backward": (
        "torch.distributed.fsdp._fully_shard._fsdp_param_group",
        "FSDPParamGroup.post_backward",
        "method",
    ),
    # Adam's (and AdamW's) state made for each parameter with a gradient: its step counters among it
    "adam_init_group": ("torch.optim.adam", "Adam._init_group", "method"),
}
# modules that bind redistribute_local_tensor by name (from ... import), each replaced too
_ALSO_BOUND = {"redistribute_local_tensor": ("torch.distributed.tensor._dispatch", "torch.distributed.tensor._api")}


def replace_dtensor_conversions(makers: dict[str, Callable[[Callable], Callable]]) -> None:
    """Replace each of DTensor's conversions named in ``_DTENSOR_CONVERSIONS`` with ``makers[name](original)``
    (the original is passed bound, for class methods; plain, for methods and functions; its getter, for properties).

    Example::

        replace_dtensor_conversions({"partition_value": lambda original: my_partition_value})
    """
    for name, make in makers.items():
        module_name, path, kind = _DTENSOR_CONVERSIONS[name]
        owner = importlib.import_module(module_name)
        *outer, attr = path.split(".")
        for part in outer:
            owner = getattr(owner, part)
        original = vars(owner)[attr].fget if kind == "property" else getattr(owner, attr)
        new = make(original)
        bound = {"classmethod": classmethod, "property": property, "staticmethod": staticmethod}.get(kind)
        setattr(owner, attr, bound(new) if bound else new)
        for other in _ALSO_BOUND.get(name, ()):
            setattr(importlib.import_module(other), attr, new)


# ---- serialization, copying and storages (frontend/storage.py) ---------------------------------------------
#
# A lazyxla tensor is a functionalization wrapper: PyTorch says it has a storage (functionalization's, with no
# data pointer), so torch.save, pickle and copy.deepcopy take the path for tensors with host-addressable storage
# and crash or raise. PyTorch offers a device no hook for these, so lazyxla replaces the Tensor methods and the
# storage constructor below with versions that treat its tensors as the XLA device's are treated.

import copyreg  # noqa: E402

import torch.serialization  # noqa: E402
import torch.storage  # noqa: E402
import torch.utils.hooks  # noqa: E402

# the reduction torch.save/pickle call for a plain tensor, and the deep copy copy.deepcopy calls
tensor_reduce_ex_internal = torch.Tensor._reduce_ex_internal
tensor_deepcopy = torch.Tensor.__deepcopy__
# PyTorch's own rebuild function for a tensor over a storage (torch.load's weights_only unpickler allows it)
rebuild_tensor_v2 = torch._utils._rebuild_tensor_v2
# the conj/neg bits PyTorch saves beside a tensor, and the warning that hooks are not saved
tensor_metadata = torch._utils.get_tensor_metadata
warn_if_has_hooks = torch.utils.hooks.warn_if_has_hooks
# torch.serialization.skip_data(): a save that writes no tensor bytes
serialization_tls = torch.serialization._serialization_tls
# the C type of every storage: its __new__ allocates with the device's C++ allocator (lazyxla has none)
StorageBase = _C.StorageBase
storage_new = _C.StorageBase.__new__
# a subclass's slots, which copy.deepcopy copies as PyTorch's own __deepcopy__ does
slot_names = copyreg._slotnames  # copyreg's own helper, which PyTorch's __deepcopy__ uses too


def has_storage(t: torch.Tensor) -> bool:
    """Whether PyTorch reports a storage for ``t`` (a functionalization wrapper does; a wrapper subclass not)."""
    return _C._has_storage(t)


def clear_non_serializable_cached_data(t: torch.Tensor) -> None:
    """Drop the size/stride caches a subclass keeps in its ``__dict__`` (PyTorch does before copying it)."""
    t._clear_non_serializable_cached_data()


def set_tensor_methods(reduce_ex_internal: Callable, deepcopy: Callable) -> None:
    """Install the tensor reduction (``torch.save``, pickle, ``copy.copy``) and deep copy lazyxla's tensors need."""
    torch.Tensor._reduce_ex_internal = reduce_ex_internal
    torch.Tensor.__deepcopy__ = deepcopy


def set_storage_new(new: Callable) -> None:
    """Route ``torch.UntypedStorage(...)`` (and TypedStorage's, ``storage.to``, ``torch.load``'s) through ``new``."""
    torch.UntypedStorage.__new__ = staticmethod(new)


def storage_identity(storage: torch.UntypedStorage) -> int:
    """The address of ``storage``'s C++ object: unique while it lives, the same for every view's storage."""
    return storage._cdata


def wrap_storage_method(name: str, wrap: Callable[[Callable], Callable]) -> None:
    """Replace ``UntypedStorage.<name>`` (``data_ptr``, ``__getitem__``, ``copy_``) with ``wrap(PyTorch's)``."""
    setattr(torch.UntypedStorage, name, wrap(getattr(torch.UntypedStorage, name)))


def wrap_tensor_untyped_storage(wrap: Callable[[Callable], Callable]) -> None:
    """Replace ``Tensor.untyped_storage`` (``storage()`` and ``_typed_storage()`` call it) with ``wrap(PyTorch's)``."""
    torch.Tensor.untyped_storage = wrap(torch.Tensor.untyped_storage)


def wrap_tensor_data_ptr(wrap: Callable[[Callable], Callable]) -> None:
    """Replace ``Tensor.data_ptr`` with ``wrap(PyTorch's)``."""
    torch.Tensor.data_ptr = wrap(torch.Tensor.data_ptr)


# the ops a functionalization wrapper's views went through from its storage's base ([] for the base itself)
_view_meta_sequence = _C._functionalization.get_view_meta_sequence
_ALIAS_METAS = frozenset({"detach_ViewMeta", "alias_ViewMeta", "lift_fresh_ViewMeta"})


def covers_its_storage(t: torch.Tensor) -> bool:
    """Whether the functionalization wrapper ``t`` holds its whole storage in order: the storage's base, or an alias
    of it (``detach()``, a ``Parameter``), not a view of a part or another layout.

    Example::

        assert covers_its_storage(w.detach()) and not covers_its_storage(w.t())
    """
    return all(type(m).__name__ in _ALIAS_METAS for m in _view_meta_sequence(t))


# frontend/layout.py: the view a functionalization wrapper would be on CPU (its strides are its value's, contiguous),
# replayed from its view metas on a meta tensor of its base's shape
view_meta_sequence = _view_meta_sequence
# a view meta's class (``expand_ViewMeta``) and arguments: (reapply_views, [out_index,] symbolic, InverseReturnMode,
# *the view op's arguments)
ViewMeta = _C._functionalization.ViewMeta
InverseReturnMode = _C._functionalization.InverseReturnMode


def is_view(t: torch.Tensor) -> bool:
    """Whether ``t`` is an autograd view of another tensor (``t._base`` is that tensor): one C call."""
    return t._is_view()


def view_base(t: torch.Tensor) -> torch.Tensor | None:
    """The tensor ``t`` is a view of (PyTorch's ``t._base``), None for a tensor that is no view."""
    return t._base


def has_internal_overlap(t: torch.Tensor) -> bool:
    """Whether two elements of ``t`` (with its strides) share one memory location, as PyTorch's kernels decide
    before they write to ``t`` (``MemOverlap::Yes``: a stride-0 dim of size > 1)."""
    return torch._debug_has_internal_overlap(t) == 1


def accept_wrapped_storage(cls: type) -> None:
    """Let ``TypedStorage.to`` / ``.cpu`` / ``.clone`` wrap a storage of class ``cls`` (a subclass of UntypedStorage):
    PyTorch's ``_new_wrapped_storage`` accepts exactly ``UntypedStorage`` and nothing derived from it."""
    typed = torch.storage.TypedStorage
    original = typed._new_wrapped_storage

    def _new_wrapped_storage(self, untyped_storage):
        if not isinstance(untyped_storage, cls):
            return original(self, untyped_storage)
        if type(self) is typed:
            return typed(wrap_storage=untyped_storage, dtype=self.dtype, _internal=True)
        return type(self)(wrap_storage=untyped_storage)

    typed._new_wrapped_storage = _new_wrapped_storage
