"""``torch_xla.stablehlo`` on lazyxla: a ``torch.export.ExportedProgram`` as a StableHLO program, saved and loaded
in torch_xla's folder layout.

``exported_program_to_stablehlo(ep)`` runs the program's graph module once on the lazyxla device and exports what
it recorded with ``lazyxla.export``: the program's inputs are the user's tensors and the ExportedProgram's state
(parameters, buffers, lifted constants, each named by its ``graph_signature`` target), its text and bytecode are
jax's lowering of lazyxla's graph (a StableHLO portable artifact, as torch_xla writes). The returned
:class:`StableHLOGraphModule` is called as the original module is (same positional arguments, same output
structure) and returns lazyxla tensors; ``save(folder)`` writes torch_xla's layout::

    functions/forward.meta       JSON: StableHLOFunctionMeta (input/output signatures, where each input comes from)
    functions/forward.bytecode   the StableHLO portable artifact
    functions/forward.mlir       its text (with include_human_readable_text)
    data/<name>                  each state tensor, np.save format (with save_weights)
    constants/<i>                additional constants (np.save format)

``StableHLOGraphModule.load(folder)`` reads it back and runs it without the original model (and without
torch.export): jax runs the bytecode. Differences from torch_xla: shapes are fixed (an ExportedProgram with
dynamic dimensions is refused, naming them); scalars are always inlined as constants
(``inline_all_constant=False`` still exports a correct program); ``custom_ops_allowed_in_graph`` and
``export_node_metadata`` are not supported; ``load`` reads arrays with ``allow_pickle=False``; the call brings
its inputs to the host and its outputs back to the device (no lazy recording).

Example::

    ep = torch.export.export(model, (x,))
    shlo = torch_xla.stablehlo.exported_program_to_stablehlo(ep)
    y = shlo(x)                                  # lazyxla tensor, equal to model(x)
    print(shlo.get_stablehlo_text())             # module @jit_program { func.func public @main(...) ... }
    shlo.save("/tmp/model_shlo")
    y2 = StableHLOGraphModule.load("/tmp/model_shlo")(x)
"""

from __future__ import annotations

import dataclasses
import enum
import io
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
import torch

import lazyxla
from lazyxla import torch_private
from lazyxla.compat._common import missing_attribute, unsupported
from lazyxla.device import devices
from lazyxla.util import atomic_write

__all__ = [
    "InputLocation",
    "StableHLOExportOptions",
    "StableHLOFunc",
    "StableHLOFunctionMeta",
    "StableHLOGraphModule",
    "StableHLOJSONSerializer",
    "StableHLOModelBundle",
    "VariableSignature",
    "VariableType",
    "XLAExportInterpreter",
    "exported_program_to_stablehlo",
    "save_as_stablehlo",
    "save_torch_model_as_stablehlo",
    "stablehlo_obj_hook",
]


@dataclass
class StableHLOExportOptions:
    """What :func:`exported_program_to_stablehlo` and ``save`` produce (torch_xla's fields).

    ``override_tracing_arguments`` / ``_kwargs`` replace the ExportedProgram's ``example_inputs`` for the trace.
    ``export_weights=False`` leaves the state out of the bundle, ``save_weights=False`` out of the folder (the
    caller then supplies it in ``bundle.state_dict``). ``inline_all_constant`` is accepted and has no effect:
    lazyxla always inlines Python scalars.

    Example::

        opts = StableHLOExportOptions(include_human_readable_text=False, save_weights=False)
    """

    include_human_readable_text: bool = True
    override_tracing_arguments: tuple[Any, ...] | None = None
    override_tracing_kwargs: Mapping[str, Any] | None = None
    save_weights: bool = True
    inline_all_constant: bool = True
    export_weights: bool = True
    custom_ops_allowed_in_graph: set[str] = field(default_factory=set)
    export_node_metadata: bool = False


class VariableType(enum.Enum):
    """Where a program input comes from: the caller's arguments, the state dict, or the bundle's constants.

    Example::

        [loc.type_ for loc in module._bundle.stablehlo_funcs[0].meta.input_locations]  # PARAMETER..., INPUT_ARG...
    """

    INPUT_ARG = "input_arg"
    PARAMETER = "parameter"
    CONSTANT = "constant"


@dataclass
class VariableSignature:
    """An input's or output's shape and dtype name (``'float32'``; a Python type's name for an unused scalar).

    Example::

        VariableSignature(shape=[8, 32], dtype="float32")
    """

    shape: list[int]
    dtype: str
    dynamic_dims: list[int] = dataclasses.field(default_factory=list)


