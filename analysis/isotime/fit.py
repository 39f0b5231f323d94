"""Fitting an IsoTime table: step-time predictors, loss from shape and time, wider or deeper.

An IsoTime ladder (rows with ``"budget_kind": "seconds"``) trains each run for a
budget of T seconds; at each budget and N level several depths (n_layers) share
≈ equal N. "Time Matters" (Inbar & Sernau 2024, arXiv 2406.18922) claims that

1. a step's wall-clock seconds follow its memory traffic (bytes) better than
   its FLOPs (:mod:`analysis.isotime.steptime_cv` scores this leave-one-shape-out);
2. a step-time predictor and a Chinchilla law L(N, D) = E + A/N^alpha + B/D^beta
   predict the final loss (nats/token) from the shape and the seconds alone:
   D = floor(T / t_step) · global_batch_size · seq_len tokens;
3. on a fixed time budget, wider/shallower shapes (larger d_model / n_layers)
   can beat the FLOP-optimal ones.

:func:`fit_isotime` measures all three on the table and writes ``fit.json``,
``fit.md`` and two figures (:mod:`analysis.isotime.report`);
:func:`add_isotime_validation` adds the held-out validation run. The
validation row (``"role": "validation"``) is never fitted.
"""

from __future__ import annotations

import json
import math
import os
from typing import Callable

import numpy as np

from chinchax import errors as errors_lib
from chinchax.laws import parametric as laws
from chinchax.storage import paths as paths_lib
from chinchax.cost import step_time as step_time_lib
from analysis.isotime import report
from analysis.isotime import aspect_law
from analysis import recipe as recipe_lib
from analysis.isotime import steptime_cv
from analysis.isoflop.approach3 import fit_approach3, parse_grid, start_grid
from analysis.errors import FitError, FitOptionError, ResultsError
from analysis.io import json_rows
from analysis.pipeline import default_out_dir
from analysis.runs import runs_from_arrays

MIN_RUNS = 6  # a step-time fit held out by shape plus a 5-parameter law need a few runs
_POSITIVE = ("seconds_budget", "N", "D", "final_eval_loss", "step_time_s")


def read_rows(path: str) -> list[dict]:
  """Every row of a JSONL results table; a later row of a run_id replaces an earlier one.

  Raises:
    ResultsError: a missing or empty file, a line that is not a JSON object with a run_id.
  """
  if os.path.isdir(path):
    raise ResultsError(f"results file {path!r} is a directory; give its results.jsonl")
  try:
    with open(path) as f:
      text = f.read()
  except OSError as e:
    raise ResultsError(f"results file {path!r} cannot be read ({e.strerror or e})") from None
  rows: dict[str, dict] = {}
  for _, row in json_rows(text, path):
    rows.pop(str(row["run_id"]), None)
    rows[str(row["run_id"])] = row
  if not rows:
    raise ResultsError(f"results file {path!r} is empty")
  return list(rows.values())


def isotime_table_info(path: str) -> dict | None:
  """None unless ``path`` is a readable JSONL table with an IsoTime row (budget_kind "seconds");
  else {"vocab_size", "seq_len" (of its first such row with a shape), "n_rows",
  "has_validation" (a done validation row)}. Never raises: other tables go to the IsoFLOP fit."""
  try:
    rows = read_rows(path)
  except ResultsError:
    return None
  sec = [r for r in rows if r.get("budget_kind") == "seconds"]
  if not sec:
    return None
  shaped = [r["shape"] for r in sec if isinstance(r.get("shape"), dict)]
  return {"vocab_size": shaped[0].get("vocab_size") if shaped else None,
          "seq_len": shaped[0].get("seq_len") if shaped else None, "n_rows": len(sec),
          "has_validation": any(_is_validation(r) and r.get("status") == "done" for r in sec)}


def _is_validation(row: dict) -> bool:
  return row.get("role") == "validation"


