"""Percentile bootstrap intervals of each approach's parameters.

Two ways of drawing replicates (:data:`METHODS`):

* ``"residuals"`` (the default): the sizes, token counts and budgets of a
  ladder are a designed, fixed set, so each replicate keeps them and resamples
  the noise instead: every run's loss is multiplied by exp(e), e drawn with
  replacement from the pooled residuals in ln L of per-budget quadratics in
  ln N (model-based resampling for a fixed design: Efron & Tibshirani 1993,
  "An Introduction to the Bootstrap", Sec. 9.5; Davison & Hinkley 1997,
  "Bootstrap Methods and their Application", Sec. 6.2-6.3).
* ``"runs"``: runs resampled with replacement, within each IsoFLOP budget for
  Approaches 1 and 2 and all together for Approach 3, as Besiroglu et al. 2024
  ("Chinchilla Scaling: A replication attempt", arXiv 2404.10102) do. On a
  small ladder a resample of 5 sizes often keeps only 2-3 distinct ones, so
  parabolas fail and the intervals are far wider than the noise.
"""

from __future__ import annotations

import dataclasses
import re
import time

import numpy as np

from analysis.isoflop import approach3
from analysis.isoflop.approach2_design import refit_like
from analysis.isoflop.approaches import FitOptions, check_approach, fit_approach
from analysis.errors import FitError, FitOptionError
from analysis.runs import Runs

CI_LEVEL = 0.95
METHODS = ("residuals", "runs")   # ways of drawing replicates; the first is the default
DEFAULT_METHOD = METHODS[0]
QUADRATIC_PARAMS = 3      # parameters of a per-budget quadratic in ln N (the p of n - p)
MIN_SIZES_FOR_RESIDUALS = 4   # a budget gives residuals only with at least this many sizes
MIN_RESIDUAL_DOF = 4      # fewer pooled residual degrees of freedom: fall back to "runs"


def percentile_interval(samples, level: float = CI_LEVEL, axis: int | None = None):
  """The central percentile interval of coverage ``level`` (0.95: 2.5th to 97.5th percentile).

  Args:
    samples: values, any shape.
    level: coverage, in (0, 1).
    axis: the axis of the samples; None pools all values.

  Returns:
    (lo, hi): numpy scalars, or arrays with ``axis`` removed.
  """
  lo, hi = 100 * (1 - level) / 2, 100 * (1 + level) / 2
  return np.percentile(samples, lo, axis=axis), np.percentile(samples, hi, axis=axis)


@dataclasses.dataclass
class BootstrapResult:
  """Percentile bootstrap of one approach.

  Attributes:
    n_resamples: replicates requested.
    n_failed: replicates whose fit failed (left out of the intervals).
    seed: seed of the numpy Generator.
    level: interval coverage (0.95).
    samples: parameter name -> values over successful replicates, shape (M,).
    ci: parameter name -> (lo, hi) percentile interval.
    std: parameter name -> standard deviation over replicates.
    frontier_C: FLOPs where the frontier band is evaluated, shape (P,).
    frontier_N: (lo, hi) of N_opt(C) over replicates, each shape (P,).
    frontier_D: (lo, hi) of D_opt(C), each shape (P,).
    wall_time_s: seconds spent.
    method: one line on how replicates were drawn and fitted (for
      "residuals": the pooled residual s.d. and its degrees of freedom; a
      fallback to "runs" says why).
    failures: why replicates failed -> how many (the fit's message without
      its parenthesised details).
    budgets_left_out: Approach 2: budget C -> in how many successful
      replicates its parabola was left out (edge, flat, ...); budgets never
      left out are absent.
    resampling: the method used, "residuals" or "runs" (also "runs" after a
      fallback).
    residual_sd: "residuals": the pooled residual s.d. in ln L; else None.
    residual_dof: "residuals": its degrees of freedom; else None.
  """

  n_resamples: int
  n_failed: int
  seed: int
  level: float
  samples: dict[str, np.ndarray]
  ci: dict[str, tuple[float, float]]
  std: dict[str, float]
  frontier_C: np.ndarray
  frontier_N: tuple[np.ndarray, np.ndarray]
  frontier_D: tuple[np.ndarray, np.ndarray]
  wall_time_s: float
  method: str
  failures: dict[str, int] = dataclasses.field(default_factory=dict)
  budgets_left_out: dict[float, int] = dataclasses.field(default_factory=dict)
  resampling: str = "runs"
  residual_sd: float | None = None
  residual_dof: int | None = None
  bounds_dropped: tuple[int, int] = (0, 0)

  @property
  def bounds_rule(self) -> dict:
    """The bounds rule on a and what it removed: replicates whose fitted a lies outside
    (0, 1) (N_opt or D_opt would shrink as C grows) are dropped; ``truncated`` says the
    interval of a is then cut at that bound by as many replicates as it removed."""
    below, above = self.bounds_dropped
    return {"rule": "replicates whose fitted a is not within (0, 1) are dropped",
            "dropped_below_0": below, "dropped_above_1": above,
            "truncated": bool(below or above)}


