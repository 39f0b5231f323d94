"""Warnings on a fit: where its numbers cannot be fully trusted, one line each.

* Approach 1: the envelope won mostly by the smallest or largest size.
* Approach 2: the known biases of IsoFLOP parabolas (wide or lopsided grids,
  large residuals, few sizes; Hoffmann et al. 2022 App. D, Besiroglu et al.
  2024, arXiv 2404.10102) and the budgets left out, with their reasons
  (:meth:`analysis.approach2.Approach2Result.warnings`).
* Approach 3: an optimum outside the box of the start grid, a best optimum
  reached only from the grid's edge, no convergence, E's interval reaching 0.
* Any bootstrap: failed replicates, and budgets left out in some replicates.

:func:`approach_warnings` is what ``chinchax fit`` prints (``console.warn``)
and writes into ``fit.json`` and ``fit.md``.
"""

from __future__ import annotations

import numpy as np

from analysis.approach3 import THETA_NAMES
from analysis.bootstrap import BootstrapResult

EDGE_FRACTION_WARN = 0.5   # Approach 1: share of envelope points won by an extreme size
E_ZERO_FRACTION = 0.05     # Approach 3: E's lower bound below this share of E "reaches 0"
# Approach 3: warn when the law's RMS residual in ln L exceeds this multiple of the runs' scatter
# about their per-budget quadratics (analysis.bootstrap.residual_pool's pooled s.d.).
FORM_MISFIT_RATIO = 2.0


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
  sd = scatter_sd     # the runs' scatter in ln L; None: not judged
  if sd is not None and np.isfinite(sd) and sd > 0 and res.residuals.size:
    rms = float(np.sqrt(np.mean(np.square(res.residuals))))
    if rms > FORM_MISFIT_RATIO * sd:
      out.append(f"the law misses the runs by {rms:.2g} in ln L (RMS), {rms / sd:.1f}x their "
                 f"scatter about the IsoFLOP quadratics ({sd:.2g}): the form E + A/N^alpha + "
                 f"B/D^beta does not hold to the runs' precision over this grid, so where its a "
                 f"differs from Approaches 1 and 2 the difference is the form's, and a residual-"
                 f"bootstrap interval (which resamples only that scatter) is too narrow")
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
  if outside:
    out.append(f"the point estimate {outside}: the interval does not describe this fit; "
               f"more resamples (--bootstrap) or a denser table would")
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
      (:func:`analysis.bootstrap.residual_pool`), against which Approach 3's
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
