"""Hugging Face ``generate()`` on lazyxla replays each whole decode token: the forward and ``_sample``'s work around it.

Example (unmodified user code; nothing to call)::

    model = transformers.AutoModelForCausalLM.from_config(cfg).to(lazyxla.device())
    out = model.generate(ids, max_new_tokens=64, cache_implementation="static")
    # from the fourth decode token on, a token is one replayed program and one host read (whether to stop)

Why
---
With the forward alone captured (``generation.py``), a replayed token still recorded ``_sample``'s ~75 ops around
it (the 4-D mask, logits processors, stopping criteria, argmax or the draw, the ids' ``cat``), uploaded ~6 known
values and ran three programs: 2–4x eager's CPU time. Here ``GenerationMixin._sample`` runs, for lazyxla models
where it can, a loop whose decode token is one captured function (``lazyxla.compile(capture=True)``) made of
transformers' own pieces, in ``_sample``'s order: ``prepare_inputs_for_generation``, the model's forward,
the logits processors, argmax or ``multinomial``, the finished rows' padding, the stopping criteria, the unfinished
rows' update, ``_update_model_kwargs_for_generation``; it also returns ``unfinished.max() == 0``, the one value the
host reads per token.

Fixed shapes: what grows every token stays outside. The ids' ``torch.cat`` is done after each token, outside the
captured function (a pending concatenation, computed when the output is read); the function gets the last token
only (``prepare_inputs_for_generation`` slices that much of the ids), and the last position id (it slices that too,
and ``_update_model_kwargs_for_generation`` makes the next one from it). Processors and criteria read the ids
through ``_Ids``: the last token, and a length that gives the same branch as the real one (``_LENGTH``: the
min-length processors compare it with their bound; the branch is a guard, so a call where it flips records that
token). The max-length criterion is the host's (it compares Python ints): the loop stops at the length without
reading the device, as ``_sample`` would (its ``unfinished_sequences`` is not used after the loop). Processors and
criteria are holders (``step_world.register_holder``): their device tensors (the EOS ids) are the step's inputs,
their numbers guards; flags (sampling, EOS padding) are arguments, so a call that changes them records again.

When: where ``generation.py`` captures the forward (static cache, lazyxla model, ``capture_generate``), and
``_sample`` is called without a streamer, assistant, synced GPUs or ``return_dict_in_generate``; every processor
and criterion is of a class in ``_LENGTH`` or ``_HOST_CRITERIA`` (exactly: a subclass may read more of the ids);
the model kwargs are the known ones (``_KWARGS``; a decoder-only attention mask, which grows, is not). Anything
else runs transformers' ``_sample`` unchanged (with the forward captured as before).
"""

from __future__ import annotations

import weakref

import torch

from lazyxla.lazy.regions import compile as lazyxla_compile
from lazyxla.lazy.step_world import register_holder

_ATTR = "_lazyxla_token_step"  # a model's captured token (``_Token``), kept on the model
# model kwargs the captured token takes: the cache, a decoder's position ids (their last column), an encoder-decoder's
# encoder output and mask (fixed); a value of another key, or a decoder-only attention mask, runs HF's loop
_KWARGS = {"cache", "past_key_values", "use_cache", "logits_to_keep", "position_ids", "decoder_position_ids"}
_ENCODER_KWARGS = {"encoder_outputs", "attention_mask"}
_POSITIONS = ("position_ids", "decoder_position_ids")
# processor class name -> the length it is shown (from the real one): one per branch its __call__ takes
_LENGTH = {
    "TemperatureLogitsWarper": lambda p, n: 0,  # (reads no ids)
    "TopKLogitsWarper": lambda p, n: 0,
    "TopPLogitsWarper": lambda p, n: 0,
    "MinPLogitsWarper": lambda p, n: 0,
    "MinLengthLogitsProcessor": lambda p, n: 0 if n < p.min_length else p.min_length,
    "MinNewTokensLengthLogitsProcessor": lambda p, n: (
        p.prompt_length_to_skip + (0 if n - p.prompt_length_to_skip < p.min_new_tokens else p.min_new_tokens)
    ),
}
_DEVICE_CRITERIA = {"EosTokenCriteria"}  # read the last token only: in the captured token
_HOST_CRITERIA = {"MaxLengthCriteria"}  # compare Python ints: the host's


# transformers' own pieces of ``_sample`` that the loop and the captured token call (private names of transformers
# 5: read by name here only; a transformers without them runs its own ``_sample``, ``_covered``)
_HF_METHODS = ("_prefill", "_update_model_kwargs_for_generation", "_optimize_model_for_decode",
               "_has_unfinished_sequences")  # fmt: skip


