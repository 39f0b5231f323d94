"""Chinchilla's three approaches to the compute-optimal frontier, with bootstrap intervals.

References are to Hoffmann et al. 2022, "Training Compute-Optimal Large Language
Models" (arXiv 2203.15556, "Chinchilla") and Besiroglu et al. 2024, "Chinchilla
Scaling: A replication attempt" (arXiv 2404.10102, "Epoch").

* Approach 1 (Chinchilla Sec. 3.1): the lower envelope of eval loss vs FLOPs
  over all runs' curves at 1500 log-spaced FLOP values; the run on the envelope
  gives N_opt(C) and D_opt = C / (6 N_opt); power laws N_opt = k_N C^a,
  D_opt = k_D C^b are fitted by least squares in log space.
* Approach 2 (Sec. 3.2, Fig. 3): per IsoFLOP budget a parabola in ln N fitted to
  the final losses; its vertex is N_opt for that budget. Budgets whose minimum
  is not bracketed by the sampled N are reported and left out.
* Approach 3 (Sec. 3.3 and App. D.2): L(N, D) = E + A/N^alpha + B/D^beta fitted
  by minimising the SUM over runs of Huber_delta(LSE(logA - alpha ln N,
  logB - beta ln D, logE) - ln L), delta = 1e-3, with L-BFGS from the 4500-point
  grid of starts, keeping the best. Summing (not averaging) matters: averaging
  shrinks the objective so L-BFGS stops early (Besiroglu et al. 2024).

Units: N parameters, D tokens, C FLOPs (C = 6ND), loss nats/token.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import dataclasses
import itertools
import math
import multiprocessing
import sys
import time
from typing import Callable, Sequence

import numpy as np
import scipy.optimize

from chinchax import errors
from chinchax import laws
from analysis.io import Runs, runs_from_arrays

HUBER_DELTA = 1e-3          # Chinchilla Sec. 3.3 / App. D.2.
APPROACH1_N_POINTS = 1500   # log-spaced FLOP values on the envelope (Chinchilla Sec. 3.1).
APPROACH1_SMOOTH = 5        # points in the local-linear smoothing window of each eval curve.
CI_LEVEL = 0.95

# Grid of L-BFGS starts (Chinchilla App. D.2; shared/reference/README.md):
# alpha, beta in {0, 0.5, ..., 2}, e = log E in {-1, -0.5, ..., 1},
# a = log A and b = log B in {0, 5, ..., 25}: 6 * 6 * 5 * 5 * 5 = 4500 starts.
GRID_LOG_A = np.arange(0.0, 25.0 + 1e-9, 5.0)
GRID_LOG_B = np.arange(0.0, 25.0 + 1e-9, 5.0)
GRID_LOG_E = np.arange(-1.0, 1.0 + 1e-9, 0.5)
GRID_ALPHA = np.arange(0.0, 2.0 + 1e-9, 0.5)
GRID_BETA = np.arange(0.0, 2.0 + 1e-9, 0.5)
THETA_NAMES = ("logA", "logB", "logE", "alpha", "beta")

APPROACHES = ("1", "2", "3")


class FitError(errors.UserError):
  """A fit could not be made; the message says why."""


class ApproachUnsupported(FitError):
  """The table cannot support this approach (e.g. Approach 1 without eval curves)."""


# --------------------------------------------------------------------------- #
# BLAS threads.

_BLAS_SYMBOLS = (  # (set, get) pairs of the OpenBLAS builds numpy/scipy ship with.
    ("scipy_openblas_set_num_threads64_", "scipy_openblas_get_num_threads64_"),
    ("scipy_openblas_set_num_threads", "scipy_openblas_get_num_threads"),
    ("openblas_set_num_threads64_", "openblas_get_num_threads64_"),
    ("openblas_set_num_threads", "openblas_get_num_threads"),
)


@contextlib.contextmanager
def single_threaded_blas():
  """Limits every loaded OpenBLAS to one thread inside the block (Linux; else a no-op).

  scipy's L-BFGS-B calls BLAS on 5-element vectors; OpenBLAS threads gain
  nothing there and, on a busy machine, waking them made the 4500-start fit
  about 10x slower.
  """
  restore = []
  try:
    with open("/proc/self/maps") as f:
      paths = {line.split()[-1] for line in f if "openblas" in line.lower()}
  except OSError:
    paths = set()
  for path in sorted(paths):
    try:
      lib = ctypes.CDLL(path)
    except OSError:
      continue
    for set_name, get_name in _BLAS_SYMBOLS:
      setter, getter = getattr(lib, set_name, None), getattr(lib, get_name, None)
      if setter is not None and getter is not None:
        getter.restype = ctypes.c_int
        restore.append((setter, int(getter())))
        setter(ctypes.c_int(1))
        break
  try:
    yield
  finally:
    for setter, n in restore:
      setter(ctypes.c_int(n))


# --------------------------------------------------------------------------- #
# Power laws.


def fit_power_law(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
  """Least-squares fit of y = k · x^p in log space.

  Args:
    x: positive abscissae, shape (K,), K >= 2 distinct values (e.g. C, FLOPs).
    y: positive ordinates, shape (K,) (e.g. N_opt).

  Returns:
    (k, p).

  Raises:
    FitError: fewer than 2 distinct x, or a non-positive value.
  """
  x = np.asarray(x, dtype=np.float64)
  y = np.asarray(y, dtype=np.float64)
  if np.any(x <= 0) or np.any(y <= 0):
    raise FitError("a power-law fit needs positive x and y")
  if np.unique(x).size < 2:
    raise FitError(f"a power-law fit needs at least 2 distinct x values, got {np.unique(x).size}")
  p, logk = np.polyfit(np.log(x), np.log(y), 1)
  return float(math.exp(logk)), float(p)


def _check_exponent(a: float, what: str) -> None:
  if not 0.0 < a < 1.0:
    raise FitError(f"{what}: fitted exponent a = {a:.4g} (N_opt ∝ C^a) is outside (0, 1); with "
                   f"C = 6ND that would make N_opt or D_opt shrink as C grows")


# --------------------------------------------------------------------------- #
# Approach 1.


@dataclasses.dataclass
class Approach1Result:
  """Approach 1 (Chinchilla Sec. 3.1): the lower envelope of the eval curves.

  Attributes:
    C: envelope FLOP values, shape (P,), P = 1500 log-spaced points between the
      smallest and the largest final FLOPs of the runs.
    N_env: parameters of the run on the envelope at each C, shape (P,).
    D_env: tokens that run has seen at C, D = C / (6 N_env), shape (P,).
    loss_env: envelope loss at each C, nats/token, shape (P,).
    k_N, a: N_opt = k_N · C^a.
    k_D, b: D_opt = k_D · C^b (b = 1 - a up to rounding, since D = C/(6N)).
    edge_fraction: share of envelope points won by the smallest or largest N
      of the table (a large share means the sizes do not bracket the optimum).
  """

  C: np.ndarray
  N_env: np.ndarray
  D_env: np.ndarray
  loss_env: np.ndarray
  k_N: float
  a: float
  k_D: float
  b: float
  edge_fraction: float

  @property
  def law(self) -> laws.PowerLawAllocation:
    return laws.PowerLawAllocation(name="fit-approach1", k_N=self.k_N, a=self.a,
                                   source="Approach 1 fit (lower envelope)",
                                   fit_range_flops=(float(self.C[0]), float(self.C[-1])))

  def params(self) -> dict[str, float]:
    return {"k_N": self.k_N, "a": self.a, "k_D": self.k_D, "b": self.b}


def smooth_curve(log_flops: np.ndarray, loss: np.ndarray, window: int = APPROACH1_SMOOTH
                 ) -> np.ndarray:
  """Local-linear smoothing of one eval curve (Chinchilla Sec. 3.1 smooths each curve).

  Each point is replaced by the value at its ln(FLOPs) of a least-squares line
  through the ``window`` nearest points in order (fewer at the ends, where the
  window is shifted inwards rather than shrunk, so a decreasing curve is not
  biased upwards at its last point).

  Args:
    log_flops: ln FLOPs seen, increasing, shape (F,).
    loss: eval loss, nats/token, shape (F,).
    window: points per local fit; <= 2 returns ``loss`` unchanged.

  Returns:
    Smoothed loss, shape (F,).
  """
  F = loss.shape[0]
  w = min(int(window), F)
  if w <= 2:
    return loss.copy()
  out = np.empty(F)
  for i in range(F):
    lo = min(max(0, i - w // 2), F - w)
    x, y = log_flops[lo:lo + w], loss[lo:lo + w]
    xm = x.mean()
    dx = x - xm
    denom = (dx * dx).sum()
    slope = (dx * (y - y.mean())).sum() / denom if denom > 0 else 0.0
    out[i] = y.mean() + slope * (log_flops[i] - xm)
  return out


def approach1_support(runs: Runs) -> str | None:
  """None if Approach 1 can run on ``runs``, else the reason it cannot."""
  if runs.curves is None:
    return ("Approach 1 needs each run's eval-loss curve (eval_curve: [[flops_seen, eval_loss], "
            "...]) and this table has none (a CSV of final losses, or JSONL rows without curves)")
  if np.unique(runs.N).size < 2:
    return "Approach 1 needs runs of at least 2 model sizes"
  return None


def fit_approach1(runs: Runs, n_points: int = APPROACH1_N_POINTS,
                  smooth: int = APPROACH1_SMOOTH) -> Approach1Result:
  """Approach 1: envelope of loss vs FLOPs over all runs' curves → power laws.

  Each curve is smoothed (:func:`smooth_curve`) and interpolated linearly in
  ln(FLOPs) (no extrapolation). At
  ``n_points`` log-spaced FLOP values between the smallest and the largest
  final FLOPs of the runs, the run with the lowest interpolated loss gives
  N_opt(C) and D_opt(C) = C / (6 N_opt) (Chinchilla Sec. 3.1, Fig. 2).

  Chinchilla trained each N with 4 cosine horizons; in an IsoFLOP ladder each
  (C, N) has one, so points before a run's end are mid-schedule and the
  envelope leans on the runs' final points. Because single runs decide the
  envelope, this is the most noise-sensitive of the three approaches; its
  bootstrap interval shows how much.

  Args:
    runs: finished runs with eval curves (``runs.curves`` not None).
    n_points: FLOP values on the envelope.
    smooth: points per local-linear smoothing window (1 = no smoothing).

  Returns:
    An :class:`Approach1Result`.

  Raises:
    ApproachUnsupported: no curves, or fewer than 2 model sizes.
    FitError: the envelope is degenerate (a single winning size).
  """
  reason = approach1_support(runs)
  if reason:
    raise ApproachUnsupported(reason)
  ends = np.array([c[-1, 0] for c in runs.curves])
  lo, hi = float(ends.min()), float(ends.max())
  if not hi > lo:
    raise FitError("Approach 1 needs runs that end at different FLOP counts")
  C = np.exp(np.linspace(math.log(lo), math.log(hi), n_points))
  logC = np.log(C)
  loss = np.full((len(runs), n_points), np.inf)
  for i, curve in enumerate(runs.curves):
    log_f = np.log(curve[:, 0])
    loss[i] = np.interp(logC, log_f, smooth_curve(log_f, curve[:, 1], smooth), left=np.inf,
                        right=np.inf)
  win = np.argmin(loss, axis=0)
  loss_env = loss[win, np.arange(n_points)]
  ok = np.isfinite(loss_env)
  if ok.sum() < 2:
    raise FitError("Approach 1: the eval curves do not overlap the range of final FLOPs")
  C, win, loss_env = C[ok], win[ok], loss_env[ok]
  N_env = runs.N[win]
  if np.unique(N_env).size < 2:
    raise FitError(f"Approach 1: one model size (N = {N_env[0]:.4g}) is on the envelope at every "
                   f"FLOP count, so no power law can be fitted")
  D_env = C / (6.0 * N_env)
  k_N, a = fit_power_law(C, N_env)
  k_D, b = fit_power_law(C, D_env)
  _check_exponent(a, "Approach 1")
  edge = (N_env == runs.N.min()) | (N_env == runs.N.max())
  return Approach1Result(C=C, N_env=N_env, D_env=D_env, loss_env=loss_env, k_N=k_N, a=a,
                         k_D=k_D, b=b, edge_fraction=float(edge.mean()))


# --------------------------------------------------------------------------- #
# Approach 2.


@dataclasses.dataclass
class BudgetParabola:
  """One IsoFLOP budget of Approach 2: loss ≈ p2 x² + p1 x + p0 with x = ln N.

  Attributes:
    C: the budget, FLOPs.
    n_runs: runs at this budget.
    n_sizes: distinct N at this budget.
    N_range: (smallest, largest) sampled N.
    coeffs: (p2, p1, p0), or None when too few sizes.
    N_opt: vertex exp(-p1 / (2 p2)), parameters (NaN without a minimum).
    D_opt: C / (6 N_opt), tokens.
    loss_opt: parabola value at the vertex, nats/token.
    status: "ok", "edge" (minimum not bracketed by the sampled N),
      "no-minimum" (p2 <= 0) or "too-few-sizes" (< 3 distinct N).
    reason: why a budget is left out ("" when ok).
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

  def to_dict(self) -> dict:
    d = dataclasses.asdict(self)
    d["N_range"] = list(self.N_range)
    d["coeffs"] = list(self.coeffs) if self.coeffs else None
    return d