def _check_row(row: dict, path: str) -> dict:
  """The row, checked: positive numbers, a shape and a batch, a known dtype and attention."""
  rid = row["run_id"]
  for col in _POSITIVE:
    x = row.get(col)
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not (math.isfinite(x) and x > 0):
      raise ResultsError(f"{path}: run {rid!r}: column {col!r} must be a number > 0, got {x!r}")
  try:
    steptime_cv.row_shape(row)
    steptime_cv.row_profile(row)
  except (KeyError, TypeError, ValueError) as e:
    raise ResultsError(f"{path}: run {rid!r}: 'shape' needs d_model, n_layers, n_heads, d_ff, "
                       f"vocab_size, seq_len and 'hparams' global_batch_size ({e!r})") from None
  except errors_lib.UserError as e:
    raise ResultsError(f"{path}: run {rid!r}: {e}") from None
  return row


def grid_rows(path: str) -> tuple[list[dict], dict]:
  """The fitted rows of an IsoTime table (done, budget_kind "seconds", not validation, with a
  measured step_time_s) and counts {"n_failed", "n_validation", "n_other", "untimed" (run ids
  of done grid runs without a measured step time, left out)}.

  Raises:
    ResultsError: no seconds rows (not an IsoTime table), fewer than :data:`MIN_RUNS` fitted
      rows, or a bad row.
  """
  rows = read_rows(path)
  sec = [r for r in rows if r.get("budget_kind") == "seconds"]
  if not sec:
    raise ResultsError(f"{path}: no row has \"budget_kind\": \"seconds\", so this is not an "
                       f"IsoTime table; fit an IsoFLOP table with the Chinchilla approaches")
  done = [r for r in sec if r.get("status") == "done"]
  grid = [r for r in done if not _is_validation(r)]
  untimed = [str(r["run_id"]) for r in grid if r.get("step_time_s") is None]
  fitted = [_check_row(r, path) for r in grid if r.get("step_time_s") is not None]
  counts = {"n_failed": sum(r.get("status") == "failed" for r in sec),
            "n_validation": sum(_is_validation(r) for r in done),
            "n_other": len(rows) - len(sec), "untimed": untimed}
  if len(fitted) < MIN_RUNS:
    raise ResultsError(f"{path}: only {len(fitted)} finished IsoTime grid runs "
                       f"({counts['n_failed']} failed); fitting step time and loss needs at "
                       f"least {MIN_RUNS}")
  return fitted, counts


def _law(rows: list[dict], path: str, law_path: str | None,
         grid) -> tuple[laws.ParametricLaw, dict]:
  """The law L(N, D): Approach 3 on ``rows`` (in-sample), or the one in ``law_path``."""
  if law_path:
    try:
      with open(law_path) as f:
        law = laws.law_from_dict(json.load(f), name="law", source=os.fspath(law_path))
    except (OSError, ValueError) as e:
      raise FitOptionError(f"law file {os.fspath(law_path)!r} cannot be used: {e}") from None
    if not isinstance(law, laws.ParametricLaw):
      raise FitOptionError(f"law file {os.fspath(law_path)!r} holds no L(N, D) (E, A, B, alpha, "
                           f"beta): an allocation-only law cannot predict a loss")
    return law, {"from": f"file {os.fspath(law_path)}", "in_sample": False,
                 "fit_range_flops": list(law.fit_range_flops) if law.fit_range_flops else None}
  runs = runs_from_arrays([r["N"] for r in rows], [r["D"] for r in rows],
                          [r["final_eval_loss"] for r in rows],
                          run_id=[str(r["run_id"]) for r in rows], source=path)
  if isinstance(grid, str):
    try:
      grid = start_grid(parse_grid(grid))
    except ValueError as e:
      raise FitOptionError(str(e)) from None
  res = fit_approach3(runs, grid=grid)
  C = [6.0 * r["N"] * r["D"] for r in rows]
  aspect = [r["shape"]["d_model"] / r["shape"]["n_layers"] for r in rows]
  law, forms = aspect_law.choose_law(runs.N, runs.D, aspect, runs.loss, res.law,
                                     fit_range=(min(C), max(C)))
  what = ("L(N, D) + P·(d_model/n_layers / 64)^kappa" if forms["form"] == "aspect"
          else "Approach 3's L(N, D)")
  return law, {"from": f"in-sample fit of {what} on these {len(rows)} IsoTime runs (form "
                       f"chosen by leave-one-out)", "in_sample": True,
               "fit_range_flops": [min(C), max(C)], "form": forms["form"],
               "forms": forms["forms"]}


