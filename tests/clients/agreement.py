"""The comparison rule of the real-client tier: a model trains on lazyxla as it does on CPU eager.

A training run on lazyxla is compared with CPU eager in three parts, each with the tolerance rule of
tests/test_training.py (``rtol`` 1e-4, ``atol`` 1e-5; a tensor's gradients and optimizer state in the unit of its
largest gradient, and gradients also within 10 times the CPU's own float32 rounding error, measured against
float64 from the same state: a true gradient of zero, as an attention key bias has, is rounding noise alone):

1. **Losses**: the losses of the lazyxla run equal those of an independent CPU run from the same weights.
2. **Gradients** (forward and backward), every step: the CPU, started from the lazyxla run's parameters and
   optimizer state before the step, computes the same loss and the same gradients.
3. **The optimizer step**, every step: torch's optimizer on the CPU, given the lazyxla run's gradients and its
   state before the step, computes the same parameters, the same optimizer state, and the same update (in the
   unit of the step's largest update, about ``lr`` for AdamW: ``atol`` 1e-5 on parameters of O(1) would hide
   an update off by 0.1%).

So every step of the lazyxla run is the step CPU eager takes from the same state, and, step by step, the run is
CPU eager's run. Parts 2 and 3 compare each step from the same state, not the end points of two independent
runs, because AdamW makes such end points differ by more than any fixed tolerance while both are right:

- AdamW moves each element by ``lr * m / (sqrt(v) + eps)``, about ``lr`` times the sign of its gradient, however
  small the gradient. Where the true gradient is zero (an attention key bias: softmax ignores a shift of a
  row's scores) or nearly zero (a few elements of any tiny random model), the float32 gradient is rounding
  noise, and its sign, hence a move of up to ``lr``, is set by the order of the float32 operations.
- This is float32 rounding and not a lazyxla error: CPU eager in float32 and CPU eager in float64 differ as
  much as lazyxla and CPU eager in float32 do, in the same tensors. Four AdamW steps (lr 1e-2), largest
  parameter difference, lazyxla - CPU float32 vs CPU float32 - CPU float64:
  Phi ``k_proj.bias`` 2.1e-4 vs 1.3e-4, GPT-NeoX ``query_key_value.bias`` 1.1e-4 vs 1.1e-4, OPT
  ``k_proj.bias`` 1.1e-4 vs 1.1e-4, Bloom ``dense_4h_to_h.weight`` 4.1e-5 vs 5.4e-5, RoBERTa
  ``output.dense.weight`` 1.3e-4 vs 4.3e-5, Gemma ``down_proj.weight`` 1.5e-5 vs 1.3e-5 (the losses agree
  within 5e-7 in all of them). The elements that differ have gradients of 1e-12 to 1e-8 against a largest
  gradient of 0.3.
- Excusing those elements does not rescue an end-point comparison: an element moved by noise changes the
  gradients of the elements that read it in the next steps (RoBERTa: noise in ``intermediate.dense.weight[5, 6]``
  moves column 5 of the next layer's ``output.dense.weight`` by up to 4e-5, elements whose own gradients are
  1e-4). Comparing from the same state stops this propagation, and the optimizer, given the same gradients,
  is then as exact as any float32 arithmetic: parts 2 and 3 excuse no element.

The rule fails for small errors (checked by perturbing one lowering rule at a time; each fails at step 1): in
the optimizer, foreach AdamW's ``sqrt`` or ``lerp`` weight off by 0.1%, fused AdamW's ``eps`` 100 times too large
or ``beta1`` off by 1e-4; in the model, RMSNorm's ``rsqrt`` off by 0.01%, layer norm's input gradient off by
0.01%, the query gradient of attention's backward off by 0.1% (BERT) or softmax's backward off by 0.1% (Llama).
"""

from __future__ import annotations

import copy

import torch

import lazyxla
from tests.util import train_steps

TOL = {"rtol": 1e-4, "atol": 1e-5}  # the rule of tests/test_training.py
OPTIMIZER_STATE = ("exp_avg", "exp_avg_sq", "momentum_buffer")  # compared after each step where present
NOISE = 10  # lazyxla's gradients may be off by 10 times the CPU's own float32 rounding error, per tensor


def _cpu(x):
    return x.detach().cpu() if isinstance(x, torch.Tensor) else x


class _LazyRun:
    """Handles on the lazyxla run: its model, its optimizer (made by ``make_opt``), and each step's loss and
    gradients (held by reference: reading them after the step's sync costs a transfer, not a compile)."""

    def __init__(self, model, loss_of, make_opt):
        self.model, self._loss_of, self._make_opt = model, loss_of, make_opt
        self.opt = None
        self.loss: torch.Tensor | None = None
        self.grads: dict[str, torch.Tensor] = {}

    def loss_of(self, model, **batch):
        self.loss = self._loss_of(model, **batch)
        return self.loss

    def make_opt(self, params):
        self.opt = self._make_opt(params)
        self.opt.register_step_pre_hook(lambda *_: self._hold_grads())
        return self.opt

    def _hold_grads(self) -> None:
        self.grads = {name: p.grad for name, p in self.model.named_parameters() if p.grad is not None}