def fit_isoflop_parabola(C: float, N: np.ndarray, loss: np.ndarray) -> BudgetParabola:
  """Fits one IsoFLOP profile with a parabola in ln N (Chinchilla Sec. 3.2, Fig. 3).

  Args:
    C: the budget, FLOPs.
    N: parameters of the runs at this budget, shape (K,).
    loss: their final losses, nats/token, shape (K,).

  Returns:
    A :class:`BudgetParabola`; its ``status`` says whether it is usable.
  """
  N = np.asarray(N, dtype=np.float64)
  loss = np.asarray(loss, dtype=np.float64)
  sizes = np.unique(N)
  rng = (float(N.min()), float(N.max()))
  nan = float("nan")
  if sizes.size < 3:
    return BudgetParabola(C, len(N), int(sizes.size), rng, None, nan, nan, nan, "too-few-sizes",
                          f"{sizes.size} distinct N (a parabola needs 3)")
  x = np.log(N)
  p2, p1, p0 = (float(v) for v in np.polyfit(x, loss, 2))
  if p2 <= 0:
    return BudgetParabola(C, len(N), int(sizes.size), rng, (p2, p1, p0), nan, nan, nan,
                          "no-minimum", "the fitted parabola opens downwards (no minimum)")
  x_opt = -p1 / (2.0 * p2)
  N_opt = math.exp(x_opt)
  loss_opt = p0 - p1 * p1 / (4.0 * p2)
  res = BudgetParabola(C, len(N), int(sizes.size), rng, (p2, p1, p0), N_opt, C / (6.0 * N_opt),
                       loss_opt, "ok")
  # The lowest observed loss must be at an interior N, and the vertex inside
  # the sampled range; otherwise the minimum is not bracketed.
  mean_loss = np.array([loss[N == s].mean() for s in sizes])
  i_best = int(np.argmin(mean_loss))
  if i_best in (0, sizes.size - 1) or not (x.min() < x_opt < x.max()):
    where = "smallest" if (i_best == 0 or x_opt <= x.min()) else "largest"
    res.status = "edge"
    res.reason = (f"the minimum sits at the {where} sampled N ({rng[0]:.3g}–{rng[1]:.3g}); "
                  f"vertex N = {N_opt:.3g}")
  return res