def law_loss(law: laws.ParametricLaw, N: float, D: float, aspect: float) -> float:
  """L in nats/token at N parameters, D tokens and d_model / n_layers ``aspect`` (the shape
  term only for a :class:`chinchax.laws.parametric.AspectLaw`)."""
  if isinstance(law, laws.AspectLaw):
    return float(law.loss_shape(N, D, aspect))
  return float(law.loss(N, D))


def predict_losses(rows: list[dict], t_pred: list[float], law: laws.ParametricLaw) -> dict:
  """Final loss from shape and seconds: D_pred = floor(T / t_pred) · batch · seq_len tokens,
  L_pred = law.loss(N, D_pred) (nats/token), rel_error = L_pred / measured − 1.

  Returns:
    {"rows": per row {run_id, step_time_pred_s, steps_pred, D_pred, loss_pred,
    loss_at_measured_D, loss, rel_error}, "median_abs_rel_error", "max_abs_rel_error",
    "worst_run_id"}.
  """
  out = []
  for r, t in zip(rows, t_pred):
    shape, gbs = steptime_cv.row_shape(r)
    steps = math.floor(r["seconds_budget"] / t) if t > 0 else 0
    D = steps * gbs * shape.seq_len
    aspect = shape.d_model / shape.n_layers
    L = law_loss(law, r["N"], D, aspect) if steps >= 1 else None
    out.append({"run_id": r["run_id"], "step_time_pred_s": t, "steps_pred": steps,
                "D_pred": D, "loss_pred": L, "loss": r["final_eval_loss"],
                "loss_at_measured_D": law_loss(law, r["N"], r["D"], aspect),
                "rel_error": None if L is None else L / r["final_eval_loss"] - 1.0})
  errs = [abs(x["rel_error"]) for x in out if x["rel_error"] is not None]
  worst = max((x for x in out if x["rel_error"] is not None), key=lambda x: abs(x["rel_error"]),
              default=None)
  return {"rows": out, "median_abs_rel_error": float(np.median(errs)) if errs else None,
          "max_abs_rel_error": max(errs) if errs else None,
          "worst_run_id": worst["run_id"] if worst else None}


def _entry(r: dict, pred: dict | None = None) -> dict:
  shape, _ = steptime_cv.row_shape(r)
  return {"run_id": r["run_id"], "d_model": shape.d_model, "n_layers": shape.n_layers,
          "aspect": shape.d_model / shape.n_layers, "N": r["N"], "D": r["D"],
          "loss": r["final_eval_loss"], "loss_se": r.get("final_eval_loss_se"),
          "loss_pred": pred["loss_pred"] if pred else None}


def _level_verdict(entries: list[dict]) -> dict:
  """Which depth wins at one (budget, N level): shallowest, deepest or intermediate."""
  depths = sorted({e["n_layers"] for e in entries})
  ranked = sorted(entries, key=lambda e: e["loss"])
  win = ranked[0]
  if len(depths) < 2:
    return {"winner": win["run_id"], "verdict": "single depth", "margin": None,
            "within_noise": None}
  verdict = ("shallowest" if win["n_layers"] == depths[0] else
             "deepest" if win["n_layers"] == depths[-1] else "intermediate")
  second = ranked[1]
  margin = second["loss"] - win["loss"]
  ses = [win.get("loss_se"), second.get("loss_se")]
  noise = (margin < 2 * math.hypot(*ses)) if all(isinstance(s, (int, float)) for s in ses) else None
  return {"winner": win["run_id"], "verdict": verdict, "margin": margin, "within_noise": noise}


