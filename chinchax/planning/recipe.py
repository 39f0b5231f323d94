"""``chinchax plan --law fit.json``: plan with the recipe the law was fitted on.

A fitted law predicts the loss of runs trained like its own (``chinchax.laws.recipe``):
the ladder's shape family (fixed depth, two heads), its sequence length and
tokenizer, its init, its LR and batch rule (with the ladder's base settings and
fewest steps), its schedule and optimizer. :func:`plan_flops` plans a FLOP
budget the way the ladder plans its validation run (``chinchax.ladder.validation``):
the law's N* made a shape by the recipe's shape rule, the rule's peak LR,
batch, β2 and warmup at the budget (× the median tuned multiplier when the
ladder tuned its LR); :func:`config_settings` is what ``--write-config`` adds
(init, schedule, optimizer, data, eval, β2). A flag that leaves the recipe
(``--seq-len``, ``--vocab-size``, a time budget's shape search, a ``--set``
override) is allowed and listed as a departure: the law's prediction no longer
holds for the run. A law file without a recipe (an older ``chinchax fit``)
plans with chinchax's defaults, saying the recipe is unknown.
"""

from __future__ import annotations

import dataclasses
import json
import math

from chinchax.cost import budget
from chinchax.cost import hardware as hardware_lib
from chinchax.cost import hparams as hparams_lib
from chinchax.laws import parametric as laws
from chinchax.laws import recipe as recipe_lib
from chinchax.planning import allocate as allocate_lib
from chinchax.planning import batch as batch_lib
from chinchax.planning import planner
from chinchax.planning import reach
from chinchax.planning import shapes as shapes_lib
from chinchax.planning.errors import PlanError

# The config knobs a recipe sets, by section: a --set override of one of them departs from it.
RECIPE_KNOBS = {
    "model": ("d_model", "n_layers", "n_heads", "d_ff", "tie_embeddings", "init", "init_std",
              "vocab_size"),
    "train": ("seq_len", "peak_lr", "global_batch_size", "b2", "warmup_steps", "schedule",
              "min_lr_ratio", "decay_fraction", "decay_shape", "eval_windows", "eval_batches",
              *recipe_lib.OPTIMIZER_KNOBS),
    "data": recipe_lib.DATA_KNOBS,
    "budget": ("n_kind",),
}
WARNING = "the law's prediction no longer holds for this run"


def law_recipe(law) -> tuple[dict | None, str | None]:
  """(the recipe in a fit file given as --law, a note when there is none or it is partial).

  A published law's name gives (None, None): it holds for its paper's recipe, not
  chinchax's. A fit file without ``recipe`` gives (None, a note that its recipe is unknown).
  """
  try:
    d = laws.read_law_file(law)  # local or gs://
  except (OSError, ValueError):
    return None, None
  if d is None:
    return None, None
  rec = d.get("recipe") if isinstance(d, dict) else None
  if not isinstance(rec, dict) or rec.get("n_recorded", 0) == 0:
    return None, (f"law file {law!r} records no recipe (an older chinchax fit, or a table "
                  f"without one): the recipe its runs were trained with is unknown, so the "
                  f"plan uses chinchax's defaults and its predicted loss may not hold")
  notes = []
  if rec.get("disagree"):
    notes.append(f"the law's runs disagree on {', '.join(rec['disagree'])}: the plan uses "
                 f"chinchax's defaults there")
  if rec.get("unknown"):
    notes.append(f"the law's recipe does not record {', '.join(rec['unknown'])}")
  return rec, "; ".join(notes) or None


def seq_len(rec: dict | None) -> int | None:
  """The recipe's tokens per sequence, or None."""
  value = recipe_lib.agreed(rec, "seq_len")
  return int(value) if value else None


def vocab_size(rec: dict | None) -> int | None:
  """The recipe tokenizer's vocabulary (tokens), or None."""
  tok = recipe_lib.agreed(rec, "tokenizer")
  return int(tok["vocab_size"]) if isinstance(tok, dict) and tok.get("vocab_size") else None


def shape_rule(rec: dict | None) -> tuple[shapes_lib.ShapeRule | None, bool]:
  """(the recipe's shape rule, its tie_embeddings), or (None, True) when it has none."""
  fam = recipe_lib.agreed(rec, "shape_family")
  if not isinstance(fam, dict):
    return None, True
  names = {f.name for f in dataclasses.fields(shapes_lib.ShapeRule)}
  kw = {k: v for k, v in fam.items() if k in names}
  kw["aspect_band"] = tuple(math.inf if x is None else float(x) for x in kw["aspect_band"])
  kw["head_dims"] = tuple(kw["head_dims"])
  if kw.get("wide_head_dim") is not None:
    kw["wide_head_dim"] = tuple(kw["wide_head_dim"])
  return shapes_lib.ShapeRule(**kw), bool(fam.get("tie_embeddings", True))


