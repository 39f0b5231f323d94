"""Percentile bootstrap intervals of each approach's parameters, by resampling runs.

Approaches 1 and 2 resample runs within each IsoFLOP budget; Approach 3
resamples all runs together, as Besiroglu et al. 2024 ("Chinchilla Scaling: A
replication attempt", arXiv 2404.10102) do.
"""

from __future__ import annotations

import dataclasses
import re
import time

import numpy as np

from analysis import approach3
from analysis.approaches import FitOptions, check_approach, fit_approach
from analysis.errors import FitError
from analysis.runs import Runs

CI_LEVEL = 0.95


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
  """Percentile bootstrap over runs.

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
    method: one line on how replicates were drawn and fitted.
    failures: why replicates failed -> how many (the fit's message without
      its parenthesised details).
    budgets_left_out: Approach 2: budget C -> in how many successful
      replicates its parabola was left out (edge, flat, ...); budgets never
      left out are absent.
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
              n_extra_starts: int = 4, options: FitOptions | None = None) -> BootstrapResult:
  """Bootstrap confidence intervals for one approach by resampling runs with replacement.

  Approaches 1 and 2 resample runs within each IsoFLOP budget (every budget
  keeps its number of runs); Approach 3 resamples all runs together, as
  Besiroglu et al. 2024 do. Intervals are percentile intervals.

  For Approach 3, each replicate starts L-BFGS from the full-data optimum plus
  ``n_extra_starts`` points drawn from the 4500-point grid instead of the
  whole grid: the replicate's optimum lies near the full-data one, and this
  keeps a replicate to a few milliseconds.

  Each replicate is fitted with the same ``options`` as the full fit. For
  Approach 2 only the budgets used by the full fit are resampled; a replicate
  in which one of them is not bracketed leaves it out (counted in
  ``budgets_left_out``), and a replicate that cannot be fitted at all is
  counted in ``failures`` and left out of the intervals.

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
    options: the full fit's :class:`~analysis.approaches.FitOptions` (window,
      loss, start grid); None: Chinchilla's choices.

  Returns:
    A :class:`BootstrapResult` (intervals for every parameter and exponent).
  """
  check_approach(approach)
  if n_resamples < 1:
    raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
  rng = np.random.default_rng(seed)
  if frontier_C is None:
    frontier_C = np.geomspace(runs.C.min(), runs.C.max(), 50)
  options = options or FitOptions()
  if approach == "2":  # budgets left out of the full fit stay out of every resample
    runs = runs.subset(np.flatnonzero(np.isin(runs.budget, [p.C for p in full.used])))
  grid = None
  if approach == "3":
    grid = approach3.chinchilla_grid() if options.grid is None else options.grid
    n_extra_starts = min(n_extra_starts, len(grid))
  t0 = time.perf_counter()
  rows: list[dict[str, float]] = []
  Ns, Ds = [], []
  n_failed = 0
  failures: dict[str, int] = {}
  left_out: dict[float, int] = {}
  used_in_full = {p.C for p in full.used} if approach == "2" else set()
  for _ in range(n_resamples):
    sub = runs.subset(_resample_indices(runs, rng, stratified=approach != "3"))
    starts = None
    if approach == "3":
      extra = grid[rng.choice(len(grid), size=n_extra_starts, replace=False)]
      starts = np.vstack([full.theta, extra])
    try:
      res = fit_approach(sub, approach, starts=starts, options=options)
      law = res.law
    except FitError as e:
      n_failed += 1
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
  if approach == "3":
    method = (f"{n_resamples} resamples of all runs with replacement (seed {seed}); L-BFGS from "
              f"the full-data optimum plus {n_extra_starts} grid points per resample")
  else:
    method = (f"{n_resamples} resamples of runs with replacement within each IsoFLOP budget "
              f"(seed {seed})")
  return BootstrapResult(n_resamples=n_resamples, n_failed=n_failed, seed=seed, level=level,
                         samples=samples, ci=ci, std=std, frontier_C=np.asarray(frontier_C),
                         frontier_N=fN, frontier_D=fD, wall_time_s=wall, method=method,
                         failures=failures, budgets_left_out=left_out)