@dataclass
class InputLocation:
    """One program input's source: ``input_arg(position)`` (the caller's flattened arguments), ``parameter(name)``
    (the bundle's ``state_dict``) or ``constant(position)`` (its ``additional_constants``).

    Example::

        InputLocation.parameter("fc1.weight")
    """

    type_: VariableType
    position: int = -1
    name: str = ""

    @classmethod
    def parameter(cls, name: str) -> InputLocation:
        return cls(type_=VariableType.PARAMETER, name=name)

    @classmethod
    def input_arg(cls, position: int) -> InputLocation:
        return cls(type_=VariableType.INPUT_ARG, position=position)

    @classmethod
    def constant(cls, position: int) -> InputLocation:
        return cls(type_=VariableType.CONSTANT, position=position)


@dataclass
class StableHLOFunctionMeta:
    """A function's calling convention, saved as ``functions/<name>.meta`` (JSON).

    ``input_signature`` and ``input_locations`` follow the StableHLO ``main``'s parameters; ``unused_inputs`` are
    the caller's arguments the program does not read; the pytree specs are ``torch.utils._pytree`` JSON.

    Example::

        meta = shlo._bundle.stablehlo_funcs[0].meta
        [loc.type_ for loc in meta.input_locations]     # [VariableType.PARAMETER, ..., VariableType.INPUT_ARG]
    """

    name: str
    stablehlo_version: str
    input_signature: list[VariableSignature]
    output_signature: list[VariableSignature]
    input_locations: list[InputLocation]
    unused_inputs: list[tuple[InputLocation, VariableSignature]]
    input_pytree_spec: str | None = None
    output_pytree_spec: str | None = None


@dataclass
class StableHLOFunc:
    """One function of a bundle: its meta, its StableHLO bytecode and (optionally) its text.

    Example::

        func = exported_program_to_stablehlo(torch.export.export(model, args))._bundle.stablehlo_funcs[0]
        func.meta.name, len(func.bytecode), func.text.splitlines()[0]
    """

    meta: StableHLOFunctionMeta
    bytecode: bytes
    text: str | None


@dataclass
class StableHLOModelBundle:
    """The functions with the state they read: ``state_dict`` (name -> NumPy array) and ``additional_constants``.

    Example::

        bundle = exported_program_to_stablehlo(torch.export.export(model, args))._bundle
        sorted(bundle.state_dict), [f.meta.name for f in bundle.stablehlo_funcs]   # the weights, ['forward']
    """

    state_dict: dict[str, Any]
    additional_constants: list[np.ndarray]
    stablehlo_funcs: list[StableHLOFunc]


class StableHLOJSONSerializer(json.JSONEncoder):
    """JSON for the meta dataclasses.

    Example::

        json.dump(meta, f, cls=StableHLOJSONSerializer)   # meta: a StableHLOFunctionMeta
    """

    def default(self, obj):
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            return dataclasses.asdict(obj)
        if isinstance(obj, VariableType):
            return obj.value
        return super().default(obj)


_HOOK_CLASSES = (StableHLOFunctionMeta, VariableSignature, InputLocation)


def stablehlo_obj_hook(dct: dict) -> Any:
    """``json.load``'s object hook that rebuilds the meta dataclasses (a dict whose keys are exactly one
    dataclass's fields becomes that dataclass).

    Example::

        meta = json.load(open("functions/forward.meta"), object_hook=stablehlo_obj_hook)
    """
    for cls in _HOOK_CLASSES:
        if {f.name for f in dataclasses.fields(cls)} == dct.keys():
            if cls is InputLocation:
                dct = {**dct, "type_": VariableType(dct["type_"])}
            return cls(**dct)
    return dct


class XLAExportInterpreter(torch.fx.Interpreter):
    """Runs an ExportedProgram's graph module on ``device``: ops that name a device (``torch.arange(...,
    device='cpu')`` in the graph) create their tensors there.

    Example::

        XLAExportInterpreter(ep.graph_module, torch_xla.device()).run(*flat_inputs, enable_io_processing=False)
    """

    def __init__(self, module, device, custom_ops_allowed_in_graph=(), gm_serializer=None) -> None:
        if custom_ops_allowed_in_graph:
            unsupported("torch_xla.stablehlo's custom_ops_allowed_in_graph", "ops lazyxla lowers (lazyxla.ops)")
        if gm_serializer is not None:
            unsupported("torch_xla.stablehlo's export_node_metadata", "the text's locations (#loc)")
        super().__init__(module)
        self._device = device
        self.tensor_id_to_dynamic_dims: dict[int, list[int]] = {}

    def call_function(self, target, args, kwargs):
        if "device" in kwargs:
            kwargs = {**kwargs, "device": self._device}
        return super().call_function(target, args, kwargs)


