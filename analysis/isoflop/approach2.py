"""Approach 2 of Hoffmann et al. 2022 (arXiv 2203.15556, Sec. 3.2, Fig. 3): IsoFLOP parabolas.

Per IsoFLOP budget a parabola in ln N is fitted to the final losses; its
vertex is N_opt for that budget. Budgets whose minimum is not bracketed by the
sampled N, whose parabola opens downwards or whose curvature is not
determined are reported and left out; so are budgets whose curvature is not
significant against the eval noise floor (when the table has each run's
``final_eval_loss_se``: p2 within :data:`NOISE_T` standard errors of 0, the
s.e. propagated from those SEs by :func:`curvature_se_from_noise`), as the
flat ones are: their vertex is set by eval noise, not by the profile.
N_opt = k_N C^a and D_opt = k_D C^b are fitted over the rest. Usable budgets carry warnings for the known biases of
the method (wide or lopsided grids, large residuals, few sizes); a window
fits each parabola only near the lowest observed loss.

Units: N parameters, D tokens, C FLOPs, loss nats/token.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from chinchax.laws import parametric as laws
from analysis.errors import ApproachUnsupported
from analysis.isoflop.powerlaw import AllocationParams, fit_allocation
from analysis.runs import Runs, tokens_6nd


# Warnings for Approach 2's known biases (Hoffmann et al. 2022 App. D; Besiroglu
# et al. 2024, arXiv 2404.10102): a parabola in ln N fitted to a wide or
# lopsided IsoFLOP profile moves its vertex, and few sizes leave it undetermined.
SPAN_WARN = 16.0        # sizes reaching more than this factor from the minimum
LOPSIDED_WARN = 3.0     # ln-span on the wider side of the minimum over the narrower side
FEW_SIZES_WARN = 5      # fewer distinct sizes than this
RESIDUAL_WARN = 0.1     # parabola residual RMS over the profile's depth
FLAT_T = 2.0            # curvature p2 within this many standard errors of 0: not determined
NOISE_T = 2.0           # p2 within this many s.e. of 0, the s.e. propagated from the runs' eval SEs: below the noise floor
_VERTEX_SHOWN = 100.0   # an edge vertex farther than this factor outside the sizes is not kept

WARNING_TEXT = {
    "span": (f"sizes reach more than {SPAN_WARN:g}x from the parabola's minimum: over so wide "
             f"a span the profile is not a parabola in ln N and N_opt is biased (Hoffmann et "
             f"al. 2022 App. D; Besiroglu et al. 2024); fit near the minimum with --window K"),
    "lopsided": (f"the sampled sizes are lopsided around the minimum (one side spans more than "
                 f"{LOPSIDED_WARN:g}x the ln N of the other): the vertex leans towards the "
                 f"wider side"),
    "residuals": (f"the parabolas' residual RMS exceeds {100 * RESIDUAL_WARN:g}% of the "
                  f"profile's depth: noisy or not parabolic in ln N over this span"),
    "few-sizes": (f"fewer than {FEW_SIZES_WARN} model sizes: the vertex rests on few points; "
                  f"with 3 sizes a resample within the budget either repeats the fit or drops "
                  f"the budget, so the bootstrap interval collapses towards zero width"),
}


@dataclasses.dataclass
class BudgetParabola:
  """One IsoFLOP budget of Approach 2: loss ≈ p2 x² + p1 x + p0 with x = ln N.

  Attributes:
    C: the budget, FLOPs.
    n_runs: runs at this budget.
    n_sizes: distinct N at this budget.
    N_range: (smallest, largest) sampled N.
    coeffs: (p2, p1, p0), or None when too few sizes.
    N_opt: vertex exp(-p1 / (2 p2)), parameters (NaN without a minimum, or
      when an edge vertex lies more than 100x outside the sampled N).
    D_opt: C / (6 N_opt), tokens.
    loss_opt: parabola value at the vertex, nats/token.
    status: "ok", "edge" (minimum not bracketed by the sampled N),
      "no-minimum" (p2 <= 0, or not finite), "flat" (the curvature p2 lies
      within 2 standard errors of 0: the minimum is not determined),
      "below-noise" (p2 lies within 2 standard errors of 0 where the s.e. is
      the one the runs' eval noise alone gives it) or "too-few-sizes" (< 3
      distinct N fitted).
    reason: why a budget is left out ("" when ok).
    n_sizes_fitted: distinct N the parabola was fitted on (fewer than
      ``n_sizes`` with a window).
    N_fitted: (smallest, largest) N the parabola was fitted on.
    N_best: the size with the lowest observed (mean) loss, parameters.
    residual_rms: RMS of the parabola's residuals, nats/token.
    depth: the parabola's rise over the fitted N from its lowest value, nats/token.
    curvature_t: p2 over its standard error (least squares, residual
      variance with K - 3 degrees of freedom); NaN with 3 runs.
    curvature_se_noise: the standard error of p2 that the runs' eval-loss
      SEs alone give it (:func:`curvature_se_from_noise`); NaN without SEs.
    curvature_z_noise: p2 / curvature_se_noise; NaN without SEs.
    warnings: kinds of :data:`WARNING_TEXT` that apply to this budget.
  """

  C: float
  n_runs: int
  n_sizes: int
  N_range: tuple[float, float]
  coeffs: tuple[float, float, float] | None
  N_opt: float
  D_opt: float
  loss_opt: float
  status: str
  reason: str = ""
  n_sizes_fitted: int = 0
  N_fitted: tuple[float, float] | None = None
  N_best: float = float("nan")
  residual_rms: float = float("nan")
  depth: float = float("nan")
  curvature_t: float = float("nan")
  curvature_se_noise: float = float("nan")
  curvature_z_noise: float = float("nan")
  warnings: tuple[str, ...] = ()

  def to_dict(self) -> dict:
    d = dataclasses.asdict(self)
    d["N_range"] = list(self.N_range)
    d["N_fitted"] = list(self.N_fitted) if self.N_fitted else None
    d["coeffs"] = list(self.coeffs) if self.coeffs else None
    d["warnings"] = list(self.warnings)
    return d


def _window(sizes: np.ndarray, i_best: int, k: int | None) -> np.ndarray:
  """The sizes within ``k`` places of the lowest observed loss (all sizes when k is None)."""
  if k is None:
    return sizes
  return sizes[max(0, i_best - k): i_best + k + 1]


def _budget_warnings(x: np.ndarray, x_opt: float, n_sizes: int, rms: float, depth: float
                     ) -> tuple[str, ...]:
  """Kinds of :data:`WARNING_TEXT` for a usable parabola fitted at ln N = ``x``."""
  out = []
  below, above = x_opt - float(x.min()), float(x.max()) - x_opt
  if max(below, above) > math.log(SPAN_WARN):
    out.append("span")
  if max(below, above) > LOPSIDED_WARN * min(below, above):
    out.append("lopsided")
  if rms > RESIDUAL_WARN * depth:
    out.append("residuals")
  if n_sizes < FEW_SIZES_WARN:
    out.append("few-sizes")
  return tuple(out)


def _curvature_t(x: np.ndarray, r: np.ndarray, p2: float, w: np.ndarray | None) -> float:
  """p2 over its least-squares standard error; NaN without residual degrees of freedom."""
  dof = x.size - 3
  if dof <= 0:
    return float("nan")
  ww = np.ones_like(x) if w is None else w ** 2
  X = np.stack([x * x, x, np.ones_like(x)], axis=1)
  s2 = float((ww * r * r).sum()) / dof
  try:
    var = s2 * np.linalg.inv(X.T @ (ww[:, None] * X))[0, 0]
  except np.linalg.LinAlgError:
    return float("nan")
  return p2 / math.sqrt(var) if var > 0 else float("inf")


def curvature_se_from_noise(x: np.ndarray, se: np.ndarray, w: np.ndarray | None) -> float:
  """The standard error of the fitted curvature p2 that the eval noise alone gives it.

  The fit is linear in the losses, p = L y with L = (XᵀΩX)⁻¹XᵀΩ (X the
  [x², x, 1] design, Ω the fit's weights, ``w``², identity when None); with
  independent loss errors of standard deviation ``se`` its covariance is
  L diag(se²) Lᵀ (propagation of errors through a linear estimator; with
  Ω = diag(1/se²) this is the (XᵀΩX)⁻¹ of weighted least squares with known
  errors, Press et al., Numerical Recipes, 3rd ed., Sec. 15.4). Returns
  √[L diag(se²) Lᵀ]₀₀.

  The runs' errors are taken as independent. Runs evaluated on the same
  fixed windows (``train.eval_windows``) share part of their error, and a
  part common to every run of a budget moves only p0, so this s.e. is an
  upper bound for them and the test it serves errs towards flagging.

  Args:
    x: ln N of the fitted runs, shape (K,).
    se: SE of each run's loss, nats/token, shape (K,).
    w: the fit's per-run weights as ``np.polyfit`` takes them (square roots
      of the run weights), shape (K,), or None.

  Returns:
    The SE of p2, nats/token per (ln N)²; NaN if the design is singular.
  """
  ww = np.ones_like(x) if w is None else np.asarray(w, dtype=np.float64) ** 2
  X = np.stack([x * x, x, np.ones_like(x)], axis=1)
  try:
    L = np.linalg.solve(X.T @ (ww[:, None] * X), X.T * ww)
  except np.linalg.LinAlgError:
    return float("nan")
  return float(math.sqrt(float(np.sum(L[0] ** 2 * np.asarray(se, dtype=np.float64) ** 2))))


def fit_isoflop_parabola(C: float, N: np.ndarray, loss: np.ndarray, *,
                         weight: np.ndarray | None = None,
                         window: int | None = None,
                         loss_se: np.ndarray | None = None) -> BudgetParabola:
  """Fits one IsoFLOP profile with a parabola in ln N (Chinchilla Sec. 3.2, Fig. 3).

  The budget is usable ("ok") only when the lowest observed loss is at an
  interior size and the vertex lies inside the fitted sizes; the vertex is
  exponentiated only then, so a nearly straight or flat profile is left out
  with its reason instead of overflowing.

  Args:
    C: the budget, FLOPs.
    N: parameters of the runs at this budget, shape (K,).
    loss: their final losses, nats/token, shape (K,).
    weight: optional weight per run, shape (K,) (weighted least squares).
    window: fit only on the sizes within ``window`` places (in sorted order)
      of the size with the lowest observed loss; None fits all sizes.
    loss_se: optional SE of each loss from its eval windows, nats/token,
      shape (K,), finite. A bracketed parabola whose p2 is less than
      :data:`NOISE_T` times :func:`curvature_se_from_noise` is left out as
      "below-noise": eval noise alone could make the profile curve that much.

  Returns:
    A :class:`BudgetParabola`; its ``status`` says whether it is usable.
  """
  N = np.asarray(N, dtype=np.float64)
  loss = np.asarray(loss, dtype=np.float64)
  sizes = np.unique(N)
  rng = (float(N.min()), float(N.max()))
  nan = float("nan")
  left = dict(N_opt=nan, D_opt=nan, loss_opt=nan)
  if sizes.size < 3:
    return BudgetParabola(C, len(N), int(sizes.size), rng, None, **left, status="too-few-sizes",
                          reason=f"{sizes.size} distinct N (a parabola needs 3)",
                          n_sizes_fitted=int(sizes.size))
  mean_loss = np.array([loss[N == s].mean() for s in sizes])
  i_best = int(np.argmin(mean_loss))
  N_best = float(sizes[i_best])
  fitted = _window(sizes, i_best, window)
  sel = np.isin(N, fitted)
  common = dict(n_sizes_fitted=int(fitted.size), N_fitted=(float(fitted[0]), float(fitted[-1])),
                N_best=N_best)
  if fitted.size < 3:
    return BudgetParabola(C, len(N), int(sizes.size), rng, None, **left, status="too-few-sizes",
                          reason=(f"{fitted.size} distinct N within {window} sizes of the lowest "
                                  f"observed loss (a parabola needs 3)"), **common)
  x, y = np.log(N[sel]), loss[sel]
  w = None if weight is None else np.sqrt(np.asarray(weight, dtype=np.float64)[sel])
  p2, p1, p0 = (float(v) for v in np.polyfit(x, y, 2, w=w))
  coeffs = (p2, p1, p0)
  resid = np.polyval(coeffs, x) - y
  rms = float(np.sqrt(np.mean(resid ** 2)))
  common["residual_rms"] = rms
  if not (math.isfinite(p2) and math.isfinite(p1) and p2 > 0):
    return BudgetParabola(C, len(N), int(sizes.size), rng, coeffs, **left, status="no-minimum",
                          reason="the fitted parabola opens downwards (no minimum)", **common)
  x_opt = -p1 / (2.0 * p2)
  x_lo, x_hi = float(x.min()), float(x.max())
  lowest = p0 - p1 * p1 / (4.0 * p2) if x_lo < x_opt < x_hi else min(
      np.polyval(coeffs, x_lo), np.polyval(coeffs, x_hi))
  depth = float(max(np.polyval(coeffs, x_lo), np.polyval(coeffs, x_hi)) - lowest)
  common["depth"] = depth
  f_lo, f_hi = common["N_fitted"]
  if not x_lo < x_opt < x_hi or i_best in (0, sizes.size - 1):
    shown = x_lo - math.log(_VERTEX_SHOWN) < x_opt < x_hi + math.log(_VERTEX_SHOWN)
    vertex = math.exp(x_opt) if shown else nan
    if i_best in (0, sizes.size - 1):
      where = "smallest" if i_best == 0 else "largest"
      reason = (f"the lowest observed loss is at the {where} sampled N ({N_best:.3g}; sampled "
                f"{rng[0]:.3g}–{rng[1]:.3g}): the minimum is not bracketed")
    else:
      side = "below" if x_opt <= x_lo else "above"
      reason = (f"the lowest observed loss is at an interior N = {N_best:.3g}, but the "
                f"parabola's vertex lies {side} the fitted N ({f_lo:.3g}–{f_hi:.3g})")
    reason += (f"; vertex N = {vertex:.3g}" if shown else
               f"; vertex ln N = {x_opt:.3g} (a nearly straight profile)")
    return BudgetParabola(C, len(N), int(sizes.size), rng, coeffs, vertex,
                          tokens_6nd(C, vertex) if shown else nan,
                          p0 - p1 * p1 / (4.0 * p2) if shown else nan, "edge", reason, **common)
  t = _curvature_t(x, resid, p2, w)
  common["curvature_t"] = t
  if t < FLAT_T:
    return BudgetParabola(C, len(N), int(sizes.size), rng, coeffs, **left, status="flat",
                          reason=(f"the parabola's curvature is {t:.2g} standard errors from 0 "
                                  f"(the loss varies by {depth:.3g} nats/token over the fitted N, "
                                  f"residual RMS {rms:.3g}): the minimum is not determined"),
                          **common)
  if loss_se is not None:
    se_p2 = curvature_se_from_noise(x, np.asarray(loss_se, dtype=np.float64)[sel], w)
    z = p2 / se_p2 if se_p2 > 0 else float("inf")
    common.update(curvature_se_noise=se_p2, curvature_z_noise=z)
    if not z >= NOISE_T:
      floor = float(np.median(np.asarray(loss_se)[sel]))
      return BudgetParabola(
          C, len(N), int(sizes.size), rng, coeffs, **left, status="below-noise",
          reason=(f"the parabola's curvature is {z:.2g} standard errors from 0 against the eval "
                  f"noise floor (median eval-loss s.e. {floor:.2g} nats/token; the loss varies by "
                  f"{depth:.3g} nats/token over the fitted N, {depth / floor:.3g}x the floor): "
                  f"the minimum is not resolved by the eval"),
          **common)
  N_opt = math.exp(x_opt)
  return BudgetParabola(C, len(N), int(sizes.size), rng, coeffs, N_opt, tokens_6nd(C, N_opt),
                        p0 - p1 * p1 / (4.0 * p2), "ok",
                        warnings=_budget_warnings(x, x_opt, int(fitted.size), rms, depth),
                        **common)


@dataclasses.dataclass
class Approach2Result(AllocationParams):
  """Approach 2 (Chinchilla Sec. 3.2): IsoFLOP parabolas → N_opt per budget → power laws.

  Attributes:
    budgets: one :class:`BudgetParabola` per IsoFLOP budget (all, usable or not).
    k_N, a: N_opt = k_N · C^a fitted over the usable budgets.
    k_D, b: D_opt = k_D · C^b.
    window: sizes either side of the lowest observed loss each parabola was
      fitted on (None: all sizes).
  """

  budgets: list[BudgetParabola]
  window: int | None = None
  noise_floor: float | None = None

  @property
  def below_noise(self) -> list[BudgetParabola]:
    """Budgets left out because their curvature is within the eval noise floor."""
    return [p for p in self.budgets if p.status == "below-noise"]

  @property
  def used(self) -> list[BudgetParabola]:
    return [p for p in self.budgets if p.status == "ok"]

  @property
  def left_out(self) -> list[BudgetParabola]:
    return [p for p in self.budgets if p.status != "ok"]

  @property
  def fit_range_flops(self) -> tuple[float, float]:
    """(C_min, C_max) of the budgets used, FLOPs."""
    Cs = [p.C for p in self.used]
    return (min(Cs), max(Cs))

  @property
  def law(self) -> laws.PowerLawAllocation:
    return self._allocation_law("fit-approach2", "Approach 2 fit (IsoFLOP parabolas)",
                                self.fit_range_flops)

  def warnings(self) -> list[str]:
    """One line per kind of bias warning, naming the budgets it applies to, plus one per
    budget left out (budgets with fewer than 3 sizes in one line)."""
    out = []
    used = self.used
    for kind, text in WARNING_TEXT.items():
      hit = [p for p in used if kind in p.warnings]
      if hit:
        out.append(f"{text} (at {_budgets(len(hit))}: C = "
                   f"{', '.join(f'{p.C:.3g}' for p in hit)}; the fit uses {_budgets(len(used))} "
                   f"in all)")
    few = [p for p in self.left_out if p.status == "too-few-sizes"]
    for p in self.left_out:
      if p.status != "too-few-sizes" or len(few) <= 3:
        out.append(f"budget C = {p.C:.3g} left out ({p.status}): {p.reason}")
    if len(few) > 3:
      out.append(f"{len(few)} budgets left out with fewer than 3 model sizes fitted")
    return out


def _budgets(n: int) -> str:
  """'1 budget' / 'n budgets'."""
  return f"{n} budget{'' if n == 1 else 's'}"


def _filled_loss_se(runs: Runs) -> np.ndarray | None:
  """Each run's eval-loss SE, the table's median SE where a row has none; None without any."""
  noise = runs.eval_noise()
  if noise is None:
    return None
  return np.where(np.isfinite(runs.loss_se), runs.loss_se, noise.median_se)


def approach2_parabolas(runs: Runs, window: int | None = None) -> list[BudgetParabola]:
  """One parabola per IsoFLOP budget of ``runs`` (sorted by C); ``window`` as in
  :func:`fit_isoflop_parabola`; per-run weights from ``runs.weight`` and eval-loss
  SEs from ``runs.loss_se`` (the table's median SE for a run without one) when present."""
  out = []
  se = _filled_loss_se(runs)
  for C in runs.budgets():
    sel = runs.budget == C
    weight = None if runs.weight is None else runs.weight[sel]
    out.append(fit_isoflop_parabola(float(C), runs.N[sel], runs.loss[sel], weight=weight,
                                    window=window, loss_se=None if se is None else se[sel]))
  return out


def _support(parabolas: list[BudgetParabola], min_budgets: int) -> str | None:
  usable = [p for p in parabolas if p.status == "ok"]
  if len(usable) >= min_budgets:
    return None
  with_sizes = sum(p.n_sizes >= 3 for p in parabolas)
  if with_sizes < min_budgets:
    return (f"Approach 2 needs at least {min_budgets} IsoFLOP budgets with 3 or more model sizes "
            f"each; this table has {with_sizes} of {len(parabolas)} budgets with 3+ sizes")
  bad = [p for p in parabolas if p.status != "ok"]
  few = [p for p in bad if p.status == "too-few-sizes"]
  if len(few) > 3:
    bad = [p for p in bad if p.status != "too-few-sizes"]
  groups: dict[str, list[float]] = {}  # budgets left out for the same reason share one clause
  for p in bad:
    groups.setdefault(p.reason, []).append(p.C)
  clauses = [f"C={', '.join(f'{c:.3g}' for c in cs)}: {reason}" for reason, cs in groups.items()]
  if len(clauses) > 3:
    clauses = clauses[:3] + [f"{sum(len(cs) for cs in list(groups.values())[3:])} more budgets"]
  left = "; ".join(clauses)
  if len(few) > 3:
    left += f"{'; ' if left else ''}{len(few)} budgets with fewer than 3 sizes"
  if any(p.status == "too-few-sizes" and p.n_sizes >= 3 for p in parabolas):
    left += "; a wider --window (2 or more) keeps 3+ sizes"
  return (f"Approach 2 needs at least {min_budgets} budgets whose loss minimum lies inside the "
          f"sampled N; only {len(usable)} qualify ({left})")


def approach2_support(runs: Runs, min_budgets: int = 3, window: int | None = None) -> str | None:
  """None if Approach 2 can run on ``runs``, else the reason it cannot."""
  return _support(approach2_parabolas(runs, window), min_budgets)


def fit_approach2(runs: Runs, min_budgets: int = 3, window: int | None = None) -> Approach2Result:
  """Approach 2: per-budget parabola minima → N_opt = k_N C^a, D_opt = k_D C^b.

  Args:
    runs: finished runs with IsoFLOP budgets (``runs.budget``).
    min_budgets: fewest usable budgets for the power-law fit.
    window: fit each parabola only on the sizes within ``window`` places of
      the size with the lowest observed loss (None: all sizes). A narrow
      window removes the bias of wide grids (Hoffmann et al. 2022 App. D).

  Returns:
    An :class:`Approach2Result` listing every budget, used or left out.

  Raises:
    ApproachUnsupported: fewer than ``min_budgets`` budgets with a bracketed
      minimum (the message lists why each was left out).
  """
  parabolas = approach2_parabolas(runs, window)
  usable = [p for p in parabolas if p.status == "ok"]
  if len(usable) < min_budgets:
    raise ApproachUnsupported(_support(parabolas, min_budgets) or "too few usable budgets")
  C = np.array([p.C for p in usable])
  k_N, a, k_D, b = fit_allocation(C, np.array([p.N_opt for p in usable]),
                                  np.array([p.D_opt for p in usable]), "Approach 2")
  noise = runs.eval_noise()
  return Approach2Result(budgets=parabolas, k_N=k_N, a=a, k_D=k_D, b=b, window=window,
                         noise_floor=None if noise is None else noise.median_se)