@dataclasses.dataclass
class Approach2Result:
  """Approach 2 (Chinchilla Sec. 3.2): IsoFLOP parabolas → N_opt per budget → power laws.

  Attributes:
    budgets: one :class:`BudgetParabola` per IsoFLOP budget (all, usable or not).
    k_N, a: N_opt = k_N · C^a fitted over the usable budgets.
    k_D, b: D_opt = k_D · C^b.
  """

  budgets: list[BudgetParabola]
  k_N: float
  a: float
  k_D: float
  b: float

  @property
  def used(self) -> list[BudgetParabola]:
    return [p for p in self.budgets if p.status == "ok"]

  @property
  def left_out(self) -> list[BudgetParabola]:
    return [p for p in self.budgets if p.status != "ok"]

  @property
  def law(self) -> laws.PowerLawAllocation:
    Cs = [p.C for p in self.used]
    return laws.PowerLawAllocation(name="fit-approach2", k_N=self.k_N, a=self.a,
                                   source="Approach 2 fit (IsoFLOP parabolas)",
                                   fit_range_flops=(min(Cs), max(Cs)))

  def params(self) -> dict[str, float]:
    return {"k_N": self.k_N, "a": self.a, "k_D": self.k_D, "b": self.b}


def approach2_parabolas(runs: Runs) -> list[BudgetParabola]:
  """One parabola per IsoFLOP budget of ``runs`` (sorted by C)."""
  out = []
  for C in runs.budgets():
    sel = runs.budget == C
    out.append(fit_isoflop_parabola(float(C), runs.N[sel], runs.loss[sel]))
  return out


