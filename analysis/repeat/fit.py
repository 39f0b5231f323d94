"""Fitting the repetition laws of :mod:`chinchax.laws.repeat` to runs that repeat data.

The procedure (Approach 3 style, :mod:`analysis.isoflop.approach3`):

1. The base law L(N, D) = E + A/N^alpha + B/D^beta is Chinchilla's Approach 3 on the runs
   of one epoch or less (D <= U), or a law given by the caller (the fit's own Approach 3).
2. With the base fixed, each form's repetition parameters minimise the summed
   Huber_delta(ln L_pred − ln L) over ALL runs (delta = 1e-3, Chinchilla App. D.2), by
   L-BFGS-B from a small grid of starts: Muennighoff's R_D* and R_N* (in log space, within
   [:data:`R_STAR_BOUNDS`]), the additive form's P (within [0, :data:`P_MAX`]); then, for
   Muennighoff's form, one polish of base and terms together from there (:func:`fit_form`).
3. Intervals: residual bootstrap (fixed design; :mod:`analysis.isoflop.bootstrap`'s default): each
   replicate multiplies every run's predicted loss by exp(e), e drawn from that form's
   centred residuals in ln L, refits the base (the additive form: on the single-epoch runs;
   Muennighoff's: jointly with its terms) and the form from the full fit's optimum; 95%
   percentile intervals.
4. Leave-one-unique-size-out: for each distinct U among the repeated runs (D > U), the form
   is refitted without that U's repeated runs and predicts them (the base, fitted on
   single-epoch runs, stays); the error is (predicted − measured) / measured.

A decay constant is "identified" when its optimum lies inside the bounds and its bootstrap
interval's upper end stays below half the upper bound; R_N* is not fitted at all when no run
has excess parameters (N > N_opt(U_D)), and then N' = N.
Units: N parameters, D and U tokens, loss nats/token.
"""

from __future__ import annotations

import dataclasses
import math
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
  """The runs of fresh data, for the base law: one epoch or less (D <= U, or no U) of the
  table's largest unique set (the unlimited split).

  A run of one epoch or less of a smaller unique set is left to the repetition fits: a
  sample of a few hundred thousand tokens is a few dozen documents, whose loss on the
  validation split lies above fresh data's even before any token repeats (0.03–0.07
  nats/token at 400k tokens of the stdlib corpus, docs/data-constrained.md).
  """
  if runs.unique_tokens is None:
    return runs
  rows = RepeatRows.from_runs(runs)
  largest = rows.U >= rows.U.max() * (1.0 - EPOCH_TOL)
  return runs.subset(np.flatnonzero(~rows.repeated & largest))


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


def _objective(form, base, rows, fit_rn, delta):
  logL = np.log(rows.loss)

  def f(theta):
    pred = make_law(form, base, theta, fit_rn).loss(rows.N, rows.D, rows.U)
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
    except (ValueError, OverflowError):
      return 1e30
    with np.errstate(all="ignore"):  # a trial step far out overflows; it is refused below
      pred = np.asarray(law.loss(rows.N, rows.D, rows.U))
    if not np.all(np.isfinite(pred) & (pred > 0)):
      return 1e30
    return _huber(np.log(pred) - logL, delta)
  return f


def fit_form(form: str, base: laws.ParametricLaw, rows: RepeatRows, *,
             delta: float = approach3.HUBER_DELTA, starts=None, joint: bool | None = None
             ) -> tuple[lr.RepeatLaw, np.ndarray]:
  """Fits one form's repetition parameters (module docstring, step 2).

  First with ``base`` fixed, from every start; then, with ``joint``, one L-BFGS-B polish of
  the base's five parameters and the form's together over all runs from that optimum (the
  form's law holds the polished base). The polish is Muennighoff's form's default: its
  excess-parameter term acts at one epoch too (a run with N > N_opt(D)), so a plain
  Chinchilla base fitted on those runs is biased under it. The additive form leaves every
  single-epoch run to the base, so its base stays the one fitted on them (polishing it on the
  repeated runs too only lets it bend toward them: on a 23-run repeat ladder it went to
  alpha = 3, E = 0).

  Args:
    form: "muennighoff" or "overfit".
    base: the single-epoch law (the fixed base, and the polish's start).
    rows: the runs, shape (R,) each.
    delta: Huber threshold.
    starts: starts of the form's parameters, shape (S, k); None: the default grid.
    joint: polish base and form together; None: for Muennighoff's form only.

  Returns:
    (law, theta): the fitted law and theta = (ln A, ln B, ln E, alpha, beta) + the form's
    parameters ((ln R_D*[, ln R_N*]) or (P,)).

  Raises:
    FitError: no run repeats data, or no start gave a finite objective.
    ValueError: an unknown form.
  """
  if not rows.repeated.any():
    raise FitError("no run trains more than one epoch (D > unique_tokens): nothing to fit")
  joint = form == "muennighoff" if joint is None else joint
  fit_rn = form == "muennighoff" and bool((excess_params(base, rows) > EPOCH_TOL).any())
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
  return _base_of(res.x, base.name)