class StableHLOGraphModule:
    """A callable StableHLO program (or several, by method name) with the state it reads.

    Called with the original module's positional arguments (CPU or lazyxla tensors, NumPy arrays), it returns
    lazyxla tensors in the original output structure.

    Example::

        shlo = exported_program_to_stablehlo(torch.export.export(model, (x,)))
        y = shlo(x)
        shlo.get_stablehlo_bytecode()     # bytes: a StableHLO portable artifact
    """

    def __init__(self, bundle: StableHLOModelBundle) -> None:
        self._bundle = bundle
        self._name_to_stablehlo = {func.meta.name: func for func in bundle.stablehlo_funcs}
        self._default_method = bundle.stablehlo_funcs[0].meta.name
        self._runners: dict[str, Any] = {}

    def evaluate(self, method_name: str, args: tuple) -> Any:
        """Run the function ``method_name`` on ``args`` (the caller's positional arguments)."""
        func = self._name_to_stablehlo[method_name]
        call_args = _extract_call_parameters(args, func.meta, self._bundle)
        if method_name not in self._runners:
            self._runners[method_name] = _runner(func)
        res = _run(self._runners[method_name], func.meta, call_args)
        if func.meta.output_pytree_spec is not None:
            res = torch_private.tree_unflatten(res, torch_private.treespec_loads(func.meta.output_pytree_spec))
        return res

    def get_stablehlo_bytecode(self, method_name: str | None = None) -> bytes:
        """The function's StableHLO portable artifact (``jax.export``'s serialized module)."""
        return self._name_to_stablehlo[method_name or self._default_method].bytecode

    def get_stablehlo_text(self, method_name: str | None = None) -> str | None:
        """The function's StableHLO text (None when exported with ``include_human_readable_text=False``)."""
        return self._name_to_stablehlo[method_name or self._default_method].text

    def save(self, directory_path: str | os.PathLike, options: StableHLOExportOptions | None = None) -> None:
        """Write the bundle in torch_xla's folder layout (see the module docstring)."""
        _save_program_bundle(self._bundle, directory_path, options)

    @classmethod
    def load(cls, directory_path: str | os.PathLike) -> StableHLOGraphModule:
        """Read a folder :meth:`save` wrote."""
        return cls(_load_program_bundle(directory_path))

    def __call__(self, *args) -> Any:
        return self.evaluate(self._default_method, args)


# ---- export ------------------------------------------------------------------------------------------------


def exported_program_to_stablehlo(
    exported_model: torch.export.ExportedProgram, options: StableHLOExportOptions | None = None
) -> StableHLOGraphModule:
    """A torch ``ExportedProgram`` as a callable backed by StableHLO: ``shlo(*args)`` equals
    ``exported_model.module()(*args)`` for inputs of the example inputs' shapes.

    Example::

        shlo = exported_program_to_stablehlo(torch.export.export(model, (x,)))
        torch.testing.assert_close(shlo(x).cpu(), model(x))
    """
    return StableHLOGraphModule(_exported_program_to_stablehlo_bundle(exported_model, options))


def save_as_stablehlo(
    exported_model: torch.export.ExportedProgram,
    stablehlo_dir: str | os.PathLike,
    options: StableHLOExportOptions | None = None,
) -> None:
    """Convert ``exported_model`` (:func:`exported_program_to_stablehlo`) and save it to ``stablehlo_dir``.

    Example::

        save_as_stablehlo(torch.export.export(model, (x,)), "/tmp/shlo")
        y = StableHLOGraphModule.load("/tmp/shlo")(x)
    """
    options = options or StableHLOExportOptions()
    exported_program_to_stablehlo(exported_model, options).save(stablehlo_dir, options)