def approach2_support(runs: Runs, min_budgets: int = 3) -> str | None:
  """None if Approach 2 can run on ``runs``, else the reason it cannot."""
  parabolas = approach2_parabolas(runs)
  usable = [p for p in parabolas if p.status == "ok"]
  if len(usable) >= min_budgets:
    return None
  with_sizes = sum(p.n_sizes >= 3 for p in parabolas)
  if with_sizes < min_budgets:
    return (f"Approach 2 needs at least {min_budgets} IsoFLOP budgets with 3 or more model sizes "
            f"each; this table has {with_sizes} of {len(parabolas)} budgets with 3+ sizes")
  left = "; ".join(f"C={p.C:.3g}: {p.reason}" for p in parabolas if p.status != "ok")
  return (f"Approach 2 needs at least {min_budgets} budgets whose loss minimum lies inside the "
          f"sampled N; only {len(usable)} qualify ({left})")


def fit_approach2(runs: Runs, min_budgets: int = 3) -> Approach2Result:
  """Approach 2: per-budget parabola minima → N_opt = k_N C^a, D_opt = k_D C^b.

  Args:
    runs: finished runs with IsoFLOP budgets (``runs.budget``).
    min_budgets: fewest usable budgets for the power-law fit.

  Returns:
    An :class:`Approach2Result` listing every budget, used or left out.

  Raises:
    ApproachUnsupported: fewer than ``min_budgets`` budgets with a bracketed
      minimum (the message lists why each was left out).
  """
  parabolas = approach2_parabolas(runs)
  usable = [p for p in parabolas if p.status == "ok"]
  if len(usable) < min_budgets:
    raise ApproachUnsupported(approach2_support(runs, min_budgets) or "too few usable budgets")
  C = np.array([p.C for p in usable])
  k_N, a = fit_power_law(C, np.array([p.N_opt for p in usable]))
  k_D, b = fit_power_law(C, np.array([p.D_opt for p in usable]))
  _check_exponent(a, "Approach 2")
  return Approach2Result(budgets=parabolas, k_N=k_N, a=a, k_D=k_D, b=b)


# --------------------------------------------------------------------------- #
# Approach 3.


def chinchilla_grid() -> np.ndarray:
  """The 4500 L-BFGS starts of Chinchilla App. D.2, shape (4500, 5).

  Columns follow :data:`THETA_NAMES`: (logA, logB, logE, alpha, beta).
  """
  return np.array(list(itertools.product(GRID_LOG_A, GRID_LOG_B, GRID_LOG_E, GRID_ALPHA,
                                         GRID_BETA)), dtype=np.float64)


