"""What the client scripts share: torch_xla when it is there, the tiny model and the data.

A script written for torch_xla imports this like any helper module next to it (``python script.py`` and
``python -m lazyxla.run script.py`` put the script's folder first on ``sys.path``; ``xmp.spawn``'s replicas
inherit it). ``xm``, ``met`` and ``xmp`` are None where torch_xla is not importable (a plain CPU run).
"""

import torch
import transformers as T

try:
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as met
    import torch_xla.distributed.xla_multiprocessing as xmp
except ImportError:
    xm = met = xmp = None

VOCAB = 64


def examples(n, seed):
    """``n`` causal-LM examples of 8 random tokens (the labels are the inputs)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (n, 8), generator=g)
    return [{"input_ids": x, "labels": x.clone()} for x in ids]


def llama():
    """A tiny random Llama (hidden size 32, 2 layers, grouped-query attention), no dropout."""
    config = T.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
    )
    return T.LlamaForCausalLM(config)


def compiled():
    """Programs compiled so far (torch_xla's UncachedCompile counter); None on the CPU."""
    return (met.counter_value("UncachedCompile") or 0) if met is not None else None


def replays():
    """Captured steps replayed so far (lazyxla's ``capture_replays``, through torch_xla's metrics API, which
    answers lazyxla's own counter names); None on the CPU."""
    return (met.counter_value("capture_replays") or 0) if met is not None else None


# torch_xla counts each host read of a value (`.item()`, which the Trainer's logging does) as this fallback; it
# reads a computed value, it is no op run on the CPU instead of the device
HOST_READ = "aten::_local_scalar_dense"


def cpu_ops():
    """The ops that ran on the CPU instead of the device (torch_xla's ``aten::`` counters but host reads)."""
    if met is None:
        return []
    return sorted(n for n in met.counter_names() if n.startswith("aten::") and n != HOST_READ)