@dataclasses.dataclass(frozen=True)
class ResidualPool:
  """The residuals that the ``"residuals"`` bootstrap draws from.

  Attributes:
    residuals: pooled residuals in ln L, each inflated by sqrt(n / (n - 3))
      of its budget and the pool centred to mean 0, shape (M,).
    sd: pooled residual standard deviation, sqrt(sum of squared raw
      residuals / dof), in ln L (about the relative noise of a loss).
    dof: residual degrees of freedom, the sum over budgets of n - 3.
    budgets: the budgets that gave residuals, FLOPs, shape (K,).
  """

  residuals: np.ndarray
  sd: float
  dof: int
  budgets: np.ndarray


def check_method(method: str) -> None:
  """Raises FitOptionError unless ``method`` is one of :data:`METHODS`."""
  if method not in METHODS:
    raise FitOptionError(f"unknown bootstrap method {method!r}; valid: {', '.join(METHODS)}")


def _window_members(runs: Runs, members: np.ndarray, window: int | None) -> np.ndarray:
  """``members`` of one budget whose size lies within ``window`` places (in the budget's
  sorted distinct sizes) of its lowest observed loss; all of them when ``window`` is None.
  The same sizes Approach 2's windowed parabola is fitted on (``analysis.isoflop.approach2``)."""
  if window is None:
    return members
  sizes = np.unique(runs.N[members])
  i_best = int(np.searchsorted(sizes, runs.N[members][np.argmin(runs.loss[members])]))
  keep = sizes[max(0, i_best - window): i_best + window + 1]
  return members[np.isin(runs.N[members], keep)]


def _window_text(window: int | None) -> str:
  if window is None:
    return ""
  return f", each on the sizes within {window} places of its lowest loss as the windowed fit"


def residual_pool(runs: Runs, window: int | None = None) -> ResidualPool:
  """The pooled residuals in ln L of per-budget quadratics in ln N.

  Each budget with at least :data:`MIN_SIZES_FOR_RESIDUALS` distinct sizes is
  fitted by ordinary least squares, ln L = c0 + c1 x + c2 x^2 with x = ln N
  (centred); its n residuals are multiplied by sqrt(n / (n - p)), p = 3, so
  that their mean square estimates the noise variance (the degrees-of-freedom
  form of the modified residuals of Davison & Hinkley 1997, Sec. 6.2, with the
  average leverage p / n in place of each run's), and the pool over all
  budgets is centred (ibid.). Runs of weight 0 are left out (the fits ignore them);
  weights otherwise do not enter.

  With ``window`` K, each budget's quadratic is fitted on the sizes within K
  places of its lowest observed loss, the sizes the windowed fit uses: over a
  wide grid (±16–32× around the optimum) a profile is not a parabola, and a
  quadratic over all sizes would pool its misfit instead of the runs' noise.

  Args:
    runs: the table, R runs.
    window: the fit's ``--window`` K (None: every size of each budget).

  Returns:
    A :class:`ResidualPool`; with no budget of 4 or more sizes (in its window),
    an empty pool with dof 0.
  """
  pieces, rss, dof, used = [], 0.0, 0, []
  keep = np.ones(len(runs), bool) if runs.weight is None else runs.weight > 0
  for C in runs.budgets():
    members = _window_members(runs, np.flatnonzero((runs.budget == C) & keep), window)
    n = members.size
    if np.unique(runs.N[members]).size < MIN_SIZES_FOR_RESIDUALS:
      continue
    x = np.log(runs.N[members])
    x = x - x.mean()
    y = np.log(runs.loss[members])
    X = np.stack([np.ones_like(x), x, x * x], axis=1)
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    r = y - X @ coef
    rss += float(r @ r)
    dof += n - QUADRATIC_PARAMS
    pieces.append(r * np.sqrt(n / (n - QUADRATIC_PARAMS)))
    used.append(float(C))
  if not pieces:
    return ResidualPool(residuals=np.zeros(0), sd=float("nan"), dof=0, budgets=np.zeros(0))
  pool = np.concatenate(pieces)
  return ResidualPool(residuals=pool - pool.mean(), sd=float(np.sqrt(rss / dof)), dof=dof,
                      budgets=np.array(used))