def _grid_edges() -> tuple[np.ndarray, np.ndarray]:
  lo = np.array([g[0] for g in (GRID_LOG_A, GRID_LOG_B, GRID_LOG_E, GRID_ALPHA, GRID_BETA)])
  hi = np.array([g[-1] for g in (GRID_LOG_A, GRID_LOG_B, GRID_LOG_E, GRID_ALPHA, GRID_BETA)])
  return lo, hi


def huber_objective(theta: np.ndarray, logN: np.ndarray, logD: np.ndarray, logL: np.ndarray,
                    delta: float = HUBER_DELTA) -> tuple[float, np.ndarray]:
  """Chinchilla's Approach-3 objective and its analytic gradient.

  f(theta) = sum_i Huber_delta(r_i), r_i = LSE(logA - alpha ln N_i,
  logB - beta ln D_i, logE) - ln L_i (Chinchilla eq. 3 / App. D.2), with
  Huber_delta(r) = r²/2 for |r| <= delta, else delta (|r| - delta/2).

  With softmax weights w_k of the three LSE terms and h = clip(r, -delta,
  delta) = Huber'(r): df/dlogA = sum h w_1, df/dalpha = -sum h w_1 ln N,
  df/dlogB = sum h w_2, df/dbeta = -sum h w_2 ln D, df/dlogE = sum h w_3.

  Args:
    theta: (logA, logB, logE, alpha, beta), shape (5,).
    logN: ln N per run, shape (R,).
    logD: ln D per run, shape (R,).
    logL: ln loss per run, shape (R,).
    delta: Huber threshold (Chinchilla: 1e-3).

  Returns:
    (f, grad): the summed Huber loss (float) and its gradient, shape (5,).
  """
  logA, logB, logE, alpha, beta = theta
  u = np.empty((3, logN.shape[0]))
  np.multiply(logN, -alpha, out=u[0])
  u[0] += logA
  np.multiply(logD, -beta, out=u[1])
  u[1] += logB
  u[2] = logE
  m = u.max(axis=0)
  u -= m
  np.exp(u, out=u)                    # u[k] = exp(term_k - m)
  s = u.sum(axis=0)
  r = np.log(s)
  r += m
  r -= logL                           # r = LSE - ln L
  h = np.clip(r, -delta, delta)       # Huber'(r)
  f = float((h * (r - 0.5 * h)).sum())  # equals sum_i Huber_delta(r_i)
  u *= h / s                          # u[k] = Huber'(r) * softmax weight k
  g = u.sum(axis=1)
  # Elementwise products and sums, not np.dot: BLAS on such short vectors gains
  # nothing and can stall on thread wake-ups on a busy machine.
  grad = np.array([g[0], g[1], g[2], -(u[0] * logN).sum(), -(u[1] * logD).sum()])
  return f, grad


