"""Profile-likelihood intervals for a Huber (or least-squares) fit in ln L.

A parameter's profile is the fit's objective f with that parameter held at a value v and every
other parameter re-optimised, f_p(v). Its interval at level q is the set of v where the
statistic

    S(v) = 2 · lambda · (f_p(v) − f_min)

stays at or below the chi-square quantile chi2_1(q) (3.84 at 95%).

Calibration, lambda: for the Huber objective sum_i rho_delta(r_i) with psi = rho' = clip(r, ±delta),
the drop-in-dispersion statistic of Schrader & Hettmansperger 1980 ("Robust analysis of variance
based upon a likelihood ratio criterion", Biometrika 67, 93-101) is 2·Δf · mean(psi') /
(sum psi(r_i)² / (n − p)), asymptotically chi2_1 under the restriction. For least squares
(every |r| <= delta) psi' = 1 and this is 2·Δf / sigma², sigma² = RSS / (n − p): the chi-square
on the residual-variance-scaled objective. With residuals mostly past delta (near-L1) the
fraction of residuals within delta, mean(psi'), is a density estimate near zero, so it is
smoothed: mean_i [Phi((delta − r_i)/h) − Phi((−delta − r_i)/h)] with Silverman's bandwidth
h = 1.06 · sd(r) · n^(-1/5).

An end of the interval that reaches the edge of the search box (the statistic never rises past
the threshold on that side) is open: the parameter is then "not identified by these data", and
the range the profile covers is reported instead of an interval. An end marked ``hard`` is a
limit of the parameter itself (P >= 0: no penalty), where the interval may close.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import scipy.optimize
import scipy.stats

CI_LEVEL = 0.95
N_GRID = 29          # profile points across the search box (plus the optimum)
RTOL = 1e-6          # the ends' relative accuracy, in the profiled coordinate
N_ZOOM = 9           # extra points across a narrow interval (twice its width), for the figure


def threshold(level: float = CI_LEVEL) -> float:
  """chi2_1 quantile at ``level`` (3.841 at 0.95)."""
  return float(scipy.stats.chi2.ppf(level, 1))


def calibration(resid: np.ndarray, delta: float, n_params: int) -> dict:
  """lambda of the module docstring from the full fit's residuals in ln L.

  Args:
    resid: residuals ln L_pred − ln L at the optimum, shape (R,).
    delta: the Huber threshold (inf: least squares).
    n_params: free parameters of the fit (p in n − p).

  Returns:
    {"scale": lambda, "inside_delta": smoothed fraction of |r| <= delta, "dof": n − p,
    "text": the calibration in words}; scale is None with no residual dof.
  """
  r = np.asarray(resid, dtype=np.float64)
  dof = r.size - n_params
  psi = np.clip(r, -delta, delta)
  var_psi = float(np.sum(psi ** 2)) / dof if dof > 0 else 0.0
  sd = float(np.std(r, ddof=1)) if r.size > 1 else 0.0
  h = 1.06 * sd * r.size ** -0.2
  if h > 0:
    inside = float(np.mean(scipy.stats.norm.cdf((delta - r) / h)
                           - scipy.stats.norm.cdf((-delta - r) / h)))
  else:
    inside = float(np.mean(np.abs(r) <= delta))
  scale = inside / var_psi if var_psi > 0 and inside > 0 else None
  text = (f"chi2_1 on 2·lambda·Δ(Huber objective), lambda = mean psi' / (sum psi² / (n − p)) = "
          f"{inside:.3g} / {var_psi:.3g} (Schrader & Hettmansperger 1980; {dof} residual dof, "
          f"{100 * inside:.0f}% of residuals within delta = {delta:g})")
  return {"scale": scale, "inside_delta": inside, "dof": int(dof), "text": text}


def profile(value_hat: float, f_hat: float, restricted: Callable, start, box: tuple,
            *, scale: float, level: float = CI_LEVEL, hard: tuple = (False, False),
            n_grid: int = N_GRID, to_natural: Callable = float) -> dict:
  """One parameter's profile and its interval (module docstring).

  Args:
    value_hat: the parameter at the fit's optimum, in the profiled coordinate (e.g. ln R*).
    f_hat: the objective there.
    restricted: (v, start) -> (f, others): the objective minimised over the other parameters
      with this one held at v, from ``start`` (their values at a neighbouring point).
    start: the other parameters at the optimum.
    box: (lo, hi) of the profiled coordinate (the fit's search box).
    scale: lambda of :func:`calibration`.
    level: confidence level.
    hard: per end, whether it is a limit of the parameter itself (the interval may close on
      it) rather than of the search.
    n_grid: grid points across ``box``.
    to_natural: the profiled coordinate -> the parameter (e.g. math.exp).

  Returns:
    {"estimate", "interval" [lo, hi] (None unless identified), "covered" [lo, hi] (the
    values within the threshold: the interval, or the range up to the box's edge),
    "identified", "open" [low, high], "level", "threshold", "grid", "statistic" (with
    :data:`N_ZOOM` more points across an interval narrower than two grid steps)} in the
    parameter's natural units; "better_optimum" when the profile found a lower objective
    than the fit's (the statistic is taken from the lower).
  """
  lo_box, hi_box = box
  grid = np.unique(np.concatenate([np.linspace(lo_box, hi_box, n_grid),
                                   [min(max(value_hat, lo_box), hi_box)]]))
  i0 = int(np.argmin(np.abs(grid - value_hat)))
  f = np.full(grid.size, np.inf)
  others: list = [None] * grid.size
  for direction in (1, -1):  # outward from the optimum, each point started from its neighbour
    s = start
    idx = range(i0, grid.size) if direction == 1 else range(i0, -1, -1)
    for i in idx:
      fi, oi = restricted(float(grid[i]), s)
      if math.isfinite(fi) and fi < f[i]:
        f[i], others[i] = fi, oi
      s = others[i] if others[i] is not None else s
  f_min = min(f_hat, float(np.min(f)))
  thr = threshold(level)
  stat = 2.0 * scale * (f - f_min)
  best = int(np.argmin(f))
  inside = stat <= thr
  j_lo = best
  while j_lo > 0 and inside[j_lo - 1]:
    j_lo -= 1
  j_hi = best
  while j_hi < grid.size - 1 and inside[j_hi + 1]:
    j_hi += 1

  def end(j_in: int, j_out: int) -> float:
    g = lambda v: 2.0 * scale * (restricted(v, others[j_in])[0] - f_min) - thr
    a, b = float(grid[j_in]), float(grid[j_out])
    try:
      return float(scipy.optimize.brentq(g, a, b, xtol=1e-12, rtol=RTOL))
    except ValueError:  # no sign change on the refined profile: the grid's linear crossing
      sa, sb = stat[j_in] - thr, stat[j_out] - thr
      return a + (b - a) * sa / (sa - sb) if sa != sb else b

  open_lo = j_lo == 0 and not hard[0]
  open_hi = j_hi == grid.size - 1 and not hard[1]
  v_lo = float(grid[0]) if j_lo == 0 else end(j_lo, j_lo - 1)
  v_hi = float(grid[-1]) if j_hi == grid.size - 1 else end(j_hi, j_hi + 1)
  covered = [to_natural(v_lo), to_natural(v_hi)]
  identified = not (open_lo or open_hi)
  step = (hi_box - lo_box) / max(n_grid - 1, 1)
  if v_hi - v_lo < 2 * step:  # a narrow interval: points across it, for the figure
    w = max(v_hi - v_lo, 1e-9 * max(abs(v_lo), 1.0))
    extra = np.clip(np.linspace(v_lo - w, v_hi + w, N_ZOOM), lo_box, hi_box)
    f_extra = np.array([restricted(float(v), others[best])[0] for v in extra])
    grid = np.concatenate([grid, extra])
    stat = np.concatenate([stat, 2.0 * scale * (f_extra - f_min)])
    order = np.argsort(grid, kind="stable")
    grid, stat = grid[order], stat[order]
  out = {"estimate": to_natural(value_hat), "interval": covered if identified else None,
         "covered": covered, "identified": identified, "open": [open_lo, open_hi],
         "level": level, "threshold": thr,
         "grid": [to_natural(v) for v in grid],
         "statistic": [float(x) if math.isfinite(x) else None for x in stat]}
  if f_min < f_hat - 1e-12 * max(abs(f_hat), 1.0):
    out["better_optimum"] = to_natural(float(grid[best]))
  return out


def describe(name: str, prof: dict, fmt: str = ".4g") -> str:
  """One phrase: "R_D* in [lo, hi] (95% profile)" or "R_D*: not identified by these data
  (profile within the 95% threshold over [lo, hi], open at the box's upper end)"."""
  lo, hi = prof["covered"]
  pct = f"{100 * prof['level']:g}%"
  if prof["identified"]:
    return f"{name} in [{lo:{fmt}}, {hi:{fmt}}] ({pct} profile)"
  ends = " and ".join(side for side, o in zip(("lower", "upper"), prof["open"]) if o)
  return (f"{name}: not identified by these data ({pct} profile within the threshold over "
          f"[{lo:{fmt}}, {hi:{fmt}}], open at the search box's {ends} end)")
