"""Loading results tables into :class:`Runs`.

Two formats are read:

* JSONL written by the ladder runner: one JSON object per line with at least
  ``run_id``, ``status`` ("done" | "failed"), ``N`` (total parameters), ``D``
  (tokens) and ``final_eval_loss`` (nats/token); optionally ``C_budget`` (the
  IsoFLOP budget, FLOPs), ``C_6nd``, ``eval_curve`` ([[flops_seen,
  eval_loss], ...], used by Approach 1), ``final_eval_loss_se`` (the standard
  error of the final eval loss over its eval windows, nats/token; null or
  absent: not measured), ``eval_windows`` (how many windows) and
  ``unique_tokens`` (the unique tokens the run's D tokens were drawn from; D /
  unique_tokens epochs; absent: fresh data). Failed rows are counted, not fitted.
* CSV with columns ``N``, ``loss`` and ``D`` or ``C`` (FLOPs; then
  D = C / (6N), Chinchilla Sec. 3's C = 6ND). Epoch AI's column names
  (``Model Size``, ``Training FLOP``, ``loss``) are accepted too. Optional
  columns: ``C_budget``, ``run_id``, ``status``, ``weight`` (per-run weight in
  the fits, >= 0; JSONL rows may carry ``weight`` too), ``final_eval_loss_se``
  (or ``loss_se``; empty: not measured), ``eval_windows`` and ``unique_tokens`` (or ``U``,
  ``Unique Tokens``; empty: fresh data), as in JSONL.

Every problem (missing column, unparsable, NaN or non-positive value,
duplicated run, empty table, too few IsoFLOP budgets) raises
:class:`ResultsError` naming the file, the line and the column.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
from typing import Sequence

import numpy as np

from analysis import validation as validation_lib
from analysis.errors import ResultsError
from analysis.runs import Runs, check_curve, flops_6nd, runs_from_arrays, tokens_6nd

# Column aliases for CSV input: canonical name -> accepted header names.
_CSV_ALIASES = {
    "N": ("N", "Model Size", "params", "n_params"),
    "D": ("D", "tokens", "Training Tokens"),
    "C": ("C", "Training FLOP", "C_6nd", "flops"),
    "loss": ("loss", "final_eval_loss", "Loss"),
    "C_budget": ("C_budget", "budget"),
    "run_id": ("run_id",),
    "status": ("status",),
    "weight": ("weight",),
    "loss_se": ("final_eval_loss_se", "loss_se"),
    "eval_windows": ("eval_windows",),
    "unique_tokens": ("unique_tokens", "U", "Unique Tokens", "unique tokens"),
}


def _optional(value, path: str, line: int, column: str, default: float) -> float:
  """An optional non-negative column: ``default`` when absent, null or empty."""
  if value is None or (isinstance(value, str) and not value.strip()):
    return default
  return _number(value, path, line, column, positive=False)


def load_results(path: str, *, min_budgets: int = 3) -> Runs:
  """Loads a results table (ladder JSONL or CSV) and validates it.

  Args:
    path: a ``.jsonl``/``.json`` file from the ladder runner, or a ``.csv``
      (other extensions are sniffed: a first character ``{`` means JSONL).
    min_budgets: fewest distinct IsoFLOP budgets accepted (a scaling law needs
      at least 3 points along C).

  Returns:
    The finished runs.

  Raises:
    ResultsError: a missing file or column, an unparsable, NaN or non-positive
      value, a duplicated run, no finished runs, or fewer than ``min_budgets``
      budgets. The message names the file, line and column.
  """
  if os.path.isdir(path):
    inside = os.path.join(path, "results.jsonl")
    hint = (f"give its table, {inside}" if os.path.isfile(inside) else
            "give a results table: a ladder's results.jsonl or a CSV with N, loss and D or C")
    raise ResultsError(f"results file {path!r} is a directory; {hint}")
  if not os.path.isfile(path):
    raise ResultsError(f"results file {path!r} does not exist")
  with open(path, newline="") as f:
    text = f.read()
  if not text.strip():
    raise ResultsError(f"results file {path!r} is empty")
  ext = os.path.splitext(path)[1].lower()
  if ext in (".jsonl", ".json", ".ndjson") or (ext != ".csv" and text.lstrip().startswith("{")):
    runs = _parse_jsonl(text, path)
  else:
    runs = _parse_csv(text, path)
  n_budgets = len(runs.budgets())
  if n_budgets < min_budgets:
    listed = ", ".join(f"{b:.3g}" for b in runs.budgets())
    raise ResultsError(f"{path}: only {n_budgets} IsoFLOP budget(s) ({listed} FLOPs) among "
                       f"{len(runs)} finished runs; fitting a scaling law needs at least "
                       f"{min_budgets}")
  return runs


def _number(value, path: str, line: int, column: str, *, positive: bool = True) -> float:
  try:
    x = float(value)
  except (TypeError, ValueError):
    raise ResultsError(f"{path}:{line}: column {column!r} is not a number: {value!r}") from None
  if math.isnan(x):
    raise ResultsError(f"{path}:{line}: column {column!r} is NaN")
  if not math.isfinite(x) or (positive and x <= 0):
    raise ResultsError(f"{path}:{line}: column {column!r} must be finite and > 0, got {x!r}")
  return x


def json_rows(text: str, path: str):
  """Yields (line number, row) for each non-blank line of a JSONL results table's ``text``
  (``path`` names it in errors); every row is a JSON object with a ``run_id``.

  Raises:
    ResultsError: a line that is not valid JSON, not an object, or has no run_id.
  """
  for line_no, raw in enumerate(text.splitlines(), start=1):
    if not raw.strip():
      continue
    try:
      row = json.loads(raw)
    except json.JSONDecodeError as e:
      raise ResultsError(f"{path}:{line_no}: not valid JSON ({e.msg})") from None
    if not isinstance(row, dict):
      raise ResultsError(f"{path}:{line_no}: each line must be a JSON object")
    if "run_id" not in row:
      raise ResultsError(f"{path}:{line_no}: missing column 'run_id'")
    yield line_no, row


def _parse_jsonl(text: str, path: str) -> Runs:
  N, D, loss, budget, ids, curves, weights = [], [], [], [], [], [], []
  ses, windows, uniques = [], [], []
  seen: dict[str, int] = {}
  seen_config: dict[tuple, int] = {}
  n_failed = 0
  any_budget = None
  all_curves = True
  held_out = []
  for line_no, row in json_rows(text, path):
    rid = str(row["run_id"])
    if rid in seen:
      raise ResultsError(f"{path}:{line_no}: duplicated run {rid!r} (first on line {seen[rid]}); "
                         f"a results table must have exactly one row per run")
    seen[rid] = line_no
    status = row.get("status", "done")
    if status == "failed":
      n_failed += 1
      continue
    if status != "done":
      raise ResultsError(f"{path}:{line_no}: run {rid!r} has status {status!r}; expected 'done' "
                         f"or 'failed'")
    for col in ("N", "D", "final_eval_loss"):
      if col not in row or row[col] is None:
        raise ResultsError(f"{path}:{line_no}: run {rid!r} is missing column {col!r}")
    if validation_lib.is_validation(row):  # held out: tests the fit, never part of it
      held_out.append(row)
      continue
    n = _number(row["N"], path, line_no, "N")
    d = _number(row["D"], path, line_no, "D")
    l = _number(row["final_eval_loss"], path, line_no, "final_eval_loss")
    has_b = row.get("C_budget") is not None
    if any_budget is None:
      any_budget = has_b
    elif any_budget != has_b:
      raise ResultsError(f"{path}:{line_no}: run {rid!r}: column 'C_budget' is present on some "
                         f"rows and missing on others")
    b = _number(row["C_budget"], path, line_no, "C_budget") if has_b else flops_6nd(n, d)
    u = (math.inf if row.get("unique_tokens") is None else
         _number(row["unique_tokens"], path, line_no, "unique_tokens"))
    config = (round(math.log(b), 6), int(round(n)), round(math.log(d), 6),
              round(math.log(u), 6) if math.isfinite(u) else None)
    if config in seen_config:
      raise ResultsError(f"{path}:{line_no}: duplicated run: {rid!r} repeats the (C_budget, N, D, "
                         f"unique_tokens) of the run on line {seen_config[config]}")
    seen_config[config] = line_no
    curve = row.get("eval_curve")
    if curve:
      try:
        curves.append(check_curve(curve, f"{path}:{line_no}", rid))
      except (TypeError, ValueError) as e:
        raise ResultsError(str(e)) from None
    else:
      all_curves = False
      curves.append(None)
    weights.append(None if row.get("weight") is None else
                   _number(row["weight"], path, line_no, "weight", positive=False))
    ses.append(_optional(row.get("final_eval_loss_se"), path, line_no, "final_eval_loss_se",
                         math.nan))
    windows.append(_optional(row.get("eval_windows"), path, line_no, "eval_windows", 0))
    N.append(n)
    D.append(d)
    loss.append(l)
    budget.append(b)
    ids.append(rid)
    uniques.append(u)
  if not N:
    raise ResultsError(f"{path}: no finished runs to fit ({n_failed} failed)")
  budget_arr = np.asarray(budget) if any_budget else None
  runs = runs_from_arrays(N, D, loss, budget=budget_arr, run_id=ids,
                          curves=curves if all_curves else None, source=path, n_failed=n_failed,
                          weight=_weights(weights, path), **_noise_columns(ses, windows))
  unique = np.asarray(uniques) if any(math.isfinite(u) for u in uniques) else None
  return dataclasses.replace(runs, held_out=tuple(held_out), unique_tokens=unique)


def _noise_columns(ses: list, windows: list) -> dict:
  """``loss_se`` and ``eval_windows`` for :func:`runs_from_arrays` (None when no row has one)."""
  return {"loss_se": np.asarray(ses) if any(math.isfinite(v) for v in ses) else None,
          "eval_windows": np.asarray(windows) if any(v > 0 for v in windows) else None}


def _weights(weights: list, path: str) -> np.ndarray | None:
  """Per-run weights: None when no row has one; every row must have one otherwise."""
  if all(w is None for w in weights):
    return None
  if any(w is None for w in weights):
    raise ResultsError(f"{path}: column 'weight' is present on some rows and missing on others")
  return np.asarray(weights, dtype=np.float64)


def _find_column(header: Sequence[str], name: str) -> str | None:
  for alias in _CSV_ALIASES[name]:
    if alias in header:
      return alias
  return None


def _parse_csv(text: str, path: str) -> Runs:
  reader = csv.DictReader(text.splitlines())
  header = [h.strip() for h in (reader.fieldnames or [])]
  reader.fieldnames = header
  cols = {name: _find_column(header, name) for name in _CSV_ALIASES}
  for required in ("N", "loss"):
    if cols[required] is None:
      raise ResultsError(f"{path}: missing column {required!r} (accepted names: "
                         f"{', '.join(_CSV_ALIASES[required])}); the header is {header}")
  if cols["D"] is None and cols["C"] is None:
    raise ResultsError(f"{path}: missing column 'D' or 'C' (tokens, or FLOPs with D = C/(6N)); "
                       f"the header is {header}")
  N, D, loss, budget, ids, weights = [], [], [], [], [], []
  ses, windows, uniques = [], [], []
  seen_ids: dict[str, int] = {}
  seen_rows: dict[tuple, int] = {}
  n_failed = 0
  for line_no, row in enumerate(reader, start=2):
    if not any((v or "").strip() for v in row.values()):
      continue
    if cols["status"] and (row.get(cols["status"]) or "").strip() == "failed":
      n_failed += 1
      continue
    n = _number(row.get(cols["N"]), path, line_no, cols["N"])
    if cols["D"] is not None:
      d = _number(row.get(cols["D"]), path, line_no, cols["D"])
    else:
      d = tokens_6nd(_number(row.get(cols["C"]), path, line_no, cols["C"]), n)
    l = _number(row.get(cols["loss"]), path, line_no, cols["loss"])
    if cols["run_id"]:
      rid = (row.get(cols["run_id"]) or "").strip()
      if rid in seen_ids:
        raise ResultsError(f"{path}:{line_no}: duplicated run {rid!r} (first on line "
                           f"{seen_ids[rid]})")
      seen_ids[rid] = line_no
    else:
      rid = f"line{line_no}"
    key = (n, d, l)
    if key in seen_rows:
      raise ResultsError(f"{path}:{line_no}: duplicated run: same N, D and loss as line "
                         f"{seen_rows[key]}")
    seen_rows[key] = line_no
    if cols["C_budget"]:
      budget.append(_number(row.get(cols["C_budget"]), path, line_no, cols["C_budget"]))
    if cols["weight"]:
      weights.append(_number(row.get(cols["weight"]), path, line_no, cols["weight"],
                             positive=False))
    ses.append(_optional(row.get(cols["loss_se"]) if cols["loss_se"] else None, path, line_no,
                         cols["loss_se"], math.nan))
    windows.append(_optional(row.get(cols["eval_windows"]) if cols["eval_windows"] else None,
                             path, line_no, cols["eval_windows"], 0))
    u = (row.get(cols["unique_tokens"]) or "").strip() if cols["unique_tokens"] else ""
    uniques.append(_number(u, path, line_no, cols["unique_tokens"]) if u else math.inf)
    N.append(n)
    D.append(d)
    loss.append(l)
    ids.append(rid)
  if not N:
    raise ResultsError(f"{path}: no runs to fit (the table has a header but no data rows"
                       f"{f', {n_failed} failed' if n_failed else ''})")
  runs = runs_from_arrays(N, D, loss, budget=np.asarray(budget) if cols["C_budget"] else None,
                          run_id=ids, source=path, n_failed=n_failed,
                          weight=np.asarray(weights) if cols["weight"] else None,
                          **_noise_columns(ses, windows))
  unique = np.asarray(uniques) if any(math.isfinite(u) for u in uniques) else None
  return dataclasses.replace(runs, unique_tokens=unique)


def write_results_jsonl(runs: Runs, path: str, failed: Sequence[str] = ()) -> None:
  """Writes ``runs`` as a ladder-style JSONL results table (plus failed rows).

  Only the fields the fitters read are written (run_id, status, C_budget, N,
  D, C_6nd, final_eval_loss, final_eval_loss_se and eval_windows where known,
  eval_curve); ``failed`` adds rows with status
  "failed" and those run ids.
  """
  with open(path, "w") as f:
    for i in range(len(runs)):
      row = {"run_id": runs.run_id[i], "status": "done", "C_budget": float(runs.budget[i]),
             "N": int(round(runs.N[i])), "D": float(runs.D[i]), "C_6nd": float(runs.C[i]),
             "final_eval_loss": float(runs.loss[i])}
      if runs.weight is not None:
        row["weight"] = float(runs.weight[i])
      if runs.loss_se is not None and math.isfinite(runs.loss_se[i]):
        row["final_eval_loss_se"] = float(runs.loss_se[i])
      if runs.eval_windows is not None and runs.eval_windows[i] > 0:
        row["eval_windows"] = int(runs.eval_windows[i])
      if runs.curves is not None:
        row["eval_curve"] = runs.curves[i].tolist()
      f.write(json.dumps(row) + "\n")
    for rid in failed:
      f.write(json.dumps({"run_id": rid, "status": "failed"}) + "\n")


def save_figure_atomic(fig, path: str, **savefig_kw) -> None:
  """``fig.savefig(path, **savefig_kw)`` written to ``path.tmp-PID`` and renamed: a reader (or a
  full disk) never sees a truncated figure, and a failed write leaves no file. The format comes
  from ``path``'s extension unless ``format`` is given.

  Raises:
    OSError: the write failed (the temporary file is removed first).
  """
  fmt = savefig_kw.pop("format", None) or os.path.splitext(path)[1].lstrip(".")
  tmp = f"{path}.tmp-{os.getpid()}"
  try:
    fig.savefig(tmp, format=fmt, **savefig_kw)
    os.replace(tmp, path)
  except BaseException:
    try:
      os.remove(tmp)
    except OSError:
      pass
    raise