def _run_starts(starts: np.ndarray, logN: np.ndarray, logD: np.ndarray, logL: np.ndarray,
                delta: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """L-BFGS (scipy L-BFGS-B, default tolerances) from each start; returns x, f, nit, success."""
  xs = np.empty_like(starts)
  fs = np.empty(len(starts))
  nit = np.empty(len(starts), dtype=np.int64)
  ok = np.empty(len(starts), dtype=bool)
  with single_threaded_blas():
    for i, x0 in enumerate(starts):
      res = scipy.optimize.minimize(huber_objective, x0, args=(logN, logD, logL, delta),
                                    jac=True, method="L-BFGS-B")
      xs[i], fs[i], nit[i], ok[i] = res.x, res.fun, res.nit, res.success
  return xs, fs, nit, ok


def run_lbfgs_starts(starts: np.ndarray, logN, logD, logL, delta: float = HUBER_DELTA,
                     n_jobs: int = 1):
  """Runs L-BFGS from every row of ``starts``, optionally over ``n_jobs`` processes.

  Returns:
    (x, f, nit, success): final thetas (S, 5), objectives (S,), iterations
    (S,), scipy success flags (S,).
  """
  n_jobs = max(1, min(int(n_jobs), len(starts)))
  if n_jobs == 1:
    return _run_starts(starts, logN, logD, logL, delta)
  chunks = np.array_split(starts, n_jobs)
  # fork is quick; once JAX (multithreaded) is loaded, a forked child can
  # deadlock, so spawn fresh interpreters instead.
  ctx = multiprocessing.get_context("spawn" if "jax" in sys.modules else "fork")
  with concurrent.futures.ProcessPoolExecutor(max_workers=n_jobs, mp_context=ctx) as pool:
    parts = list(pool.map(_run_starts, chunks, *([logN] * n_jobs, [logD] * n_jobs,
                                                 [logL] * n_jobs, [delta] * n_jobs)))
  return tuple(np.concatenate([p[k] for p in parts]) for k in range(4))


@dataclasses.dataclass
class Approach3Result:
  """Approach 3 (Chinchilla Sec. 3.3): the parametric law L(N, D) = E + A/N^alpha + B/D^beta.

  Attributes:
    E, A, B, alpha, beta: fitted parameters (E nats/token).
    theta: (logA, logB, logE, alpha, beta) at the optimum, shape (5,).
    objective: summed Huber loss at the optimum.
    delta: Huber threshold used.
    n_starts: L-BFGS starts run.
    n_starts_at_best: starts ending within a relative 1e-6 of the best objective.
    n_interior_starts_at_best: how many of those have no coordinate at an
      extreme of the grid (0 suggests a wider grid could find a better optimum).
    best_start: the start (logA, logB, logE, alpha, beta) that reached the best
      (the first in grid order among equal objectives).
    best_start_on_grid_edge: whether that start has a coordinate at an extreme
      of the start grid.
    optimum_inside_grid: whether the optimum lies inside the grid's box.
    converged: scipy's success flag for the best start.
    n_iter: L-BFGS iterations of the best start.
    residuals: ln L_pred - ln L per run, shape (R,).
    wall_time_s: seconds spent in the multi-start fit.
    fit_range_flops: (C_min, C_max) of the fitted runs.
  """

  E: float
  A: float
  B: float
  alpha: float
  beta: float
  theta: np.ndarray
  objective: float
  delta: float
  n_starts: int
  n_starts_at_best: int
  n_interior_starts_at_best: int
  best_start: np.ndarray
  best_start_on_grid_edge: bool
  optimum_inside_grid: bool
  converged: bool
  n_iter: int
  residuals: np.ndarray
  wall_time_s: float
  fit_range_flops: tuple[float, float]

  @property
  def law(self) -> laws.ParametricLaw:
    return laws.ParametricLaw(name="fit-approach3", E=self.E, A=self.A, B=self.B,
                              alpha=self.alpha, beta=self.beta,
                              source="Approach 3 fit (summed Huber, L-BFGS)",
                              fit_range_flops=self.fit_range_flops)

  @property
  def a(self) -> float:
    return self.law.a

  @property
  def b(self) -> float:
    return self.law.b

  @property
  def G(self) -> float:
    return self.law.G

  def params(self) -> dict[str, float]:
    return {"E": self.E, "A": self.A, "B": self.B, "alpha": self.alpha, "beta": self.beta,
            "a": self.a, "b": self.b, "G": self.G}


def fit_approach3(runs: Runs, *, starts: np.ndarray | None = None, delta: float = HUBER_DELTA,
                  n_jobs: int = 1, polish: bool = True) -> Approach3Result:
  """Approach 3 exactly as Chinchilla App. D.2 describes it.

  Minimises the SUM over runs of Huber_delta(LSE(logA - alpha ln N,
  logB - beta ln D, logE) - ln L) with scipy's L-BFGS-B (analytic gradient,
  :func:`huber_objective`, scipy's default tolerances) from every start and
  keeps the lowest objective. With ``polish``, one more L-BFGS-B run from that
  optimum with tight tolerances (ftol 1e-15, gtol 1e-12) removes the last
  early-stopping error; it is kept only if it lowers the objective.

  Args:
    runs: finished runs (N, D, final loss).
    starts: L-BFGS starts, shape (S, 5) in :data:`THETA_NAMES` order; default
      the 4500-point grid of :func:`chinchilla_grid`.
    delta: Huber threshold (Chinchilla: 1e-3).
    n_jobs: processes for the starts (1 = in this process).
    polish: refine the best optimum with tight tolerances.

  Returns:
    An :class:`Approach3Result`.

  Raises:
    FitError: fewer than 5 runs, or the best optimum has alpha or beta <= 0.
  """
  if len(runs) < 5:
    raise ApproachUnsupported(f"Approach 3 fits 5 parameters and needs at least 5 runs, "
                              f"got {len(runs)}")
  logN, logD, logL = np.log(runs.N), np.log(runs.D), np.log(runs.loss)
  if starts is None:
    starts = chinchilla_grid()
  starts = np.atleast_2d(np.asarray(starts, dtype=np.float64))
  t0 = time.perf_counter()
  xs, fs, nit, ok = run_lbfgs_starts(starts, logN, logD, logL, delta, n_jobs)
  fs = np.where(np.isfinite(fs), fs, np.inf)
  best = int(np.argmin(fs))
  theta = xs[best]
  objective = float(fs[best])
  if polish and np.isfinite(objective):
    with single_threaded_blas():
      res = scipy.optimize.minimize(huber_objective, theta, args=(logN, logD, logL, delta),
                                    jac=True, method="L-BFGS-B",
                                    options={"ftol": 1e-15, "gtol": 1e-12, "maxiter": 2000})
    if np.isfinite(res.fun) and res.fun <= objective:
      theta, objective = res.x, float(res.fun)
  wall = time.perf_counter() - t0
  logA, logB, logE, alpha, beta = (float(v) for v in theta)
  if not (alpha > 0 and beta > 0):
    raise FitError(f"Approach 3: the best optimum has alpha = {alpha:.4g}, beta = {beta:.4g}; "
                   f"both must be > 0 (the data do not determine the law)")
  lo, hi = _grid_edges()
  best_start = starts[best]
  edge = np.any(np.isclose(starts, lo) | np.isclose(starts, hi), axis=1)
  at_best = fs <= fs[best] * (1 + 1e-6) + 1e-15
  inside = bool(np.all((theta >= lo) & (theta <= hi)))
  E, A, B = math.exp(logE), math.exp(logA), math.exp(logB)
  pred = np.log(E + A * runs.N ** -alpha + B * runs.D ** -beta)
  C = runs.C
  return Approach3Result(
      E=E, A=A, B=B, alpha=alpha, beta=beta, theta=np.array(theta, dtype=np.float64),
      objective=objective,
      delta=delta, n_starts=len(starts),
      n_starts_at_best=int(at_best.sum()), n_interior_starts_at_best=int((at_best & ~edge).sum()),
      best_start=best_start.copy(), best_start_on_grid_edge=bool(edge[best]),
      optimum_inside_grid=inside,
      converged=bool(ok[best]), n_iter=int(nit[best]), residuals=pred - logL, wall_time_s=wall,
      fit_range_flops=(float(C.min()), float(C.max())))


# --------------------------------------------------------------------------- #
# Bootstrap.


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
              n_extra_starts: int = 4) -> BootstrapResult:
  """Bootstrap confidence intervals for one approach by resampling runs with replacement.

  Approaches 1 and 2 resample runs within each IsoFLOP budget (every budget
  keeps its number of runs); Approach 3 resamples all runs together, as
  Besiroglu et al. 2024 do. Intervals are percentile intervals.

  For Approach 3, each replicate starts L-BFGS from the full-data optimum plus
  ``n_extra_starts`` points drawn from the 4500-point grid instead of the
  whole grid: the replicate's optimum lies near the full-data one, and this
  keeps a replicate to a few milliseconds.

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

  Returns:
    A :class:`BootstrapResult` (intervals for every parameter and exponent).
  """
  if n_resamples < 1:
    raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
  rng = np.random.default_rng(seed)
  if frontier_C is None:
    frontier_C = np.geomspace(runs.C.min(), runs.C.max(), 50)
  grid = chinchilla_grid() if approach == "3" else None
  t0 = time.perf_counter()
  rows: list[dict[str, float]] = []
  Ns, Ds = [], []
  n_failed = 0
  for _ in range(n_resamples):
    sub = runs.subset(_resample_indices(runs, rng, stratified=approach != "3"))
    try:
      if approach == "1":
        res = fit_approach1(sub)
      elif approach == "2":
        res = fit_approach2(sub)
      elif approach == "3":
        extra = grid[rng.choice(len(grid), size=n_extra_starts, replace=False)]
        res = fit_approach3(sub, starts=np.vstack([full.theta, extra]))
      else:
        raise ValueError(f"unknown approach {approach!r}; valid: {APPROACHES}")
      law = res.law
    except FitError:
      n_failed += 1
      continue
    rows.append(res.params())
    n_opt, d_opt = law.optimal_allocation(frontier_C)
    Ns.append(n_opt)
    Ds.append(d_opt)
  wall = time.perf_counter() - t0
  q = (100 * (1 - level) / 2, 100 * (1 + level) / 2)
  names = list(full.params())
  samples = {k: np.array([r[k] for r in rows]) for k in names}
  if rows:
    ci = {k: (float(np.percentile(v, q[0])), float(np.percentile(v, q[1])))
          for k, v in samples.items()}
    std = {k: float(np.std(v, ddof=1)) if len(v) > 1 else 0.0 for k, v in samples.items()}
    Ns_a, Ds_a = np.array(Ns), np.array(Ds)
    fN = (np.percentile(Ns_a, q[0], axis=0), np.percentile(Ns_a, q[1], axis=0))
    fD = (np.percentile(Ds_a, q[0], axis=0), np.percentile(Ds_a, q[1], axis=0))
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
                         frontier_N=fN, frontier_D=fD, wall_time_s=wall, method=method)


