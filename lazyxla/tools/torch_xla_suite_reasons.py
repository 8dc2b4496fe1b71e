"""Why a torch_xla test case fails under lazyxla: the reasons ``torch_xla_suite`` sorts failures into.

Each reason is a pattern over the case's error (or, for a file that stopped before its cases ran, over the
file's output) and a label. The first pattern that matches names the reason; ``REASONS`` is ordered from the
most specific. Labels that name a point of issue 17 are work another part of the project owns; they are
re-counted by re-running the suite once that work lands.

Example::

    classify("AttributeError: module 'torch_xla' has no attribute '_XLAC'", "")   # 'needs torch_xla._XLAC ...'
"""

from __future__ import annotations

import re

XLA_DEVICE = "needs the 'xla' device string (issue 17 point 1)"
_XLA_NAMED = "|".join(
    (
        r"from the 'XLA' backend",
        "support for xla devices",
        "type='xla'",
        "device string: xla",
        r"Expected one of .* device type",
        "'xla'",
        r"(?<!lazy)xla:\d",
    )
)
XLAC = "needs torch_xla._XLAC (C++ internals)"
HLO_BUILDER = "needs torch_xla's HLO builder (core.xla_builder, _XLAC.lowering.LoweringContext: C++ bindings)"
PLUGINS = (
    "needs a TPU through torch_xla.experimental.plugins (PJRT plugin binaries loaded by _XLAC.PjRtPlugin, "
    "torch_xla._internal.tpu.TpuPlugin)"
)
PATCHED_WORLD_HLO = (
    "records a collective over replicas the run lacks (a patched world group) only to read its HLO text "
    "(_XLAC); lazyxla checks replica groups when a collective is recorded"
)
# what torch_xla's debugging bindings say that lazyxla's (same names) cannot: its HLO builder's instruction names,
# its SPMD virtual device's host copies, a compiled call's output already computed, collectives on one replica
HLO_NAMES = (
    "matches torch_xla's HLO instruction names (%p1.1, %custom-call.1, %opt-barrier.1, %dot.3) in "
    "_XLAC._get_xla_tensors_hlo's text; lazyxla's text is jax's lowering of the program (args_0_.1, dot_general.1)"
)
FSDPV2_BARRIER = (
    "expects FSDPv2's backward optimization barrier in the HLO text (_XLAC); lazyxla's FSDPv2 applies none (its "
    "optimization_barrier options have no effect)"
)
ONE_REPLICA_HLO = (
    "reads the HLO text (_XLAC) of a collective over the run's one replica: lazyxla's program has none there (over "
    "one replica its result is its input), torch_xla's has the op"
)
HOST_COPY = (
    "expects _XLAC's debug info to show a tensor kept on the host (torch_xla's SPMD virtual device, or its CPU "
    "fallback of torch.polar); lazyxla moves a tensor to the device at once and lowers polar"
)
DYNAMO_OUTPUT_SPEC = (
    "reads the sharding of a torch.compile(backend='openxla') output before a sync (_XLAC debug info): torch_xla "
    "computes the call at once, lazyxla records it as one pending node"
)
INPLACE_SHARDING = (
    "expects an in-place op to keep the tensor's sharding annotation while pending (_XLAC): lazyxla's in-place "
    "op makes a new value without one (XLA's partitioner then lays it out; an uneven layout is lost)"
)
OP_COUNTERS = "reads torch_xla's per-op C++ counters (xla::<aten op>)"
CUSTOM_OPS = "needs torch_xla's custom ops (torch.ops.xla.*)"
CPP_METRICS = "checks torch_xla's C++ counters and metrics (TensorToData, LazyTracing)"
VIRTUAL_DEVICE = (
    "counts torch_xla's SPMD virtual device (a tensor kept on the host until mark_sharding, then uploaded as "
    "shards); lazyxla copies a tensor to every device when it is moved"
)
TRACE_NAMES = "checks the trace names of torch_xla's C++ runtime"
DUMP_FILES = "checks torch_xla's IR/HLO dump files (XLA_SAVE_TENSORS_FILE)"
PRIVATE = "uses a private torch_xla name (an underscored one outside torch_xla._internal)"
THREAD_REPLICAS = (
    "expects torch_xla's CPU replicas, threads of one process each driving device xla:<i>; lazyxla's replicas are "
    "processes, each driving its device xla:0"
)
TORCHRUN = "must be launched by torchrun (the suite runs each file as a script)"
OPENXLA = "needs torch.compile(backend='openxla') (issue 17 point 4)"
EAGER = "needs torch_xla.experimental.eager_mode (issue 17 point 4)"

