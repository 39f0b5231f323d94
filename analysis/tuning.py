"""A tuned ladder's report: how far each size's best LR sits from the rule, an LR power law,
the seed noise per point, and how a moves when the ladder is tuned.

A tuned ladder (``ladder.lr_trials`` / ``ladder.seeds``, ``chinchax.ladder.tuning``) keeps
every trial of a grid point in its row (``trials``: lr_mult, seed, peak_lr,
final_eval_loss, eval_curve) and fits each point's best LR. This module reads
those rows and writes ``tuning.json`` and ``tuning.md`` beside the fit:

* per point: C (FLOPs), N, the rule's peak LR, the best trial's multiplier and an
  LR estimate refined by a parabola in ln LR through the best trial and its two
  neighbours (its vertex, kept within the neighbours; the best trial's LR when it
  is at an end of the multiplier grid, flagged ``at_edge``), and the seeds'
  standard deviation of the final eval loss;
* LR power laws fitted by least squares in log-log over the points not at an edge:
  LR = k_N·N^p_N and LR = k_C·C^p_C, beside DeepSeek's η_opt = 0.3118·C^−0.125
  (Bi et al. 2024, arXiv 2401.02954, Sec. 3.1, eq. 1);
* a of Approaches 1 and 2 fitted on the same runs' ×1 trials (the untuned
  ladder the rule alone gives; bitwise its runs with ``train.trial_batching=loop``),
  beside the tuned fit's a from ``fit.json``.

Units: LR dimensionless (AdamW peak), C FLOPs, N parameters, losses nats/token.
"""

from __future__ import annotations

import json
import math
import os
from typing import Callable

import numpy as np

from analysis.isoflop.approaches import fit_approach
from analysis.errors import FitError, ResultsError
from analysis.io import load_results

DEEPSEEK_LR = (0.3118, -0.125)  # η_opt = 0.3118·C^−0.1250 (Bi et al. 2024, Sec. 3.1, eq. 1)


def read_rows(results_path: str) -> list[dict]:
  """The rows of a ladder's JSONL table ([] for a CSV table or one that is not JSON lines)."""
  try:
    with open(results_path) as f:
      return [json.loads(l) for l in f if l.strip()]
  except (OSError, ValueError):
    return []


def tuned_rows(rows: list[dict]) -> list[dict]:
  """The finished rows of a table that carry trials (fit rows and the validation run)."""
  return [r for r in rows if r.get("status") == "done" and r.get("trials")]


def refined_lr(trials: list[dict]) -> tuple[float, float, bool]:
  """(best multiplier, LR estimate, at_edge) from one point's trials (seeds averaged per LR).

  The estimate is the vertex of the parabola in ln LR through the best LR and its two
  neighbours, clipped to their range; at an end of the grid it is the best LR itself.
  """
  by = {}
  for t in trials:
    if t["final_eval_loss"] is None:
      by[t["lr_mult"]] = (t["peak_lr"], math.inf)
      continue
    lr, losses = by.get(t["lr_mult"], (t["peak_lr"], []))
    if losses is not math.inf:
      by[t["lr_mult"]] = (lr, [*losses, t["final_eval_loss"]])
  mults = sorted(by)
  lrs = [by[m][0] for m in mults]
  losses = [math.inf if by[m][1] is math.inf else float(np.mean(by[m][1])) for m in mults]
  i = int(np.argmin(losses))
  if i == 0 or i == len(mults) - 1 or not all(map(math.isfinite, losses[i - 1:i + 2])):
    return mults[i], lrs[i], True
  x = np.log(lrs[i - 1:i + 2])
  c2, c1, _ = np.polyfit(x, losses[i - 1:i + 2], 2)
  vertex = -c1 / (2 * c2) if c2 > 0 else x[1]
  return mults[i], float(np.exp(np.clip(vertex, x[0], x[2]))), False