def wider_vs_deeper(rows: list[dict], loss_rows: list[dict], law: laws.ParametricLaw,
                    flop_shape: Callable[[float], dict] | None = None,
                    warn: Callable[[str], None] = lambda m: None) -> dict:
  """Per time budget: the time-optimal run, the predicted optimum, the FLOP-optimal shape at
  the time-optimal run's FLOPs (C = 6·N·D; N_opt = law.optimal_allocation(C)[0], its shape from
  ``flop_shape(N_opt)`` when given), and loss vs aspect d_model/n_layers per N level with a
  verdict ("the shallowest/widest shape wins", "the deepest wins" or "mixed"); plus "answer"."""
  preds = {p["run_id"]: p for p in loss_rows}
  budgets = sorted({float(r["seconds_budget"]) for r in rows})
  out = []
  for T in budgets:
    sel = [r for r in rows if float(r["seconds_budget"]) == T]
    entries = [_entry(r, preds.get(r["run_id"])) for r in sel]
    best = min(entries, key=lambda e: e["loss"])
    with_pred = [e for e in entries if e["loss_pred"] is not None]
    best_pred = min(with_pred, key=lambda e: e["loss_pred"]) if with_pred else None
    C = next(float(r.get("C_6nd") or 6.0 * r["N"] * r["D"]) for r in sel
             if r["run_id"] == best["run_id"])
    n_opt, d_opt = (float(x) for x in law.optimal_allocation(C))
    flop = {"C": C, "N_opt": n_opt, "D_opt": d_opt, "shape": None}
    if flop_shape is not None:
      try:
        flop["shape"] = dict(flop_shape(n_opt))
      except (ValueError, TypeError, errors_lib.UserError) as e:
        warn(f"budget {T:g} s: no FLOP-optimal shape for N_opt {n_opt:.3g}: {e}")
    levels = []
    for level in sorted({float(r.get("N_target") or r["N"]) for r in sel}):
      es = sorted((e for e, r in zip(entries, sel) if float(r.get("N_target") or r["N"]) == level),
                  key=lambda e: e["aspect"])
      levels.append({"N_target": level, "runs": es, **_level_verdict(es)})
    compared = [lv["verdict"] for lv in levels if lv["verdict"] != "single depth"]
    verdict = ("no depth comparison (one depth per N level)" if not compared else
               "the shallowest/widest shape wins" if set(compared) == {"shallowest"} else
               "the deepest wins" if set(compared) == {"deepest"} else "mixed")
    out.append({"seconds_budget": T, "time_optimal": best, "predicted_optimal": best_pred,
                "predicted_optimum_is_measured": bool(best_pred and
                                                      best_pred["run_id"] == best["run_id"]),
                "flop_optimal": flop, "levels": levels, "verdict": verdict})
  return {"budgets": out, "answer": _answer([b["verdict"] for b in out])}


def _answer(verdicts: list[str]) -> str:
  k = len(verdicts)
  wide = verdicts.count("the shallowest/widest shape wins")
  deep = verdicts.count("the deepest wins")
  if k and wide == k:
    return (f"wider/shallower wins: at equal N and equal training time the shallowest shape "
            f"had the lowest loss on all {k} budgets")
  if k and deep == k:
    return f"deeper wins: the deepest shape had the lowest loss on all {k} budgets"
  return (f"mixed: the shallowest/widest shape won on {wide} of {k} budgets, the deepest on "
          f"{deep}, the others mixed or not compared")