def rule_hparams(rec: dict | None, N: float, C: float, seq_len: int,
                 batch_multiple: int) -> tuple[hparams_lib.HParams, float] | None:
  """The recipe's LR/batch rule at N parameters and C FLOPs: (HParams, peak LR); the peak LR
  is the rule's × the median tuned multiplier when the ladder tuned it. None without a rule.

  The batch is rounded to a positive multiple of ``batch_multiple`` as the ladder rounds it
  (``chinchax.ladder.grid.make_run``)."""
  hp = recipe_lib.agreed(rec, "hparams")
  if not isinstance(hp, dict) or not isinstance(hp.get("base"), dict):
    return None
  h = hparams_lib.hparams_for_run(
      hp["rule"], N, C, seq_len, hparams_lib.Base(**hp["base"]),
      min_steps=int(hp.get("min_steps", 1)),
      max_global_batch_size=int(hp.get("max_global_batch_size",
                                       hparams_lib.MAX_GLOBAL_BATCH_SIZE)))
  if h.rule != "fixed" and h.global_batch_size % batch_multiple:
    gbs = max(batch_multiple, batch_multiple * round(h.global_batch_size / batch_multiple))
    steps = budget.steps_for_tokens(C / (6.0 * N), gbs * seq_len)
    h = dataclasses.replace(h, global_batch_size=gbs, steps=steps, warmup_steps=min(
        h.warmup_steps, budget.max_warmup_steps(steps)))
  elif h.rule == "fixed" and h.global_batch_size % batch_multiple:
    h = dataclasses.replace(h, global_batch_size=batch_multiple * max(
        1, round(h.global_batch_size / batch_multiple)))
    h = dataclasses.replace(h, steps=budget.steps_for_tokens(C / (6.0 * N),
                                                             h.global_batch_size * seq_len))
  lr = h.peak_lr
  tuned = hp.get("tuned")
  if isinstance(tuned, dict) and tuned.get("median_lr_mult"):
    lr *= float(tuned["median_lr_mult"])
  return h, lr


def plan_flops(C: float, law, rec: dict, *, seq_len: int | None = None,
               vocab: int | None = None, hardware: hardware_lib.Hardware | None = None,
               step_time_model=None, k: int = 5, kv_heads_ratio: int = 1) -> planner.Plan:
  """Plans a FLOP budget with a law's recipe (module docstring).

  Args:
    C: FLOPs (> 0).
    law: the law (object, name or fit path).
    rec: the recipe of the law's fit file (:func:`law_recipe`).
    seq_len: --seq-len, when given (a departure when it differs from the recipe's).
    vocab: --vocab-size, when given (a departure when it differs from the tokenizer's).
    hardware, step_time_model, k, kv_heads_ratio: as
      :func:`chinchax.planning.planner.plan_flops` (a ratio > 1 is a departure).
  Returns:
    The plan; ``plan.recipe`` holds the recipe, its config settings and the departures.
  Raises:
    PlanError: a bad budget or law, or a budget below one step of the chosen shape.
  """
  C = planner.check_budget(C, "--flops")
  law = planner.load_law(law)
  departures: list[str] = []
  r_seq = recipe_lib.agreed(rec, "seq_len")
  if seq_len is not None and r_seq is not None and seq_len != r_seq:
    departures.append(f"--seq-len {seq_len} (the law's runs used seq_len {r_seq})")
  seq_len = seq_len or r_seq or planner.default_seq_len(
      hardware.is_accelerator if hardware else False)
  r_vocab = vocab_size(rec)
  if vocab is not None and r_vocab is not None and vocab != r_vocab:
    departures.append(f"--vocab-size {vocab} (the law's tokenizer has {r_vocab} tokens)")
  vocab = vocab or r_vocab or 257
  rule, tied = shape_rule(rec)
  accelerator = hardware.is_accelerator if hardware is not None else False
  if rule is None:
    rule = shapes_lib.rule_for(accelerator)
  if kv_heads_ratio > 1:
    rule = dataclasses.replace(rule, kv_heads_ratio=kv_heads_ratio)
    departures.append(f"--kv-heads-ratio {kv_heads_ratio} (grouped-query shapes; the law's "
                      f"runs had the recipe's heads)")
  alloc = allocate_lib.allocate(C, law)
  cands = shapes_lib.propose_shapes(alloc.N, vocab_size=vocab, seq_len=seq_len, rule=rule, k=k,
                                    tie_embeddings=tied)
  chosen = cands[0]
  multiple = hardware.n_devices if hardware else 1
  reach.check_one_step(C, chosen, seq_len * multiple, vocab, seq_len, accelerator)
  got = rule_hparams(rec, chosen.N, C, seq_len, multiple)
  if got is None:
    batch = batch_lib.plan_batch(C / (6.0 * chosen.N), N=chosen.N, seq_len=seq_len, C=C,
                                 batch_multiple=multiple)
    b2 = None
  else:
    h, lr = got
    tps = h.global_batch_size * seq_len
    batch = batch_lib.BatchPlan(global_batch_size=h.global_batch_size, seq_len=seq_len,
                                steps=max(1, h.steps), tokens=max(1, h.steps) * tps, peak_lr=lr,
                                warmup_steps=h.warmup_steps)
    b2 = h.b2
  plan = planner.Plan(mode="flops", budget={"flops": C}, law=law, allocation=alloc,
                      chosen=chosen, batch=batch,
                      predicted_loss=allocate_lib.law_loss(law, chosen.N, batch.tokens),
                      hardware=hardware, candidates=[c.to_dict() for c in cands],
                      warnings=list(alloc.warnings))
  plan.warnings.extend(reach.budget_warnings(plan, C))
  planner.lay_out(plan, hardware, step_time_model)  # microbatches, remat: the memory per device
  plan.recipe = {"law": rec, "settings": config_settings(rec, b2), "departures": departures}
  return plan


