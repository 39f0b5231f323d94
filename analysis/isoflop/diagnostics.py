"""Warnings on a fit: where its numbers cannot be fully trusted, one line each.

* Approach 1: the envelope won mostly by the smallest or largest size.
* Approach 2: the known biases of IsoFLOP parabolas (wide or lopsided grids,
  large residuals, few sizes; Hoffmann et al. 2022 App. D, Besiroglu et al.
  2024, arXiv 2404.10102) and the budgets left out, with their reasons
  (:meth:`analysis.isoflop.approach2.Approach2Result.warnings`).
* Approach 3: an optimum outside the box of the start grid, a best optimum
  reached only from the grid's edge, no convergence, E's interval reaching 0.
* Any bootstrap: failed replicates, and budgets left out in some replicates.

:func:`approach_warnings` is what ``chinchax fit`` prints (``console.warn``)
and writes into ``fit.json`` and ``fit.md``.

:func:`agreement` is the fit's verdict on its approaches (``agreement`` in
``fit.json``, "Agreement" in ``fit.md``): Approaches 1 and 2, which both read
N_opt off the IsoFLOP data without a parametric form, agree when their
exponents a differ by at most :data:`AGREEMENT_TOL`; Approach 3 is judged by
its own form check (:func:`form_check`), not by agreement, since where its
form misses the runs its a follows the form and can differ from a faithful
pair of the other two.
"""

from __future__ import annotations

import numpy as np

from analysis.isoflop.approach3 import THETA_NAMES
from analysis.isoflop.bootstrap import BootstrapResult

EDGE_FRACTION_WARN = 0.5   # Approach 1: share of envelope points won by an extreme size
E_ZERO_FRACTION = 0.05     # Approach 3: E's lower bound below this share of E "reaches 0"
# Approach 3: warn when the law's RMS residual in ln L exceeds this multiple of the runs' scatter
# about their per-budget quadratics (analysis.isoflop.bootstrap.residual_pool's pooled s.d.).
FORM_MISFIT_RATIO = 2.0
AGREEMENT_TOL = 0.05       # Approaches 1 and 2 agree when their a differ by at most this


def form_check(res, scatter_sd: float | None) -> dict:
  """Approach 3's form check: its residuals against the runs' scatter.

  Args:
    res: an :class:`~analysis.isoflop.approach3.Approach3Result` (``residuals``: ln
      L_pred - ln L per run, shape (R,)).
    scatter_sd: the runs' scatter in ln L about per-budget quadratics in ln N
      (the pooled s.d. of :func:`analysis.isoflop.bootstrap.residual_pool`); None or
      not finite: not judged.

  Returns:
    {"residual_rms": RMS of the residuals in ln L, "scatter_sd", "ratio":
    their quotient, "limit": :data:`FORM_MISFIT_RATIO`, "holds": ratio <=
    limit (None when not judged)}.
  """
  rms = float(np.sqrt(np.mean(np.square(res.residuals)))) if res.residuals.size else float("nan")
  judged = scatter_sd is not None and np.isfinite(scatter_sd) and scatter_sd > 0
  ratio = rms / scatter_sd if judged else None
  return {"residual_rms": rms, "scatter_sd": float(scatter_sd) if judged else None,
          "ratio": ratio, "limit": FORM_MISFIT_RATIO,
          "holds": None if ratio is None or not np.isfinite(ratio) else
          bool(ratio <= FORM_MISFIT_RATIO)}


