"""Hugging Face ``generate()`` on lazyxla replays its decode step (whole-step capture of the model's forward).

Example (unmodified user code; nothing to call)::

    model = transformers.AutoModelForCausalLM.from_config(cfg).to(lazyxla.device())
    out = model.generate(ids, max_new_tokens=64, cache_implementation="static")
    # from the decode's fourth token on, each token's forward is one replayed program (no op recorded)

Why
---
A decode token's forward records ~190 ops (a tiny GPT-2) and compiles nothing new: recording is the whole cost.
``generate()`` already asks for a compiled forward when the cache is static (``_valid_auto_compile_criteria``,
then ``get_compiled_call``: ``torch.compile`` on CUDA and TPU). On a lazyxla model it gets a captured forward
instead (``lazyxla.compile(fn, capture=True)``, lazy/capture.py): two recorded tokens from the same state verify
the step, and later tokens replay its program.

The KV cache is the step's state: it is a keyword argument (``cache``, or ``past_key_values``), and its tensors
(each layer's ``keys``, ``values`` and ``cumulative_length``) live in plain Python objects. Its classes are
registered as *holders* (``step_world.register_holder``), so capture knows those tensors as locations: read as
program inputs, changed in place by the replay as a recorded token changes them (``index_copy_``, ``add_``),
with the cache object, its layers' tensors (by identity, shape and dtype) and its Python flags (``is_updated``,
``is_initialized``) among the guards. Token positions are device tensors (``cumulative_length``, the position
ids), so a new position is a new input, not a new program. The forward's output holds the cache itself, which
capture cannot return; the captured function returns the output without it, and the cache object is put back.

When: a model on the lazyxla device, a compileable cache (static, not the dynamic one), its layers initialized
(the prefill ran: the prefill itself is never captured), no ``generation_config.disable_compile``, and
``lazyxla.config.capture_generate`` (default on; ``LAZYXLA_CAPTURE_GENERATE=0`` turns it off). Anything else,
and every model not on lazyxla, takes transformers' own path. Where ``_sample``'s per-token work is covered too,
``generation_token.py`` captures the whole token instead (the forward inside it).
"""

from __future__ import annotations

import weakref

from lazyxla.config import config
from lazyxla.device import devices
from lazyxla.frontend import generation_token
from lazyxla.lazy.regions import compile as lazyxla_compile
from lazyxla.lazy.step_world import register_holder
from lazyxla.util import after_import

_MODELING = "transformers.modeling_utils"  # defines PreTrainedModel (it imports GenerationMixin)
_CACHE_NAMES = ("cache", "past_key_values")  # the forward's keyword for the cache (transformers 5, 4)
_ATTR = "_lazyxla_decode_step"  # a model's captured forward (``_Decode``), kept on the model


class _Decode:
    """A model's forward for decoding: captured once the cache is initialized, else called as it is."""

    def __init__(self, model) -> None:
        self.model = weakref.ref(model)  # (kept on the model: no cycle keeping it alive)
        self.cache_key = None
        self.captured = lazyxla_compile(self._forward, capture=True)

    def _forward(self, **kwargs):
        """The model's forward, returning its output without the cache (capture returns tensors and numbers)."""
        out = self.model()(**kwargs)
        cache = kwargs.get(self.cache_key)
        return type(out)(**{k: v for k, v in out.items() if v is not cache})

    def __call__(self, *args, **kwargs):
        key = next((k for k in _CACHE_NAMES if kwargs.get(k) is not None), None)
        cache = kwargs.get(key)
        if args or key is None or not _initialized(cache):
            return self.model()(*args, **kwargs)
        self.cache_key = key
        out = self.captured(**kwargs)
        out[key] = cache  # (the output held the cache: generate() reads it back from there)
        return out

    @property
    def capture_status(self) -> str:
        return self.captured.capture_status