# --------------------------------------------------------------------------- #
# All approaches.


@dataclasses.dataclass
class FitReport:
  """Everything ``analysis fit`` computes.

  Attributes:
    runs: the runs fitted.
    results: approach ("1", "2", "3") -> its result.
    bootstraps: approach -> :class:`BootstrapResult` (absent when not run).
    skipped: approach -> the reason it was skipped.
    requested: approaches asked for.
    frontier_C: FLOPs of the frontier table and figure, shape (P,).
  """

  runs: Runs
  results: dict
  bootstraps: dict
  skipped: dict
  requested: tuple[str, ...]
  frontier_C: np.ndarray

  def laws(self) -> dict[str, laws.Law]:
    """Fitted laws by approach."""
    return {k: r.law for k, r in self.results.items()}


def support_reason(runs: Runs, approach: str) -> str | None:
  """None if ``approach`` can run on ``runs``, else the reason."""
  if approach == "1":
    return approach1_support(runs)
  if approach == "2":
    return approach2_support(runs)
  if approach == "3":
    return None if len(runs) >= 5 else f"Approach 3 needs at least 5 runs, got {len(runs)}"
  raise ValueError(f"unknown approach {approach!r}; valid: {', '.join(APPROACHES)}")


def frontier_flops(runs: Runs, extra_decades: float = 2.0, n: int = 60) -> np.ndarray:
  """Log-spaced FLOPs from the data's smallest C to ``extra_decades`` past its largest."""
  lo, hi = runs.C.min(), runs.C.max() * 10 ** extra_decades
  return np.geomspace(lo, hi, n)


