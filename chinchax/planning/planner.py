"""The planner: a FLOP, time or dollar budget → shape, tokens, batch, steps, loss.

Three budgets:

* ``--flops C`` — the law's compute-optimal N*, D* (closed form); the shape
  rule's nearest shape (``chinchax.planning.shapes.propose_shapes``); D = C / (6·N) for
  that shape's exact N, cut into whole steps.
* ``--hours H --hardware SPEC`` — wall-clock budgets after "Time Matters"
  (Inbar & Sernau 2024): with a step-time model for the hardware (a measured
  file given by ``--step-time-model``, else the analytic roofline of
  ``chinchax.cost.step_time``) every candidate shape gets the tokens it can see in
  H hours, D(shape) = floor((H·3600 − t_start) / t_step) · tokens_per_step
  (t_start: start-up seconds when the step-time file records them), and the
  predicted loss L(N, D(shape)); the best shape wins. Candidates span sizes
  from ¼× to 4× the FLOP-optimal N and aspect ratios d_model/n_layers from 16
  (deep, narrow) to 256 (wide, shallow). The FLOP-optimal shape — the shape
  rule's pick for the law's N* at the compute the hardware delivers in H hours
  — is reported beside the best, with the loss difference.
* ``--dollars X --hardware SPEC`` — X dollars buy X / ($ per device-hour ×
  devices) hours (``chinchax/cost/hardware_prices.json``), planned as above;
  reports tokens per dollar and the predicted loss at ¼×…4× the budget.

With a law that predicts no loss (Chinchilla Approaches 1 and 2), the time
planner picks the candidate closest to the law's frontier at the compute it
reaches: the smallest |ln(N / N_opt(6·N·D(shape)))| (``chinchax.planning.timed``).

Batch, peak LR and warmup follow ``chinchax.planning.batch.plan_batch``.
``--calibrate K`` (time budgets) times the K best candidates and the
FLOP-optimal shape with ``chinchax train``'s own step on this machine
(``chinchax.planning.calibrate``) and chooses among the measured ones, their
start-up (set-up, compile, first step) paid out of the budget: ranking by a
fitted model alone favours whichever shape the model under-predicts most.

The written config file is ``chinchax.planning.config_file``'s, the report
``chinchax.planning.render``'s and the command line ``chinchax.cli.plan``'s.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

from chinchax.cost import budget
from chinchax.cost import hardware as hardware_lib
from chinchax.planning import allocate as allocate_lib
from chinchax.planning import batch as batch_lib
from chinchax.planning import layout as layout_lib
from chinchax.planning import calibrate as calibrate_lib
from chinchax.planning import reach
from chinchax.planning import shapes as shapes_lib
from chinchax.cost import step_time as step_time_lib
from chinchax.planning import timed
from chinchax.planning.errors import PlanError

DEFAULT_LAW = "epoch"
DEFAULT_SEQ_LEN_ACCELERATOR = 2048
DEFAULT_SEQ_LEN_CPU = 128
# Candidate grid of the time planner: sizes N*·2^(j/2), j = -4..4, and these
# preferred aspect ratios d_model / n_layers.
SIZE_STEPS = tuple(2.0 ** (j / 2) for j in range(-4, 5))
ASPECT_RATIOS = (16.0, 32.0, 64.0, 128.0, 256.0)
DOLLAR_CURVE = (0.25, 0.5, 1.0, 2.0, 4.0)


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
    aot: ``--aot``: the planned run compiled for its hardware
      (``chinchax.aot.plancheck``): fits, layouts, the compile report.
    layout: ``--aot`` moved the run to this layout ({"remat", "scan_layers",
      "mesh"}), which ``--write-config`` writes; None keeps the defaults.
    fit: with hardware, how the run fits its devices (``chinchax.planning.layout``):
      microbatches M of the global batch, remat, loss chunks, mesh and the memory per
      device, which ``--write-config`` writes; None without hardware.
    recipe: a law with a recipe (``chinchax.planning.recipe``): {"law": the fit's recipe,
      "settings": {section: {knob: value}} it puts in the written config, "departures":
      lines saying where the plan leaves it}; None for a law without one.
    loss_units: what the loss figures are in and whether the law's loss transfers to the
      plan's tokenizer (``chinchax.planning.loss_units``); None until judged.
    tokenizer: the data settings the written config gets for a vocabulary the plan chose
      itself ({"tokenizer": "bpe", "bpe_vocab_size": V} on an accelerator), else None.
    data_limit: ``--unique-tokens``: the data-constrained optimum beside the unconstrained
      one (``chinchax.planning.constrained.data_limited``); None without a limit.
  """

  mode: str
  budget: dict
  law: Any
  allocation: allocate_lib.Allocation
  chosen: shapes_lib.ShapeCandidate
  batch: batch_lib.BatchPlan
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
  aot: dict | None = None
  layout: dict | None = None
  fit: Any = None
  recipe: dict | None = None
  loss_units: dict | None = None
  data_limit: dict | None = None
  tokenizer: dict | None = None

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
                "predicts_loss": allocate_lib.predicts_loss(self.law)},
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
        "aot": None if self.aot is None else {k: v for k, v in self.aot.items() if k != "report"},
        "layout": self.layout, "fit": None if self.fit is None else self.fit.to_dict(),
        "tokens_per_dollar": (self.D / self.dollars) if self.dollars else None,
        "candidates": self.candidates, "comparison": self.comparison,
        "dollar_curve": self.dollar_curve, "warnings": list(self.warnings),
        "startup_s": self.startup_s, "calibration": self.calibration,
        "calibration_factor": self.calibration_factor,
        "recipe": self.recipe, "loss_units": self.loss_units, "data_limit": self.data_limit, "tokenizer": self.tokenizer,
    }
    return out


