"""L(N, D) or L(N, D, aspect): which law an IsoTime ladder's losses support, by leave-one-out.

An IsoTime ladder trains ≈ equal N at several depths, so its runs can tell whether the
loss depends on the shape beyond N and D. Two forms are fitted to the grid runs' final
losses (nats/token):

* ``plain``: Chinchilla's L = E + A / N^alpha + B / D^beta (Hoffmann et al. 2022, eq. 2);
* ``aspect``: the same plus P · (r / 64)^kappa, r = d_model / n_layers
  (:class:`chinchax.laws.parametric.AspectLaw`): a penalty that grows with the aspect ratio.

Both minimise the summed Huber loss (delta 1e-3) of ln L_pred − ln L, as Chinchilla's
Approach 3 does (App. D.2), with scipy's bounded least squares from the in-sample
Approach 3 optimum (and a few starts of the shape term). Each form is refitted without
each run in turn and predicts it (leave-one-run-out); the shape term is kept only when it
lowers the held-out runs' median |relative error| (the median: one fold that leaves out the
widest run extrapolates the term, and should not decide alone), so the extra two parameters
must earn their place out of sample. On shape-free synthetic runs the term it does keep by
chance is below 0.01 nats over the runs' aspect ratios (tests/test_aspect_law.py).
"""

from __future__ import annotations

import numpy as np
from scipy import optimize

from chinchax.laws import parametric as laws

HUBER_DELTA = 1e-3  # Chinchilla App. D.2
ASPECT0 = 64.0
FORMS = ("plain", "aspect")
_KAPPA_STARTS = (1.0, 2.0, 3.0)
_P_STARTS = (1e-3, 3e-2)


def _predict(theta: np.ndarray, N, D, aspect, form: str) -> np.ndarray:
  logA, logB, logE, alpha, beta = theta[:5]
  out = np.exp(logE) + np.exp(logA - alpha * np.log(N)) + np.exp(logB - beta * np.log(D))
  if form == "aspect":
    out = out + np.exp(theta[5] + theta[6] * np.log(aspect / ASPECT0))
  return out


def _fit(N, D, aspect, loss, form: str, start: laws.ParametricLaw) -> np.ndarray:
  """theta = (logA, logB, logE, alpha, beta[, logP, kappa]) minimising the summed Huber loss."""
  base = [np.log(start.A), np.log(start.B), np.log(max(start.E, 1e-3)), start.alpha, start.beta]
  starts = [base] if form == "plain" else [base + [np.log(p), k] for p in _P_STARTS
                                           for k in _KAPPA_STARTS]
  lo = [-20.0, -20.0, -10.0, 1e-3, 1e-3] + ([-30.0, 1e-3] if form == "aspect" else [])
  hi = [40.0, 40.0, 5.0, 4.0, 4.0] + ([5.0, 8.0] if form == "aspect" else [])
  best = None
  for x0 in starts:
    x0 = np.clip(np.asarray(x0, dtype=np.float64), np.asarray(lo) + 1e-9,
                 np.asarray(hi) - 1e-9)
    res = optimize.least_squares(
        lambda th: np.log(_predict(th, N, D, aspect, form)) - np.log(loss), x0,
        loss="huber", f_scale=HUBER_DELTA, bounds=(lo, hi))
    if best is None or res.cost < best.cost:
      best = res
  return best.x


def _law(theta: np.ndarray, form: str, name: str, fit_range) -> laws.ParametricLaw:
  kw = dict(name=name, E=float(np.exp(theta[2])), A=float(np.exp(theta[0])),
            B=float(np.exp(theta[1])), alpha=float(theta[3]), beta=float(theta[4]),
            source="IsoTime fit (summed Huber on ln L, leave-one-out form choice)",
            fit_range_flops=fit_range)
  if form == "plain":
    return laws.ParametricLaw(**kw)
  return laws.AspectLaw(**kw, P=float(np.exp(theta[5])), kappa=float(theta[6]), aspect0=ASPECT0)


def choose_law(N, D, aspect, loss, start: laws.ParametricLaw, *, name: str = "isotime-law",
               fit_range=None) -> tuple[laws.ParametricLaw, dict]:
  """Fits both forms to runs (arrays of shape (R,): parameters, tokens, d_model / n_layers,
  final loss in nats/token) and keeps the shape term when it lowers the leave-one-out median
  |error|.

  Args:
    start: the in-sample Approach 3 law (the fits' start).
  Returns:
    (law, info): a :class:`chinchax.laws.parametric.ParametricLaw` or :class:`chinchax.laws.parametric.AspectLaw`;
    info = {"form", "forms": {form: {"loo_median_abs_rel_error", "loo_max_abs_rel_error",
    "in_sample_median_abs_rel_error", "params"}}}.
  """
  N, D, aspect, loss = (np.asarray(x, dtype=np.float64) for x in (N, D, aspect, loss))
  forms = {}
  for form in FORMS:
    theta = _fit(N, D, aspect, loss, form, start)
    loo = []
    for i in range(len(loss)):
      keep = np.arange(len(loss)) != i
      th = _fit(N[keep], D[keep], aspect[keep], loss[keep], form, start)
      loo.append(float(_predict(th, N[i], D[i], aspect[i], form) / loss[i] - 1.0))
    law = _law(theta, form, name, fit_range)
    ins = _predict(theta, N, D, aspect, form) / loss - 1.0
    params = {k: getattr(law, k) for k in ("E", "A", "B", "alpha", "beta")}
    if form == "aspect":
      params.update(P=law.P, kappa=law.kappa, aspect0=law.aspect0)
    forms[form] = {"law": law, "loo_median_abs_rel_error": float(np.median(np.abs(loo))),
                   "loo_max_abs_rel_error": float(np.max(np.abs(loo))),
                   "in_sample_median_abs_rel_error": float(np.median(np.abs(ins))),
                   "params": params}
  plain, shaped = (forms[f]["loo_median_abs_rel_error"] for f in FORMS)
  chosen = "aspect" if shaped < plain else "plain"
  law = forms[chosen]["law"]
  info = {"form": chosen, "forms": {f: {k: v for k, v in forms[f].items() if k != "law"}
                                    for f in FORMS}}
  return law, info
