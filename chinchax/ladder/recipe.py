"""The recipe of one ladder run, recorded in its results row (``chinchax.laws.recipe``).

The shape family is the ladder's shape rule (``chinchax.planning.shapes.PRESETS["ladder"]``)
at the run's depth; the hyperparameter rule is ``ladder.hparams`` with the base
settings it starts from; the tokenizer and corpus fingerprint come from the
token store's manifest the run trained on.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib

from chinchax.cost import hparams as hparams_lib
from chinchax.laws import recipe as recipe_lib
from chinchax.planning import shapes as shapes_lib
import chinchax.ladder.grid as grid

LADDER_FAMILY = "ladder"


def shape_family(n_layers: int, tie_embeddings: bool, rule_name: str = LADDER_FAMILY) -> dict:
  """The ladder's shape rule at depth ``n_layers`` as a JSON-ready dict (``name`` = "ladder").

  Its fixed knobs: n_layers (``min_layers`` with ``depths`` = "fixed"), n_heads, the width
  quantum, and d_ff ≈ 8/3·d_model (``chinchax.planning.shapes``)."""
  rule = shapes_lib.PRESETS[rule_name]
  if rule.depths == "fixed":  # the ladder family: one depth per run
    rule = dataclasses.replace(rule, min_layers=int(n_layers))
  d = dataclasses.asdict(rule)
  d = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}
  d["aspect_band"] = [None if (isinstance(x, float) and not math.isfinite(x)) else x
                      for x in rule.aspect_band]
  return {"name": rule_name, "d_ff_ratio": 8.0 / 3.0, "tie_embeddings": bool(tie_embeddings),
          **d}


def hparams_rule(lc, base_train) -> dict:
  """``ladder.hparams`` as the recipe records it: the rule, the base settings it starts from,
  the fewest steps it shrinks the batch to, and its constants (``chinchax.cost.hparams``)."""
  base = hparams_lib.Base.from_config(base_train)
  out = {"rule": str(lc.hparams), "base": dataclasses.asdict(base),
         "min_steps": int(max(lc.min_steps, lc.batch_min_steps)),
         "max_global_batch_size": hparams_lib.MAX_GLOBAL_BATCH_SIZE, "constants": None}
  if lc.hparams == "deepseek":
    out["constants"] = {"lr_coef": hparams_lib.DEEPSEEK_LR_COEF,
                        "lr_exponent": hparams_lib.DEEPSEEK_LR_EXPONENT,
                        "batch_coef": hparams_lib.DEEPSEEK_BATCH_COEF,
                        "batch_exponent": hparams_lib.DEEPSEEK_BATCH_EXPONENT,
                        "source": "DeepSeek LLM (arXiv 2401.02954) Sec. 3.1 eq. 1"}
  if int(lc.lr_trials) > 1:
    out["lr_trials"] = {"k": int(lc.lr_trials), "factor": float(lc.lr_trial_factor),
                        "center": float(lc.lr_trial_center), "seeds": int(lc.seeds)}
  return out


def _manifest(summary: dict) -> dict:
  try:
    return json.loads((pathlib.Path(summary["store"]) / "manifest.json").read_text())
  except (KeyError, OSError, ValueError):
    return {}


def row_recipe(plan, r: grid.LadderRun, cfg, summary: dict) -> dict:
  """The recipe of run ``r`` trained with config ``cfg`` (its summary names the token store)."""
  manifest = _manifest(summary)
  tok = manifest.get("tokenizer")
  lc = plan.config.ladder
  return recipe_lib.run_recipe(
      cfg, tokenizer=tok, fingerprint=manifest.get("fingerprint"),
      shape_family=shape_family(r.shape.n_layers, bool(cfg.model.tie_embeddings),
                                lc.shape_rule),
      hparams=hparams_rule(lc, plan.config.train_config.train))