def lr_points(rows: list[dict]) -> list[dict]:
  """One record per tuned fit row (the validation run left out): run_id, C, N, rule_lr,
  best_lr_mult, best_lr (refined), at_edge, seed_sd, n_seeds."""
  out = []
  for r in tuned_rows(rows):
    if r.get("role") == "validation":
      continue
    mult, lr, edge = refined_lr(r["trials"])
    out.append({"run_id": r["run_id"], "C": r["C_budget"], "N": r["N"],
                "rule_lr": r["hparams"]["peak_lr"], "best_lr_mult": mult, "best_lr": lr,
                "at_edge": edge, "seed_sd": r.get("seed_sd"), "n_seeds": r.get("n_seeds", 1)})
  return out


def power_law(x, y) -> dict | None:
  """y = k·x^p by least squares on ln y against ln x: {"k", "p", "n"}; None below 3 points
  or when x does not vary."""
  x, y = np.log(np.asarray(x, float)), np.log(np.asarray(y, float))
  if x.size < 3 or np.ptp(x) == 0:
    return None
  p, ln_k = np.polyfit(x, y, 1)
  return {"k": float(np.exp(ln_k)), "p": float(p), "n": int(x.size)}


def untuned_table(rows: list[dict], path: str, mult: float = 1.0) -> int:
  """Writes to ``path`` the fit rows with each point's ``mult`` trials (seeds averaged) in place
  of its best: the ladder the rule alone gives. Returns the rows written (0: no such trial)."""
  n = 0
  with open(path, "w") as f:
    for r in tuned_rows(rows):
      if r.get("role") == "validation":
        continue
      group = [t for t in r["trials"] if t["lr_mult"] == mult]
      if not group or any(t["final_eval_loss"] is None for t in group):
        continue
      curve = np.mean([np.asarray(t["eval_curve"], float) for t in group], axis=0)
      losses = [t["final_eval_loss"] for t in group]
      se = (float(np.std(losses, ddof=1) / math.sqrt(len(losses))) if len(losses) > 1
            else group[0].get("final_eval_loss_se"))
      keep = {k: v for k, v in r.items() if k != "trials"}
      f.write(json.dumps({**keep, "final_eval_loss": float(np.mean(losses)),
                          "final_eval_loss_se": se, "eval_curve": curve.tolist()}) + "\n")
      n += 1
  return n


def untuned_a(rows: list[dict], out_dir: str) -> dict:
  """a of Approaches 1 and 2 on the ×1 trials ({"1": a or None, "2": ...}, with "error" texts)."""
  path = os.path.join(out_dir, "untuned_results.jsonl")
  out: dict = {}
  if not untuned_table(rows, path):
    return {"error": "no ×1 trial in the table"}
  try:
    runs = load_results(path)
  except ResultsError as e:
    return {"error": str(e)}
  for k in ("1", "2"):
    try:
      out[k] = float(fit_approach(runs, k).params()["a"])
    except FitError as e:
      out[k] = None
      out[f"error_{k}"] = str(e).split(" (")[0]
  return out


def tuning_report(results_path: str, out_dir: str, log: Callable[[str], None] = print) -> dict:
  """Writes ``tuning.json``, ``tuning.md`` and ``untuned_results.jsonl`` (the table of the ×1
  trials that a untuned is fitted on, :func:`untuned_table`) into ``out_dir``, and appends a
  note to its ``fit.md`` (when present) that the fit read each point's best LR. Returns the
  report.

  Raises:
    FitError: the table has no tuned rows.
  """
  rows = read_rows(results_path)
  points = lr_points(rows)
  if not points:
    raise FitError(f"{results_path}: no tuned runs (rows with trials) to report on")
  os.makedirs(out_dir, exist_ok=True)
  inner = [p for p in points if not p["at_edge"]]
  tuned_a = {}
  fit_json = os.path.join(out_dir, "fit.json")
  if os.path.exists(fit_json):
    fit = json.load(open(fit_json))
    for k in ("1", "2", "3"):
      v = fit.get(f"approach{k}") or {}
      if v.get("status") == "ok" and isinstance(v.get("a"), (int, float)):
        tuned_a[k] = v["a"]
  sds = [p["seed_sd"] for p in points if p["seed_sd"] is not None]
  report = {
      "points": points,
      "lr_law_N": power_law([p["N"] for p in inner], [p["best_lr"] for p in inner]),
      "lr_law_C": power_law([p["C"] for p in inner], [p["best_lr"] for p in inner]),
      "deepseek_lr_law_C": {"k": DEEPSEEK_LR[0], "p": DEEPSEEK_LR[1]},
      "median_best_over_rule": float(np.median([p["best_lr"] / p["rule_lr"] for p in points])),
      "at_edge": sum(p["at_edge"] for p in points),
      "median_seed_sd": float(np.median(sds)) if sds else None,
      "a_tuned": tuned_a, "a_untuned": untuned_a(rows, out_dir),
  }
  with open(os.path.join(out_dir, "tuning.json"), "w") as f:
    json.dump(report, f, indent=2)
  md = markdown(report)
  with open(os.path.join(out_dir, "tuning.md"), "w") as f:
    f.write(md)
  fit_md = os.path.join(out_dir, "fit.md")
  if os.path.exists(fit_md):
    with open(fit_md, "a") as f:
      f.write("\n## Tuned ladder\n\nEach point of this fit is the best of its learning-rate "
              "trials (the mean over seeds at that LR); every trial is kept in the table. "
              "See tuning.md.\n")
  log(f"tuning: best LR / rule's LR median {report['median_best_over_rule']:.2f} over "
      f"{len(points)} points ({report['at_edge']} at an end of the trial grid); "
      + _a_line(report))
  return report