# ----------------------------------------------------------------------------
# Planning.


def default_seq_len(accelerator: bool) -> int:
  """Tokens per sequence when none is given: 2048 on accelerators, 128 on CPU."""
  return DEFAULT_SEQ_LEN_ACCELERATOR if accelerator else DEFAULT_SEQ_LEN_CPU


@functools.lru_cache(maxsize=4096)
def _shapes(n_target: float, vocab_size: int, seq_len: int, accelerator: bool, k: int,
            aspect_ratio: float, kv_heads_ratio: int = 1) -> tuple[shapes_lib.ShapeCandidate, ...]:
  rule = dataclasses.replace(shapes_lib.rule_for(accelerator), kv_heads_ratio=kv_heads_ratio)
  return tuple(shapes_lib.propose_shapes(n_target, vocab_size=vocab_size, seq_len=seq_len,
                                         rule=rule, k=k, aspect_ratio=aspect_ratio))


def check_budget(value, flag: str) -> float:
  """``value`` as a float; PlanError naming ``flag`` unless it is a positive finite number."""
  if value is None or isinstance(value, bool) or not isinstance(value, (int, float)) or not (
      math.isfinite(value) and value > 0):
    raise PlanError(f"{flag} must be a positive finite number, got {value!r}")
  return float(value)


def load_law(law) -> Any:
  """The law object of a law, name or fit-file path (PlanError when it cannot be used)."""
  try:
    return allocate_lib.resolve_law(law)
  except (ValueError, KeyError, TypeError, OSError) as e:
    why = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
    # resolve_law's own message names the law already ("unknown law 'x': ... valid names: ...")
    raise PlanError(why if repr(str(law)) in why else f"cannot use law {law!r}: {why}") from None


