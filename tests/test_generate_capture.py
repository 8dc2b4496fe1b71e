"""Hugging Face ``generate()`` with a static cache replays its decode step on lazyxla (``frontend/generation.py``).

Tiny random-config GPT-2, Llama and T5 (nothing is downloaded) give the CPU's tokens, greedy and sampling; from
the fourth decode token on the forward is replayed (one program, its ops not recorded), nothing compiles, and a
warm token executes far fewer recorded nodes than with ``capture_generate`` off. A changed batch size or maximum
length records again and still gives the CPU's tokens. The holder mechanism itself (``step_world.register_holder``)
is checked on a plain object: replays equal lazy mode, and a step that replaces a held tensor is refused.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import transformers as T

import lazyxla
from lazyxla.frontend import generation, generation_token
from lazyxla.lazy import step_world
from tests.clients.test_generate import MODELS, NEW, V  # the same tiny models as the client test

MODES = {
    "greedy": {"do_sample": False},
    "sample": {"do_sample": True, "top_k": 1, "temperature": 0.7},  # top-k 1: the CPU's tokens (whole sampling path)
}
COUNTERS = ("compiles", "nodes_executed", "capture_replays")


class Probe(T.LogitsProcessor):
    """Notes lazyxla's counters each time generation asks for a token's scores (returns them unchanged)."""

    def __init__(self) -> None:
        self.marks: list[tuple[int, ...]] = []

    def __call__(self, input_ids, scores):
        c = lazyxla.metrics.counters()
        self.marks.append(tuple(c.get(k, 0) for k in COUNTERS))
        return scores

    def per_token(self) -> list[tuple[int, ...]]:
        """(compiles, nodes, replays) between each token's scores and the next's."""
        return [tuple(b - a for a, b in zip(x, y)) for x, y in zip(self.marks, self.marks[1:])]


def _model(name):
    torch.manual_seed(0)
    return MODELS[name]().eval()


def _prompt(batch=2):
    return torch.randint(3, V, (batch, 5), generator=torch.Generator().manual_seed(1))


def _kw(mode="greedy", new=NEW):
    return {**MODES[mode], "max_new_tokens": new, "min_new_tokens": new, "pad_token_id": 0}


def _generate(model, prompt, **kw):
    probe = Probe()
    out = model.generate(prompt, logits_processor=T.LogitsProcessorList([probe]), cache_implementation="static", **kw)
    return out.cpu(), probe.per_token()


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("mode", list(MODES))
def test_generate_replays_the_decode_step_with_cpu_tokens(name, mode, dev):
    model = _model(name)
    want = model.generate(_prompt(), cache_implementation="static", **_kw(mode))
    model.to(dev)
    got, per_token = _generate(model, _prompt().to(dev), **_kw(mode))
    assert torch.equal(got, want), (got, want)
    compiles, _, replays = zip(*per_token)
    # two recorded tokens verify the step (the first call's first decode tokens): every later one is replayed, and
    # from the second replayed token on nothing compiles (the first replay's pending work is a program of its own)
    assert sum(compiles[4:]) == 0, compiles
    assert all(replays[3:]), replays
    assert generation.decode_step(model).capture_status == "replaying"
    # a second call (a new cache object of the same shapes) replays from its first decode token
    again, per_token = _generate(model, _prompt().to(dev), **_kw(mode))
    assert torch.equal(again, want)
    compiles, nodes, replays = zip(*per_token)
    assert sum(compiles) == 0 and all(replays), per_token
    with lazyxla.config.override(capture_generate=False):  # every token recorded: the forward's nodes too
        recorded, off = _generate(model, _prompt().to(dev), **_kw(mode))
    assert torch.equal(recorded, want)
    assert not any(r for _, _, r in off), off
    # what a replayed token still executes is generate()'s own work around the forward (O(1) in the model's size)
    assert max(nodes[1:]) * 3 < min(n for _, n, _ in off[1:]), (nodes, off)


def test_sampling_with_choice_replays_the_recorded_draws(dev):
    """With a choice of tokens (top-k 8) lazyxla draws from its device RNG, not the CPU's: a replayed step draws
    the keys a recorded one would, so the same seed gives the same tokens with capture on and off."""
    model = _model("gpt2").to(dev)
    kw = {**_kw("sample"), "top_k": 8, "temperature": 1.5}
    runs = {}
    for on in (True, False, True):
        with lazyxla.config.override(capture_generate=on):
            torch.manual_seed(3)
            got, per_token = _generate(model, _prompt().to(dev), **kw)
        runs.setdefault(on, []).append((got, sum(r for _, _, r in per_token)))
    (first, _), (second, replayed) = runs[True]
    ((recorded, none),) = runs[False]
    assert torch.equal(second, recorded) and torch.equal(first, recorded), (first, second, recorded)
    assert replayed == NEW - 1 and none == 0


@pytest.mark.parametrize("change", ["batch", "max_length"])
def test_a_changed_batch_or_length_records_again_with_cpu_tokens(change, dev):
    batch, new = (3, NEW) if change == "batch" else (2, NEW + 4)
    # (a CPU twin: generate() keeps the longest static cache a model has had, so the reference runs on its own)
    want = _model("llama").generate(_prompt(batch), cache_implementation="static", **_kw(new=new))
    model = _model("llama").to(dev)
    _generate(model, _prompt().to(dev), **_kw())
    misses = lazyxla.metrics.counters().get("capture_guard_misses", 0)
    got, per_token = _generate(model, _prompt(batch).to(dev), **_kw(new=new))
    assert torch.equal(got, want), (got, want)
    assert lazyxla.metrics.counters().get("capture_guard_misses", 0) > misses  # the cache's shapes are guards
    replays = [r for _, _, r in per_token]
    assert not any(replays[:2]) and all(replays[3:]), replays


def test_disable_compile_records_every_token(dev):
    """``generate(..., disable_compile=True)``, transformers' own switch, opts one call out."""
    model = _model("gpt2")
    want = model.generate(_prompt(), cache_implementation="static", **_kw())
    model.to(dev)
    got, per_token = _generate(model, _prompt().to(dev), disable_compile=True, **_kw())
    assert torch.equal(got, want)
    assert not any(r for _, _, r in per_token)