def fit_all(runs: Runs, approaches: Sequence[str] = APPROACHES, *, n_bootstrap: int = 200,
            seed: int = 0, strict: bool = False, n_jobs: int = 1,
            log: Callable[[str], None] | None = None) -> FitReport:
  """Fits the requested approaches, each with a bootstrap.

  Args:
    runs: finished runs.
    approaches: any of "1", "2", "3".
    n_bootstrap: bootstrap replicates per approach (0 = none).
    seed: bootstrap seed.
    strict: raise :class:`ApproachUnsupported` when an approach cannot run
      (an explicit request) instead of recording it as skipped.
    n_jobs: processes for Approach 3's 4500 starts.
    log: optional progress printer.

  Returns:
    A :class:`FitReport`.
  """
  say = log or (lambda msg: None)
  for a in approaches:
    if a not in APPROACHES:
      raise ValueError(f"unknown approach {a!r}; valid: {', '.join(APPROACHES)}")
  fC = frontier_flops(runs)
  results, boots, skipped = {}, {}, {}
  for a in approaches:
    reason = support_reason(runs, a)
    if reason is None:
      try:
        t0 = time.perf_counter()
        fitter = {"1": fit_approach1, "2": fit_approach2}.get(a)
        res = fitter(runs) if fitter else fit_approach3(runs, n_jobs=n_jobs)
        say(f"approach {a}: fitted in {time.perf_counter() - t0:.1f} s")
      except FitError as e:
        reason = str(e)
    if reason is not None:
      if strict:
        raise ApproachUnsupported(reason)
      skipped[a] = reason
      say(f"approach {a}: skipped: {reason}")
      continue
    results[a] = res
    if n_bootstrap > 0:
      boots[a] = bootstrap(runs, a, res, n_resamples=n_bootstrap, seed=seed, frontier_C=fC)
      say(f"approach {a}: {n_bootstrap} bootstrap resamples in {boots[a].wall_time_s:.1f} s")
  return FitReport(runs=runs, results=results, bootstraps=boots, skipped=skipped,
                   requested=tuple(approaches), frontier_C=fC)


# --------------------------------------------------------------------------- #
# Synthetic data.


def synthetic_runs(law: laws.ParametricLaw, budgets: Sequence[float], *, n_sizes: int = 7,
                   span: float = 8.0, noise: float = 0.0, seed: int = 0,
                   curve_points: int = 0, curve_noise: float = 0.0) -> Runs:
  """IsoFLOP runs whose losses come from a known law, for testing the fitters.

  For each budget C, ``n_sizes`` model sizes log-spaced over
  [N_opt(C) / span, N_opt(C) · span] get D = C / (6N) tokens and final loss
  L(N, D) · exp(noise · z), z ~ N(0, 1) per run (so ``noise`` is the standard
  deviation of ln L).

  Args:
    law: the true law.
    budgets: IsoFLOP budgets, FLOPs.
    n_sizes: sizes per budget.
    span: factor between the optimum and the smallest/largest size.
    noise: standard deviation of the per-run noise on ln L.
    seed: seed of the noise.
    curve_points: if > 0, each run also gets an eval curve of that many
      points log-spaced from C/100 to C: L(N, flops / (6N)) times the run's
      noise factor times exp(curve_noise · z) per point; its last point is the
      final loss (for Approach 1).
    curve_noise: standard deviation of the extra per-point noise on ln L.

  Returns:
    :class:`Runs` with one budget per entry of ``budgets``.
  """
  rng = np.random.default_rng(seed)
  N, D, loss, budget, curves = [], [], [], [], []
  for C in budgets:
    n_opt, _ = law.optimal_allocation(float(C))
    for n in n_opt * np.geomspace(1.0 / span, span, n_sizes):
      d = C / (6.0 * n)
      run_factor = math.exp(noise * rng.standard_normal())
      if curve_points > 0:
        flops = np.geomspace(C / 100.0, C, curve_points)
        curve_loss = law.loss(n, flops / (6.0 * n)) * run_factor * np.exp(
            curve_noise * rng.standard_normal(curve_points))
        curves.append(np.stack([flops, curve_loss], axis=1))
        final = float(curve_loss[-1])
      else:
        final = float(law.loss(n, d) * run_factor)
      N.append(n)
      D.append(d)
      loss.append(final)
      budget.append(float(C))
  return runs_from_arrays(N, D, loss, budget=budget, curves=curves if curve_points > 0 else None,
                          source=f"synthetic:{law.name}")