def _hf(obj, name: str):
    return getattr(obj, name)


class _Ids:
    """What a processor or criterion sees of the ids: their length (``shape``) and their last token (an index of
    the last column, as ``ids[:, -1]`` or ``ids[:, -1:]``, reads ``last``, of shape (batch, 1))."""

    def __init__(self, last: torch.Tensor, length: int) -> None:
        self.last = last
        self.shape = torch.Size((last.shape[0], length))
        self.device, self.dtype, self.ndim = last.device, last.dtype, 2

    def __getitem__(self, index):
        return self.last[index]

    def size(self, dim=None):
        return self.shape if dim is None else self.shape[dim]


class _Token:
    """A model's captured decode token (``_token``, made of HF's pieces), kept on the model."""

    def __init__(self, model) -> None:
        self.model = weakref.ref(model)  # (kept on the model: no cycle keeping it alive)
        self.captured = lazyxla_compile(self._token, capture=True)

    def _token(self, last, unfinished, pad, flags, processors, lengths, criteria, kwargs, encoder):
        """One decode token from the last one: (next tokens, unfinished rows, whether all finished, next positions).

        ``flags``: (sampling, EOS padding, encoder-decoder); ``lengths``: each processor's ``_LENGTH``."""
        do_sample, has_eos, is_encoder_decoder = flags
        model = self.model()
        kwargs = dict(kwargs)
        if encoder is not None:  # (an encoder's output, passed as its fields: rebuilt as the model returned it)
            kind, fields = encoder
            kwargs["encoder_outputs"] = kind(**fields)
        ids = last[:, None]
        inputs = model.prepare_inputs_for_generation(ids, next_sequence_length=1, **kwargs)
        outputs = model(**inputs, return_dict=True)
        logits = outputs.logits[:, -1].to(copy=True, dtype=torch.float32, device=ids.device)
        scores = logits
        for p, n in zip(processors, lengths):
            scores = p(_Ids(ids, n), scores)
        tokens = _select(scores, do_sample, has_eos, unfinished, pad)
        new = _Ids(tokens[:, None], 0)
        done = torch.full((last.shape[0],), False, device=ids.device, dtype=torch.bool)
        for c in criteria:
            done = done | c(new, None)
        unfinished = unfinished & ~done
        updated = _hf(model, "_update_model_kwargs_for_generation")(
            outputs, {k: kwargs[k] for k in _POSITIONS if k in kwargs}, is_encoder_decoder=is_encoder_decoder
        )
        # (a copy: a view would keep the grown positions alive, a computed tensor the replay could not put back)
        positions = {k: updated[k][..., -1:].clone() for k in _POSITIONS if k in kwargs}
        return tokens, unfinished, unfinished.max() == 0, positions

    @property
    def capture_status(self) -> str:
        return self.captured.capture_status


def token_step(model) -> _Token:
    """``model``'s captured decode token (made on first use, kept on the model).

    Example::

        out = model.generate(ids, cache_implementation="static")
        print(token_step(model).capture_status)        # 'replaying'
    """
    step = model.__dict__.get(_ATTR)
    if step is None:
        step = _Token(model)
        object.__setattr__(model, _ATTR, step)  # (not a submodule: nn.Module's __setattr__ would look)
    return step


def _covered(model, logits_processor, stopping_criteria, generation_config, synced_gpus, streamer, kw) -> bool:
    """Whether this ``_sample`` call's per-token work is what ``_Token`` does (else HF's loop runs)."""
    if not all(hasattr(model, name) for name in _HF_METHODS) or not hasattr(generation_config, "_pad_token_tensor"):
        return False
    if synced_gpus or streamer is not None or generation_config.is_assistant:
        return False
    if generation_config.return_dict_in_generate or not kw.get("use_cache", True):
        return False
    if any(type(p).__name__ not in _LENGTH for p in logits_processor):
        return False
    if any(type(c).__name__ not in _DEVICE_CRITERIA | _HOST_CRITERIA for c in stopping_criteria):
        return False
    allowed = _KWARGS | (_ENCODER_KWARGS if model.config.is_encoder_decoder else set())
    if any(v is not None and k not in allowed for k, v in kw.items()):
        return False
    positions = [kw[k] for k in _POSITIONS if kw.get(k) is not None]
    return all(p.ndim == 2 for p in positions)


def _select(scores, do_sample: bool, has_eos: bool, unfinished, pad):
    """``_sample``'s token selection: argmax or a draw, then the finished rows' padding."""
    if do_sample:
        tokens = torch.multinomial(torch.nn.functional.softmax(scores, dim=-1), num_samples=1).squeeze(1)
    else:
        tokens = torch.argmax(scores, dim=-1)
    return tokens * unfinished + pad * (1 - unfinished) if has_eos else tokens