def residual_replicate(runs: Runs, pool: ResidualPool, rng: np.random.Generator) -> Runs:
  """One replicate of the ``"residuals"`` bootstrap: the same runs with resampled noise.

  Run i's final loss becomes loss_i · exp(e_i), e_i drawn with replacement
  from ``pool.residuals`` (Efron & Tibshirani 1993, Sec. 9.5); its eval curve,
  if any, is multiplied by the same exp(e_i). N, D, budgets, run ids, weights
  and the eval-noise columns are kept.

  Args:
    runs: R runs.
    pool: from :func:`residual_pool` (non-empty).
    rng: numpy Generator.

  Returns:
    :class:`Runs` of the same R runs in the same order.

  Raises:
    ValueError: an empty pool.
  """
  if pool.residuals.size == 0:
    raise ValueError("the residual pool is empty: no budget has 4 or more sizes")
  factor = np.exp(rng.choice(pool.residuals, size=len(runs), replace=True))
  curves = None
  if runs.curves is not None:
    curves = tuple(np.column_stack([c[:, 0], c[:, 1] * f]) for c, f in zip(runs.curves, factor))
  return dataclasses.replace(runs, loss=runs.loss * factor, curves=curves)


def _resample_indices(runs: Runs, rng: np.random.Generator, stratified: bool) -> np.ndarray:
  if not stratified:
    return rng.integers(0, len(runs), size=len(runs))
  parts = []
  for C in runs.budgets():
    members = np.flatnonzero(runs.budget == C)
    parts.append(rng.choice(members, size=members.size, replace=True))
  return np.sort(np.concatenate(parts))