def plan_flops(C: float, law: Any = DEFAULT_LAW, *, vocab_size: int = 257,
               seq_len: int | None = None, accelerator: bool = True,
               hardware: hardware_lib.Hardware | None = None,
               step_time_model: Any = None, k: int = 5, kv_heads_ratio: int = 1) -> Plan:
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
    kv_heads_ratio: query heads per k/v head of the shapes (1 = multi-head;
      ``shapes.ShapeRule.kv_heads_ratio``).
  Returns:
    The :class:`Plan`; its N is the chosen shape's exact N and D = C / (6·N)
    rounded to whole steps.
  Raises:
    PlanError: bad budget or law; a budget below one step of the chosen shape
      (``reach.check_one_step``: the message names the smallest budget that works).
  """
  C = check_budget(C, "--flops")
  law = load_law(law)
  if hardware is not None:
    accelerator = hardware.is_accelerator
  seq_len = seq_len or default_seq_len(accelerator)
  alloc = allocate_lib.allocate(C, law)
  cands = list(_shapes(alloc.N, vocab_size, seq_len, accelerator, k,
                       shapes_lib.ASPECT_RATIO_TARGET, kv_heads_ratio))
  chosen = cands[0]
  multiple = hardware.n_devices if hardware else 1
  reach.check_one_step(C, chosen, seq_len * multiple, vocab_size, seq_len, accelerator)
  batch = batch_lib.plan_batch(C / (6.0 * chosen.N), N=chosen.N, seq_len=seq_len, C=C,
                               batch_multiple=multiple)
  plan = Plan(mode="flops", budget={"flops": C}, law=law, allocation=alloc, chosen=chosen,
              batch=batch, predicted_loss=allocate_lib.law_loss(law, chosen.N, batch.tokens),
              hardware=hardware, candidates=[c.to_dict() for c in cands],
              warnings=list(alloc.warnings))
  plan.warnings.extend(reach.budget_warnings(plan, C))
  lay_out(plan, hardware, step_time_model)
  return plan


def lay_out(plan: Plan, hardware: hardware_lib.Hardware | None, step_time_model=None) -> None:
  """On ``hardware`` (None: nothing to do): the plan's predicted step time (seconds; the
  roofline model unless ``step_time_model`` is given) and its layout — the microbatches and
  remat policy whose memory fits a device (``layout.fit_plan``)."""
  if hardware is None:
    return
  model = step_time_model or step_time_lib.RooflineStepTime(hardware)
  plan.step_time_model = step_time_lib.describe_model(model)
  plan.step_time_s = float(model.predict(plan.chosen.shape, plan.batch.global_batch_size))
  layout_lib.fit_plan(plan, hardware, model)


def plan_time(seconds: float, hardware: hardware_lib.Hardware, law: Any = DEFAULT_LAW, *,
              vocab_size: int = 257, seq_len: int | None = None, step_time_model: Any = None,
              k: int = 5, mode: str = "hours", budget_dict: dict | None = None,
              calibrate: int = 0, measure: Any = None, progress: Any = None,
              kv_heads_ratio: int = 1) -> Plan:
  """Plans a run for a wall-clock budget on ``hardware`` (Time Matters, Inbar & Sernau 2024).

  Args:
    seconds: wall-clock budget (> 0).
    hardware: the devices.
    law: law object, name or fit-file path.
    vocab_size, seq_len: as in :func:`plan_flops`.
    step_time_model: a model from ``chinchax.cost.step_time`` (default: roofline).
    k: candidates to list.
    mode, budget_dict: how the budget was given (for reporting).
    calibrate: time the best ``calibrate`` candidates (and the FLOP-optimal
      shape) on this machine and choose among those measured ones: a model
      that under-predicts one shape's step time would otherwise pick exactly
      that shape. Measured start-up (set-up, compile, first step) comes out
      of the budget. 0 trusts the model.
    measure: ``(ModelShape, global_batch_size) -> (step_time_s, startup_s)``
      for calibration, needed when ``calibrate`` > 0 (on this machine's devices:
      ``functools.partial(chinchax.planning.measure.measure_step_time, hardware=hardware)``).
    progress: called with a line before each calibration measurement.
    kv_heads_ratio: as in :func:`plan_flops`.
  Returns:
    The :class:`Plan` of the best candidate, with ``comparison`` holding the
    FLOP-optimal shape, the best shape and the loss difference.
  Raises:
    PlanError: bad budget or law, or no shape that finishes one step in time.
  """
  seconds = check_budget(seconds, "--hours")
  law = load_law(law)
  has_loss = allocate_lib.predicts_loss(law)
  accelerator = hardware.is_accelerator
  seq_len = seq_len or default_seq_len(accelerator)
  model = step_time_model or step_time_lib.RooflineStepTime(hardware)

  # The FLOP-optimal shape at the compute the hardware actually delivers: start
  # from peak × MFU, take the law's N*, measure the compute its shape reaches
  # in the time, repeat until C settles.
  C = seconds * hardware.peak_flops * step_time_lib.DEFAULT_MFU
  flop_opt = None
  for _ in range(8):
    n_opt = law.optimal_allocation(C)[0]
    cand = _shapes(n_opt, vocab_size, seq_len, accelerator, 1, shapes_lib.ASPECT_RATIO_TARGET,
                   kv_heads_ratio)[0]
    flop_opt = timed.evaluate(cand, seconds, C, law, model, hardware)
    if flop_opt.tokens <= 0:
      C /= 4.0
      continue
    C_new = budget.flops_6nd(cand.N, flop_opt.tokens)
    if abs(math.log(C_new / C)) < 1e-3:
      break
    C = C_new
  if flop_opt is None or flop_opt.tokens <= 0:
    startup = (step_time_lib.model_startup_s(model, flop_opt.candidate.shape,
                                             flop_opt.batch.global_batch_size)
               if flop_opt is not None else 0.0)
    why = (f" (the step-time model's start-up alone is {startup:.3g} s)"
           if startup >= seconds else "")
    raise PlanError(f"{seconds / 3600:.3g} hours on {hardware.spec} is not enough for one "
                    f"training step of even the smallest shape{why}; raise the budget")

  pool: dict[tuple[int, int], timed.TimedCandidate] = {flop_opt.candidate.key: flop_opt}
  n_ref = flop_opt.candidate.N
  for f in SIZE_STEPS:
    for r in ASPECT_RATIOS:
      for cand in _shapes(n_ref * f, vocab_size, seq_len, accelerator, 1, r, kv_heads_ratio):
        if cand.key not in pool:
          pool[cand.key] = timed.evaluate(cand, seconds, C, law, model, hardware)
  ranked = sorted(pool.values(), key=lambda tc: timed.rank_key(tc, has_loss))
  if calibrate:
    ranked, flop_opt, factor, notes = calibrate_lib.calibrate(
        ranked, flop_opt, calibrate, measure, seconds, C, law, model, hardware, has_loss,
        progress)
  best = ranked[0]
  if calibrate and flop_opt.tokens > 0:  # the compute the FLOP-optimal shape really reaches
    alloc = allocate_lib.allocate(budget.flops_6nd(flop_opt.candidate.N, flop_opt.tokens), law)
  else:
    alloc = allocate_lib.allocate(C, law)
  plan = Plan(mode=mode, budget=budget_dict or {"hours": seconds / 3600.0}, law=law,
              allocation=alloc, chosen=best.candidate, batch=best.batch,
              predicted_loss=best.loss if best.tokens > 0 else None, hardware=hardware,
              step_time_model=step_time_lib.describe_model(model), step_time_s=best.step_time_s,
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
  plan.comparison = timed.compare(flop_opt, best, has_loss)
  layout_lib.fit_plan(plan, hardware, model, best.fit)
  return plan


def plan_dollars(dollars: float, hardware: hardware_lib.Hardware, law: Any = DEFAULT_LAW, *,
                 vocab_size: int = 257, seq_len: int | None = None, step_time_model: Any = None,
                 k: int = 5, curve: tuple[float, ...] = DOLLAR_CURVE, calibrate: int = 0,
                 measure: Any = None, progress: Any = None, kv_heads_ratio: int = 1) -> Plan:
  """Plans a run for a dollar budget: dollars → hours at the table's price → :func:`plan_time`.

  Adds ``dollar_curve``: the best predicted loss (and tokens, N) at each
  multiple in ``curve`` of the budget, i.e. what each extra dollar buys
  (from the step-time model alone; ``calibrate`` measures the main plan only).

  Raises:
    PlanError: bad budget or law, or hardware without a price.
  """
  dollars = check_budget(dollars, "--dollars")
  price = hardware.price_per_hour
  if price is None:
    raise PlanError(f"the accelerator table has no price for {hardware.accelerator.display_name};"
                    f" add price_per_device_hour to the table or plan with --hours")
  kw = dict(vocab_size=vocab_size, seq_len=seq_len, step_time_model=step_time_model,
            kv_heads_ratio=kv_heads_ratio)
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
