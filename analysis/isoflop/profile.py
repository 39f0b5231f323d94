"""Profile-likelihood intervals of Approach 3's exponents a = beta / (alpha + beta) and
b = alpha / (alpha + beta) = 1 − a (:mod:`analysis.profile`).

a is held on a grid across (0, 1) by writing alpha = (1 − a)·s, beta = a·s and minimising
Chinchilla's Huber objective (:func:`analysis.isoflop.approach3.huber_objective`, its analytic
gradient carried through the substitution: df/ds = (1 − a)·df/dalpha + a·df/dbeta) over
(ln A, ln B, ln E, s) by L-BFGS-B, each point started from its neighbour's optimum. b's
profile is a's mirrored. Units: a and b dimensionless.
"""

from __future__ import annotations

import numpy as np
import scipy.optimize

from analysis import profile as pl
from analysis.blas import single_threaded_blas
from analysis.isoflop import approach3

A_BOX = (0.02, 0.98)                 # a's search box (a in (0, 1): N_opt and D_opt grow with C)
_FREE_BOUNDS = [(-50.0, 50.0)] * 3 + [(1e-3, 10.0)]  # ln A, ln B, ln E, s = alpha + beta


def profile_a(res, runs, *, delta: float = approach3.HUBER_DELTA, asymmetry: float = 1.0,
              level: float = pl.CI_LEVEL, n_grid: int = pl.N_GRID) -> dict:
  """Profiles of Approach 3's a and b.

  Args:
    res: the Approach-3 result (its ``theta`` = (ln A, ln B, ln E, alpha, beta)).
    runs: the runs it was fitted on (``runs.weight`` used as the fit did).
    delta, asymmetry: the fit's loss (:func:`analysis.isoflop.approach3.huber_objective`).
    level: confidence level.
    n_grid: grid points across :data:`A_BOX`.

  Returns:
    {"calibration", "a": profile dict, "b": the same mirrored}; {"note"} without residual
    degrees of freedom.
  """
  logN, logD, logL = np.log(runs.N), np.log(runs.D), np.log(runs.loss)
  w = runs.weight
  theta = np.asarray(res.theta, dtype=np.float64)
  f_hat = approach3.huber_objective(theta, logN, logD, logL, delta, w, asymmetry)[0]
  logA, logB, logE, alpha, beta = theta
  pred = np.logaddexp(np.logaddexp(logA - alpha * logN, logB - beta * logD), logE)
  cal = pl.calibration(pred - logL, delta, 5)
  if cal["scale"] is None:
    return {"calibration": cal, "note": "no residual degrees of freedom: no profile"}

  def restricted(a, start):
    def g(y):
      t = np.array([y[0], y[1], y[2], (1.0 - a) * y[3], a * y[3]])
      f, grad = approach3.huber_objective(t, logN, logD, logL, delta, w, asymmetry)
      return f, np.array([grad[0], grad[1], grad[2], (1.0 - a) * grad[3] + a * grad[4]])
    with single_threaded_blas(), np.errstate(all="ignore"):
      r = scipy.optimize.minimize(g, np.asarray(start, dtype=np.float64), jac=True,
                                  method="L-BFGS-B", bounds=_FREE_BOUNDS,
                                  options={"ftol": 1e-15, "gtol": 1e-12, "maxiter": 2000})
    return (float(r.fun) if np.isfinite(r.fun) else np.inf), np.asarray(r.x)

  a_hat = beta / (alpha + beta)
  start = np.array([logA, logB, logE, alpha + beta])
  prof = pl.profile(float(a_hat), float(f_hat), restricted, start, A_BOX, scale=cal["scale"],
                    level=level, n_grid=n_grid)
  mirror = {"estimate": 1.0 - prof["estimate"],
            "interval": None if prof["interval"] is None else [1.0 - prof["interval"][1],
                                                                 1.0 - prof["interval"][0]],
            "covered": [1.0 - prof["covered"][1], 1.0 - prof["covered"][0]],
            "identified": prof["identified"], "open": prof["open"][::-1],
            "level": level, "threshold": prof["threshold"],
            "grid": [1.0 - x for x in prof["grid"][::-1]],
            "statistic": prof["statistic"][::-1]}
  return {"calibration": cal, "a": prof, "b": mirror}
