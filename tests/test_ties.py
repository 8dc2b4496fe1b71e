"""Tied parameters and buffers stay one object across lazyxla moves, and tied models train like eager."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
import transformers
from torch import nn

import lazyxla
from lazyxla.frontend import modules
from tests.util import train_steps

TOL = {"rtol": 1e-4, "atol": 1e-5}  # the rule of tests/test_training.py


class TiedLM(nn.Module):
    """A toy LM whose output projection is its embedding, with a buffer shared by two submodules."""

    def __init__(self, vocab: int = 32, width: int = 16):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.hidden = nn.Linear(width, width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight
        scale = torch.linspace(0.5, 1.5, width)
        self.hidden.register_buffer("scale", scale)
        self.head.register_buffer("scale", scale)

    def forward(self, x):
        h = torch.tanh(self.hidden(self.embed(x)) * self.hidden.scale)
        return self.head(h * self.head.scale)


def _assert_tied(m: TiedLM):
    assert m.head.weight is m.embed.weight
    assert m.head.scale is m.hidden.scale
    assert len(list(m.parameters())) == 3


def test_tied_weights_and_buffers_survive_the_move_and_back(dev):
    m = TiedLM()
    ref = {k: v.clone() for k, v in m.state_dict().items()}
    m.to(dev)
    _assert_tied(m)
    assert m.embed.weight.device.type == "lazyxla" and m.hidden.scale.device.type == "lazyxla"
    m.to("cpu")
    _assert_tied(m)
    for k, v in m.state_dict().items():
        torch.testing.assert_close(v, ref[k], rtol=0, atol=0)


def test_one_device_copy_and_one_gradient(dev):
    m = TiedLM()
    F.cross_entropy(m(torch.tensor([[1, 2, 3]])).flatten(0, 1), torch.tensor([2, 3, 4])).backward()
    m.to(dev)
    _assert_tied(m)
    assert m.embed.weight.grad is not None and m.embed.weight.grad.device.type == "lazyxla"
    m.half()  # a lazyxla -> lazyxla conversion keeps the tie too
    _assert_tied(m)
    assert m.embed.weight.dtype == torch.float16


def test_a_shared_submodule_and_an_optimizer_see_one_parameter(dev):
    lin = nn.Linear(4, 4)
    m = nn.Sequential(lin, nn.ReLU(), lin).to(dev)
    assert m[0] is m[2]
    opt = torch.optim.AdamW(TiedLM().to(dev).parameters())
    assert sum(len(g["params"]) for g in opt.param_groups) == 3


def _cpu_only_conversions(m: nn.Module) -> nn.Module:
    m.to(torch.float64)
    m.half()
    m._apply(lambda t: t + 1)  # not idempotent: PyTorch converts a tied tensor once per attribute
    return m


def test_cpu_only_conversions_behave_exactly_as_pytorch():
    """Importing lazyxla changes no CPU program: the same objects, the same values as PyTorch's own _apply."""
    ours, theirs = TiedLM(), TiedLM()
    theirs.load_state_dict(ours.state_dict())
    before = [id(p) for p in ours.parameters()]
    _cpu_only_conversions(ours)
    wrapped = nn.Module._apply
    try:
        nn.Module._apply = modules._original_apply
        _cpu_only_conversions(theirs)
    finally:
        nn.Module._apply = wrapped
    assert [id(p) for p in ours.parameters()] == before  # PyTorch kept identity: nothing replaced
    assert (ours.head.scale is ours.hidden.scale) == (theirs.head.scale is theirs.hidden.scale)
    for (k, a), b in zip(ours.state_dict().items(), theirs.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=k)


def test_overwrite_on_conversion_keeps_pytorchs_meaning_on_cpu():
    """With ``overwrite_module_params_on_conversion`` PyTorch unties on CPU; lazyxla does not change that."""
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    try:
        m = TiedLM().to(torch.float64)
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(False)
    assert m.head.weight is not m.embed.weight


def test_state_dict_round_trip_keeps_ties(dev):
    src = TiedLM().to(dev)
    with torch.no_grad():
        src.embed.weight.add_(1.0)
    state = src.state_dict()
    dst = TiedLM().to(dev)
    dst.load_state_dict(state)  # copies in place: the objects, hence the ties, stay
    _assert_tied(dst)
    cpu = TiedLM()
    cpu.load_state_dict({k: v.cpu() for k, v in state.items()})
    _assert_tied(cpu)
    torch.testing.assert_close(cpu.head.weight, src.embed.weight.cpu(), rtol=0, atol=0)
    dst.to("cpu")
    _assert_tied(dst)


def test_load_state_dict_assign_unties_as_in_eager(dev):
    """``assign=True`` makes one Parameter per key on every device (eager too): documented, not changed."""
    eager, lazy = TiedLM(), TiedLM().to(dev)
    eager.load_state_dict(TiedLM().state_dict(), assign=True)
    lazy.load_state_dict(TiedLM().to(dev).state_dict(), assign=True)
    assert (lazy.head.weight is lazy.embed.weight) == (eager.head.weight is eager.embed.weight)


def _lm_loss(model, x, y):
    return F.cross_entropy(model(x).flatten(0, 1), y.flatten())