def _approach3_warnings(res, boot: BootstrapResult | None, scatter_sd: float | None) -> list[str]:
  out = []
  lo, hi = res.grid_box if res.grid_box is not None else (None, None)
  if not res.optimum_inside_grid:
    outside = ""
    if lo is not None:
      outside = ", ".join(f"{n} = {v:.3g} not in [{a:.3g}, {b:.3g}]"
                          for n, v, a, b in zip(THETA_NAMES, res.theta, lo, hi) if not a <= v <= b)
    out.append(f"the optimum lies outside the box of the start grid ({outside}): a grid that "
               f"covers it (--grid) would check that no better optimum exists")
  if res.best_start_on_grid_edge and res.n_interior_starts_at_best == 0:
    out.append("only starts on the grid's edge reached the best optimum; a wider grid of starts "
               "might find a better one")
  if not res.converged:
    out.append(f"L-BFGS did not report convergence from the best start ({res.n_iter} "
               f"iterations)")
  form = form_check(res, scatter_sd)
  if form["holds"] is False:
    rms, sd = form["residual_rms"], form["scatter_sd"]
    out.append(f"the law misses the runs by {rms:.2g} in ln L (RMS), {rms / sd:.1f}x their "
               f"scatter about the IsoFLOP quadratics ({sd:.2g}): the form E + A/N^alpha + "
               f"B/D^beta does not hold to the runs' precision over this grid, so where its a "
               f"differs from Approaches 1 and 2 the difference is the form's"
               + (", and a residual-bootstrap interval (which resamples only that scatter) is "
                  "too narrow" if boot is not None and boot.resampling == "residuals" else ""))
  if boot is not None and "E" in boot.ci:
    e_lo, e_hi = boot.ci["E"]
    if np.isfinite(e_lo) and e_lo < E_ZERO_FRACTION * res.E:
      out.append(f"the {100 * boot.level:g}% interval of E reaches 0 ([{e_lo:.3g}, "
                 f"{e_hi:.3g}]): the data do not determine the irreducible loss")
  return out


def outside_interval(res, boot: BootstrapResult | None) -> str | None:
  """When the fit's own exponent a lies outside its bootstrap interval (a sign that few
  replicates were fitted, or that they fit something else): a short note with the interval and
  the number of replicates fitted; else None."""
  if boot is None or "a" not in boot.ci:
    return None
  a = res.params()["a"]
  lo, hi = boot.ci["a"]
  if not (np.isfinite(lo) and np.isfinite(hi)) or lo <= a <= hi:
    return None
  n_ok = boot.n_resamples - boot.n_failed
  return (f"a = {a:.4f} lies outside its own 95% interval [{lo:.4f}, {hi:.4f}], from "
          f"{n_ok} of {boot.n_resamples} bootstrap replicates fitted")


def _bootstrap_warnings(boot: BootstrapResult | None, res=None) -> list[str]:
  if boot is None:
    return []
  out = []
  outside = outside_interval(res, boot) if res is not None else None
  if "fell back to resampling runs" in (boot.method or ""):
    out.append(boot.method.split(": ", 1)[0].replace("; fell back", ", so the bootstrap fell "
                                                     "back"))
  if outside:
    out.append(f"the point estimate {outside}: the interval does not describe this fit; "
               f"more resamples (--bootstrap) or a denser table would")
  below, above = getattr(boot, "bounds_dropped", (0, 0))
  if below or above:
    lo, hi = boot.ci.get("a", (float("nan"), float("nan")))
    side = (f"{above} above 1, so its upper end {hi:.4f} is cut short" if above and not below
            else f"{below} at or below 0, so its lower end {lo:.4f} is cut short" if below
            and not above else f"{below} at or below 0 and {above} at or above 1: both ends "
            f"are cut short")
    out.append(f"the interval of a is truncated by the bounds rule: {below + above} of "
               f"{boot.n_resamples} replicates fitted a outside (0, 1) (N_opt or D_opt would "
               f"shrink as C grows) and were dropped, {side}")
  if boot.n_failed:
    why = "; ".join(f"{n}x {msg}" for msg, n in sorted(boot.failures.items(),
                                                      key=lambda kv: -kv[1])[:3])
    out.append(f"{boot.n_failed} of {boot.n_resamples} bootstrap resamples could not be fitted "
               f"and are left out of the intervals ({why})")
  if boot.budgets_left_out:
    n_ok = boot.n_resamples - boot.n_failed
    which = ", ".join(f"{C:.3g} ({n} of {n_ok})" for C, n in sorted(boot.budgets_left_out.items()))
    out.append(f"budgets used in the fit were left out of some bootstrap resamples, where their "
               f"minimum was not bracketed or not determined: C = {which}")
  return out


