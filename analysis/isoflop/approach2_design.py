"""Approach 2 refitted on a fixed design: an alternative for its bootstrap replicates.

The full fit (:func:`analysis.isoflop.approach2.fit_approach2`) chooses, from the
observed losses, which budgets to use (the lowest observed loss at an interior
size, the vertex inside the fitted sizes, the curvature significant) and, with
a window, which sizes each parabola is fitted on (those near the lowest
observed loss). By default every bootstrap replicate makes those choices
again (:func:`analysis.isoflop.bootstrap.bootstrap`), so a budget whose minimum lies
near the edge of its sizes is left out of many replicates: on a published
12-budget table with ``--window 3`` the largest budgets were left out of
109-160 of 200 replicates.

:func:`refit_on_design` instead takes the full fit's choices as the design:
every replicate fits a parabola on the same sizes of the same budgets and
takes its vertex whether or not the replicate's own lowest loss is interior
(the fixed-design bootstrap of a regression whose regressors were chosen
before resampling; Davison & Hinkley 1997, "Bootstrap Methods and their
Application", Sec. 6.2-6.3). A budget is still left out of a replicate, and
counted, when its parabola has no minimum (p2 <= 0) or its vertex lies more
than 100x outside its sizes.

Measured on synthetic ladders from a known law (``benchmarks/coverage.py
--fixed-design``; docs/fitting.md, "Are the intervals honest?"), the fixed design keeps
nearly every budget in every replicate but gives wider intervals than
repeating the choices: 1.43x the spread of the full fit's a over ladders
where optima sit near the grids' ends, against 1.20x: the replicates then keep
vertices they extrapolate, which the full fit would have dropped. It is
therefore not the default (``bootstrap(..., fixed_design=True)``).

Units: N parameters, D tokens, C FLOPs, loss nats/token.
"""

from __future__ import annotations

import math

import numpy as np

from analysis.isoflop.approach2 import (_VERTEX_SHOWN, Approach2Result, BudgetParabola,
                                fit_approach2)
from analysis.errors import ApproachUnsupported
from analysis.isoflop.powerlaw import fit_allocation
from analysis.runs import Runs, tokens_6nd


def design_parabola(full: BudgetParabola, runs: Runs) -> BudgetParabola:
  """Refits one budget of the full fit on the same sizes (a bootstrap replicate's parabola).

  Args:
    full: a usable budget of the full fit (status "ok"), whose ``N_fitted``
      range gives the sizes to fit.
    runs: the replicate's runs (any budgets; those at ``full.C`` within
      ``full.N_fitted`` are fitted, with ``runs.weight`` when present).

  Returns:
    A :class:`~analysis.isoflop.approach2.BudgetParabola`: "ok" with the parabola's
    vertex (inside the fitted sizes or not); "too-few-sizes" with fewer than 3
    distinct sizes (a resample of runs can drop some); "no-minimum" when
    p2 <= 0; "edge" when the vertex lies more than 100x outside the sizes.
  """
  lo, hi = full.N_fitted
  sel = (runs.budget == full.C) & (runs.N >= lo * (1 - 1e-9)) & (runs.N <= hi * (1 + 1e-9))
  N, y = runs.N[sel], runs.loss[sel]
  sizes = np.unique(N)
  nan = float("nan")
  base = dict(C=full.C, n_runs=int(sel.sum()), n_sizes=int(sizes.size),
              N_range=full.N_range, n_sizes_fitted=int(sizes.size), N_fitted=full.N_fitted)
  if sizes.size < 3:
    return BudgetParabola(**base, coeffs=None, N_opt=nan, D_opt=nan, loss_opt=nan,
                          status="too-few-sizes",
                          reason=f"{sizes.size} distinct N in the replicate (a parabola needs 3)")
  x = np.log(N)
  w = None if runs.weight is None else np.sqrt(runs.weight[sel])
  p2, p1, p0 = (float(v) for v in np.polyfit(x, y, 2, w=w))
  if not (math.isfinite(p1) and math.isfinite(p2) and p2 > 0):
    return BudgetParabola(**base, coeffs=(p2, p1, p0), N_opt=nan, D_opt=nan, loss_opt=nan,
                          status="no-minimum", reason="the replicate's parabola has no minimum")
  x_opt = -p1 / (2.0 * p2)
  margin = math.log(_VERTEX_SHOWN)
  if not float(x.min()) - margin < x_opt < float(x.max()) + margin:
    return BudgetParabola(**base, coeffs=(p2, p1, p0), N_opt=nan, D_opt=nan, loss_opt=nan,
                          status="edge",
                          reason="the replicate's vertex lies more than 100x outside the sizes")
  n_opt = math.exp(x_opt)
  return BudgetParabola(**base, coeffs=(p2, p1, p0), N_opt=n_opt, D_opt=tokens_6nd(full.C, n_opt),
                        loss_opt=p0 - p1 * p1 / (4.0 * p2), status="ok")


def refit_on_design(runs: Runs, full: Approach2Result, min_budgets: int = 3) -> Approach2Result:
  """Approach 2 on a bootstrap replicate, with the full fit's budgets and sizes as the design.

  Each budget the full fit used is refitted by :func:`design_parabola`
  (same sizes, no re-selection by the replicate's lowest loss, no flatness or
  noise-floor test); budgets the full fit left out stay out. N_opt = k_N C^a
  and D_opt = k_D C^b are then fitted over the refitted budgets as in
  :func:`analysis.isoflop.approach2.fit_approach2`.

  Args:
    runs: the replicate's runs (the full fit's N, D and budgets for residual
      resampling; a resample of them for run resampling).
    full: the full-data :class:`~analysis.isoflop.approach2.Approach2Result`.
    min_budgets: fewest refitted budgets for the power-law fit.

  Returns:
    An :class:`~analysis.isoflop.approach2.Approach2Result` whose ``budgets`` are the
    full fit's used budgets, refitted ("ok") or left out in this replicate.

  Raises:
    ApproachUnsupported: fewer than ``min_budgets`` budgets refitted.
  """
  parabolas = [design_parabola(p, runs) for p in full.used]
  usable = [p for p in parabolas if p.status == "ok"]
  if len(usable) < min_budgets:
    raise ApproachUnsupported(f"Approach 2 needs at least {min_budgets} budgets with a minimum; "
                              f"{len(usable)} of the full fit's {len(parabolas)} have one in "
                              f"this replicate")
  C = np.array([p.C for p in usable])
  k_N, a, k_D, b = fit_allocation(C, np.array([p.N_opt for p in usable]),
                                  np.array([p.D_opt for p in usable]), "Approach 2")
  return Approach2Result(budgets=parabolas, k_N=k_N, a=a, k_D=k_D, b=b, window=full.window,
                         noise_floor=full.noise_floor)


def refit_like(runs: Runs, full: Approach2Result, fixed_design: bool = True) -> Approach2Result:
  """A replicate's Approach 2 fit: :func:`refit_on_design` with ``fixed_design``, else the
  full procedure of :func:`~analysis.isoflop.approach2.fit_approach2` with the full fit's window."""
  if fixed_design:
    return refit_on_design(runs, full)
  return fit_approach2(runs, window=full.window)