class _State:
    """A plain object holding device tensors (a KV cache's shape: a list of layer objects)."""

    def __init__(self, dev) -> None:
        self.layers = [_Layer(dev), _Layer(dev)]
        self.flag = True


class _Layer:
    def __init__(self, dev) -> None:
        self.keys = torch.zeros(4, device=dev)
        self.count = torch.zeros((), dtype=torch.long, device=dev)


@pytest.fixture
def holder():
    step_world.register_holder(_State)
    yield
    step_world._HOLDERS.remove(_State)  # (the fast path's leaves as before)
    step_world._PLAIN = (torch.Tensor, *step_world.NUMBERS, *step_world._HOLDERS)


def test_a_holders_tensors_are_read_and_written_in_place_by_replays(holder, dev):
    lin = torch.nn.Linear(4, 4).to(dev)

    def step(x, state):
        for layer in state.layers:
            layer.keys.mul_(0.5).add_(lin(x))
            layer.count.add_(1)
        return state.layers[0].keys.sum() + state.layers[1].keys.sum()

    run = lazyxla.compile(step, capture=True)
    states = [_State(dev), _State(dev)]  # lazy mode's, and the captured step's
    x = torch.randn(4, device=dev)
    for i in range(5):
        want = step(x + i, states[0])
        got = run(x + i, states[1])
        assert torch.allclose(got.cpu(), want.cpu()), i
        for a, b in zip(states[0].layers, states[1].layers):
            assert torch.equal(a.keys.cpu(), b.keys.cpu()) and a.count.item() == b.count.item() == i + 1
    assert run.capture_status == "replaying"
    fresh = _State(dev)  # another holder of the same shapes: replayed on its own tensors, not the verified call's
    got = run(x, fresh)
    assert fresh.layers[0].count.item() == 1 and states[1].layers[0].count.item() == 5
    assert torch.allclose(got.cpu(), (2 * lin(x)).sum().cpu())


def test_a_step_that_replaces_a_held_tensor_is_refused(holder, dev):
    def step(x, state):
        state.layers[0].keys = state.layers[0].keys + x  # a new tensor (a cache that grows): not replayable
        return state.layers[0].keys.sum()

    run = lazyxla.compile(step, capture=True)
    state = _State(dev)
    x = torch.ones(4, device=dev)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(4):
            out = run(x, state)
    assert out.item() == 16.0
    assert "replaces tensor" in run.capture_status and "layers.0.keys" in run.capture_status, run.capture_status


# ---- the whole decode token captured (frontend/generation_token.py) ---------------------------------------------