def bootstrap(runs: Runs, approach: str, full, *, n_resamples: int = 200, seed: int = 0,
              frontier_C: np.ndarray | None = None, level: float = CI_LEVEL,
              n_extra_starts: int = 4, options: FitOptions | None = None,
              method: str = DEFAULT_METHOD, fixed_design: bool = False) -> BootstrapResult:
  """Bootstrap confidence intervals for one approach (percentile intervals).

  ``method="residuals"`` keeps every run's N, D and budget and multiplies its
  loss (and eval curve) by exp(e), e drawn from :func:`residual_pool` of the
  whole table (:func:`residual_replicate`); with fewer than
  :data:`MIN_RESIDUAL_DOF` residual degrees of freedom it falls back to
  ``"runs"`` and ``method`` of the result says why. ``method="runs"``
  resamples runs with replacement: within each IsoFLOP budget for Approaches 1
  and 2 (every budget keeps its number of runs), all together for Approach 3,
  as Besiroglu et al. 2024 do.

  For Approach 3, each replicate starts L-BFGS from the full-data optimum plus
  ``n_extra_starts`` points drawn from the full fit's grid of starts
  (:func:`analysis.isoflop.approach3.default_grid`, or ``options.grid``) instead of the
  whole grid: the replicate's optimum lies near the full-data one, and this
  keeps a replicate to a few milliseconds.

  Each replicate is fitted with the same ``options`` as the full fit. For
  Approach 2 only the budgets used by the full fit are resampled, and each
  replicate repeats the full fit's choices: which of them are bracketed and,
  with a window, which sizes lie near the lowest loss. A replicate in which one
  of them is not bracketed leaves it out (counted in ``budgets_left_out``), as
  the full fit would have on such data; a replicate that cannot be fitted at
  all is counted in ``failures`` and left out of the intervals. With
  ``fixed_design`` each replicate instead refits the parabolas on the full
  fit's sizes of those budgets without choosing again
  (:func:`analysis.isoflop.approach2_design.refit_on_design`). On synthetic ladders
  (``benchmarks/coverage.py``, docs/fitting.md, "Are the intervals honest?") repeating
  the choices gives 95% intervals covering the true a in 94% of 280 ladders
  (7 settings), 0.87-1.24 times as wide as a's spread over ladders, while the
  fixed design widens them further (1.43x on 12-budget ladders whose optima
  sit near the grids' ends, against 1.20x): the budgets a replicate
  drops are the ones whose vertex it would extrapolate, and the full fit drops
  them in the same way.

  Args:
    runs: the runs the full fit used.
    approach: "1", "2" or "3".
    full: the full-data result of that approach (Approach3Result etc.).
    n_resamples: replicates.
    seed: seed of ``numpy.random.default_rng``.
    frontier_C: FLOPs at which to band N_opt(C), D_opt(C), shape (P,).
    level: interval coverage.
    n_extra_starts: Approach 3 only, grid starts per replicate besides the
      full-data optimum.
    options: the full fit's :class:`~analysis.isoflop.approaches.FitOptions` (window,
      loss, start grid); None: Chinchilla's choices.
    method: "residuals" or "runs" (:data:`METHODS`).
    fixed_design: Approach 2 only: refit each replicate on the full fit's
      budgets and sizes (True) instead of repeating the full fit's choice of
      budgets and windows in every replicate (False, the default).

  Returns:
    A :class:`BootstrapResult` (intervals for every parameter and exponent).

  Raises:
    ValueError: an unknown approach, or ``n_resamples`` < 1.
    FitOptionError: an unknown ``method``.
  """
  check_approach(approach)
  check_method(method)
  if n_resamples < 1:
    raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
  rng = np.random.default_rng(seed)
  if frontier_C is None:
    frontier_C = np.geomspace(runs.C.min(), runs.C.max(), 50)
  options = options or FitOptions()
  pool = fallback = None
  if method == "residuals":
    # The whole table's noise, before Approach 2 drops budgets; with a window, Approach 2's
    # from the windowed quadratics its fit uses (the window is Approach 2's: Approaches 1 and 3
    # fit every size, and their noise is the scatter about quadratics over all sizes).
    pool = (residual_pool(runs, options.window) if options.window is not None and approach == "2"
            else residual_pool(runs))
    if pool.dof < MIN_RESIDUAL_DOF:
      fallback = (f"residual resampling needs >= {MIN_RESIDUAL_DOF} residual degrees of freedom "
                  f"(budgets with >= {MIN_SIZES_FOR_RESIDUALS} sizes, n - {QUADRATIC_PARAMS} "
                  f"each), the table has {pool.dof}; fell back to resampling runs")
      pool = None
  if approach == "2":  # budgets left out of the full fit stay out of every resample
    runs = runs.subset(np.flatnonzero(np.isin(runs.budget, [p.C for p in full.used])))
  grid = None
  if approach == "3":
    grid = (approach3.default_grid(float(runs.loss.min())) if options.grid is None
            else options.grid)
    n_extra_starts = min(n_extra_starts, len(grid))
  t0 = time.perf_counter()
  rows: list[dict[str, float]] = []
  Ns, Ds = [], []
  n_failed = 0
  failures: dict[str, int] = {}
  bounds = [0, 0]  # replicates dropped by the bounds rule: a <= 0, a >= 1
  left_out: dict[float, int] = {}
  used_in_full = {p.C for p in full.used} if approach == "2" else set()
  for _ in range(n_resamples):
    if pool is not None:
      sub = residual_replicate(runs, pool, rng)
    else:
      sub = runs.subset(_resample_indices(runs, rng, stratified=approach != "3"))
    starts = None
    if approach == "3":
      extra = grid[rng.choice(len(grid), size=n_extra_starts, replace=False)]
      starts = np.vstack([full.theta, extra])
    try:
      if approach == "2":
        res = refit_like(sub, full, fixed_design=fixed_design)
      else:
        res = fit_approach(sub, approach, starts=starts, options=options)
      law = res.law
    except FitError as e:
      n_failed += 1
      hit = re.search(r"fitted exponent a = (\S+) ", str(e))
      if hit:
        bounds[float(hit.group(1)) >= 1.0] += 1
      # The message without its details and numbers, so that like failures count together.
      why = re.sub(r"-?\d+\.\d+(e[+-]?\d+)?|-?\d+e[+-]?\d+", "…", str(e).split(" (")[0])
      failures[why] = failures.get(why, 0) + 1
      continue
    if approach == "2":
      for p in res.left_out:
        if p.C in used_in_full:
          left_out[p.C] = left_out.get(p.C, 0) + 1
    rows.append(res.params())
    n_opt, d_opt = law.optimal_allocation(frontier_C)
    Ns.append(n_opt)
    Ds.append(d_opt)
  wall = time.perf_counter() - t0
  names = list(full.params())
  samples = {k: np.array([r[k] for r in rows]) for k in names}
  if rows:
    ci = {k: tuple(float(x) for x in percentile_interval(v, level)) for k, v in samples.items()}
    std = {k: float(np.std(v, ddof=1)) if len(v) > 1 else 0.0 for k, v in samples.items()}
    Ns_a, Ds_a = np.array(Ns), np.array(Ds)
    fN = percentile_interval(Ns_a, level, axis=0)
    fD = percentile_interval(Ds_a, level, axis=0)
  else:
    ci = {k: (float("nan"), float("nan")) for k in names}
    std = {k: float("nan") for k in names}
    fN = fD = (np.full(len(frontier_C), np.nan), np.full(len(frontier_C), np.nan))
  pool_window = options.window if approach == "2" else None
  if pool is not None:
    line = (f"{n_resamples} replicates resampling residuals (seed {seed}): each run's loss and "
            f"eval curve times exp(e), e drawn with replacement from {pool.residuals.size} "
            f"pooled, centred residuals in ln L of quadratics in ln N over "
            f"{pool.budgets.size} budgets{_window_text(pool_window)} (inflated by sqrt(n/(n-{QUADRATIC_PARAMS}))); pooled "
            f"residual s.d. {pool.sd:.3g} in ln L, {pool.dof} dof; N, D and budgets fixed")
  elif approach == "3":
    line = f"{n_resamples} resamples of all runs with replacement (seed {seed})"
  else:
    line = (f"{n_resamples} resamples of runs with replacement within each IsoFLOP budget "
            f"(seed {seed})")
  if approach == "3":
    line += (f"; L-BFGS from the full-data optimum plus {n_extra_starts} grid points per "
             f"{'replicate' if pool is not None else 'resample'}")
  if fallback:
    line = f"{fallback}: {line}"
  return BootstrapResult(n_resamples=n_resamples, n_failed=n_failed, seed=seed, level=level,
                         samples=samples, ci=ci, std=std, frontier_C=np.asarray(frontier_C),
                         frontier_N=fN, frontier_D=fD, wall_time_s=wall, method=line,
                         failures=failures, budgets_left_out=left_out,
                         resampling="residuals" if pool is not None else "runs",
                         residual_sd=None if pool is None else pool.sd,
                         residual_dof=None if pool is None else pool.dof,
                         bounds_dropped=(bounds[0], bounds[1]))