class _CpuMirror:
    """A CPU copy of a training run that redoes each step from the lazyxla run's state and compares."""

    def __init__(self, model, batch, loss_of, make_opt, lazy: _LazyRun):
        self.model = copy.deepcopy(model)
        self.params = dict(self.model.named_parameters())
        self.opt = make_opt(self.model.parameters())
        self.exact = copy.deepcopy(model).double()  # float64: what float32 rounding costs the CPU's gradients
        self.batch, self.loss_of, self.lazy = batch, loss_of, lazy
        self.step = 0

    def check_step(self) -> None:
        """Redo the step the lazyxla run just took, from the state it had before, and compare."""
        self.step += 1
        loss = self.loss_of(self.model, **self.batch)
        loss.backward()
        self._check("loss", _cpu(self.lazy.loss), loss.detach(), **TOL)
        lazy_grads = {name: _cpu(g) for name, g in self.lazy.grads.items()}
        assert lazy_grads.keys() == {n for n, p in self.params.items() if p.grad is not None}, "different gradients"
        noise = self._rounding_noise()
        for name, g in lazy_grads.items():
            p = self.params[name]
            atol = TOL["atol"] * p.grad.abs().max() + NOISE * noise[name]
            self._check(f"{name}.grad", g, p.grad, rtol=TOL["rtol"], atol=atol)
            p.grad = g  # the optimizer check: torch's step on lazyxla's gradients
        before = {name: p.detach().clone() for name, p in self.params.items()}
        self.opt.step()
        self.opt.zero_grad()
        after = {name: _cpu(p) for name, p in self.lazy.model.named_parameters()}
        for name, p in after.items():
            self._check(name, p, self.params[name].detach(), **TOL)
        self._check_updates(after, before)
        self._check_optimizer_state(lazy_grads)
        self._load_lazy_state()

    def _rounding_noise(self) -> dict[str, torch.Tensor]:
        """Per tensor, how far the CPU's float32 gradients are from float64 ones computed from the same state."""
        batch = {
            k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in self.batch.items()
        }
        self.loss_of(self.exact, **batch).backward()
        noise = {}
        for name, p in self.exact.named_parameters():
            if p.grad is not None:
                noise[name] = (self.params[name].grad.double() - p.grad).abs().max().float()
                p.grad = None
        return noise

    def _check_updates(self, after, before) -> None:
        """The updates themselves, in the unit of the largest update (about lr for AdamW), to the float32
        resolution of the parameters they move: parameters of O(1) would hide an update off by 0.1% of lr under
        their own ``atol``, and one of 1.0 under its ``rtol``."""
        moves = {name: self.params[name].detach() - before[name] for name in after}
        unit = max(m.abs().max() for m in moves.values())
        for name, got in after.items():
            want = self.params[name].detach()
            spacing = 2 * torch.finfo(want.dtype).eps * want.abs()  # two float32 steps at the parameter's size
            allowed = TOL["rtol"] * moves[name].abs() + TOL["atol"] * unit + spacing
            excess = ((got - want).abs() - allowed).max()
            assert excess <= 0, f"step {self.step}, {name}: the update differs from CPU eager's by {excess} too much"

    def _check_optimizer_state(self, grads) -> None:
        """Computed by both from the same gradients: to the rule's tolerance in the unit of the tensor's gradient."""
        names = {id(p): name for name, p in self.lazy.model.named_parameters()}
        for p, state in self.lazy.opt.state.items():
            name = names[id(p)]
            want = self.opt.state[self.params[name]]
            for key in OPTIMIZER_STATE:
                if key in state:
                    unit = grads[name].abs().max() if name in grads else 0.0  # frozen: the state stays zero
                    scale = unit**2 if key == "exp_avg_sq" else unit
                    atol = TOL["atol"] * scale
                    self._check(f"{name}.{key}", _cpu(state[key]), want[key], rtol=TOL["rtol"], atol=atol)

    def _load_lazy_state(self) -> None:
        """The next step starts from the lazyxla run's parameters and optimizer state."""
        exact = dict(self.exact.named_parameters())
        with torch.no_grad():
            for name, p in self.lazy.model.named_parameters():
                self.params[name].copy_(_cpu(p))
                exact[name].copy_(self.params[name])
        state = self.lazy.opt.state_dict()
        # copies: load_state_dict keeps the ``step`` tensors themselves, which torch's step increments in place
        state["state"] = {i: {k: _cpu(v).clone() for k, v in s.items()} for i, s in state["state"].items()}
        self.opt.load_state_dict(state)

    def _check(self, what, got, want, rtol, atol) -> None:
        torch.testing.assert_close(got, want, rtol=rtol, atol=atol, msg=lambda m: f"step {self.step}, {what}: {m}")


def train_like_eager(model, batch: dict, loss_of, make_opt, dev, steps: int) -> dict:
    """Train ``model`` ``steps`` steps on lazyxla and check the run against CPU eager by the module's rule.

    ``make_opt(model.parameters())`` builds the optimizer. Returns the compile count after each step, the
    largest loss difference to an independent CPU run and the largest parameter difference to that run's end
    point (for the closing note of issue 16; the latter is reported, not asserted: see the module docstring),
    and, as ``"cpu_model"``, a CPU copy of the model holding the lazyxla run's final parameters.
    """
    ref, ref_losses = train_steps(copy.deepcopy(model), batch, loss_of, make_opt, torch.device("cpu"), steps)
    lazy = _LazyRun(model, loss_of, make_opt)
    mirror = _CpuMirror(model, batch, loss_of, make_opt, lazy)
    compiles: list[int] = []

    def on_step():
        compiles.append(lazyxla.metrics.counters()["compiles"])
        mirror.check_step()

    _, losses = train_steps(model, batch, lazy.loss_of, lazy.make_opt, dev, steps, on_step=on_step)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), **TOL)
    ref_params = dict(ref.named_parameters())
    return {
        "compiles": compiles,
        "loss_diff": max(abs(a - b) for a, b in zip(losses, ref_losses)),
        "param_diff": max((_cpu(p) - ref_params[n].detach()).abs().max().item() for n, p in model.named_parameters()),
        "cpu_model": mirror.model,
    }