def _a_line(r: dict) -> str:
  parts = []
  for k in ("1", "2"):
    t, u = r["a_tuned"].get(k), r["a_untuned"].get(k)
    if t is not None and u is not None:
      parts.append(f"approach {k}: a {u:.3f} untuned -> {t:.3f} tuned")
  return "; ".join(parts) or "a not compared (an approach did not fit)"


def markdown(r: dict) -> str:
  """tuning.md: the per-point table, the LR laws, the seed noise and a tuned vs untuned."""
  lines = ["# Tuned ladder", "",
           "Each point is the best of its LR trials; the LR column is the vertex of a parabola "
           "in ln LR through the best trial and its neighbours (the best trial's LR at an end of "
           "the grid, marked *).", "",
           "| run | C (FLOPs) | N | rule LR | best × | best LR | seed s.d. (nats) |",
           "|---|---|---|---|---|---|---|"]
  for p in r["points"]:
    sd = "" if p["seed_sd"] is None else f"{p['seed_sd']:.4f}"
    lines.append(f"| {p['run_id']} | {p['C']:.3g} | {p['N']:,} | {p['rule_lr']:.3g} | "
                 f"×{p['best_lr_mult']:g}{'*' if p['at_edge'] else ''} | {p['best_lr']:.3g} | "
                 f"{sd} |")
  lines += ["", f"Median best LR / rule's LR: {r['median_best_over_rule']:.2f}; "
            f"{r['at_edge']} of {len(r['points'])} points at an end of the trial grid "
            "(widen ladder.lr_trials or lr_trial_factor if many are).", ""]
  for key, var in (("lr_law_N", "N"), ("lr_law_C", "C")):
    law = r[key]
    lines.append(f"- LR({var}) = {law['k']:.4g}·{var}^{law['p']:.3f} ({law['n']} points)"
                 if law else f"- LR({var}): fewer than 3 points inside the trial grid")
  k, p = r["deepseek_lr_law_C"]["k"], r["deepseek_lr_law_C"]["p"]
  lines.append(f"- DeepSeek's rule (Bi et al. 2024, eq. 1): LR(C) = {k}·C^{p}")
  if r["median_seed_sd"] is not None:
    lines.append(f"- Seed noise: median s.d. of a point's final eval loss over seeds "
                 f"{r['median_seed_sd']:.4f} nats/token")
  lines += ["", "a (N_opt ∝ C^a), untuned (the ×1 trials) against tuned:", ""]
  for k in ("1", "2"):
    u, t = r["a_untuned"].get(k), r["a_tuned"].get(k)
    lines.append(f"- Approach {k}: untuned {'—' if u is None else f'{u:.4f}'}, tuned "
                 f"{'—' if t is None else f'{t:.4f}'}")
  return "\n".join(lines) + "\n"