@pytest.mark.parametrize(
    "make_opt",
    [lambda ps: torch.optim.SGD(ps, lr=0.5, momentum=0.9), lambda ps: torch.optim.AdamW(ps, lr=1e-2)],
    ids=["sgd", "adamw"],
)
def test_tied_lm_trains_like_eager(make_opt, dev):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, 32, (2, 8), generator=g), torch.randint(0, 32, (2, 8), generator=g)
    model, batch = TiedLM(), {"x": x, "y": y}
    ref, ref_losses = train_steps(copy.deepcopy(model), batch, _lm_loss, make_opt, torch.device("cpu"), steps=4)
    lazy, losses = train_steps(model, batch, _lm_loss, make_opt, dev, steps=4)
    _assert_tied(lazy)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), **TOL)
    for (name, p), q in zip(lazy.state_dict().items(), ref.state_dict().values()):
        torch.testing.assert_close(p.cpu(), q, **TOL, msg=lambda m, n=name: f"{n}: {m}")


# ---- Hugging Face models (tiny random configs, nothing downloaded) ---------------------------------------------


def _gpt2():
    config = transformers.GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=2,
        vocab_size=64,
        n_positions=32,
        bos_token_id=0,
        eos_token_id=0,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    return transformers.GPT2LMHeadModel(config), lambda m: [m.lm_head.weight, m.transformer.wte.weight]


def _t5():
    config = transformers.T5Config(
        vocab_size=64,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=2,
        dropout_rate=0.0,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    )
    return transformers.T5ForConditionalGeneration(config), lambda m: [
        m.lm_head.weight,
        m.shared.weight,
        m.encoder.embed_tokens.weight,
        m.decoder.embed_tokens.weight,
    ]


def _bart():
    config = transformers.BartConfig(
        vocab_size=64,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=32,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=2,
    )
    return transformers.BartForConditionalGeneration(config), lambda m: [
        m.lm_head.weight,
        m.model.shared.weight,
        m.model.encoder.embed_tokens.weight,
        m.model.decoder.embed_tokens.weight,
    ]


LR, HF_STEPS = 1e-2, 3


def _zero_gradient_part(name: str) -> slice | None:
    """The part of an attention key bias, whose gradient is exactly zero in exact arithmetic.

    Softmax over keys is invariant to adding one constant per query, which is what a key bias adds, so its true
    gradient is 0 and what backward computes is rounding noise (GPT-2 here: ~1e-11, against ~1e-4 for the query
    bias). AdamW's step ``lr * m / (sqrt(v) + eps)`` turns that noise into moves of ~1e-5 whose sign and size
    depend on summation order (eager CPU with another order would differ from itself as much), so this part
    is checked against the bound of an AdamW move, ``lr`` per step, not the 1e-4 rule.
    """
    if name.endswith("attn.c_attn.bias"):  # GPT-2: [query | key | value], key in the middle third
        return slice(32, 64)
    if name.endswith("k_proj.bias"):  # BART
        return slice(None)
    return None


def _assert_params_close(name: str, actual: torch.Tensor, expected: torch.Tensor):
    noise = _zero_gradient_part(name)
    if noise is not None:
        torch.testing.assert_close(actual[noise], expected[noise], rtol=0, atol=2 * LR * HF_STEPS, msg=name)
        actual, expected = actual.clone(), expected.clone()
        actual[noise] = expected[noise] = 0
    torch.testing.assert_close(actual, expected, **TOL, msg=lambda m: f"{name}: {m}")


def _hf_loss(model, **batch):
    return model(**batch).loss


def _adamw(params):
    return torch.optim.AdamW(params, lr=LR, weight_decay=0.01)


@pytest.mark.parametrize("build", [_gpt2, _t5, _bart], ids=["gpt2", "t5", "bart"])
def test_hf_tied_models_stay_tied_and_train_like_eager(build, dev):
    torch.manual_seed(0)
    model, tied = build()
    assert all(t is tied(model)[0] for t in tied(model))
    g = torch.Generator().manual_seed(1)
    batch = {
        "input_ids": torch.randint(3, 64, (2, 8), generator=g),
        "labels": torch.randint(3, 64, (2, 8), generator=g),
    }
    ref, ref_losses = train_steps(copy.deepcopy(model), batch, _hf_loss, _adamw, torch.device("cpu"), HF_STEPS)
    compiles = []

    def count():
        compiles.append(lazyxla.metrics.counters()["compiles"])

    lazy, losses = train_steps(model, batch, _hf_loss, _adamw, dev, HF_STEPS, on_step=count)
    assert all(t is tied(lazy)[0] for t in tied(lazy)), "a tied weight was untied by the move"
    assert tied(lazy)[0].device.type == "lazyxla"
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), **TOL)
    ref_params = dict(ref.named_parameters())
    for name, p in lazy.named_parameters():
        _assert_params_close(name, p.detach().cpu(), ref_params[name].detach())
    assert compiles[2] == compiles[1], compiles  # compiles settle by step 2
    assert not any(k.startswith("fallback.") for k in lazyxla.metrics.counters()), lazyxla.metrics.counters()