REASONS: tuple[tuple[str, str], ...] = (
    (r"No module named 'torchvision'", "needs torchvision (not installed)"),
    (r"No module named 'absl'", "needs absl-py (pip install absl-py)"),
    (r"xla_builder|_XLAC\.lowering|LoweringContext", HLO_BUILDER),
    (r"cannot import name 'plugins'|experimental\.plugins", PLUGINS),
    (r"the replica groups must split the \d+ replicas", PATCHED_WORLD_HLO),
    (r"_XLAC", XLAC),
    (r"AssertionError: 'opt-barrier\.\d+ = ", FSDPV2_BARRIER),
    (r"AssertionError: '%[\w.-]+ = |Full HLO:", HLO_NAMES),
    (r"^AssertionError: HloModule ", ONE_REPLICA_HLO),
    (r"'Tensor on host: with size", HOST_COPY),
    (r"'ShardingSpec: None' unexpectedly found", DYNAMO_OUTPUT_SPEC),
    (
        r"'CompileTime__Percentile_99_sec' not found",
        "expects a compile before any sync (rand, flatten, roll, flip are only recorded; torch_xla under PJRT "
        "does not compile there either: the test dates from XRT and no torch_xla run script includes it)",
    ),
    (
        r"'CompileTime' not found in \[\]",
        "torch_xla's openxla backend compiles while Dynamo traces the first call; lazyxla records the call as one "
        "node of the pending graph and compiles it at the next sync",
    ),
    (r"'VirtualDeviceUsage' not found", VIRTUAL_DEVICE),
    (
        r"Missing elements \{'TransferToDeviceTime'\}",
        "its only upload is a program's RNG key, which lazyxla hands to the program call (counted in OutboundData, "
        "not timed apart: a separate copy doubled a small sync's host time)",
    ),
    (r"'xla::\w+' not found", OP_COUNTERS),
    (r"1: device\(type='xla', index=0\)|'backward_ordinal': 1, 'device': 'xla:0'", THREAD_REPLICAS),
    (r"'save\.hlo\.\d+' not found", DUMP_FILES),
    (
        r"expected target dtype to be Long or Byte, but got Float",
        "nll_loss with a float target: torch_xla accepts it, PyTorch (and lazyxla) raise",
    ),
    (r"is not supported by lazyxla's torch_xla compatibility layer", "raises NotImplementedError in the layer"),
    (r"'_OpNamespace' 'xla'", CUSTOM_OPS),
    (
        r"No module named 'torch_xla\._internal|'torch_xla\._internal[\w.]*' has no attribute",
        "needs a torch_xla._internal name the layer does not provide",
    ),
    (r"\bTPU(\b|v\d)|tpu\.|libtpu|requires TPU|device_type\(\) == 'TPU'", "needs a TPU"),
    (r"pallas|custom_kernel|flash_attention|splash_attention", "needs Pallas kernels (TPU)"),
    (r"does not exist: this process has \d+ lazyxla device", "asks for a device index the run does not have"),
    (_XLA_NAMED, XLA_DEVICE),
    (r"'EagerOp\w+' not found", "small int tensors are computed on the host (known values): no eager program"),
    (r"eager_mode|experimental\.eager|EagerOp|no attribute 'experimental'", EAGER),
    (r"launched with torchrun", TORCHRUN),
    (r"marked as skipped|backend='openxla'|openxla|dynamo_bridge", OPENXLA),
    # test_scan_layers.py's setUp clears scan_layers' private trace cache before every case
    (r"has no attribute '_(ONE_LAYER_CACHE|SCAN_COMPUTATION_CACHE)'", PRIVATE),
    (
        r"value_and_grad_partitioned|_ONE_LAYER_CACHE|_SCAN_COMPUTATION_CACHE|tree_flatten_none|XLA_HLO_DEBUG",
        "tests torch_xla's scan internals (value_and_grad_partitioned, its trace caches, HLO debug text)",
    ),
    (r"scan_layers|experimental\.scan|\bscan\b", "needs scan / scan_layers (issue 17 point 3)"),
    (
        r"fsdp|FullyShardedDataParallel|fully_sharded|zero_redundancy|ZeroRedundancy|utils\.checkpoint",
        "needs FSDP / ZeRO-1 / gradient checkpointing (issue 17 point 2)",
    ),
    (
        r"torchax/amp\.py[\s\S]*dim_Dimname",
        "its __main__ imports torchax, and torchax (0.0.13, the newest on PyPI) does not import beside torch 2.13 "
        "(its amp table names aten.prod.dim_Dimname, which torch 2.13 removed)",
    ),
    (
        r"No module named '(requests|datasets|transformers|tensorflow|torchax)'",
        "needs a package the suite's environment lacks",
    ),
    (r"has no attribute|cannot import name|No module named", "a torch_xla name the layer does not provide"),
)
OTHER = "other (see the case's error)"

