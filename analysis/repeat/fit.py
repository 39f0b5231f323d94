"""Fitting the repetition laws of :mod:`chinchax.laws.repeat` to runs that repeat data.

The procedure (Approach 3 style, :mod:`analysis.isoflop.approach3`):

1. The base law L(N, D) = E + A/N^alpha + B/D^beta is Chinchilla's Approach 3 on the runs
   of one epoch or less (D <= U), or a law given by the caller (the fit's own Approach 3).
2. With the base fixed, each form's repetition parameters minimise the summed
   Huber_delta(ln L_pred − ln L) over ALL runs (delta = 1e-3, Chinchilla App. D.2), by
   L-BFGS-B from a small grid of starts: Muennighoff's R_D* and R_N* (in log space, within
   [:data:`R_STAR_BOUNDS`]), the additive form's P (within [0, :data:`P_MAX`]). That is the
   papers' two-stage procedure (Muennighoff et al. 2023, Sec. 3 and App.: the single-epoch
   law first, the decay constants with it held) and the default, :data:`BASE_MODES`
   "fixed"; "joint" adds one polish of base and terms together from there (:func:`fit_form`).
3. Intervals: residual bootstrap (fixed design; :mod:`analysis.isoflop.bootstrap`'s default): each
   replicate multiplies every run's predicted loss by exp(e), e drawn from that form's
   centred residuals in ln L, refits the base where the fit made it (a base fitted on this
   table's single-epoch runs is refitted on the replicate's, then held; "joint" polishes it
   with the terms; a given base stays) and the form from the full fit's optimum; 95%
   percentile intervals. A replicate that fails is counted by its reason, never raised.
   Profile-likelihood intervals beside them: :mod:`analysis.repeat.profile`.
4. Leave-one-unique-size-out: for each distinct U among the repeated runs (D > U), the form
   is refitted without that U's repeated runs and predicts them (a fixed base stays; "joint"
   polishes it again in each fold); the error is (predicted − measured) / measured. A fold
   that fails is recorded with its reason.

R_N* is not fitted at all when no run has excess parameters (N > N_opt(U_D)), and then N' = N.
Units: N parameters, D and U tokens, loss nats/token.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time

import numpy as np
import scipy.optimize

from chinchax.laws import parametric as laws
from chinchax.laws import repeat as lr
from analysis.isoflop import approach3
from analysis.blas import single_threaded_blas
from analysis.isoflop.bootstrap import CI_LEVEL, percentile_interval
from analysis.errors import FitError
from analysis.runs import Runs

EPOCH_TOL = 1e-6            # D / U <= 1 + this counts as one epoch
R_STAR_BOUNDS = (1e-2, 1e4)  # search box of R_D* and R_N*
P_MAX = 10.0                 # search box of P: [0, P_MAX]
_LOG_R_STARTS = np.log([1.0, 5.0, 15.0, 50.0, 300.0])
_P_STARTS = (1e-4, 1e-3, 1e-2, 0.1, 1.0)
BASE_MODES = ("fixed", "joint")  # the base held (two-stage, the default) or polished with the terms
# What a failed replicate or fold can raise: the fit's own errors and float trouble at a far point.
FIT_FAILURES = (FitError, ValueError, ArithmeticError, np.linalg.LinAlgError)


@dataclasses.dataclass
class RepeatRows:
  """The runs a repetition fit sees, shape (R,) each: N params, D tokens, U unique tokens
  (inf: fresh data), loss nats/token, run ids."""

  N: np.ndarray
  D: np.ndarray
  U: np.ndarray
  loss: np.ndarray
  run_id: tuple

  @property
  def epochs(self) -> np.ndarray:
    """D / U, shape (R,) (0 for fresh data)."""
    return self.D / self.U

  @property
  def repeated(self) -> np.ndarray:
    """Mask of runs with more than one epoch, shape (R,)."""
    return self.epochs > 1.0 + EPOCH_TOL

  def subset(self, mask) -> "RepeatRows":
    return RepeatRows(self.N[mask], self.D[mask], self.U[mask], self.loss[mask],
                      tuple(np.asarray(self.run_id, dtype=object)[mask]))

  @classmethod
  def from_runs(cls, runs: Runs) -> "RepeatRows":
    U = (np.full(len(runs), np.inf) if runs.unique_tokens is None
         else np.asarray(runs.unique_tokens, dtype=np.float64))
    return cls(runs.N, runs.D, U, runs.loss, runs.run_id)


def has_repetition(runs: Runs) -> bool:
  """Whether any run of ``runs`` trained more than one epoch (D > U)."""
  return runs.unique_tokens is not None and bool(RepeatRows.from_runs(runs).repeated.any())


def single_epoch(runs: Runs) -> Runs:
  """The single-epoch runs, for Approaches 1-3 and the base law: every run of one epoch or
  less (D <= U, or no U), whatever its unique set (Muennighoff et al. 2023, Sec. 3: no token
  repeats, so D' = D). A table whose single-epoch runs each record their own U (each read
  its data once) fits as a plain IsoFLOP table.

  (A sample of a few hundred thousand tokens sits a little above fresh data even read once:
  0.03–0.07 nats/token at 400k tokens of the stdlib corpus, docs/data-constrained.md; those
  runs count as single-epoch runs too, and that gap shows in the base's residuals.)
  """
  if runs.unique_tokens is None:
    return runs
  return runs.subset(np.flatnonzero(~RepeatRows.from_runs(runs).repeated))


def _huber(r: np.ndarray, delta: float) -> float:
  a = np.abs(r)
  return float(np.where(a <= delta, 0.5 * r * r, delta * (a - 0.5 * delta)).sum())


def make_law(form: str, base: laws.ParametricLaw, theta, fit_rn: bool = True) -> lr.RepeatLaw:
  """The law of ``form`` at parameters ``theta``: (ln R_D*[, ln R_N*]) or (P,)."""
  if form == "muennighoff":
    rn = math.exp(theta[1]) if fit_rn else None
    return lr.MuennighoffLaw(base=base, R_D_star=math.exp(theta[0]), R_N_star=rn,
                             name="fit-muennighoff", source="chinchax fit (Muennighoff form)")
  return lr.OverfitLaw(base=base, P=max(float(theta[0]), 0.0), name="fit-overfit",
                       source="chinchax fit (additive overfitting penalty, our form)")


def excess_params(base: laws.ParametricLaw, rows: RepeatRows) -> np.ndarray:
  """R_N = N / min(N, N_opt(min(U, D))) − 1 per run (Muennighoff's excess parameters)."""
  U_D = np.minimum(rows.U, rows.D)
  return rows.N / np.minimum(rows.N, np.asarray(lr.tokens_to_params(base, U_D))) - 1.0


BAD_OBJECTIVE = 1e30  # the objective at a trial point where the law is not finite


def _objective(form, base, rows, fit_rn, delta):
  logL = np.log(rows.loss)

  def f(theta):
    with np.errstate(all="ignore"):  # a trial step far out overflows; it is refused below
      pred = np.asarray(make_law(form, base, theta, fit_rn).loss(rows.N, rows.D, rows.U))
    if not np.all(np.isfinite(pred) & (pred > 0)):
      return BAD_OBJECTIVE
    return _huber(np.log(pred) - logL, delta)
  return f


def _base_theta(base: laws.ParametricLaw) -> list[float]:
  return [math.log(base.A), math.log(base.B), math.log(base.E), base.alpha, base.beta]


def _base_of(theta, name: str = "fit-base") -> laws.ParametricLaw:
  logA, logB, logE, alpha, beta = (float(v) for v in theta[:5])
  return laws.ParametricLaw(name=name, E=math.exp(logE), A=math.exp(logA), B=math.exp(logB),
                            alpha=alpha, beta=beta,
                            source="chinchax fit: base polished jointly with the repetition terms")


def _form_bounds(form: str, fit_rn: bool) -> list:
  lo, hi = math.log(R_STAR_BOUNDS[0]), math.log(R_STAR_BOUNDS[1])
  if form == "muennighoff":
    return [(lo, hi), (lo, hi)] if fit_rn else [(lo, hi)]
  if form == "overfit":
    return [(0.0, P_MAX)]
  raise ValueError(f"unknown form {form!r}; valid: {', '.join(lr.FORMS)}")


def _minimize(f, x0, bounds):
  with single_threaded_blas():
    return scipy.optimize.minimize(f, x0, method="L-BFGS-B", bounds=bounds,
                                   options={"ftol": 1e-15, "gtol": 1e-12, "maxiter": 2000})


def _joint_objective(form, base_name, rows, fit_rn, delta):
  logL = np.log(rows.loss)

  def f(theta):
    try:
      law = make_law(form, _base_of(theta, base_name), theta[5:], fit_rn)
    except (ValueError, ArithmeticError):
      return BAD_OBJECTIVE
    with np.errstate(all="ignore"):  # a trial step far out overflows; it is refused below
      pred = np.asarray(law.loss(rows.N, rows.D, rows.U))
    if not np.all(np.isfinite(pred) & (pred > 0)):
      return BAD_OBJECTIVE
    return _huber(np.log(pred) - logL, delta)
  return f


def fit_form(form: str, base: laws.ParametricLaw, rows: RepeatRows, *,
             delta: float = approach3.HUBER_DELTA, starts=None, joint: bool = False
             ) -> tuple[lr.RepeatLaw, np.ndarray]:
  """Fits one form's repetition parameters (module docstring, step 2).

  First with ``base`` fixed, from every start (the papers' two-stage procedure, the
  default); then, with ``joint``, one L-BFGS-B polish of the base's five parameters and the
  form's together over all runs from that optimum (the form's law holds the polished base).
  A reason to polish: Muennighoff's excess-parameter term acts at one epoch too (a run with
  N > N_opt(D)), so a plain Chinchilla base fitted on those runs is biased under it. A reason
  not to: the polished base bends toward the repeated runs (the additive form's, on a 23-run
  repeat ladder, went to alpha = 3, E = 0), and the decay constants then trade with it.

  Args:
    form: "muennighoff" or "overfit".
    base: the single-epoch law (the fixed base, and the polish's start).
    rows: the runs, shape (R,) each.
    delta: Huber threshold.
    starts: starts of the form's parameters, shape (S, k); None: the default grid.
    joint: polish base and form together (default: the base held fixed).

  Returns:
    (law, theta): the fitted law and theta = (ln A, ln B, ln E, alpha, beta) + the form's
    parameters ((ln R_D*[, ln R_N*]) or (P,)).

  Raises:
    FitError: no run repeats data, or no start gave a finite objective.
    ValueError: an unknown form.
  """
  if not rows.repeated.any():
    raise FitError("no run trains more than one epoch (D > unique_tokens): nothing to fit")
  fit_rn = fit_rn_for(form, base, rows)
  bounds = _form_bounds(form, fit_rn)
  if starts is None:
    if form == "muennighoff":
      starts = ([(a, b) for a in _LOG_R_STARTS for b in _LOG_R_STARTS] if fit_rn
                else [(a,) for a in _LOG_R_STARTS])
    else:
      starts = [(p,) for p in _P_STARTS]
  f = _objective(form, base, rows, fit_rn, delta)
  best_x, best_f = None, math.inf
  for x0 in np.atleast_2d(np.asarray(starts, dtype=np.float64)):
    res = _minimize(f, x0, bounds)
    if np.isfinite(res.fun) and res.fun < best_f:
      best_x, best_f = np.asarray(res.x, dtype=np.float64), float(res.fun)
  if best_x is None:
    raise FitError(f"the {form} form could not be fitted (no start gave a finite objective)")
  theta = np.concatenate([_base_theta(base), best_x])
  law_base = base
  if joint:
    g = _joint_objective(form, base.name, rows, fit_rn, delta)
    jb = [(-50.0, 50.0)] * 3 + [(0.01, 3.0)] * 2 + bounds
    res = _minimize(g, theta, jb)
    if np.isfinite(res.fun) and res.fun <= best_f:
      theta = np.asarray(res.x, dtype=np.float64)
      law_base = dataclasses.replace(_base_of(theta, base.name), units=base.units,
                                     fit_range_flops=base.fit_range_flops)
  return make_law(form, law_base, theta[5:], fit_rn), theta


def fit_rn_for(form: str, base: laws.ParametricLaw, rows: RepeatRows) -> bool:
  """Whether R_N* is fitted: Muennighoff's form and some run with excess parameters."""
  return form == "muennighoff" and bool((excess_params(base, rows) > EPOCH_TOL).any())


def _refit_base(base: laws.ParametricLaw, rows: RepeatRows,
                delta: float = approach3.HUBER_DELTA) -> laws.ParametricLaw:
  """``base`` refitted on the single-epoch runs of ``rows`` by L-BFGS from its own
  parameters (Approach 3's objective, one start: a bootstrap replicate's base)."""
  one = rows.subset(~rows.repeated)
  args = (np.log(one.N), np.log(one.D), np.log(one.loss), delta)
  with single_threaded_blas():
    res = scipy.optimize.minimize(approach3.huber_objective, np.asarray(_base_theta(base)),
                                  args=args, jac=True, method="L-BFGS-B")
  if not (res.x[3] > 0 and res.x[4] > 0):
    raise FitError("a bootstrap replicate's base has alpha or beta <= 0")
  return dataclasses.replace(_base_of(res.x, base.name), units=base.units,
                             fit_range_flops=base.fit_range_flops)


def failure_reason(e: BaseException) -> str:
  """A failure's kind and message without its numbers, so that like failures count together."""
  msg = re.sub(r"-?\d+(\.\d+)?(e[+-]?\d+)?", "…", str(e).split(" (")[0])
  return f"{type(e).__name__}: {msg}"[:160]


def _ci_of(samples: dict[str, list]) -> dict:
  out = {}
  for k, v in samples.items():
    v = [x for x in v if x is not None and math.isfinite(x)]
    out[k] = [float(x) for x in percentile_interval(v, CI_LEVEL)] if len(v) >= 2 else None
  return out


def bootstrap_form(form: str, rows: RepeatRows, law: lr.RepeatLaw, theta: np.ndarray,
                   n: int = 200, seed: int = 0, *, joint: bool = False,
                   refit_base: bool = True) -> dict:
  """Residual-bootstrap intervals of a form's parameters (module docstring, step 3).

  Args:
    form, rows, law, theta: the full fit (:func:`fit_form`).
    n: replicates; seed: their seed.
    joint: polish base and terms together in each replicate (as the full fit did).
    refit_base: with the base held fixed, refit it on each replicate's single-epoch runs
      first (a base this table fitted); False: the base stays (a given one).

  Returns:
    {"ci": {param: [lo, hi]}, "n_resamples", "n_failed", "failures" (reason -> count),
    "seed", "level", "method", "wall_time_s"}.
  """
  t0 = time.perf_counter()
  rng = np.random.default_rng(seed)
  pred = np.asarray(law.loss(rows.N, rows.D, rows.U))
  resid = np.log(pred) - np.log(rows.loss)
  resid = resid - resid.mean()
  samples: dict[str, list] = {k: [] for k in law.params()}
  failed, failures = 0, {}
  for _ in range(n):
    star = dataclasses.replace(rows, loss=pred * np.exp(rng.choice(resid, len(pred))))
    try:
      with np.errstate(all="ignore"):
        base = (_refit_base(law.base, star) if refit_base and not joint else law.base)
        fitted, _ = fit_form(form, base, star, starts=[theta[5:]], joint=joint)
    except FIT_FAILURES as e:
      failed += 1
      why = failure_reason(e)
      failures[why] = failures.get(why, 0) + 1
      continue
    for k, v in fitted.params().items():
      samples[k].append(v)
  what = ("base polished with the form" if joint else
          "base refitted on the single-epoch runs, then held" if refit_base else
          "the given base held")
  return {"ci": _ci_of(samples), "n_resamples": n, "n_failed": failed, "failures": failures,
          "seed": seed, "level": CI_LEVEL, "method": f"residuals (fixed design; {what})",
          "wall_time_s": round(time.perf_counter() - t0, 3)}


def leave_one_unique_out(form: str, base: laws.ParametricLaw, rows: RepeatRows,
                         theta: np.ndarray, joint: bool = False) -> dict:
  """Leave-one-unique-size-out prediction errors (module docstring, step 4).

  Returns:
    {"folds": [{"unique_tokens", "n_runs", "rel_errors": [...], "mean_abs_rel_error"}],
    "failed_folds": [{"unique_tokens", "reason"}], "rms_rel_error", "mean_abs_rel_error"}
    over all held-out runs (None with under 2 sizes or no fold fitted).
  """
  sizes = np.unique(rows.U[rows.repeated])
  folds, errs, failed = [], [], []
  for U in sizes:
    out = rows.repeated & np.isclose(rows.U, U, rtol=1e-9)
    train = rows.subset(~out)
    if not train.repeated.any():
      continue
    try:
      with np.errstate(all="ignore"):
        fitted, _ = fit_form(form, base, train, joint=joint)
    except FIT_FAILURES as e:
      failed.append({"unique_tokens": float(U), "reason": failure_reason(e)})
      continue
    held = rows.subset(out)
    pred = np.asarray(fitted.loss(held.N, held.D, held.U))
    e = (pred - held.loss) / held.loss
    errs += e.tolist()
    folds.append({"unique_tokens": float(U), "n_runs": int(out.sum()),
                  "rel_errors": [float(x) for x in e],
                  "mean_abs_rel_error": float(np.mean(np.abs(e)))})
  if not errs:
    return {"folds": [], "failed_folds": failed, "rms_rel_error": None,
            "mean_abs_rel_error": None,
            "note": ("every fold failed" if failed else
                     "fewer than 2 unique sizes among the repeated runs: nothing to hold out")}
  e = np.asarray(errs)
  return {"folds": folds, "failed_folds": failed, "rms_rel_error": float(np.sqrt(np.mean(e ** 2))),
          "mean_abs_rel_error": float(np.mean(np.abs(e)))}


def base_only_errors(base: laws.ParametricLaw, rows: RepeatRows) -> dict:
  """The base law's relative errors on the repeated runs (repetition ignored), as a reference."""
  held = rows.subset(rows.repeated)
  e = (np.asarray(base.loss(held.N, held.D)) - held.loss) / held.loss
  return {"rms_rel_error": float(np.sqrt(np.mean(e ** 2))),
          "mean_abs_rel_error": float(np.mean(np.abs(e)))}
