"""A run's recipe (what it was trained with besides N and D) and what many runs share.

A scaling law holds for the recipe its runs shared: the same tokenizer and
corpus, sequence length, shape family, initialisation, learning-rate and batch
rule, schedule and optimizer. A run trained with another recipe lands
elsewhere (a plan from a ladder's law with the default peak_lr, seq_len and
init landed 12.7% above the law's loss where the ladder's own validation run
landed within 0.3%). So every ladder row records its run's recipe
(:func:`run_recipe`), ``chinchax fit`` writes what the rows share
(:func:`combine`) into ``fit.json``, and ``chinchax plan --law fit.json``
plans with it (``chinchax.planning.recipe``).

A recipe is a JSON-ready dict of :data:`FIELDS`:

* ``tokenizer``: {kind, vocab_size, sha256} of the token store's tokenizer.
* ``data``: the ``data`` knobs that choose the text and its tokens
  (:data:`DATA_KNOBS`) and the corpus ``fingerprint`` (sha256 over its
  documents, ``chinchax.data.sources``).
* ``seq_len``: tokens per sequence.
* ``shape_family``: the shape rule's parameters (``chinchax.planning.shapes.ShapeRule``
  as a dict, with ``name`` and ``tie_embeddings``).
* ``init``: {rule, init_std} (``model.init``; init_std only for ``fixed``).
* ``hparams``: the LR/batch/β2/warmup rule ``chinchax.cost.hparams`` applied:
  {rule, base: {peak_lr, global_batch_size, b2, warmup_steps}, min_steps,
  max_global_batch_size, constants}; with LR trials, ``tuned`` (added by the fit).
* ``schedule``: {kind, min_lr_ratio, and for wsd decay_fraction, decay_shape}.
* ``optimizer``: AdamW's b1, eps, weight_decay, decay_embeddings, grad_clip, z_loss.
* ``n_kind``: which N the budget counts (total or non_embedding).
* ``eval``: how the loss was measured (eval_windows, eval_batches).

:func:`combine` keeps a field's value where every run agrees and records
``{"disagree": [values...]}`` where they do not; a field no run recorded is
None and listed in ``unknown``.
"""

from __future__ import annotations

import json
import math

FIELDS = ("tokenizer", "data", "seq_len", "shape_family", "init", "hparams", "schedule",
          "optimizer", "n_kind", "eval")
# The data knobs that decide which text becomes which tokens (store_root, workers and
# threads only decide where and how fast).
DATA_KNOBS = ("source", "paths", "text_field", "txt_documents", "hf_name", "hf_config",
              "hf_split", "tokenizer", "tokenizer_path", "eos_token", "bpe_vocab_size",
              "decode_errors", "val_fraction")
OPTIMIZER_KNOBS = ("b1", "eps", "weight_decay", "decay_embeddings", "grad_clip", "z_loss")
VERSION = 1


def _plain(value):
  """A JSON value: floats that are whole stay floats, ints stay ints, tuples become lists."""
  return json.loads(json.dumps(value))


