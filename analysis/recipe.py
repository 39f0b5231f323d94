"""The recipe a fitted law holds for, from the rows of its results table (``chinchax.laws.recipe``).

``fit.json`` records what the fitted runs shared (:func:`table_recipe`):
tokenizer, corpus, seq_len, shape family, init, LR and batch rule, schedule,
optimizer and N kind, each a single value where every run agrees and a
``{"disagree": [...]}`` where they do not; with LR trials, each point's tuned
peak LR and the median tuned multiplier of the rule's LR. A table without
recipes (a CSV, or rows from an older chinchax) gets what its rows do say
(seq_len, vocabulary, the LR rule's name) and ``complete: false``. The loss
units of the law (:class:`chinchax.laws.units.LossUnits`) follow from the
recipe's tokenizer and corpus, with the runs' median bytes per token (from
their eval loss and bits per byte).
"""

from __future__ import annotations

import json
import math
import os

import numpy as np

from chinchax.laws import units as law_units
from chinchax.laws import recipe as recipe_lib


def _rows(path: str) -> list[dict] | None:
  """The finished grid rows of a JSONL table; None for a CSV or an unreadable file."""
  if not path or os.path.splitext(path)[1].lower() == ".csv":
    return None
  try:
    with open(path) as f:
      rows = [json.loads(line) for line in f if line.strip()]
  except (OSError, ValueError):
    return None
  return [r for r in rows if isinstance(r, dict) and r.get("status", "done") == "done"
          and r.get("role", "grid") != "validation"]


def _legacy(row: dict) -> dict:
  """What an older row (no ``recipe``) says of its recipe: seq_len, vocabulary, LR rule."""
  shape = row.get("shape") or {}
  hp = row.get("hparams") or {}
  return {"seq_len": shape.get("seq_len"),
          "hparams": {"rule": hp["rule"]} if hp.get("rule") else None}


def _tuned(rows: list[dict]) -> dict | None:
  """Each point's tuned LR (rows with ``best_peak_lr``) and the median tuned multiplier."""
  pts = [{"C": r.get("C_budget"), "N": r.get("N"), "peak_lr": r["best_peak_lr"],
          "lr_mult": r.get("best_lr_mult")}
         for r in rows if r.get("best_peak_lr") is not None]
  if not pts:
    return None
  mults = [p["lr_mult"] for p in pts if p["lr_mult"] is not None]
  return {"points": pts, "median_lr_mult": float(np.median(mults)) if mults else None}


def bytes_per_token(rows: list[dict]) -> float | None:
  """Median UTF-8 bytes per token of the rows' eval text: loss / ln 2 / bits per byte."""
  vals = []
  for r in rows:
    loss, bpb = r.get("final_eval_loss"), r.get("final_eval_bits_per_byte")
    if isinstance(loss, (int, float)) and isinstance(bpb, (int, float)) and bpb > 0 \
        and math.isfinite(loss) and math.isfinite(bpb):
      vals.append(loss / math.log(2.0) / bpb)
  return float(np.median(vals)) if vals else None


def table_recipe(path: str) -> dict:
  """The recipe of the finished grid runs of the results table at ``path`` (module docstring).

  Returns:
    :func:`chinchax.laws.recipe.combine`'s dict; ``hparams.tuned`` when the runs were tuned;
    ``source`` says whether the rows recorded recipes (``"rows"``), only some of their
    fields (``"older rows"``) or nothing (``"none"``: a CSV).
  """
  rows = _rows(path)
  if rows is None:
    out = recipe_lib.combine([])
    out["source"] = "none"
    return out
  full = [r.get("recipe") for r in rows]
  if any(isinstance(x, dict) for x in full):
    out = recipe_lib.combine(full)
    out["source"] = "rows"
  else:
    out = recipe_lib.combine([_legacy(r) for r in rows])
    out.update(source="older rows", complete=False)
  tuned = _tuned(rows)
  if tuned is not None and isinstance(out.get("hparams"), dict) \
      and "disagree" not in out["hparams"]:
    out["hparams"] = {**out["hparams"], "tuned": tuned}
  return out


def table_units(path: str, recipe: dict) -> law_units.LossUnits:
  """The loss units of a law fitted on the table at ``path`` with recipe ``recipe``."""
  rows = _rows(path) or []
  return law_units.LossUnits.from_recipe(recipe, bytes_per_token(rows))


def _tokenizer_of(row: dict) -> tuple[str, str] | None:
  """(key, words) of the tokenizer a row's run used: its recipe's tokenizer, else (an older
  row) its vocabulary size; None when the row says neither."""
  rec = row.get("recipe") if isinstance(row.get("recipe"), dict) else {}
  tok = rec.get("tokenizer")
  if isinstance(tok, dict) and tok.get("kind"):
    sha = tok.get("sha256") or ""
    words = (f"{tok['kind']} ({tok.get('vocab_size')} ids"
             f"{', sha256 ' + sha[:12] + '…' if sha else ''})")
    return json.dumps(tok, sort_keys=True), words
  vocab = (row.get("shape") or {}).get("vocab_size")
  return (f"vocab:{vocab}", f"a {vocab}-id vocabulary") if vocab else None


def tokenizer_groups(path: str) -> list[tuple[str, int]]:
  """[(the tokenizer in words, its number of runs)] over the finished grid runs of the JSONL
  table at ``path``, in first-seen order; runs that record no tokenizer are not counted. More
  than one group: the runs' losses are nats per token of different tokens (different units)."""
  groups: dict[str, list] = {}
  for row in _rows(path) or []:
    tok = _tokenizer_of(row)
    if tok is not None:
      groups.setdefault(tok[0], [tok[1], 0])[1] += 1
  return [(words, n) for words, n in groups.values()]


def markdown_lines(recipe: dict, units: dict | None) -> list[str]:
  """fit.md's "Recipe" section: the units and one line per recipe field."""
  lines = ["## Recipe", ""]
  if units:
    lines.append(f"Loss units: {units.get('description', 'nats/token')}.")
  if not recipe.get("complete"):
    lines.append("The recipe is incomplete: " + (
        "the table's rows recorded none; `chinchax plan --law` cannot reproduce the runs."
        if recipe.get("source") != "rows" else
        f"unknown: {', '.join(recipe.get('unknown') or []) or '-'}."))
  if recipe.get("disagree"):
    lines.append(f"The runs disagree on: {', '.join(recipe['disagree'])} (a law over mixed "
                 f"recipes holds for none of them exactly).")
  lines.append("")
  lines += [f"- {line}" for line in recipe_lib.describe(recipe)]
  return lines + [""]