def _ci_of(samples: dict[str, list]) -> dict:
  out = {}
  for k, v in samples.items():
    v = [x for x in v if x is not None and math.isfinite(x)]
    out[k] = [float(x) for x in percentile_interval(v, CI_LEVEL)] if len(v) >= 2 else None
  return out


def bootstrap_form(form: str, rows: RepeatRows, law: lr.RepeatLaw, theta: np.ndarray,
                   n: int = 200, seed: int = 0) -> dict:
  """Residual-bootstrap intervals of a form's parameters (module docstring, step 3).

  Returns:
    {"ci": {param: [lo, hi]}, "n_resamples", "n_failed", "seed", "level", "wall_time_s"}.
  """
  t0 = time.perf_counter()
  rng = np.random.default_rng(seed)
  pred = np.asarray(law.loss(rows.N, rows.D, rows.U))
  resid = np.log(pred) - np.log(rows.loss)
  resid = resid - resid.mean()
  samples: dict[str, list] = {k: [] for k in law.params()}
  failed = 0
  for _ in range(n):
    try:
      star = dataclasses.replace(rows, loss=pred * np.exp(rng.choice(resid, len(pred))))
      base = law.base if form == "muennighoff" else _refit_base(law.base, star)
      fitted, _ = fit_form(form, base, star, starts=[theta[5:]])
    except (FitError, ValueError, FloatingPointError):
      failed += 1
      continue
    for k, v in fitted.params().items():
      samples[k].append(v)
  return {"ci": _ci_of(samples), "n_resamples": n, "n_failed": failed, "seed": seed,
          "level": CI_LEVEL, "method": "residuals (fixed design; base and form refitted)",
          "wall_time_s": round(time.perf_counter() - t0, 3)}


def leave_one_unique_out(form: str, base: laws.ParametricLaw, rows: RepeatRows,
                         theta: np.ndarray) -> dict:
  """Leave-one-unique-size-out prediction errors (module docstring, step 4).

  Returns:
    {"folds": [{"unique_tokens", "n_runs", "rel_errors": [...], "mean_abs_rel_error"}],
    "rms_rel_error", "mean_abs_rel_error"} over all held-out runs (None with under 2 sizes).
  """
  sizes = np.unique(rows.U[rows.repeated])
  folds, errs = [], []
  for U in sizes:
    out = rows.repeated & np.isclose(rows.U, U, rtol=1e-9)
    train = rows.subset(~out)
    if not train.repeated.any():
      continue
    fitted, _ = fit_form(form, base, train)
    held = rows.subset(out)
    pred = np.asarray(fitted.loss(held.N, held.D, held.U))
    e = (pred - held.loss) / held.loss
    errs += e.tolist()
    folds.append({"unique_tokens": float(U), "n_runs": int(out.sum()),
                  "rel_errors": [float(x) for x in e],
                  "mean_abs_rel_error": float(np.mean(np.abs(e)))})
  if not errs:
    return {"folds": [], "rms_rel_error": None, "mean_abs_rel_error": None,
            "note": "fewer than 2 unique sizes among the repeated runs: nothing to hold out"}
  e = np.asarray(errs)
  return {"folds": folds, "rms_rel_error": float(np.sqrt(np.mean(e ** 2))),
          "mean_abs_rel_error": float(np.mean(np.abs(e)))}


def base_only_errors(base: laws.ParametricLaw, rows: RepeatRows) -> dict:
  """The base law's relative errors on the repeated runs (repetition ignored), as a reference."""
  held = rows.subset(rows.repeated)
  e = (np.asarray(base.loss(held.N, held.D)) - held.loss) / held.loss
  return {"rms_rel_error": float(np.sqrt(np.mean(e ** 2))),
          "mean_abs_rel_error": float(np.mean(np.abs(e)))}