def approach_warnings(key: str, res, boot: BootstrapResult | None = None,
                      scatter_sd: float | None = None) -> list[str]:
  """The warnings on one approach's fit and bootstrap, one sentence each.

  Args:
    key: "1", "2" or "3".
    res: that approach's result.
    boot: its bootstrap, or None.
    scatter_sd: the runs' scatter in ln L about per-budget quadratics in ln N
      (:func:`analysis.isoflop.bootstrap.residual_pool`), against which Approach 3's
      residuals are judged; None: not judged.

  Returns:
    Warnings, possibly none.
  """
  out: list[str] = []
  if key == "1" and res.edge_fraction > EDGE_FRACTION_WARN:
    out.append(f"{100 * res.edge_fraction:.0f}% of the envelope is won by the smallest or the "
               f"largest model size: the sizes may not bracket the optimum")
  elif key == "2":
    out += res.warnings()
  elif key == "3":
    out += _approach3_warnings(res, boot, scatter_sd)
  return out + _bootstrap_warnings(boot, res)


def agreement(results: dict, scatter_sd: float | None) -> dict:
  """The fit's agreement criterion: Approaches 1 and 2 within :data:`AGREEMENT_TOL` in a,
  Approach 3 by its form check.

  Args:
    results: approach key ("1", "2", "3") -> its result (those fitted).
    scatter_sd: the runs' scatter in ln L (:func:`form_check`).

  Returns:
    {"criterion": the rule in words, "tolerance": :data:`AGREEMENT_TOL`,
    "approach1_2": {"a1", "a2", "abs_delta_a", "agree"} or None when either is
    missing, "approach3_form": :func:`form_check` plus "a" and
    "abs_delta_a_to_1_2" (|a3 - mean of a1, a2|, for information, not judged),
    or None without Approach 3}.
  """
  out: dict = {"criterion": (f"Approaches 1 and 2 agree when |a1 - a2| <= {AGREEMENT_TOL:g}; "
                             f"Approach 3 is judged by its form check (RMS of its residuals in "
                             f"ln L at most {FORM_MISFIT_RATIO:g}x the runs' scatter about the "
                             f"IsoFLOP quadratics), not by agreement"),
               "tolerance": AGREEMENT_TOL, "approach1_2": None, "approach3_form": None}
  a = {k: float(r.params()["a"]) for k, r in results.items()}
  if "1" in a and "2" in a:
    d = abs(a["1"] - a["2"])
    out["approach1_2"] = {"a1": a["1"], "a2": a["2"], "abs_delta_a": d,
                          "agree": bool(d <= AGREEMENT_TOL)}
  if "3" in results:
    form = form_check(results["3"], scatter_sd)
    others = [a[k] for k in ("1", "2") if k in a]
    form.update(a=a["3"], abs_delta_a_to_1_2=abs(a["3"] - float(np.mean(others)))
                if others else None)
    out["approach3_form"] = form
  return out


def agreement_markdown(block: dict | None) -> list[str]:
  """The "Agreement" section of ``fit.md`` from :func:`agreement`'s dict (no lines without
  one, as in a ``fit.json`` written before it existed)."""
  if not block or (block["approach1_2"] is None and block["approach3_form"] is None):
    return []
  lines = ["## Agreement", "", f"Criterion: {block['criterion']}.", ""]
  p = block["approach1_2"]
  if p is not None:
    verdict = "agree" if p["agree"] else "DISAGREE"
    lines.append(f"- Approaches 1 and 2: a = {p['a1']:.4f} and {p['a2']:.4f}, |Δa| = "
                 f"{p['abs_delta_a']:.4f} {'≤' if p['agree'] else '>'} {block['tolerance']:g}: "
                 f"{verdict}.")
  else:
    lines.append("- Approaches 1 and 2: not both fitted; agreement not judged.")
  f = block["approach3_form"]
  if f is not None:
    gap = ("" if f["abs_delta_a_to_1_2"] is None else
           f"; a = {f['a']:.4f}, {f['abs_delta_a_to_1_2']:.4f} from Approaches 1-2 (not judged)")
    if f["holds"] is None:
      lines.append(f"- Approach 3's form: residual RMS {f['residual_rms']:.3g} in ln L; the runs' "
                   f"scatter is not measured (no budget with 4+ sizes), so not judged{gap}.")
    else:
      verdict = ("holds to the runs' precision" if f["holds"] else
                 "does NOT hold to the runs' precision")
      lines.append(f"- Approach 3's form: residual RMS {f['residual_rms']:.3g} in ln L, "
                   f"{f['ratio']:.1f}x the runs' scatter ({f['scatter_sd']:.3g}; limit "
                   f"{f['limit']:g}x): the form {verdict}{gap}.")
  return lines + [""]