def run_recipe(config, *, tokenizer: dict | None, fingerprint: str | None,
               shape_family: dict | None, hparams: dict | None) -> dict:
  """The recipe of one run (module docstring) from its training config.

  Args:
    config: the run's training config (``chinchax.config.base_config`` layout).
    tokenizer: the token store's tokenizer description ({kind, vocab_size, sha256}; its
      manifest's ``tokenizer``), None when unknown.
    fingerprint: the corpus fingerprint (sha256 hex), None when unknown.
    shape_family: the shape rule the run's shape came from, as a dict; None when the shape
      was given by hand.
    hparams: the hyperparameter rule as a dict ({rule, base, min_steps, ...}).
  Returns:
    A dict with every key of :data:`FIELDS` (JSON-ready).
  """
  t, m, d = config.train, config.model, config.data
  tok = None
  if tokenizer is not None:
    tok = {"kind": tokenizer.get("kind"), "vocab_size": tokenizer.get("vocab_size"),
           "sha256": tokenizer.get("sha256")}
  schedule = {"kind": str(t.schedule), "min_lr_ratio": float(t.min_lr_ratio)}
  if t.schedule == "wsd":
    schedule.update(decay_fraction=float(t.decay_fraction), decay_shape=str(t.decay_shape))
  return _plain({
      "tokenizer": tok,
      "data": {**{k: d[k] for k in DATA_KNOBS}, "fingerprint": fingerprint},
      "seq_len": int(t.seq_len),
      "shape_family": shape_family,
      "init": {"rule": str(m.init), "init_std": float(m.init_std) if m.init == "fixed" else None},
      "hparams": hparams,
      "schedule": schedule,
      "optimizer": {"name": "adamw", **{k: t[k] for k in OPTIMIZER_KNOBS}},
      "n_kind": str(config.budget.n_kind),
      "eval": {"eval_windows": int(t.eval_windows), "eval_batches": int(t.eval_batches)},
  })


def _key(value) -> str:
  return json.dumps(value, sort_keys=True)


def combine(recipes: list[dict | None]) -> dict:
  """What ``recipes`` (one per run; None for a run that recorded none) share.

  Returns:
    {field: value} for every field of :data:`FIELDS` where all recorded runs agree;
    {field: {"disagree": [distinct values, in first-seen order], "runs": [count each]}}
    where they do not; None where no run recorded it. Plus ``version``, ``n_runs`` (runs
    given), ``n_recorded`` (runs with a recipe), ``disagree`` and ``unknown`` (field
    names), and ``complete`` (every run recorded a recipe and no field is unknown).
  """
  known = [r for r in recipes if isinstance(r, dict)]
  out: dict = {"version": VERSION, "n_runs": len(recipes), "n_recorded": len(known)}
  disagree, unknown = [], []
  for field in FIELDS:
    values = [r.get(field) for r in known if r.get(field) is not None]
    if not values:
      out[field] = None
      unknown.append(field)
      continue
    distinct: dict[str, list] = {}
    for v in values:
      distinct.setdefault(_key(v), [v, 0])[1] += 1
    if len(distinct) == 1 and len(values) == len(known):
      out[field] = values[0]
    else:
      out[field] = {"disagree": [v for v, _ in distinct.values()],
                    "runs": [n for _, n in distinct.values()]}
      if len(values) < len(known):
        out[field]["unrecorded_runs"] = len(known) - len(values)
      disagree.append(field)
  out["disagree"] = disagree
  out["unknown"] = unknown
  out["complete"] = bool(known) and len(known) == len(recipes) and not unknown
  return out


def agreed(recipe: dict | None, field: str):
  """The field's shared value, or None when unknown or the runs disagree on it."""
  if not isinstance(recipe, dict):
    return None
  value = recipe.get(field)
  if isinstance(value, dict) and "disagree" in value:
    return None
  return value


def describe(recipe: dict | None) -> list[str]:
  """One short line per recipe field ("field: value"), for reports and ``chinchax plan``."""
  if not isinstance(recipe, dict):
    return ["unknown (no recipe recorded)"]
  lines = []
  for field in FIELDS:
    v = recipe.get(field)
    if v is None:
      text = "unknown"
    elif isinstance(v, dict) and "disagree" in v:
      text = "runs disagree: " + " | ".join(_short(x) for x in v["disagree"])
    else:
      text = _short(v)
    lines.append(f"{field}: {text}")
  return lines


def _short(v) -> str:
  if isinstance(v, dict):
    return ", ".join(f"{k}={_short(x)}" for k, x in v.items()
                     if x not in (None, "", []) and k not in ("tuned", "sha256", "fingerprint"))
  if isinstance(v, float):
    return f"{v:.4g}" if math.isfinite(v) else str(v)
  if isinstance(v, list):
    return "[" + ", ".join(_short(x) for x in v) + "]"
  return str(v)