# The reasons that mean a case uses more than torch_xla's public or ``_internal`` Python API: its C++ internals (its
# bindings ``_XLAC``, the HLO builder, PJRT plugins; its custom ops; what its C++ runtime alone produces: per-op and
# runtime counters and metrics, trace event names, IR/HLO dump files) or a private Python function. Such cases are
# outside the suite's headline figure (``summarize``'s ``python_api_run``); the raw figure counts them.
OUTSIDE_PYTHON_API = frozenset(
    (
        XLAC,
        HLO_NAMES,
        FSDPV2_BARRIER,
        ONE_REPLICA_HLO,
        HOST_COPY,
        DYNAMO_OUTPUT_SPEC,
        INPLACE_SHARDING,
        HLO_BUILDER,
        PLUGINS,
        PATCHED_WORLD_HLO,
        OP_COUNTERS,
        CUSTOM_OPS,
        CPP_METRICS,
        VIRTUAL_DEVICE,
        TRACE_NAMES,
        DUMP_FILES,
        PRIVATE,
    )
)


def classify(detail: str, output: str = "") -> str:
    """The reason label for a failing case from its error ``detail``, else from the last traceback in the
    file's ``output`` (a replica's traceback names what the parent's last line does not).

    Example::

        classify("ModuleNotFoundError: No module named 'torchvision'")   # 'needs torchvision (not installed)'
    """
    last = output.rfind("Traceback (most recent call last)")
    for text in (detail, output[last:] if last >= 0 else ""):
        for pattern, label in REASONS:
            if text and re.search(pattern, text):
                return label
    return OTHER


_ERROR_LINE = re.compile(r"^(\w+\.)*\w*(Error|Exception|Interrupt|Exit)\b.*|^\w+Error$")


def last_error(output: str) -> str:
    """The last exception line of a process's output (``Type: message``), or its last non-empty line.

    Example::

        last_error("Traceback ...\\nValueError: bad shape\\n")   # 'ValueError: bad shape'
    """
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for line in reversed(lines):
        if _ERROR_LINE.match(line) and not line.endswith("raised:"):  # spawn's summary: the replica's error follows
            return line[:500]
    return lines[-1][:500] if lines else "(no output)"
