"""The validation run: a held-out run at a larger budget that tests the fitted law.

A ladder's ``validation`` row (``"role": "validation"`` in ``results.jsonl``)
is never fitted. After the fit, the law the report gives (the same one
``chinchax plan --law fit.json`` reads: Approach 3's L(N, D) when it was
fitted, :func:`chinchax.laws.parametric.law_from_dict`) predicts that run's final eval
loss at its exact N and D, and the prediction is compared with the measured
loss: ``rel_error = (measured − predicted) / predicted``. This is the
out-of-sample check of Hoffmann et al. 2022 (Sec. 3.4 / Table 3, where the
fitted law's allocation is trained as Chinchilla and its loss compared).
"""

from __future__ import annotations

from chinchax.laws import parametric as laws


def validation_block(data: dict, row: dict) -> dict:
  """The ``validation`` section of ``fit.json`` for one held-out run.

  Args:
    data: the fit's JSON dict (:func:`analysis.report.report_dict`).
    row: the validation run's results row (N, D, C_budget, final_eval_loss).
  Returns:
    {run_id, C (FLOPs), N (parameters), D (tokens), N_opt (the law's optimal
    N at C), law (which section of the fit), predicted_loss, measured_loss
    (nats/token), measured_se (the standard error of the measured loss over its eval windows;
    None when the run has none), rel_error, note}. ``predicted_loss`` and ``rel_error`` are
    None when the fit has no loss law (Approaches 1/2 give only N_opt).
  """
  N, D = float(row["N"]), float(row["D"])
  C = float(row.get("C_budget") or 6.0 * N * D)
  measured = float(row["final_eval_loss"])
  se = row.get("final_eval_loss_se")
  out = {"run_id": row.get("run_id"), "C": C, "N": N, "D": D, "N_opt": None, "law": None,
         "predicted_loss": None, "measured_loss": measured,
         "measured_se": float(se) if se is not None else None, "rel_error": None, "note": ""}
  try:
    law = laws.law_from_dict(data, name="fit")
  except ValueError as e:
    out["note"] = f"no fitted law to test: {e}"
    return out
  out["law"] = data.get("law_from") or ("approach2" if "approach2" in data else "approach1")
  out["N_opt"] = float(law.optimal_allocation(C)[0])
  if isinstance(law, laws.ParametricLaw):
    predicted = float(law.loss(N, D))
    out["predicted_loss"] = predicted
    out["rel_error"] = (measured - predicted) / predicted
  else:
    out["note"] = "the fit has no L(N, D) (Approach 3 was not fitted): no loss prediction"
  return out


def markdown(block: dict) -> list[str]:
  """The fit.md lines of a ``validation`` section."""
  lines = ["## Validation run (held out, not fitted)", ""]
  lines.append(f"Run `{block['run_id']}`: C = {block['C']:.3g} FLOPs, N = {block['N']:,.0f} "
               f"params, D = {block['D']:,.0f} tokens"
               + (f" (the law's N_opt at this C: {block['N_opt']:,.0f})."
                  if block.get("N_opt") else "."))
  if block.get("predicted_loss") is not None:
    se = block.get("measured_se")
    lines.append(f"Predicted final eval loss {block['predicted_loss']:.4f}, measured "
                 f"{block['measured_loss']:.4f}" + (f" ± {se:.4f} (s.e.)" if se else "")
                 + f" nats/token: relative error {100 * block['rel_error']:+.2f}% "
                 f"(law: {block['law']}).")
  else:
    lines.append(f"Measured final eval loss {block['measured_loss']:.4f} nats/token; "
                 f"{block.get('note', '')}.")
  lines.append("")
  return lines


def is_validation(row: dict) -> bool:
  """Whether a results row is a held-out validation run (never fitted)."""
  return row.get("role") == "validation"
