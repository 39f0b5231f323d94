"""Profile-likelihood intervals of the repetition constants (:mod:`analysis.profile`).

For each of a form's parameters (Muennighoff's ln R_D*, ln R_N*; the additive form's P) the
Huber objective of :func:`analysis.repeat.fit.fit_form` is minimised over the form's other
parameters (and, for a "joint" fit, the base's five) with that one held on a grid across its
search box (:data:`analysis.repeat.fit.R_STAR_BOUNDS`, [0, P_MAX]). A constant whose profile
stays within the threshold to the box's edge is not identified by the table: on a flat ridge a
bootstrap interval of a few units can still come out (each replicate stops somewhere on the
ridge), the profile says how far the ridge runs.
Units: R* in repetitions (dimensionless), P dimensionless.
"""

from __future__ import annotations

import math

import numpy as np

from analysis import profile as pl
from analysis.isoflop import approach3
from analysis.repeat import fit as fr
from chinchax.laws import repeat as lr

_JOINT_BASE_BOUNDS = [(-50.0, 50.0)] * 3 + [(0.01, 3.0)] * 2


def _names(form: str, fit_rn: bool) -> list[str]:
  if form == "muennighoff":
    return ["R_D_star", "R_N_star"] if fit_rn else ["R_D_star"]
  return ["P"]


def profile_form(form: str, base, rows: fr.RepeatRows, law: lr.RepeatLaw, theta: np.ndarray,
                 *, joint: bool = False, level: float = pl.CI_LEVEL,
                 delta: float = approach3.HUBER_DELTA, n_grid: int = pl.N_GRID) -> dict:
  """Profiles of every fitted parameter of one form.

  Args:
    form: "muennighoff" or "overfit".
    base: the base the fit started from (held when not ``joint``).
    rows: the runs fitted, shape (R,) each.
    law, theta: the fit (:func:`analysis.repeat.fit.fit_form`).
    joint: re-optimise the base's five parameters too at every point (a "joint" fit).
    level: confidence level.
    delta: the Huber threshold of the fit.
    n_grid: grid points across each box.

  Returns:
    {"calibration": {...}, param: :func:`analysis.profile.profile`'s dict, ...}.
  """
  fit_rn = fr.fit_rn_for(form, base, rows)
  names = _names(form, fit_rn)
  k = len(names)
  bounds = fr._form_bounds(form, fit_rn)
  theta = np.asarray(theta, dtype=np.float64)
  if joint:
    full_bounds = _JOINT_BASE_BOUNDS + bounds
    f_full = fr._joint_objective(form, base.name, rows, fit_rn, delta)
    x_hat = theta.copy()
  else:
    full_bounds = bounds
    f_full = fr._objective(form, base, rows, fit_rn, delta)
    x_hat = theta[5:].copy()
  off = 5 if joint else 0
  f_hat = float(f_full(x_hat))
  with np.errstate(all="ignore"):
    resid = np.log(np.asarray(law.loss(rows.N, rows.D, rows.U))) - np.log(rows.loss)
  cal = pl.calibration(resid, delta, len(x_hat))
  out: dict = {"calibration": {kk: v for kk, v in cal.items()}, "level": level,
               "base": "re-optimised at every point" if joint else "held fixed"}
  if cal["scale"] is None:
    out["note"] = "no residual degrees of freedom: no profile"
    return out
  for j, name in enumerate(names):
    idx = off + j
    rest = [i for i in range(len(x_hat)) if i != idx]
    rest_bounds = [full_bounds[i] for i in rest]

    def restricted(v, start, idx=idx, rest=rest, rest_bounds=rest_bounds):
      def g(y):
        x = np.empty(len(x_hat))
        x[idx] = v
        x[rest] = y
        return f_full(x)
      if not rest:
        return g(np.empty(0)), np.empty(0)
      res = fr._minimize(g, np.asarray(start, dtype=np.float64), rest_bounds)
      return float(res.fun), np.asarray(res.x, dtype=np.float64)

    log = form == "muennighoff"
    out[name] = pl.profile(float(x_hat[idx]), f_hat, restricted, x_hat[rest],
                           tuple(full_bounds[idx]), scale=cal["scale"], level=level,
                           hard=(not log, False), n_grid=n_grid,
                           to_natural=math.exp if log else float)
  return out


def profile_lines(form: str, prof: dict) -> list[str]:
  """One phrase per profiled parameter (:func:`analysis.profile.describe`)."""
  return [pl.describe(name, p) for name, p in prof.items()
          if isinstance(p, dict) and "covered" in p]


def unidentified(prof: dict | None) -> dict:
  """{param: [lo, hi] covered} for each parameter whose profile is open at an end."""
  return {name: p["covered"] for name, p in (prof or {}).items()
          if isinstance(p, dict) and "covered" in p and not p["identified"]}