TOKEN_COUNTERS = ("compiles", "executions", "ops_recorded", "capture_replays")


def _loop_generate(model, prompt, **kw):
    """``generate()`` with lazyxla's counters noted each time the decoding loop asks whether to go on (no logits
    processor of ours: a replayed token runs none); per token, the counters' increments (token 0: the prefill's)."""
    marks = []
    ask = model._has_unfinished_sequences

    def asked(*a, **k):
        c = lazyxla.metrics.counters()
        marks.append(tuple(c.get(k, 0) for k in TOKEN_COUNTERS))
        return ask(*a, **k)

    model._has_unfinished_sequences = asked
    try:
        out = model.generate(prompt, cache_implementation="static", **kw)
    finally:
        del model._has_unfinished_sequences
    return out.cpu(), [tuple(b - a for a, b in zip(x, y)) for x, y in zip(marks, marks[1:])]


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("mode", list(MODES))
def test_generate_replays_each_whole_token_with_cpu_tokens(name, mode, dev):
    """A warm decode token is one replayed program (the forward, the processors, the draw or argmax, the stopping
    criteria) and the two ops of the ids' ``cat``: none of generate()'s per-token work is recorded."""
    model = _model(name)
    want = model.generate(_prompt(), cache_implementation="static", **_kw(mode))
    model.to(dev)
    got, per_token = _loop_generate(model, _prompt().to(dev), **_kw(mode))
    assert torch.equal(got, want), (got, want)
    assert len(per_token) == NEW
    compiles, programs, ops, replays = zip(*per_token)
    assert sum(compiles[4:]) == 0 and all(replays[4:]), per_token
    assert generation_token.token_step(model).capture_status == "replaying"
    again, per_token = _loop_generate(model, _prompt().to(dev), **_kw(mode))
    assert torch.equal(again, want)
    assert all(t == (0, 1, 2, 1) for t in per_token[1:]), per_token  # (compiles, programs, ops, replays)


def test_sampling_with_choice_replays_the_recorded_draws_of_whole_tokens(dev):
    """With a choice (top-k 8), a replayed token draws the keys a recorded one would: the same seed gives the
    same tokens with the whole token captured and with capture off."""
    model = _model("llama").to(dev)
    kw = {**_kw("sample"), "top_k": 8, "temperature": 1.5}
    runs = []
    for on in (True, True, False):
        with lazyxla.config.override(capture_generate=on):
            torch.manual_seed(3)
            got, per_token = _loop_generate(model, _prompt().to(dev), **kw)
        runs.append((got, sum(t[3] for t in per_token)))
    (first, _), (second, replayed), (recorded, none) = runs
    assert torch.equal(first, recorded) and torch.equal(second, recorded), runs
    assert replayed == NEW - 1 and none == 0
    assert generation_token.token_step(model).capture_status == "replaying"


def test_a_min_length_reached_mid_call_gives_cpu_tokens(dev):
    """``min_new_tokens`` below the length: the EOS ban holds for the first tokens only (the processor's branch is
    a guard: the token where it flips records), and an EOS the model picks then ends the row as on the CPU."""
    model = _model("llama")
    model.generation_config.eos_token_id = 5  # (a token the tiny model picks: rows end early once allowed)
    kw = {"do_sample": False, "max_new_tokens": NEW + 4, "min_new_tokens": 3, "pad_token_id": 0}
    want = model.generate(_prompt(), cache_implementation="static", **kw)
    model.to(dev)
    for _ in range(3):
        got, _ = _loop_generate(model, _prompt().to(dev), **kw)
        assert torch.equal(got, want), (got, want)
    assert generation_token.token_step(model).capture_status == "replaying"


def test_a_processor_that_reads_the_ids_keeps_hfs_loop(dev):
    """A repetition penalty reads every generated id: not in the captured token; transformers' loop runs, with the
    forward replayed as before, and gives the CPU's tokens."""
    model = _model("gpt2")
    kw = {**_kw(), "repetition_penalty": 1.5}
    want = model.generate(_prompt(), cache_implementation="static", **kw)
    model.to(dev)
    got, per_token = _loop_generate(model, _prompt().to(dev), **kw)
    assert torch.equal(got, want)
    assert generation_token._ATTR not in model.__dict__  # (no captured token was made)
    assert all(t[3] for t in per_token[4:]), per_token  # the forward is replayed
    assert min(t[2] for t in per_token[4:]) > 10, per_token  # and the rest of each token recorded