def save_torch_model_as_stablehlo(
    torchmodel: torch.nn.Module,
    args: tuple[Any, ...],
    path: str | os.PathLike,
    options: StableHLOExportOptions | None = None,
) -> None:
    """``torch.export.export(torchmodel, args)``, converted and saved to ``path`` (traced with ``args``).

    Example::

        save_torch_model_as_stablehlo(model, (x,), "/tmp/shlo")
    """
    exported = torch.export.export(torchmodel, tuple(args))
    options = dataclasses.replace(options or StableHLOExportOptions(), override_tracing_arguments=tuple(args))
    save_as_stablehlo(exported, path, options)


def _exported_program_to_stablehlo_bundle(exported_model, options) -> StableHLOModelBundle:
    options = options or StableHLOExportOptions()
    _check_program(exported_model)
    args, kwargs = _tracing_inputs(exported_model, options)
    flat = list(torch_private.exported_flat_inputs(exported_model, tuple(args), dict(kwargs)))
    signature = exported_model.graph_signature
    user_output = torch.export.graph_signature.OutputKind.USER_OUTPUT
    user_outputs = [k for k, s in enumerate(signature.output_specs) if s.kind == user_output]
    interpreter = XLAExportInterpreter(
        exported_model.graph_module,
        lazyxla.device(),
        options.custom_ops_allowed_in_graph,
        object() if options.export_node_metadata else None,
    )

    def forward(*inputs):
        with torch.no_grad():
            res = interpreter.run(*inputs, enable_io_processing=False)
        return tuple(res[k] for k in user_outputs)

    exported = lazyxla.export(forward, [x.detach() if isinstance(x, torch.Tensor) else x for x in flat])
    meta, state = _meta(exported, flat, signature, exported_model.call_spec)
    func = StableHLOFunc(
        meta,
        bytes(exported.jax.mlir_module_serialized),
        exported.stablehlo_text() if options.include_human_readable_text else None,
    )
    state_dict = {name: devices.host_array(t) for name, t in state.items()} if options.export_weights else {}
    return StableHLOModelBundle(state_dict=state_dict, additional_constants=[], stablehlo_funcs=[func])


def _check_program(ep) -> None:
    if not isinstance(ep, torch.export.ExportedProgram):
        hint = (
            "; for a module, call torch.export.export(model, args) first, or save_torch_model_as_stablehlo(model, "
            "args, path)"
            if isinstance(ep, torch.nn.Module)
            else ""
        )
        raise TypeError(
            "torch_xla.stablehlo converts a torch.export.ExportedProgram (torch.export.export(model, args)), "
            f"got a {type(ep).__name__}{hint}"
        )
    dynamic = [
        f"{n.name} dimension {i} ({d})"
        for n in ep.graph.nodes
        if n.op == "placeholder" and isinstance(n.meta.get("val"), torch.Tensor)
        for i, d in enumerate(n.meta["val"].shape)
        if not isinstance(d, int)
    ]
    if dynamic:
        raise NotImplementedError(
            f"torch_xla.stablehlo on lazyxla: the ExportedProgram has dynamic input dimensions ({', '.join(dynamic)});"
            " lazyxla exports programs of fixed shapes. Export with fixed shapes (torch.export.export(model, args) "
            "without dynamic_shapes=), one program per input shape"
        )


def _tracing_inputs(ep, options) -> tuple[tuple, dict]:
    if options.override_tracing_arguments is not None:
        args, kwargs = tuple(options.override_tracing_arguments), dict(options.override_tracing_kwargs or {})
    elif ep.example_inputs is not None:
        args, kwargs = ep.example_inputs
    else:
        raise ValueError(
            "the ExportedProgram has no example_inputs: pass the inputs to trace as "
            "StableHLOExportOptions(override_tracing_arguments=args)"
        )
    if kwargs:
        raise ValueError(
            f"torch_xla.stablehlo exports positional arguments only (as torch_xla does); the program takes "
            f"keyword arguments {sorted(kwargs)}: wrap the module so they are positional"
        )
    return args, kwargs