def attach(plan: planner.Plan, rec: dict, *, seq_len: int | None, vocab: int | None) -> None:
  """A time or dollar plan with a law's recipe: its settings go into the written config; the
  time planner's own shape search, batch and LR are departures (it ranks shapes by time)."""
  departures = ["a time budget: the shape, batch and peak LR come from the time planner's "
                "search over depths and widths, not from the law's shape family and LR rule"]
  r_seq = recipe_lib.agreed(rec, "seq_len")
  if seq_len is not None and r_seq is not None and seq_len != r_seq:
    departures.append(f"--seq-len {seq_len} (the law's runs used seq_len {r_seq})")
  r_vocab = vocab_size(rec)
  if vocab is not None and r_vocab is not None and vocab != r_vocab:
    departures.append(f"--vocab-size {vocab} (the law's tokenizer has {r_vocab} tokens)")
  plan.recipe = {"law": rec, "settings": config_settings(rec, None), "departures": departures}


def config_settings(rec: dict | None, b2: float | None) -> dict[str, dict]:
  """{section: {knob: value}} the written config takes from the recipe (besides the shape,
  batch, LR and warmup the plan already holds): init, schedule, optimizer, β2, data, eval."""
  out: dict[str, dict] = {"model": {}, "train": {}, "data": {}, "budget": {}}
  init = recipe_lib.agreed(rec, "init")
  if isinstance(init, dict):
    out["model"]["init"] = init["rule"]
    if init.get("init_std") is not None:
      out["model"]["init_std"] = init["init_std"]
  sched = recipe_lib.agreed(rec, "schedule")
  if isinstance(sched, dict):
    out["train"]["schedule"] = sched["kind"]
    out["train"]["min_lr_ratio"] = sched["min_lr_ratio"]
    for k in ("decay_fraction", "decay_shape"):
      if k in sched:
        out["train"][k] = sched[k]
  opt = recipe_lib.agreed(rec, "optimizer")
  if isinstance(opt, dict):
    out["train"].update({k: opt[k] for k in recipe_lib.OPTIMIZER_KNOBS if k in opt})
  if b2 is not None:
    out["train"]["b2"] = b2
  ev = recipe_lib.agreed(rec, "eval")
  if isinstance(ev, dict):
    out["train"].update(ev)
  data = recipe_lib.agreed(rec, "data")
  if isinstance(data, dict):
    out["data"] = {k: data[k] for k in recipe_lib.DATA_KNOBS if k in data}
  n_kind = recipe_lib.agreed(rec, "n_kind")
  if n_kind:
    out["budget"]["n_kind"] = n_kind
  return {k: v for k, v in out.items() if v}


def parse_override(text: str) -> tuple[str, str, object]:
  """``"section.knob=value"`` → (section, knob, value); the value as JSON when it parses
  (numbers, true/false, quoted strings), else the text.

  Raises:
    PlanError: no ``=``, or a key that is not ``section.knob``.
  """
  key, sep, raw = text.partition("=")
  parts = key.strip().split(".")
  if not sep or len(parts) != 2 or not all(parts):
    raise PlanError(f"--set {text!r} must be SECTION.KNOB=VALUE, e.g. --set train.peak_lr=0.003")
  try:
    value = json.loads(raw)
  except ValueError:
    value = raw
  return parts[0], parts[1], value


def apply_overrides(plan: planner.Plan, overrides: list[tuple[str, str, object]],
                    written: dict[str, dict]) -> None:
  """Records --set overrides in ``plan.recipe`` (created when the law has none): each one
  changing a knob the recipe set (``written``: the config's planned values) is a departure."""
  if not overrides:
    return
  if plan.recipe is None:
    plan.recipe = {"law": None, "settings": {}, "departures": []}
  plan.recipe["overrides"] = [[s, k, v] for s, k, v in overrides]
  if plan.recipe.get("law") is None:
    return
  for section, knob, value in overrides:
    if knob in RECIPE_KNOBS.get(section, ()) and written.get(section, {}).get(knob) != value:
      plan.recipe["departures"].append(
          f"--set {section}.{knob}={value!r} (the law's recipe gives "
          f"{written.get(section, {}).get(knob)!r})")


def departure_warning(plan: planner.Plan) -> str | None:
  """One warning line naming every departure from the law's recipe, or None."""
  deps = (plan.recipe or {}).get("departures") or []
  if not deps:
    return None
  return f"the plan departs from the law's recipe: {'; '.join(deps)}; {WARNING}"