def _sample(model, input_ids, logits_processor, stopping_criteria, generation_config, **model_kwargs):
    """``GenerationMixin._sample`` with each decode token one captured call (``_Token``); the prefill's token is
    ``_sample``'s own code, recorded. The loop asks ``_has_unfinished_sequences`` as ``_sample``'s does."""
    pad = _hf(generation_config, "_pad_token_tensor")
    pad = None if pad is None else pad.to(input_ids.device)
    flags = (generation_config.do_sample, any(hasattr(c, "eos_token_id") for c in stopping_criteria),
             model.config.is_encoder_decoder)  # fmt: skip
    unfinished = torch.ones(input_ids.shape[0], dtype=torch.long, device=input_ids.device)
    max_length = stopping_criteria.max_length
    processors = list(logits_processor)
    criteria = [c for c in stopping_criteria if type(c).__name__ in _DEVICE_CRITERIA]
    step, finished = None, False
    with _hf(model, "_optimize_model_for_decode")():
        while _hf(model, "_has_unfinished_sequences")(finished, False, device=input_ids.device):
            if step is None:  # the prefill's token: _sample's body
                outputs = _hf(model, "_prefill")(input_ids, generation_config, model_kwargs, is_first_iteration=True)
                model_kwargs = _hf(model, "_update_model_kwargs_for_generation")(
                    outputs, model_kwargs, is_encoder_decoder=flags[2]
                )
                logits = outputs.logits[:, -1].to(copy=True, dtype=torch.float32, device=input_ids.device)
                del outputs
                tokens = _select(logits_processor(input_ids, logits), flags[0], flags[1], unfinished, pad)
                input_ids = torch.cat([input_ids, tokens[:, None]], dim=-1)
                unfinished = unfinished & ~stopping_criteria(input_ids, None)
                done = unfinished.max() == 0
                step, (fixed, encoder, positions) = token_step(model), _decode_state(model_kwargs)
            else:
                lengths = [_LENGTH[type(p).__name__](p, input_ids.shape[1]) for p in processors]
                tokens, unfinished, done, positions = step.captured(
                    tokens, unfinished, pad, flags, processors, lengths, criteria, {**fixed, **positions}, encoder
                )
                input_ids = torch.cat([input_ids, tokens[:, None]], dim=-1)
            # (the max-length criterion is the host's: at the length, stop without reading the device)
            finished = (max_length is not None and input_ids.shape[1] >= max_length) or bool(done)
    return input_ids


def _decode_state(model_kwargs: dict) -> tuple:
    """What the captured token takes of the model kwargs after the prefill's token: the fixed ones (the cache, an
    encoder's mask), the encoder's output as (its class, its fields), and the last column of the position ids."""
    fixed = {k: v for k, v in model_kwargs.items() if k not in _POSITIONS and k != "encoder_outputs"}
    encoder = model_kwargs.get("encoder_outputs")
    encoder = None if encoder is None else (type(encoder), dict(encoder))
    positions = {k: model_kwargs[k][..., -1:] for k in _POSITIONS if model_kwargs.get(k) is not None}
    return fixed, encoder, positions


def patch(mixin, wants_capture) -> None:
    """Route ``mixin._sample`` (``GenerationMixin``) to ``_sample`` for lazyxla models that ``wants_capture``
    (``generation._wants_capture``: a static cache, ...) when ``_covered``; every other call to HF's own."""
    # (transformers' own modules: imported when transformers is loaded, not with lazyxla)
    from transformers.generation import logits_process, stopping_criteria

    original = mixin._sample
    if getattr(original, "_lazyxla", False):
        return
    register_holder(logits_process.LogitsProcessor)
    register_holder(stopping_criteria.StoppingCriteria)

    def _sample_patched(self, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus=False,
                        streamer=None, **model_kwargs):  # fmt: skip
        if wants_capture(self, model_kwargs, generation_config) and _covered(
            self, logits_processor, stopping_criteria, generation_config, synced_gpus, streamer, model_kwargs
        ):
            return _sample(self, input_ids, logits_processor, stopping_criteria, generation_config,
                           **model_kwargs)  # fmt: skip
        return original(self, input_ids, logits_processor, stopping_criteria, generation_config,
                        synced_gpus=synced_gpus, streamer=streamer, **model_kwargs)  # fmt: skip

    _sample_patched._lazyxla = True
    mixin._sample = _sample_patched