def _meta(exported, flat, signature, call_spec) -> tuple[StableHLOFunctionMeta, dict[str, torch.Tensor]]:
    """The function's meta (inputs as ``main`` takes them) and the state tensors by name."""
    user = torch.export.graph_signature.InputKind.USER_INPUT
    specs = signature.input_specs
    state = {s.target: x for s, x in zip(specs, flat) if s.kind != user and isinstance(x, torch.Tensor)}
    n_state = sum(1 for s in specs if s.kind != user)
    tensor_positions = [i for i, x in enumerate(flat) if isinstance(x, torch.Tensor)]  # program input j -> flat i
    kept = exported.jax.module_kept_var_idx
    locations, signatures, used = [], [], set()
    for j in kept:
        i = tensor_positions[j]
        if specs[i].kind == user:
            locations.append(InputLocation.input_arg(i - n_state))
            used.add(i)
        else:
            locations.append(InputLocation.parameter(specs[i].target))
        signatures.append(_signature(exported.jax.in_avals[j]))
    unused = [
        (InputLocation.input_arg(i - n_state), _value_signature(flat[i]))
        for i in range(n_state, len(flat))
        if i not in used
    ]
    meta = StableHLOFunctionMeta(
        name="forward",
        stablehlo_version=_artifact_version(exported.jax.mlir_module_serialized),
        input_signature=signatures,
        output_signature=[_signature(a) for a in exported.jax.out_avals],
        input_locations=locations,
        unused_inputs=unused,
        input_pytree_spec=torch_private.treespec_dumps(call_spec.in_spec),
        output_pytree_spec=torch_private.treespec_dumps(call_spec.out_spec),
    )
    return meta, state


def _signature(aval) -> VariableSignature:
    return VariableSignature(shape=list(aval.shape), dtype=_dtype_name(devices.torch_dtype(aval.dtype)))


def _value_signature(x) -> VariableSignature:
    if isinstance(x, torch.Tensor):
        return VariableSignature(shape=list(x.shape), dtype=_dtype_name(x.dtype))
    return VariableSignature(shape=[], dtype=type(x).__name__)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _artifact_version(blob: bytes) -> str:
    """The StableHLO version a portable artifact names in its header (``b'ML\\xefR\\rStableHLO_v1.15\\x00'``)."""
    head = bytes(blob[:64])
    start = head.find(b"StableHLO_v")
    if start < 0:
        return "0.0.0"
    end = head.find(b"\x00", start)
    return head[start + len("StableHLO_v") : end if end > 0 else None].decode("ascii", "replace")


# ---- running -----------------------------------------------------------------------------------------------


def _extract_call_parameters(args: tuple, meta: StableHLOFunctionMeta, bundle: StableHLOModelBundle) -> list:
    if meta.input_pytree_spec is not None:
        args, _ = torch_private.tree_flatten(args)
    call_args = []
    for loc in meta.input_locations:
        if loc.type_ == VariableType.PARAMETER:
            if loc.name not in bundle.state_dict:
                raise KeyError(
                    f"the StableHLO program reads the state tensor {loc.name!r}, which this bundle does not hold "
                    "(exported with export_weights=False or saved with save_weights=False): put its value in "
                    f"module._bundle.state_dict[{loc.name!r}]"
                )
            call_args.append(bundle.state_dict[loc.name])
        elif loc.type_ == VariableType.CONSTANT:
            call_args.append(bundle.additional_constants[loc.position])
        else:
            if loc.position >= len(args):
                raise TypeError(
                    f"the StableHLO program reads argument {loc.position} (flattened); the call passed {len(args)}"
                )
            call_args.append(args[loc.position])
    return call_args


def _runner(func: StableHLOFunc) -> jax.export.Exported:
    """A ``jax.export.Exported`` that runs ``func.bytecode``: the calling convention of a stand-in program with
    the meta's signatures, and the function's own module."""
    ins = [jax.ShapeDtypeStruct(tuple(s.shape), _np_dtype(s.dtype)) for s in func.meta.input_signature]
    outs = [jax.ShapeDtypeStruct(tuple(s.shape), _np_dtype(s.dtype)) for s in func.meta.output_signature]

    def stand_in(*_):
        return tuple(jax.numpy.zeros(o.shape, o.dtype) for o in outs)

    with devices.x64():
        template = jax.export.export(jax.jit(stand_in, keep_unused=True))(*ins)  # for jax's default backend: lazyxla's
    return dataclasses.replace(template, mlir_module_serialized=func.bytecode)


def _np_dtype(name: str) -> np.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"the StableHLO function's signature names the dtype {name!r}, which is no torch dtype")
    return devices.np_dtype(dtype)


def _run(runner: jax.export.Exported, meta: StableHLOFunctionMeta, call_args: list) -> list[torch.Tensor]:
    device = lazyxla.device()
    hosts = [_host(x, sig, k) for k, (x, sig) in enumerate(zip(call_args, meta.input_signature))]
    with devices.x64():
        arrays = [jax.device_put(h, devices.jax_device(device.index)) for h in hosts]
        outs = runner.call(*arrays)
    return [devices.to_host(o, getattr(torch, s.dtype)).to(device) for o, s in zip(outs, meta.output_signature)]


