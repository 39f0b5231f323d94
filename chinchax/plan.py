"""``chinchax plan``: a FLOP, time or dollar budget → shape, tokens, batch, steps, loss, config.

Three budgets:

* ``--flops C`` — the law's compute-optimal N*, D* (closed form); the shape
  rule's nearest shape (``chinchax.budget.propose_shapes``); D = C / (6·N) for
  that shape's exact N, cut into whole steps.
* ``--hours H --hardware SPEC`` — wall-clock budgets after "Time Matters"
  (Inbar & Sernau 2024): with a step-time model for the hardware (a measured
  file given by ``--step-time-model``, else the analytic roofline of
  ``chinchax.hardware``) every candidate shape gets the tokens it can see in
  H hours, D(shape) = floor((H·3600 − t_start) / t_step) · tokens_per_step
  (t_start: start-up seconds when the step-time file records them), and the
  predicted loss L(N, D(shape)); the best shape wins. Candidates span sizes
  from ¼× to 4× the FLOP-optimal N and aspect ratios d_model/n_layers from 16
  (deep, narrow) to 256 (wide, shallow). The FLOP-optimal shape — the shape
  rule's pick for the law's N* at the compute the hardware delivers in H hours
  — is reported beside the best, with the loss difference.
* ``--dollars X --hardware SPEC`` — X dollars buy X / ($ per device-hour ×
  devices) hours (``chinchax/hardware_prices.json``), planned as above;
  reports tokens per dollar and the predicted loss at ¼×…4× the budget.

With a law that predicts no loss (Chinchilla Approaches 1 and 2), the time
planner picks the candidate closest to the law's frontier at the compute it
reaches: the smallest |ln(N / N_opt(6·N·D(shape)))|.

Batch, peak LR and warmup follow ``chinchax.budget.plan_batch``.
``--calibrate K`` (time budgets) times the K best candidates and the
FLOP-optimal shape with ``chinchax train``'s own step on this machine
(:func:`measure_step_time`) and chooses among the measured ones, their
start-up (set-up, compile, first step) paid out of the budget: ranking by a fitted
model alone favours whichever shape the model under-predicts most.

``--write-config PATH`` writes an ml_collections config file that
``chinchax train --config PATH`` runs unchanged, with budget.mode = "tokens"
and budget.tokens = the planned D (whole steps), so the run sees exactly D.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import os
import pathlib
import sys
from typing import Any

import numpy as np

from chinchax import errors
from chinchax import budget
from chinchax import hardware as hardware_lib

DEFAULT_LAW = "epoch"
DEFAULT_SEQ_LEN_ACCELERATOR = 2048
DEFAULT_SEQ_LEN_CPU = 128
# Candidate grid of the time planner: sizes N*·2^(j/2), j = -4..4, and these
# preferred aspect ratios d_model / n_layers.
SIZE_STEPS = tuple(2.0 ** (j / 2) for j in range(-4, 5))
ASPECT_RATIOS = (16.0, 32.0, 64.0, 128.0, 256.0)
DOLLAR_CURVE = (0.25, 0.5, 1.0, 2.0, 4.0)


class PlanError(errors.UserError):
  """A budget, law, hardware or option the planner cannot use; the message says why."""


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


def local_devices_for(hardware: hardware_lib.Hardware) -> list:
  """The first ``hardware.n_devices`` local JAX devices, if this machine is ``hardware``.

  Raises:
    PlanError: the local devices are another kind, or too few.
  """
  import jax
  from chinchax import bench as bench_lib

  devices = jax.devices()
  backend = jax.default_backend()
  local = bench_lib.match_accelerator(devices[0].device_kind, backend,
                                      hardware_lib.load_accelerators())
  if local is None or local.name != hardware.accelerator.name:
    raise PlanError(f"--calibrate times candidates on this machine, which has "
                    f"{len(devices)}× {devices[0].device_kind} ({backend}), not "
                    f"{hardware.spec}; plan without --calibrate or run where the hardware is")
  if len(devices) < hardware.n_devices:
    raise PlanError(f"--calibrate needs {hardware.n_devices} local devices for {hardware.spec}, "
                    f"this process has {len(devices)}"
                    + (f" (on CPU: XLA_FLAGS=--xla_force_host_platform_device_count="
                       f"{hardware.n_devices})" if backend == "cpu" else ""))
  return devices[:hardware.n_devices]


def step_config(shape: budget.ModelShape, global_batch_size: int, *, steps: int):
  """The training config whose step a planned ``shape`` runs (defaults elsewhere), ``steps`` long."""
  from chinchax import config as config_lib

  c = config_lib.base_config()
  c.model.update(vocab_size=shape.vocab_size, d_model=shape.d_model, n_layers=shape.n_layers,
                 n_heads=shape.n_heads, d_ff=shape.d_ff, tie_embeddings=shape.tie_embeddings)
  c.train.update(global_batch_size=int(global_batch_size), seq_len=shape.seq_len)
  c.budget.update(mode="steps", steps=steps)
  return c


def measure_step_time(shape: budget.ShapeCandidate | budget.ModelShape, global_batch_size: int,
                      hardware: hardware_lib.Hardware, *, warmup_steps: int = 3,
                      timed_steps: int = 20) -> tuple[float, float]:
  """Times ``chinchax train``'s step for a shape on this machine's devices.

  The step is :func:`chinchax.bench.measure_point`'s — the training config
  the planner would write (default compute dtype and attention), random
  tokens — on the first ``hardware.n_devices`` local devices.

  Returns:
    (mean step time over the timed steps, start-up = everything before the
    steady state: state set-up, tracing, compilation, first step), in seconds.
  Raises:
    PlanError: the local devices are not ``hardware`` (kind or count), or the
      step fails to compile or run (the message carries XLA's error).
  """
  from chinchax import bench as bench_lib

  shape = getattr(shape, "shape", shape)
  devices = local_devices_for(hardware)
  c = step_config(shape, global_batch_size, steps=warmup_steps + timed_steps + 1)
  row = bench_lib.measure_point(c, warmup_steps=warmup_steps, timed_steps=timed_steps,
                                devices=devices)
  if row.get("status") != "ok":
    raise PlanError(f"--calibrate: the train step of d_model {shape.d_model} × {shape.n_layers} "
                    f"layers, batch {global_batch_size} failed ({row.get('status')}): "
                    f"{row.get('error', '')[:500]}")
  # A budget pays the mean step, slow outliers included (the bench reports the median).
  return float(np.mean(row["step_times_s"])), float(row["startup_s"])


@dataclasses.dataclass(frozen=True)
class TimedCandidate:
  """A shape evaluated under a wall-clock budget.

  Attributes:
    candidate: the shape and its exact N.
    batch: batch, steps and tokens reachable in the time.
    step_time_s: predicted seconds per step.
    loss: L(N, tokens) in nats/token, None for an allocation-only law.
    frontier_gap: |ln(N / N_opt(6·N·tokens))|, distance from the law's frontier.
    memory_bytes: rough peak memory per device (FSDP-sharded state).
    measured: the calibration measurement behind ``step_time_s``, if any.
    startup_s: seconds before the steady state, paid out of the budget (from
      the measurement, else the step-time model's, else 0).
  """

  candidate: budget.ShapeCandidate
  batch: budget.BatchPlan
  step_time_s: float
  loss: float | None
  frontier_gap: float
  memory_bytes: float
  measured: "Measurement | None" = None
  startup_s: float = 0.0

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
    if self.measured is not None:
      out.update(model_step_time_s=self.measured.model_step_time_s)
    return out


@dataclasses.dataclass
class Plan:
  """A planned run.

  Attributes:
    mode: "flops", "hours" or "dollars".
    budget: the budget as given ({"flops": C} / {"hours": H} / {"dollars": X}).
    law: the law object used.
    allocation: N*, D* of the law at the FLOP budget (for time budgets: at the
      compute the FLOP-optimal shape reaches in the time).
    chosen: the chosen shape.
    batch: its batch, steps, tokens (D), peak LR and warmup.
    predicted_loss: L(N, D), None for an allocation-only law.
    hardware: the devices, when given.
    step_time_model: description of the step-time model, when used.
    step_time_s: predicted seconds per step.
    candidates: the other shapes considered (dicts, best first).
    comparison: time budgets: the FLOP-optimal shape beside the best one.
    dollar_curve: dollar budgets: predicted loss at ¼×…4× the dollars.
    warnings: things the user should know (extrapolations, memory).
    startup_s: start-up seconds (set-up, compile, first step) of the chosen
      shape, paid out of the time budget: measured with ``--calibrate``, else
      from a step-time file whose rows carry ``startup_s``, else 0.
    calibration: ``--calibrate``: per measured shape the model's and the
      measured step time and the model's relative error.
    calibration_factor: median measured / predicted step time, applied to
      the unmeasured candidates.
  """

  mode: str
  budget: dict
  law: Any
  allocation: budget.Allocation
  chosen: budget.ShapeCandidate
  batch: budget.BatchPlan
  predicted_loss: float | None
  hardware: hardware_lib.Hardware | None = None
  step_time_model: str | None = None
  step_time_s: float | None = None
  candidates: list = dataclasses.field(default_factory=list)
  comparison: dict | None = None
  dollar_curve: list | None = None
  warnings: list = dataclasses.field(default_factory=list)
  startup_s: float = 0.0
  calibration: list | None = None
  calibration_factor: float | None = None

  @property
  def N(self) -> int:
    """Total parameters of the chosen shape."""
    return self.chosen.N

  @property
  def D(self) -> int:
    """Training tokens: steps × global_batch_size × seq_len."""
    return self.batch.tokens

  @property
  def C(self) -> float:
    """6·N·D FLOPs of the planned run."""
    return budget.flops_6nd(self.N, self.D)

  @property
  def seconds(self) -> float | None:
    """Predicted wall-clock seconds (start-up + steps × step time), when a step-time model is known."""
    if self.step_time_s is None:
      return None
    return self.startup_s + self.batch.steps * self.step_time_s

  @property
  def dollars(self) -> float | None:
    """Predicted cost in dollars, when hardware with a price is known."""
    if self.seconds is None or self.hardware is None or self.hardware.price_per_hour is None:
      return None
    return self.seconds / 3600.0 * self.hardware.price_per_hour

  def to_dict(self) -> dict:
    """JSON-ready summary; N and D are the planned run's parameters and tokens."""
    s = self.chosen.shape
    a = self.allocation
    out = {
        "mode": self.mode, "budget": self.budget,
        "law": {"name": self.law.name, "source": getattr(self.law, "source", ""),
                "predicts_loss": budget.law_loss(self.law, 1e9, 1e10) is not None},
        "N": self.N, "D": self.D, "C": self.C, "tokens_per_param": self.D / self.N,
        "non_embedding": self.chosen.non_embedding, "predicted_loss": self.predicted_loss,
        "N_opt": a.N, "D_opt": a.D, "C_opt": a.C, "loss_opt": a.loss,
        "tokens_per_param_opt": a.tokens_per_param,
        "shape": self.chosen.to_dict(),
        "d_model": s.d_model, "n_layers": s.n_layers, "n_heads": s.n_heads, "d_ff": s.d_ff,
        "vocab_size": s.vocab_size, "seq_len": self.batch.seq_len,
        "global_batch_size": self.batch.global_batch_size,
        "tokens_per_step": self.batch.tokens_per_step, "steps": self.batch.steps,
        "peak_lr": self.batch.peak_lr, "warmup_steps": self.batch.warmup_steps,
        "flops": {"6ND": self.C,
                  "matmul_mfu": budget.matmul_flops_per_token(s) * self.D,
                  "chinchilla_appendix_f": budget.chinchilla_flops_per_token(s) * self.D},
        "hardware": self.hardware.to_dict() if self.hardware else None,
        "step_time_model": self.step_time_model, "step_time_s": self.step_time_s,
        "seconds": self.seconds, "hours": None if self.seconds is None else self.seconds / 3600,
        "dollars": self.dollars,
        "tokens_per_dollar": (self.D / self.dollars) if self.dollars else None,
        "candidates": self.candidates, "comparison": self.comparison,
        "dollar_curve": self.dollar_curve, "warnings": list(self.warnings),
        "startup_s": self.startup_s, "calibration": self.calibration,
        "calibration_factor": self.calibration_factor,
    }
    return out


# ----------------------------------------------------------------------------
# Planning.


@functools.lru_cache(maxsize=4096)
def _shapes(n_target: float, vocab_size: int, seq_len: int, accelerator: bool, k: int,
            aspect_ratio: float) -> tuple[budget.ShapeCandidate, ...]:
  return tuple(budget.propose_shapes(n_target, vocab_size=vocab_size, seq_len=seq_len,
                                     accelerator=accelerator, k=k, aspect_ratio=aspect_ratio))


def _check_budget(value, flag: str) -> float:
  if value is None or isinstance(value, bool) or not isinstance(value, (int, float)) or not (
      math.isfinite(value) and value > 0):
    raise PlanError(f"{flag} must be a positive finite number, got {value!r}")
  return float(value)


def _load_law(law) -> Any:
  try:
    return budget.resolve_law(law)
  except (ValueError, KeyError, TypeError, OSError) as e:
    raise PlanError(f"cannot use law {law!r}: {e}") from None


def plan_flops(C: float, law: Any = DEFAULT_LAW, *, vocab_size: int = 257,
               seq_len: int | None = None, accelerator: bool = True,
               hardware: hardware_lib.Hardware | None = None,
               step_time_model: Any = None, k: int = 5) -> Plan:
  """Plans a run for a FLOP budget.

  Args:
    C: FLOPs (> 0).
    law: law object, published-law name or fit-file path.
    vocab_size: tokenizer vocabulary.
    seq_len: tokens per sequence (default 2048 on accelerators, 128 on CPU).
    accelerator: shape multiples of 128 (True) or 16 (CPU); ignored when
      ``hardware`` is given (its kind decides).
    hardware: devices, for predicted time and cost and the batch multiple.
    step_time_model: overrides the hardware's roofline.
    k: candidates to list.
  Returns:
    The :class:`Plan`; its N is the chosen shape's exact N and D = C / (6·N)
    rounded to whole steps.
  Raises:
    PlanError: bad budget or law.
  """
  C = _check_budget(C, "--flops")
  law = _load_law(law)
  if hardware is not None:
    accelerator = hardware.is_accelerator
  seq_len = seq_len or (DEFAULT_SEQ_LEN_ACCELERATOR if accelerator else DEFAULT_SEQ_LEN_CPU)
  alloc = budget.allocate(C, law)
  cands = list(_shapes(alloc.N, vocab_size, seq_len, accelerator, k, budget.ASPECT_RATIO_TARGET))
  chosen = cands[0]
  multiple = hardware.n_devices if hardware else 1
  batch = budget.plan_batch(C / (6.0 * chosen.N), N=chosen.N, seq_len=seq_len, C=C,
                            batch_multiple=multiple)
  plan = Plan(mode="flops", budget={"flops": C}, law=law, allocation=alloc, chosen=chosen,
              batch=batch, predicted_loss=budget.law_loss(law, chosen.N, batch.tokens),
              hardware=hardware, candidates=[c.to_dict() for c in cands],
              warnings=list(alloc.warnings))
  if hardware is not None:
    model = step_time_model or hardware_lib.RooflineStepTime(hardware)
    plan.step_time_model = hardware_lib.describe_model(model)
    plan.step_time_s = float(model.predict(chosen.shape, batch.global_batch_size))
    _memory_warning(plan, hardware)
  return plan


def _candidate_batch_size(cand: budget.ShapeCandidate, C_rule: float, n_devices: int) -> int:
  """The global batch (sequences) of ``cand`` under the batch rule at compute ``C_rule``."""
  return budget.plan_batch(C_rule / (6.0 * cand.N), N=cand.N, seq_len=cand.shape.seq_len,
                           C=C_rule, batch_multiple=n_devices).global_batch_size


def _evaluate(cand: budget.ShapeCandidate, seconds: float, C_rule: float, law: Any,
              model: Any, hardware: hardware_lib.Hardware, *,
              measured: "Measurement | None" = None) -> TimedCandidate:
  """Tokens reachable in ``seconds`` for ``cand``, and the loss they predict.

  With ``measured``, its step time replaces the model's and its start-up
  seconds are taken out of the budget first.
  """
  seq_len = cand.shape.seq_len
  n = hardware.n_devices
  gbs = _candidate_batch_size(cand, C_rule, n)
  if measured is None:
    t = float(model.predict(cand.shape, gbs))
    startup = float(model.startup_s(cand.shape, gbs)) if hasattr(model, "startup_s") else 0.0
  else:
    t, startup = measured.step_time_s, measured.startup_s
  if not (math.isfinite(t) and t > 0):
    raise PlanError(f"step-time model predicted {t!r} s for {cand.shape}; it must be positive")
  steps = max(0, int(math.floor((seconds - startup) / t)))
  tps = gbs * seq_len
  tokens = steps * tps
  lr = budget.peak_learning_rate(budget.flops_6nd(cand.N, max(tokens, 1)))
  batch = budget.BatchPlan(global_batch_size=gbs, seq_len=seq_len, steps=steps, tokens=tokens,
                           peak_lr=lr, warmup_steps=min(int(math.ceil(cand.N / tps)), steps // 10))
  if tokens > 0:
    loss = budget.law_loss(law, cand.N, tokens)
    n_opt = law.optimal_allocation(budget.flops_6nd(cand.N, tokens))[0]
    gap = abs(math.log(cand.N / n_opt))
  else:
    loss, gap = (math.inf if budget.law_loss(law, 1e9, 1e10) is not None else None), math.inf
  profile = getattr(model, "profile", None) or hardware_lib.ExecutionProfile.for_kind(
      hardware.accelerator.kind)
  mem = hardware_lib.memory_per_device(cand.shape, gbs, n_devices=n, profile=profile)
  mem = mem - 16 * cand.N * (1 - 1 / n)  # parameters and AdamW state sharded (FSDP)
  return TimedCandidate(cand, batch, t, loss, gap, mem, measured, startup)


def _rank_key(tc: TimedCandidate, has_loss: bool):
  if tc.tokens <= 0:
    return (1, math.inf)
  return (0, tc.loss if has_loss else tc.frontier_gap)


def plan_time(seconds: float, hardware: hardware_lib.Hardware, law: Any = DEFAULT_LAW, *,
              vocab_size: int = 257, seq_len: int | None = None, step_time_model: Any = None,
              k: int = 5, mode: str = "hours", budget_dict: dict | None = None,
              calibrate: int = 0, measure: Any = None, progress: Any = None) -> Plan:
  """Plans a run for a wall-clock budget on ``hardware`` (Time Matters, Inbar & Sernau 2024).

  Args:
    seconds: wall-clock budget (> 0).
    hardware: the devices.
    law: law object, name or fit-file path.
    vocab_size, seq_len: as in :func:`plan_flops`.
    step_time_model: a model from ``chinchax.hardware`` (default: roofline).
    k: candidates to list.
    mode, budget_dict: how the budget was given (for reporting).
    calibrate: time the best ``calibrate`` candidates (and the FLOP-optimal
      shape) on this machine and choose among those measured ones: a model
      that under-predicts one shape's step time would otherwise pick exactly
      that shape. Measured start-up (set-up, compile, first step) comes out
      of the budget. 0 trusts the model.
    measure: ``(ModelShape, global_batch_size) -> (step_time_s, startup_s)``
      for calibration (default :func:`measure_step_time` on ``hardware``).
    progress: called with a line before each calibration measurement.
  Returns:
    The :class:`Plan` of the best candidate, with ``comparison`` holding the
    FLOP-optimal shape, the best shape and the loss difference.
  Raises:
    PlanError: bad budget or law, or no shape that finishes one step in time.
  """
  seconds = _check_budget(seconds, "--hours")
  law = _load_law(law)
  has_loss = budget.law_loss(law, 1e9, 1e10) is not None
  accelerator = hardware.is_accelerator
  seq_len = seq_len or (DEFAULT_SEQ_LEN_ACCELERATOR if accelerator else DEFAULT_SEQ_LEN_CPU)
  model = step_time_model or hardware_lib.RooflineStepTime(hardware)

  # The FLOP-optimal shape at the compute the hardware actually delivers: start
  # from peak × MFU, take the law's N*, measure the compute its shape reaches
  # in the time, repeat until C settles.
  C = seconds * hardware.peak_flops * hardware_lib.DEFAULT_MFU
  flop_opt = None
  for _ in range(8):
    n_opt = law.optimal_allocation(C)[0]
    cand = _shapes(n_opt, vocab_size, seq_len, accelerator, 1, budget.ASPECT_RATIO_TARGET)[0]
    flop_opt = _evaluate(cand, seconds, C, law, model, hardware)
    if flop_opt.tokens <= 0:
      C /= 4.0
      continue
    C_new = budget.flops_6nd(cand.N, flop_opt.tokens)
    if abs(math.log(C_new / C)) < 1e-3:
      break
    C = C_new
  if flop_opt is None or flop_opt.tokens <= 0:
    startup = float(model.startup_s(flop_opt.candidate.shape, flop_opt.batch.global_batch_size)
                    ) if flop_opt is not None and hasattr(model, "startup_s") else 0.0
    why = (f" (the step-time model's start-up alone is {startup:.3g} s)"
           if startup >= seconds else "")
    raise PlanError(f"{seconds / 3600:.3g} hours on {hardware.spec} is not enough for one "
                    f"training step of even the smallest shape{why}; raise the budget")

  pool: dict[tuple[int, int], TimedCandidate] = {
      (flop_opt.candidate.shape.d_model, flop_opt.candidate.shape.n_layers): flop_opt}
  n_ref = flop_opt.candidate.N
  for f in SIZE_STEPS:
    for r in ASPECT_RATIOS:
      for cand in _shapes(n_ref * f, vocab_size, seq_len, accelerator, 1, r):
        key = (cand.shape.d_model, cand.shape.n_layers)
        if key not in pool:
          pool[key] = _evaluate(cand, seconds, C, law, model, hardware)
  ranked = sorted(pool.values(), key=lambda tc: _rank_key(tc, has_loss))
  if calibrate:
    ranked, flop_opt, factor, notes = _calibrate(ranked, flop_opt, calibrate, measure, seconds,
                                                 C, law, model, hardware, has_loss, progress)
  best = ranked[0]
  if calibrate and flop_opt.tokens > 0:  # the compute the FLOP-optimal shape really reaches
    alloc = budget.allocate(budget.flops_6nd(flop_opt.candidate.N, flop_opt.tokens), law)
  else:
    alloc = budget.allocate(C, law)
  plan = Plan(mode=mode, budget=budget_dict or {"hours": seconds / 3600.0}, law=law,
              allocation=alloc, chosen=best.candidate, batch=best.batch,
              predicted_loss=best.loss if best.tokens > 0 else None, hardware=hardware,
              step_time_model=hardware_lib.describe_model(model), step_time_s=best.step_time_s,
              candidates=[tc.to_dict() for tc in ranked[:max(k, calibrate, 1)]],
              warnings=list(alloc.warnings))
  plan.startup_s = best.startup_s
  if best.measured is not None:
    plan.step_time_model = (f"measured on this machine (--calibrate {calibrate}); unmeasured "
                            f"shapes: {factor:.3g} × {plan.step_time_model}")
    plan.calibration_factor = factor
    plan.warnings.extend(notes)
    plan.calibration = [
        {"d_model": tc.candidate.shape.d_model, "n_layers": tc.candidate.shape.n_layers,
         "global_batch_size": tc.batch.global_batch_size,
         "model_step_time_s": tc.measured.model_step_time_s,
         "measured_step_time_s": tc.measured.step_time_s,
         "model_error": tc.measured.model_error, "startup_s": tc.measured.startup_s}
        for tc in ranked if tc.measured is not None]  # the FLOP-optimal one is among them
  plan.comparison = _compare(flop_opt, best, has_loss)
  _memory_warning(plan, hardware, best.memory_bytes)
  return plan


@dataclasses.dataclass(frozen=True)
class _ScaledStepTime:
  """A step-time model's predictions × ``factor`` (its bias measured by calibration)."""

  model: Any
  factor: float
  profile: Any = None

  def predict(self, shape: budget.ModelShape, global_batch_size: int) -> float:
    return self.factor * float(self.model.predict(shape, global_batch_size))

  def startup_s(self, shape: budget.ModelShape, global_batch_size: int) -> float:
    f = getattr(self.model, "startup_s", None)
    return float(f(shape, global_batch_size)) if f is not None else 0.0


def _calibrate(ranked: list[TimedCandidate], flop_opt: TimedCandidate, k: int, measure: Any,
               seconds: float, C: float, law: Any, model: Any,
               hardware: hardware_lib.Hardware, has_loss: bool, progress: Any = None):
  """Measures candidates until the best one is a measured one.

  First the model's top ``k`` and the FLOP-optimal shape are measured; the
  unmeasured candidates' predictions are then multiplied by the median
  measured/predicted ratio (the model's bias on this machine), everything is
  re-ranked, and while the best is unmeasured it is measured too (at most
  ``k`` more). Only a measured candidate can be chosen.

  Returns:
    (all candidates, measured and corrected, best first; the FLOP-optimal
    candidate with its measurement; the correction factor; warnings)
  Raises:
    PlanError: no measured candidate finishes a step once its start-up is paid.
  """
  if measure is None:
    measure = functools.partial(measure_step_time, hardware=hardware)

  def key(tc):
    return (tc.candidate.shape.d_model, tc.candidate.shape.n_layers)

  by_key = {key(tc): tc for tc in ranked}
  by_key.setdefault(key(flop_opt), flop_opt)
  measured: dict[tuple[int, int], TimedCandidate] = {}

  def measure_one(tc):
    s = tc.candidate.shape
    if progress is not None:
      progress(f"timing d_model {s.d_model} × {s.n_layers} layers, batch "
               f"{tc.batch.global_batch_size} (shape {len(measured) + 1})")
    t, startup = measure(s, tc.batch.global_batch_size)
    m = Measurement(float(t), float(startup), tc.step_time_s)
    measured[key(tc)] = _evaluate(tc.candidate, seconds, C, law, model, hardware, measured=m)

  for tc in [tc for tc in ranked if tc.tokens > 0][:k] + [flop_opt]:
    if key(tc) not in measured:
      measure_one(tc)
  extra = 0
  while True:
    factor = float(np.median([tc.measured.step_time_s / tc.measured.model_step_time_s
                              for tc in measured.values()]))
    scaled = _ScaledStepTime(model, factor, getattr(model, "profile", None))
    current = [measured.get(kk) or _evaluate(tc.candidate, seconds, C, law, scaled, hardware)
               for kk, tc in by_key.items()]
    current.sort(key=lambda tc: _rank_key(tc, has_loss))
    best = current[0]
    if key(best) in measured or extra >= k or best.tokens <= 0:
      break
    measure_one(by_key[key(best)])
    extra += 1
  chosen = min(measured.values(), key=lambda tc: _rank_key(tc, has_loss))
  if chosen.tokens <= 0:
    m = chosen.measured
    raise PlanError(
        f"{seconds:.4g} s is not enough for one training step once start-up is paid: the "
        f"measured shapes need {min(tc.measured.startup_s for tc in measured.values()):.3g} s "
        f"or more to start (set-up, compile, first step) and {m.step_time_s:.3g} s per step; "
        f"raise the budget or plan without --calibrate")
  notes = []
  better = [tc for tc in current if key(tc) not in measured and tc.tokens > 0
            and _rank_key(tc, has_loss) < _rank_key(chosen, has_loss)]
  if better:
    s = better[0].candidate.shape
    notes.append(f"calibration stopped after {len(measured)} timed shapes; the unmeasured "
                 f"d_model {s.d_model} × {s.n_layers} layers is predicted better than the chosen "
                 f"one (from the corrected model); rerun with a larger --calibrate to time it")
  return ([chosen] + [tc for tc in current if key(tc) != key(chosen)], measured[key(flop_opt)],
          factor, notes)


def _compare(flop_opt: TimedCandidate, best: TimedCandidate, has_loss: bool) -> dict:
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


def _memory_warning(plan: Plan, hardware: hardware_lib.Hardware,
                    mem: float | None = None) -> None:
  if mem is None:
    prof = hardware_lib.ExecutionProfile.for_kind(hardware.accelerator.kind)
    n = hardware.n_devices
    mem = hardware_lib.memory_per_device(plan.chosen.shape, plan.batch.global_batch_size,
                                         n_devices=n, profile=prof) - 16 * plan.N * (1 - 1 / n)
  cap = hardware.accelerator.memory_bytes
  if mem > cap:
    plan.warnings.append(
        f"estimated memory {mem / 1e9:.3g} GB per device exceeds the {cap / 1e9:.3g} GB of a "
        f"{hardware.accelerator.display_name} even with parameters and optimizer state sharded "
        f"(mesh.fsdp); use model.remat, more devices or a smaller global_batch_size")


def plan_dollars(dollars: float, hardware: hardware_lib.Hardware, law: Any = DEFAULT_LAW, *,
                 vocab_size: int = 257, seq_len: int | None = None, step_time_model: Any = None,
                 k: int = 5, curve: tuple[float, ...] = DOLLAR_CURVE, calibrate: int = 0,
                 measure: Any = None, progress: Any = None) -> Plan:
  """Plans a run for a dollar budget: dollars → hours at the table's price → :func:`plan_time`.

  Adds ``dollar_curve``: the best predicted loss (and tokens, N) at each
  multiple in ``curve`` of the budget, i.e. what each extra dollar buys
  (from the step-time model alone; ``calibrate`` measures the main plan only).

  Raises:
    PlanError: bad budget or law, or hardware without a price.
  """
  dollars = _check_budget(dollars, "--dollars")
  price = hardware.price_per_hour
  if price is None:
    raise PlanError(f"the accelerator table has no price for {hardware.accelerator.display_name};"
                    f" add price_per_device_hour to the table or plan with --hours")
  kw = dict(vocab_size=vocab_size, seq_len=seq_len, step_time_model=step_time_model)
  plan = plan_time(dollars / price * 3600.0, hardware, law, k=k, mode="dollars",
                   budget_dict={"dollars": dollars, "hours": dollars / price},
                   calibrate=calibrate, measure=measure, progress=progress, **kw)
  points = []
  for m in curve:
    if m == 1.0:
      p = plan
    else:
      try:
        p = plan_time(m * dollars / price * 3600.0, hardware, plan.law, k=1, mode="dollars", **kw)
      except PlanError:
        continue
    points.append({"dollars": m * dollars, "N": p.N, "D": p.D, "predicted_loss": p.predicted_loss,
                   "tokens_per_dollar": p.D / (m * dollars)})
  plan.dollar_curve = points
  return plan


# ----------------------------------------------------------------------------
# Output.


def _fmt_int(x: float) -> str:
  return f"{x:,.0f}" if abs(x) < 1e7 else f"{x:.4g}"


def format_plan(plan: Plan) -> str:
  """A readable multi-line report of ``plan``."""
  s, b, a = plan.chosen.shape, plan.batch, plan.allocation
  lines = []
  if plan.mode == "flops":
    head = f"FLOP budget {plan.budget['flops']:.4g} FLOPs"
  elif plan.mode == "hours":
    head = f"time budget {plan.budget['hours']:.4g} hours on {plan.hardware.spec}"
  else:
    head = (f"dollar budget ${plan.budget['dollars']:,.2f} on {plan.hardware.spec} "
            f"= {plan.budget['hours']:.4g} hours")
  lines.append(f"chinchax plan — {head}")
  lines.append(f"  law            {plan.law.name}  ({getattr(plan.law, 'source', '')})")
  loss = f", frontier loss {a.loss:.4f} nats/token" if a.loss is not None else ""
  lines.append(f"  optimum        C {a.C:.4g} FLOPs → N* {a.N:.4g} params, D* {a.D:.4g} tokens "
               f"({a.tokens_per_param:.1f} tokens/param){loss}")
  lines.append(f"  shape          d_model {s.d_model}, n_layers {s.n_layers}, n_heads {s.n_heads} "
               f"(head_dim {s.kv_size}), d_ff {s.d_ff}, vocab_size {s.vocab_size}, "
               f"seq_len {b.seq_len}")
  lines.append(f"                 N {_fmt_int(plan.N)} params (non-embedding "
               f"{_fmt_int(plan.chosen.non_embedding)}), aspect d_model/n_layers "
               f"{plan.chosen.aspect_ratio:.0f}")
  lines.append(f"  training       global_batch_size {b.global_batch_size} × seq_len {b.seq_len} = "
               f"{_fmt_int(b.tokens_per_step)} tokens/step, {_fmt_int(b.steps)} steps, "
               f"D {_fmt_int(plan.D)} tokens ({plan.D / plan.N:.1f} tokens/param)")
  lines.append(f"                 peak_lr {b.peak_lr:.3g}, warmup {_fmt_int(b.warmup_steps)} steps,"
               f" cosine decay to 10% over the run")
  mfu = budget.matmul_flops_per_token(s) * plan.D
  appf = budget.chinchilla_flops_per_token(s) * plan.D
  lines.append(f"  FLOPs          6ND {plan.C:.4g} | matmul (MFU) {mfu:.4g} | "
               f"Chinchilla App. F {appf:.4g}")
  if plan.predicted_loss is not None:
    lines.append(f"  predicted loss {plan.predicted_loss:.4f} nats/token")
  if plan.step_time_s is not None:
    lines.append(f"  step time      {plan.step_time_s:.4g} s ({plan.step_time_model})")
    cost = f", ${plan.dollars:,.2f}" if plan.dollars is not None else ""
    start = (f" = start-up {plan.startup_s:.3g} s + {_fmt_int(plan.batch.steps)} steps"
             if plan.startup_s else "")
    lines.append(f"  wall time      {plan.seconds / 3600:.4g} hours{start}{cost}")
    if plan.dollars:
      lines.append(f"  tokens/dollar  {plan.D / plan.dollars:.4g}")
  if plan.calibration:
    lines.append(f"  calibration    measured on this machine (model → measured s/step, model error);"
                 f" unmeasured shapes × {plan.calibration_factor:.3g}")
    for r in plan.calibration:
      lines.append(f"    d_model {r['d_model']:>5} × {r['n_layers']:>3} layers, batch "
                   f"{r['global_batch_size']:>5}: {r['model_step_time_s']:.4g} → "
                   f"{r['measured_step_time_s']:.4g} s ({r['model_error']:+.1%}), start-up "
                   f"{r['startup_s']:.3g} s")
  if plan.comparison:
    lines.append(f"  vs FLOP-opt    {plan.comparison['summary']}")
  if plan.dollar_curve:
    lines.append("  loss per dollar")
    for p in plan.dollar_curve:
      loss = "-" if p["predicted_loss"] is None else f"{p['predicted_loss']:.4f}"
      lines.append(f"    ${p['dollars']:>12,.2f}  N {p['N']:.3g}  D {p['D']:.3g}  loss {loss}  "
                   f"tokens/$ {p['tokens_per_dollar']:.3g}")
  lines.append("  candidates")
  timed = plan.mode != "flops"
  hdr = "    d_model n_layers n_heads   d_ff            N   ΔN/N* aspect"
  lines.append(hdr + ("        D  step_s     loss" if timed else ""))
  for c in plan.candidates:
    row = (f"    {c['d_model']:>7} {c['n_layers']:>8} {c['n_heads']:>7} {c['d_ff']:>6} "
           f"{c['N']:>12,} {c['N'] / plan.allocation.N - 1:>+7.3f} {c['aspect_ratio']:>6.0f}")
    if timed:
      loss = "-" if c["predicted_loss"] is None else f"{c['predicted_loss']:.4f}"
      mark = "*" if c.get("step_time_source") == "measured" else " "
      row += f" {c['D']:>8.3g} {c['step_time_s']:>7.3g}{mark} {loss:>7}"
    lines.append(row)
  for w in plan.warnings:
    lines.append(f"  warning        {w}")
  return "\n".join(lines)


def config_source(plan: Plan, workdir: str) -> str:
  """Python source of an ml_collections config file that trains ``plan`` exactly.

  The file's ``get_config(variant=None)`` starts from
  ``chinchax.config.base_config()`` and sets the model shape, batch, seq_len,
  peak LR, warmup, eval/checkpoint intervals, the budget (mode "tokens",
  tokens = D) and the workdir.
  """
  s, b = plan.chosen.shape, plan.batch
  every = max(1, min(1000, b.steps // 10))
  if plan.hardware is not None and plan.hardware.accelerator.kind == "cpu":
    cpu_devices, cpu_note = plan.hardware.n_devices, f"the {plan.hardware.spec!r} the plan timed"
  else:
    cpu_devices = next(n for n in (8, 4, 2, 1) if b.global_batch_size % n == 0)
    cpu_note = "as many virtual devices as divide the batch"
  budget_desc = ", ".join(f"{k}={v:.6g}" for k, v in plan.budget.items())
  loss = "n/a" if plan.predicted_loss is None else f"{plan.predicted_loss:.4f} nats/token"
  return f'''"""Planned run: {plan.mode} budget ({budget_desc}), law {plan.law.name}.

N = {plan.N:,} parameters, D = {plan.D:,} tokens ({plan.D / plan.N:.1f} tokens/param),
C = 6ND = {plan.C:.4g} FLOPs, predicted loss {loss}.
Run: chinchax train --config THIS_FILE
"""

from chinchax import config as config_lib


def get_config(variant=None):
  """The planned run's config (``variant`` is accepted and ignored)."""
  del variant
  c = config_lib.base_config()
  c.workdir = {workdir!r}
  c.model.update(vocab_size={s.vocab_size}, d_model={s.d_model}, n_layers={s.n_layers},
                 n_heads={s.n_heads}, d_ff={s.d_ff}, tie_embeddings={s.tie_embeddings})
  c.train.update(global_batch_size={b.global_batch_size}, seq_len={b.seq_len},
                 peak_lr={b.peak_lr!r}, warmup_steps={b.warmup_steps},
                 eval_every={every}, checkpoint_every={every},
                 log_every={max(1, min(50, b.steps // 20))})
  c.budget.update(mode="tokens", tokens={plan.D}, n_kind="total")
  # On CPU: {cpu_note} (ignored on accelerators).
  c.mesh.num_cpu_devices = {cpu_devices}
  return c
'''


def build_config(plan: Plan, workdir: str):
  """The ConfigDict that :func:`config_source` writes (for validation before writing)."""
  namespace: dict = {}
  exec(compile(config_source(plan, workdir), "<planned config>", "exec"), namespace)
  return namespace["get_config"]()


def write_config(plan: Plan, path: str | os.PathLike, workdir: str | None = None,
                 n_devices: int | None = None) -> pathlib.Path:
  """Validates and writes the planned config file; nothing is written on error.

  Raises:
    PlanError: the directory does not exist, or the config fails validation.
  """
  from chinchax import config as config_lib

  path = pathlib.Path(path)
  if not path.parent.exists() or not path.parent.is_dir():
    raise PlanError(f"cannot write config {str(path)!r}: directory {str(path.parent)!r} does not "
                    f"exist")
  if path.suffix != ".py":
    raise PlanError(f"config path {str(path)!r} must end in .py (an ml_collections config file)")
  workdir = workdir or default_workdir(plan)
  try:
    config_lib.validate(build_config(plan, workdir), n_devices=n_devices or 1)
  except config_lib.ConfigError as e:
    raise PlanError(f"the planned config is invalid: {e}") from None
  tmp = path.with_name(path.name + ".tmp")
  tmp.write_text(config_source(plan, workdir))
  tmp.replace(path)
  return path


def default_workdir(plan: Plan) -> str:
  """runs/plan-N<N>-D<D>, e.g. runs/plan-N1.2e+06-D2.4e+07."""
  return f"runs/plan-N{plan.N:.2g}-D{plan.D:.2g}"


# ----------------------------------------------------------------------------
# CLI.


class _Parser(argparse.ArgumentParser):
  """argparse that raises :class:`PlanError` (one line, exit code 2) instead of printing usage."""

  def error(self, message):
    raise PlanError(f"{message} (see chinchax plan --help)")


_NUMERIC_FLAGS = ("--flops", "--hours", "--dollars", "--vocab-size", "--seq-len", "--mfu",
                  "--bandwidth-efficiency", "--candidates", "--calibrate")


def _join_negative_numbers(argv: list[str]) -> list[str]:
  """["--flops", "-1e20"] → ["--flops=-1e20"], so a negative budget reaches our own check."""
  out, i = [], 0
  while i < len(argv):
    a = argv[i]
    if a in _NUMERIC_FLAGS and i + 1 < len(argv) and argv[i + 1].startswith("-"):
      try:
        float(argv[i + 1])
      except ValueError:
        pass
      else:
        out.append(f"{a}={argv[i + 1]}")
        i += 2
        continue
    out.append(a)
    i += 1
  return out


def _parser() -> argparse.ArgumentParser:
  p = _Parser(
      prog="chinchax plan",
      description="Turn a FLOP, wall-clock or dollar budget into a compute-optimal model shape, "
                  "token count, batch, steps, predicted loss and (optionally) a config file.")
  g = p.add_mutually_exclusive_group(required=True)
  g.add_argument("--flops", type=float, help="FLOP budget C (C = 6ND)")
  g.add_argument("--hours", type=float, help="wall-clock budget in hours (needs --hardware)")
  g.add_argument("--dollars", type=float, help="dollar budget (needs --hardware with a price)")
  p.add_argument("--hardware", help="devices, e.g. v5p-128, v5e-16, h100x8, 8xa100-80gb, cpu")
  p.add_argument("--law", default=DEFAULT_LAW,
                 help="published law (chinchilla-approach1, chinchilla-approach2, "
                      "chinchilla-approach3, chinchilla-approach3-unrounded, epoch) or a fit JSON "
                      f"path (default: {DEFAULT_LAW})")
  p.add_argument("--vocab-size", type=int, default=257,
                 help="vocabulary size (default 257: chinchax's byte tokenizer)")
  p.add_argument("--seq-len", type=int, default=None,
                 help=f"tokens per sequence (default {DEFAULT_SEQ_LEN_ACCELERATOR} on "
                      f"accelerators, {DEFAULT_SEQ_LEN_CPU} on CPU)")
  p.add_argument("--step-time-model", metavar="PATH",
                 help="measured step-time JSON (format: chinchax.hardware module docstring); "
                      "default: analytic roofline")
  p.add_argument("--mfu", type=float, default=hardware_lib.DEFAULT_MFU,
                 help="roofline compute efficiency (default %(default)s)")
  p.add_argument("--bandwidth-efficiency", type=float,
                 default=hardware_lib.DEFAULT_BANDWIDTH_EFFICIENCY,
                 help="roofline fraction of peak HBM bandwidth (default %(default)s)")
  p.add_argument("--hardware-table", metavar="PATH",
                 help="accelerator/price table JSON (default chinchax/hardware_prices.json)")
  p.add_argument("--candidates", type=int, default=5, help="candidate shapes to list")
  p.add_argument("--calibrate", type=int, default=0, metavar="K",
                 help="--hours/--dollars: time the K best candidates and the FLOP-optimal shape "
                      "on this machine's devices and choose among them (default 0: trust the "
                      "step-time model)")
  p.add_argument("--write-config", metavar="PATH", help="write an ml_collections config file")
  p.add_argument("--workdir", help="workdir of the written config (default runs/plan-N…-D…)")
  p.add_argument("--json", action="store_true", help="print JSON instead of the table")
  return p


def _fraction(value: float, flag: str) -> float:
  if not (math.isfinite(value) and 0 < value <= 1):
    raise PlanError(f"{flag} must lie in (0, 1], got {value!r}")
  return value


def run(args: argparse.Namespace) -> Plan:
  """Plans from parsed CLI arguments (raises PlanError, HardwareError, StepTimeError)."""
  if args.vocab_size is None or args.vocab_size < 2:
    raise PlanError(f"--vocab-size must be an integer >= 2, got {args.vocab_size!r}")
  if args.seq_len is not None and args.seq_len < 2:
    raise PlanError(f"--seq-len must be an integer >= 2, got {args.seq_len!r}")
  if args.candidates < 1:
    raise PlanError(f"--candidates must be >= 1, got {args.candidates!r}")
  if args.calibrate < 0:
    raise PlanError(f"--calibrate must be >= 0 (candidates to time), got {args.calibrate!r}")
  if args.calibrate and args.flops is not None:
    raise PlanError("--calibrate times candidates for --hours or --dollars; a --flops plan "
                    "does not depend on step time")
  mfu = _fraction(args.mfu, "--mfu")
  bw = _fraction(args.bandwidth_efficiency, "--bandwidth-efficiency")
  for flag in ("flops", "hours", "dollars"):
    value = getattr(args, flag)
    if value is not None:
      _check_budget(value, f"--{flag}")
  if (args.hours is not None or args.dollars is not None) and not args.hardware:
    raise PlanError("--hours and --dollars need --hardware (e.g. --hardware v5p-128 or h100x8)")
  law = _load_law(args.law)
  hw = None
  if args.hardware:
    table = hardware_lib.load_accelerators(args.hardware_table)
    hw = hardware_lib.parse_hardware(args.hardware, table)
  model = None
  if args.step_time_model:
    if hw is None:
      raise PlanError("--step-time-model needs --hardware (the devices it was measured on)")
    model = hardware_lib.load_step_time_model(args.step_time_model)
    if model.fallback.n_devices != hw.n_devices:
      raise PlanError(f"step-time model {args.step_time_model!r} was measured on "
                      f"{model.fallback.n_devices} devices but --hardware {args.hardware!r} has "
                      f"{hw.n_devices}")
  elif hw is not None:
    model = hardware_lib.RooflineStepTime(hw, mfu=mfu, bandwidth_efficiency=bw)
  kw = dict(vocab_size=args.vocab_size, seq_len=args.seq_len, k=args.candidates,
            step_time_model=model)
  if args.flops is not None:
    plan = plan_flops(args.flops, law, hardware=hw, **kw)
  else:
    if args.calibrate:
      kw.update(calibrate=args.calibrate, progress=lambda line: print(
          f"chinchax plan: {line}", file=sys.stderr, flush=True))
      if hw.accelerator.kind == "cpu":
        _expose_cpu_devices(hw.n_devices)
      local_devices_for(hw)  # the wrong machine is refused before any planning
    if args.hours is not None:
      plan = plan_time(args.hours * 3600.0, hw, law, budget_dict={"hours": args.hours}, **kw)
    else:
      plan = plan_dollars(args.dollars, hw, law, **kw)
  return plan


def _expose_cpu_devices(n: int) -> None:
  """Makes ``n`` virtual CPU devices visible for --calibrate on ``cpuxN``, if JAX has not started.

  Once JAX's backend runs (e.g. in-process callers), its device count is kept
  and :func:`measure_step_time` says what is missing.
  """
  import jax
  if n > 1:
    try:
      jax.config.update("jax_num_cpu_devices", n)
    except RuntimeError:
      pass


def main(argv: list[str] | None = None) -> int:
  """``chinchax plan`` entry point; returns the exit code (2 for bad input, nothing written)."""
  parser = _parser()
  argv = list(sys.argv[1:] if argv is None else argv)
  try:
    args = parser.parse_args(_join_negative_numbers([str(a) for a in argv]))
  except SystemExit as e:  # --help
    return e.code if isinstance(e.code, int) else 0
  except PlanError as e:
    print(f"chinchax plan: error: {e}", file=sys.stderr)
    return 2
  try:
    plan = run(args)
    if args.write_config:
      write_config(plan, args.write_config, args.workdir,
                   n_devices=plan.hardware.n_devices if plan.hardware else 1)
  except (PlanError, hardware_lib.HardwareError, hardware_lib.StepTimeError) as e:
    print(f"chinchax plan: error: {e}", file=sys.stderr)
    return 2
  if args.json:
    for w in plan.warnings:
      print(f"chinchax plan: warning: {w}", file=sys.stderr)
    print(json.dumps(_finite(plan.to_dict()), indent=2, allow_nan=False))
  else:
    print(format_plan(plan))
    if args.write_config:
      print(f"  config         wrote {args.write_config}")
  return 0


def _finite(x):
  """``x`` with non-finite floats replaced by None (strict JSON has no Infinity/NaN)."""
  if isinstance(x, dict):
    return {k: _finite(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_finite(v) for v in x]
  if isinstance(x, float) and not math.isfinite(x):
    return None
  return x


if __name__ == "__main__":
  sys.exit(main())