def fit_isotime(results_path: str | os.PathLike, out_dir: str | os.PathLike | None, *,
                law_path: str | os.PathLike | None = None,
                flop_shape: Callable[[float], dict] | None = None,
                log: Callable[[str], None] | None = print,
                warn: Callable[[str], None] | None = print, figures: bool = True,
                grid: str | np.ndarray | None = None) -> dict:
  """Fits an IsoTime table and writes ``fit.json``, ``fit.md`` and the figures into ``out_dir``.

  Compares the step-time predictors of "Time Matters" (Inbar & Sernau 2024) leave-one-shape-
  out (:func:`analysis.isotime.steptime_cv.compare_predictors`), chooses by held-out MAPE (the simplest within 5% of the lowest),
  predicts each run's final loss (nats/token) from its shape and seconds with that predictor's
  held-out step time and the law, and tabulates wider vs deeper per time budget. Only done
  rows with budget_kind "seconds" and role != "validation" are used.

  Args:
    results_path: the IsoTime ladder's results.jsonl.
    out_dir: output folder (created); None: ``fit`` beside the table.
    law_path: a fit JSON with L(N, D) (e.g. a FLOP ladder's fit.json); None: Approach 3 fitted
      in-sample on the IsoTime runs.
    flop_shape: N -> {"d_model", "n_layers", "N", ...}: the shape rule's shape for the
      FLOP-optimal N (None: only N_opt is reported).
    log, warn: printers (None: silent).
    figures: write ``step_time_predictors.png`` and ``loss_vs_aspect.png``.
    grid: Approach 3's L-BFGS start grid (spec or (S, 5) array; None: Chinchilla's).
  Returns:
    The fit.json dict (module :mod:`analysis.isotime.report` lists its keys).
  Raises:
    ResultsError: not an IsoTime table, too few runs or shapes, a bad row.
    FitOptionError: an unusable ``law_path`` or grid. FitError: Approach 3 failed.
    PathError: ``out_dir`` cannot be written. Nothing is written when anything fails.
  """
  say, tell = log or (lambda m: None), warn or (lambda m: None)
  path = os.fspath(results_path)
  out = os.fspath(out_dir) if out_dir else default_out_dir(path)
  paths_lib.check_writable_dir(out, "fit output directory")
  rows, counts = grid_rows(path)
  if counts["untimed"]:
    tell(f"{len(counts['untimed'])} done run(s) have no measured step_time_s and are left out: "
         f"{', '.join(counts['untimed'][:5])}{' …' if len(counts['untimed']) > 5 else ''}")
  say(f"IsoTime table {path}: {len(rows)} finished grid runs ({counts['n_failed']} failed, "
      f"{counts['n_validation']} validation run(s) held out)")
  try:
    cv = steptime_cv.compare_predictors(rows, warn=tell)
  except ValueError as e:
    raise ResultsError(f"{path}: {e}") from None
  chosen = cv["chosen"]
  predictors = cv["predictors"]
  law, law_info = _law(rows, path, os.fspath(law_path) if law_path else None, grid)
  losses = predict_losses(rows, predictors[chosen]["heldout_predictions_s"], law)
  wvd = wider_vs_deeper(rows, losses["rows"], law, flop_shape, tell)
  section = steptime_cv.step_time_section(predictors, chosen, rows)
  for key in ("n_devices", "compute_dtype", "attention", "hardware"):
    if len({str(r.get(key)) for r in rows}) > 1:
      tell(f"the runs differ in {key}; the step_time section records {section[key]!r}")
  params = {k: float(getattr(law, k)) for k in ("E", "A", "B", "alpha", "beta")}
  term = ({"aspect_term": {"P": law.P, "kappa": law.kappa, "aspect0": law.aspect0}}
          if isinstance(law, laws.AspectLaw) else {})
  data = {"kind": "isotime", "source": path,
          "name": ("isotime-law" if not law_info["in_sample"] else "isotime-aspect-law"
                   if term else "isotime-approach3"),
          **params, **term, "fit_range_flops": law_info["fit_range_flops"],
          "law": {**params, **term, "from": law_info["from"], "in_sample": law_info["in_sample"],
                  "form": law_info.get("form", "plain"), "forms": law_info.get("forms")},
          "law_from": law_info["from"], "n_runs": len(rows), **counts,
          "n_shapes": cv["n_shapes"],
          "budgets_s": sorted({float(r["seconds_budget"]) for r in rows}),
          "runs": [report.run_summary(r) for r in rows],
          "predictors": predictors, "chosen_predictor": chosen, "step_time": section,
          "loss_prediction": {"predictor": chosen, **losses}, "wider_vs_deeper": wvd,
          "recipe": recipe_lib.table_recipe(path), "figures": []}
  data["units"] = recipe_lib.table_units(path, data["recipe"]).to_dict()
  report.write_outputs(data, out, figures=figures)
  p = predictors[chosen]
  say(f"step time: {chosen} predictor chosen, held-out MAPE {100 * p['heldout_mape']:.1f}% "
      + ", ".join(f"{k} {100 * v['heldout_mape']:.1f}%" for k, v in predictors.items()
                  if v["status"] == "ok" and k != chosen))
  if losses["median_abs_rel_error"] is not None:
    say(f"loss from shape and time ({law_info['from']}): median |error| "
        f"{100 * losses['median_abs_rel_error']:.2f}%, worst "
        f"{100 * losses['max_abs_rel_error']:.2f}% ({losses['worst_run_id']})")
  say(f"wider or deeper: {wvd['answer']}")
  say(f"wrote {os.path.join(out, 'fit.json')}, fit.md and {len(data['figures'])} figure(s)")
  return data