def _host(x, sig: VariableSignature, k: int) -> np.ndarray:
    want = _np_dtype(sig.dtype)
    if isinstance(x, torch.Tensor):
        host = devices.host_array(x.detach().cpu())
    else:
        host = np.asarray(x, dtype=want if np.isscalar(x) else None)
    if host.dtype.kind == "V" and host.dtype.itemsize == want.itemsize:  # np.save keeps bfloat16 as raw 2-byte values
        host = host.view(want)
    if tuple(host.shape) != tuple(sig.shape) or host.dtype != want:
        raise ValueError(
            f"input {k} of the StableHLO program is {sig.dtype}{list(sig.shape)}, the call gave "
            f"{host.dtype}{list(host.shape)}: the program was exported for fixed shapes and dtypes"
        )
    return host


# ---- the folder --------------------------------------------------------------------------------------------


def _save_program_bundle(bundle: StableHLOModelBundle, stablehlo_dir, options=None) -> None:
    options = options or StableHLOExportOptions()
    if options.save_weights:
        os.makedirs(os.path.join(stablehlo_dir, "data"), exist_ok=True)
        for key, val in bundle.state_dict.items():
            atomic_write(os.path.join(stablehlo_dir, "data", key), _npy(val))
    func_dir = os.path.join(stablehlo_dir, "functions")
    os.makedirs(func_dir, exist_ok=True)
    for func in bundle.stablehlo_funcs:
        meta = json.dumps(func.meta, cls=StableHLOJSONSerializer).encode()
        atomic_write(os.path.join(func_dir, func.meta.name + ".meta"), meta)
        atomic_write(os.path.join(func_dir, func.meta.name + ".bytecode"), bytes(func.bytecode))
        if func.text is not None:
            atomic_write(os.path.join(func_dir, func.meta.name + ".mlir"), func.text.encode())
    os.makedirs(os.path.join(stablehlo_dir, "constants"), exist_ok=True)
    for i, constant in enumerate(bundle.additional_constants):
        atomic_write(os.path.join(stablehlo_dir, "constants", str(i)), _npy(constant))


def _npy(value) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.asarray(value), allow_pickle=False)
    return buf.getvalue()


def _load_program_bundle(stablehlo_dir) -> StableHLOModelBundle:
    func_dir = os.path.join(stablehlo_dir, "functions")
    if not os.path.isdir(func_dir):
        raise FileNotFoundError(
            f"{os.fspath(stablehlo_dir)!r} holds no functions/ folder: it is not a folder save_as_stablehlo or "
            "StableHLOGraphModule.save wrote"
        )
    data_dir = os.path.join(stablehlo_dir, "data")
    state_dict = {}
    if os.path.isdir(data_dir):
        state_dict = {name: _load_npy(os.path.join(data_dir, name)) for name in sorted(os.listdir(data_dir))}
    const_dir = os.path.join(stablehlo_dir, "constants")
    names = sorted(os.listdir(const_dir), key=int) if os.path.isdir(const_dir) else []
    constants = [_load_npy(os.path.join(const_dir, name)) for name in names]
    funcs = []
    for name in sorted(os.listdir(func_dir)):
        if name.endswith(".meta"):
            base = os.path.join(func_dir, name[: -len(".meta")])
            with open(base + ".meta", encoding="utf-8") as f:
                meta = json.load(f, object_hook=stablehlo_obj_hook)
            with open(base + ".bytecode", "rb") as f:
                bytecode = f.read()
            text = None
            if os.path.exists(base + ".mlir"):
                with open(base + ".mlir", encoding="utf-8") as f:
                    text = f.read()
            funcs.append(StableHLOFunc(meta, bytecode, text))
    if not funcs:
        raise FileNotFoundError(f"{os.fspath(func_dir)!r} holds no <name>.meta file: no function to load")
    return StableHLOModelBundle(state_dict=state_dict, additional_constants=constants, stablehlo_funcs=funcs)


def _load_npy(path: str) -> np.ndarray:
    with open(path, "rb") as f:
        return np.load(f, allow_pickle=False)  # files from outside are data, never pickles (DESIGN: trust model)


def __getattr__(name: str):
    raise missing_attribute(__name__, name)
