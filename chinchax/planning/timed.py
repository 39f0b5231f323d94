"""Shapes under a wall-clock budget: tokens reachable in the time, predicted loss, ranking.

After "Time Matters" (Inbar & Sernau 2024): with a step-time model every
candidate shape gets D(shape) = floor((seconds − t_start) / t_step) ·
tokens_per_step tokens and the loss L(N, D(shape)) they predict; with a law
that predicts no loss, candidates are ranked by their distance from the law's
frontier, |ln(N / N_opt(6·N·D(shape)))|.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from chinchax.cost import budget
from chinchax.cost import hardware as hardware_lib
from chinchax.planning import allocate as allocate_lib
from chinchax.planning import batch as batch_lib
from chinchax.planning import layout as layout_lib
from chinchax.planning import shapes as shapes_lib
from chinchax.cost import step_time as step_time_lib
from chinchax.planning.errors import PlanError


@dataclasses.dataclass(frozen=True)
class Measurement:
  """A candidate's train step measured on this machine (``--calibrate``).

  Attributes:
    step_time_s: mean seconds per step in the steady state.
    startup_s: seconds before the steady state (set-up, compile, first step);
      taken out of the budget.
    model_step_time_s: what the step-time model predicted for the same step.
  """

  step_time_s: float
  startup_s: float
  model_step_time_s: float

  @property
  def model_error(self) -> float:
    """predicted / measured − 1 of the step-time model on this step."""
    return self.model_step_time_s / self.step_time_s - 1.0


@dataclasses.dataclass(frozen=True)
class TimedCandidate:
  """A shape evaluated under a wall-clock budget.

  Attributes:
    candidate: the shape and its exact N.
    batch: batch, steps and tokens reachable in the time.
    step_time_s: predicted seconds per step.
    loss: L(N, tokens) in nats/token, None for an allocation-only law.
    frontier_gap: |ln(N / N_opt(6·N·tokens))|, distance from the law's frontier.
    memory_bytes: the analytic peak memory per device of its layout (``fit``).
    measured: the calibration measurement behind ``step_time_s``, if any.
    startup_s: seconds before the steady state, paid out of the budget (from
      the measurement, else the step-time model's, else 0).
    fit: how it fits the devices (``chinchax.planning.layout.choose_layout``:
      microbatches, remat); its step time is the model's for that layout.
  """

  candidate: shapes_lib.ShapeCandidate
  batch: batch_lib.BatchPlan
  step_time_s: float
  loss: float | None
  frontier_gap: float
  memory_bytes: float
  measured: Measurement | None = None
  startup_s: float = 0.0
  fit: layout_lib.Layout | None = None

  @property
  def tokens(self) -> int:
    return self.batch.tokens

  def to_dict(self) -> dict:
    out = self.candidate.to_dict()
    out.update(global_batch_size=self.batch.global_batch_size, steps=self.batch.steps,
               D=self.batch.tokens, step_time_s=self.step_time_s,
               tokens_per_second=self.batch.tokens_per_step / self.step_time_s,
               predicted_loss=self.loss, frontier_gap=self.frontier_gap,
               memory_gb_per_device=self.memory_bytes / 1e9,
               step_time_source="measured" if self.measured else "model",
               startup_s=self.startup_s)
    if self.fit is not None:
      out.update(microbatches=self.fit.microbatches, remat=self.fit.remat,
                 fits_memory=self.fit.fits)
    if self.measured is not None:
      out.update(model_step_time_s=self.measured.model_step_time_s)
    return out


def candidate_batch_size(cand: shapes_lib.ShapeCandidate, C_rule: float, n_devices: int) -> int:
  """The global batch (sequences) of ``cand`` under the batch rule at compute ``C_rule``."""
  return batch_lib.plan_batch(C_rule / (6.0 * cand.N), N=cand.N, seq_len=cand.shape.seq_len,
                              C=C_rule, batch_multiple=n_devices).global_batch_size


def evaluate(cand: shapes_lib.ShapeCandidate, seconds: float, C_rule: float, law: Any,
             model: Any, hardware: hardware_lib.Hardware, *,
             measured: Measurement | None = None) -> TimedCandidate:
  """Tokens reachable in ``seconds`` for ``cand``, and the loss they predict.

  With ``measured``, its step time replaces the model's and its start-up
  seconds are taken out of the budget first.

  Args:
    cand: the shape.
    seconds: the wall-clock budget.
    C_rule: the compute the batch and LR rules read (FLOPs).
    law: the scaling law (its loss, or its frontier for an allocation-only law).
    model: the step-time model.
    hardware: the devices.
    measured: a calibration measurement of this shape's step.
  Raises:
    PlanError: the model predicts a non-positive or non-finite step time.
  """
  seq_len = cand.shape.seq_len
  n = hardware.n_devices
  gbs = candidate_batch_size(cand, C_rule, n)
  fit = layout_lib.choose_layout(cand.shape, gbs, hardware, model=model)
  if measured is None:
    t = fit.step_time_s
    startup = step_time_lib.model_startup_s(model, cand.shape, gbs)
  else:
    t, startup = measured.step_time_s, measured.startup_s
  if not (math.isfinite(t) and t > 0):
    raise PlanError(f"step-time model predicted {t!r} s for {cand.shape}; it must be positive")
  steps = max(0, int(math.floor((seconds - startup) / t)))
  tps = gbs * seq_len
  tokens = steps * tps
  lr = batch_lib.peak_learning_rate(budget.flops_6nd(cand.N, max(tokens, 1)))
  batch = batch_lib.BatchPlan(global_batch_size=gbs, seq_len=seq_len, steps=steps, tokens=tokens,
                              peak_lr=lr, warmup_steps=batch_lib.warmup_steps(cand.N, tps, steps))
  if tokens > 0:
    loss = allocate_lib.law_loss(law, cand.N, tokens, aspect=cand.aspect_ratio)
    n_opt = law.optimal_allocation(budget.flops_6nd(cand.N, tokens))[0]
    gap = abs(math.log(cand.N / n_opt))
  else:
    loss, gap = (math.inf if allocate_lib.predicts_loss(law) else None), math.inf
  return TimedCandidate(cand, batch, t, loss, gap, fit.memory.total, measured, startup, fit)


def rank_key(tc: TimedCandidate, has_loss: bool) -> tuple:
  """Sort key, best first: shapes that finish a step before shapes that do not, then those
  that fit the devices in some layout, then the predicted loss (``has_loss``) or the
  distance from the law's frontier."""
  if tc.tokens <= 0:
    return (1, 1, math.inf)
  fits = tc.fit is None or tc.fit.fits
  return (0, 0 if fits else 1, tc.loss if has_loss else tc.frontier_gap)


def compare(flop_opt: TimedCandidate, best: TimedCandidate, has_loss: bool) -> dict:
  """The FLOP-optimal shape beside the chosen one, with the loss difference and a sentence."""
  fs, bs = flop_opt.candidate.shape, best.candidate.shape
  same = (fs.d_model, fs.n_layers) == (bs.d_model, bs.n_layers)
  out = {"flop_optimal": flop_opt.to_dict(), "best": best.to_dict(), "same_shape": same,
         "loss_gain": (flop_opt.loss - best.loss) if has_loss and not same else 0.0 if same
         else None,
         "tokens_ratio": best.tokens / flop_opt.tokens if flop_opt.tokens else None,
         "throughput_ratio": (best.batch.tokens_per_step / best.step_time_s)
         / (flop_opt.batch.tokens_per_step / flop_opt.step_time_s)}
  if same:
    which = "timed shape" if best.measured is not None else "shape"
    out["summary"] = (f"the FLOP-optimal shape is also the best in this time: no other {which} "
                      f"reaches a lower predicted loss")
    return out
  size_ratio = best.candidate.N / flop_opt.candidate.N
  if size_ratio > 1.25:
    kind = f"a larger ({size_ratio:.2g}× N)"
  elif size_ratio < 0.8:
    kind = f"a smaller ({size_ratio:.2g}× N)"
  elif best.candidate.aspect_ratio > flop_opt.candidate.aspect_ratio:
    kind = "a wider/shallower"
  elif best.candidate.aspect_ratio < flop_opt.candidate.aspect_ratio:
    kind = "a deeper/narrower"
  else:
    kind = "a differently sized"
  gain = (f"predicted loss {best.loss:.4f} vs {flop_opt.loss:.4f} nats/token "
          f"(−{flop_opt.loss - best.loss:.4f})" if has_loss else "closer to the law's frontier")
  out["summary"] = (
      f"{kind} shape beats the FLOP-optimal one: d_model {bs.d_model} × {bs.n_layers} layers "
      f"(N {best.candidate.N:.3g}, aspect {best.candidate.aspect_ratio:.0f}) sees "
      f"{best.tokens:.3g} tokens vs {flop_opt.tokens:.3g} for d_model {fs.d_model} × "
      f"{fs.n_layers} layers (N {flop_opt.candidate.N:.3g}, aspect "
      f"{flop_opt.candidate.aspect_ratio:.0f}); {gain}; throughput "
      f"{out['throughput_ratio']:.2f}× tokens/s")
  return out