def add_isotime_validation(results_path: str | os.PathLike,
                           out_dir: str | os.PathLike | None = None, *,
                           log: Callable[[str], None] | None = print) -> dict | None:
  """Adds the table's done validation run (never fitted) to an IsoTime ``fit.json`` / ``fit.md``.

  The block: run_id, seconds_budget (s), shape, N, D (tokens), predicted_loss (the row's, from
  its planner), predicted_loss_fit (fit.json's law at D = floor(T / predicted_step_time_s) ·
  batch · seq_len), measured_loss (nats/token), rel_error = (measured − predicted) /
  predicted (and rel_error_fit), step times planned, predicted by the fit's step_time
  section and measured (s), train_time_s vs seconds_budget.

  Returns:
    The block, or None when the table has no done validation row.
  Raises:
    ResultsError: the table cannot be read. FitError: fit.json is missing or not an IsoTime fit.
  """
  path = os.fspath(results_path)
  out = os.fspath(out_dir) if out_dir else default_out_dir(path)
  rows = [r for r in read_rows(path) if r.get("budget_kind") == "seconds"
          and _is_validation(r) and r.get("status") == "done"]
  if not rows:
    return None
  row = rows[-1]
  json_path = os.path.join(out, "fit.json")
  try:
    with open(json_path) as f:
      data = json.load(f)
  except (OSError, ValueError) as e:
    raise FitError(f"cannot read {json_path} ({e}); fit {path} first") from None
  if data.get("kind") != "isotime":
    raise FitError(f"{json_path} is not an IsoTime fit; fit {path} first")
  law = laws.law_from_dict(data, name="fit")
  shape, gbs = steptime_cv.row_shape(row)
  T = float(row["seconds_budget"])
  measured = float(row["final_eval_loss"])
  planned_t = row.get("predicted_step_time_s") or row.get("step_time_planned_s")
  d_pred = (math.floor(T / planned_t) * gbs * shape.seq_len) if planned_t else None
  fit_loss = law_loss(law, row["N"], d_pred, shape.d_model / shape.n_layers) if d_pred else None
  predicted = row.get("predicted_loss")
  model = step_time_lib.model_from_dict(data["step_time"])
  rel = lambda a, b: (a - b) / b if a is not None and b else None  # noqa: E731
  block = {"run_id": row["run_id"], "seconds_budget": T, "shape": dict(row["shape"]),
           "global_batch_size": gbs, "N": row["N"], "D": row["D"],
           "predictor": row.get("predictor"),
           "predicted_loss": predicted, "predicted_loss_fit": fit_loss, "D_pred_fit": d_pred,
           "measured_loss": measured, "rel_error": rel(measured, predicted),
           "rel_error_fit": rel(measured, fit_loss),
           "step_time_planned_s": planned_t, "step_time_fit_s": model.predict(shape, gbs),
           "step_time_s": row.get("step_time_s"),
           "step_time_rel_error": rel(row.get("step_time_s"), planned_t),
           "train_time_s": row.get("train_time_s"),
           "train_time_rel": rel(row.get("train_time_s"), T)}
  data["validation"] = block
  report.write_outputs(data, out, figures=False)
  if log is not None and block["rel_error"] is not None:
    log(f"validation: run {block['run_id']} ({T:g} s): predicted loss {predicted:.4f}, measured "
        f"{measured:.4f} nats/token ({100 * block['rel_error']:+.2f}%)")
  return block