def _initialized(cache) -> bool:
    """Whether every layer of ``cache`` (of both sub-caches of an encoder-decoder cache) holds its tensors."""
    subs = [getattr(cache, n) for n in ("self_attention_cache", "cross_attention_cache") if hasattr(cache, n)]
    layers = [layer for c in subs or [cache] for layer in getattr(c, "layers", ())]
    return bool(layers) and all(getattr(layer, "is_initialized", False) for layer in layers)


def decode_step(model):
    """``model``'s captured decode forward (made on first use, kept on the model).

    Example::

        step = decode_step(model)
        out = model.generate(ids, cache_implementation="static")
        print(step.capture_status)         # 'replaying'
    """
    step = model.__dict__.get(_ATTR)
    if step is None:
        step = _Decode(model)
        object.__setattr__(model, _ATTR, step)  # (not a submodule: nn.Module's __setattr__ would look)
    return step


def model_on_lazyxla(model) -> bool:
    """Whether ``model``'s (first) parameter is on the lazyxla device: the models whose library calls lazyxla
    routes to captured steps (``generate()`` here, ``Trainer.training_step`` in ``frontend/trainer.py``).

    Example::

        model_on_lazyxla(torch.nn.Linear(2, 2).to(lazyxla.device()))    # True
    """
    try:
        return devices.on_device(next(model.parameters()))
    except StopIteration:
        return False


def _wants_capture(model, model_kwargs: dict, generation_config) -> bool:
    """``generate()``'s own criteria for a compiled decode step, on a lazyxla model: a compileable cache (not the
    dynamic one), no quantizer that forbids compiling, no ``disable_compile``."""
    if not config.capture_generate or generation_config.disable_compile or not model_on_lazyxla(model):
        return False
    cache = next((model_kwargs.get(k) for k in _CACHE_NAMES if model_kwargs.get(k) is not None), None)
    decoder = getattr(cache, "self_attention_cache", cache)
    quantizer = getattr(model, "hf_quantizer", None)
    return (
        cache is not None
        and getattr(cache, "is_compileable", False)
        and type(decoder).__name__ != "DynamicCache"
        and (quantizer is None or quantizer.is_compileable)
    )


def _patch(modeling) -> None:
    """Route ``generate()``'s compiled-forward choice to capture for lazyxla models, and its sampling loop to a
    captured token where it can (``frontend/generation_token.py``); others: unchanged."""
    # (transformers' own modules, loaded by modeling_utils already: imported here, when it is, not with lazyxla)
    from transformers import cache_utils
    from transformers.generation import utils as generation_utils

    register_holder(cache_utils.Cache)
    if hasattr(cache_utils, "EncoderDecoderCache"):  # (a Cache too in transformers 5; a separate class in 4)
        register_holder(cache_utils.EncoderDecoderCache)
    generation_token.patch(generation_utils.GenerationMixin, lambda model, kw, gc: _wants_capture(model, kw, gc))
    mixin, cls = generation_utils.GenerationMixin, modeling.PreTrainedModel
    criteria = getattr(mixin, "_valid_auto_compile_criteria", None)
    compiled_call = getattr(cls, "get_compiled_call", None)
    if criteria is None or compiled_call is None or getattr(compiled_call, "_lazyxla", False):
        return  # (a transformers without auto-compiled decoding, or patched already)

    def _valid_auto_compile_criteria(self, model_kwargs, generation_config):
        if model_on_lazyxla(self):
            return _wants_capture(self, model_kwargs, generation_config)
        return criteria(self, model_kwargs, generation_config)

    def get_compiled_call(self, compile_config):
        if model_on_lazyxla(self):
            return decode_step(self)
        return compiled_call(self, compile_config)

    get_compiled_call._lazyxla = True
    mixin._valid_auto_compile_criteria = _valid_auto_compile_criteria
    cls.get_compiled_call = get_compiled_call


def install() -> None:
    """Patch transformers now if it is loaded, else when it is (done when lazyxla is imported).

    Example::

        import lazyxla, transformers      # either order
    """
    after_import({_MODELING: _patch})
