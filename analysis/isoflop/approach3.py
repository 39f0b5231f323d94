"""Approach 3 of Hoffmann et al. 2022 (arXiv 2203.15556, Sec. 3.3, App. D.2): the parametric law.

L(N, D) = E + A/N^alpha + B/D^beta is fitted by minimising the SUM over runs
of Huber_delta(LSE(logA - alpha ln N, logB - beta ln D, logE) - ln L),
delta = 1e-3, with L-BFGS from the 4500-point grid of starts, keeping the best
(the grid's log E axis is carried on past 1 for a table whose losses all lie above e:
:func:`default_grid`).
Summing (not averaging) matters: averaging shrinks the objective so L-BFGS
stops early (Besiroglu et al. 2024, "Chinchilla Scaling: A replication
attempt", arXiv 2404.10102).

Units: N parameters, D tokens, C FLOPs, loss nats/token.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import math
import multiprocessing
import sys
import time

import numpy as np
import scipy.optimize

from chinchax.laws import parametric as laws
from analysis.blas import single_threaded_blas
from analysis.errors import ApproachUnsupported, FitError
from analysis.runs import Runs

HUBER_DELTA = 1e-3          # Chinchilla Sec. 3.3 / App. D.2.

# Grid of L-BFGS starts (Chinchilla App. D.2):
# alpha, beta in {0, 0.5, ..., 2}, e = log E in {-1, -0.5, ..., 1},
# a = log A and b = log B in {0, 5, ..., 25}: 6 * 6 * 5 * 5 * 5 = 4500 starts.
GRID_LOG_A = np.arange(0.0, 25.0 + 1e-9, 5.0)
GRID_LOG_B = np.arange(0.0, 25.0 + 1e-9, 5.0)
GRID_LOG_E = np.arange(-1.0, 1.0 + 1e-9, 0.5)
GRID_ALPHA = np.arange(0.0, 2.0 + 1e-9, 0.5)
GRID_BETA = np.arange(0.0, 2.0 + 1e-9, 0.5)
THETA_NAMES = ("logA", "logB", "logE", "alpha", "beta")
_GRIDS = (GRID_LOG_A, GRID_LOG_B, GRID_LOG_E, GRID_ALPHA, GRID_BETA)  # in THETA_NAMES order
MIN_RUNS = len(THETA_NAMES)  # a fit of 5 parameters needs at least 5 runs

# exp() of a larger log overflows float64: an optimum out there is not a law.
_MAX_LOG = math.log(float(np.finfo(np.float64).max))


def chinchilla_grid() -> np.ndarray:
  """The 4500 L-BFGS starts of Chinchilla App. D.2, shape (4500, 5).

  Columns follow :data:`THETA_NAMES`: (logA, logB, logE, alpha, beta).
  """
  return np.array(list(itertools.product(*_GRIDS)), dtype=np.float64)


# The highest log E the default grid reaches: a per-token loss of e^3 ≈ 20 nats is the entropy
# of a uniform choice among 4.9e8 tokens, above any language model's irreducible loss.
MAX_DEFAULT_LOG_E = 3.0


def default_grid(min_loss: float) -> np.ndarray:
  """The default grid of starts for a table whose lowest loss is ``min_loss``.

  :func:`chinchilla_grid`, with its log E axis carried on in Chinchilla's steps of 0.5
  past 1 up to the first value >= ln(min_loss) (at most :data:`MAX_DEFAULT_LOG_E`) when
  every loss lies above e. E is below every measured loss (A/N^alpha and B/D^beta are
  positive), so the admissible log E reaches ln(min_loss); Chinchilla's axis stops at
  E = e ≈ 2.72 nats (their fit: E = 1.69), below the losses of a corpus whose losses are all
  higher (BPE tokens, say). Each new log E value comes with the 900 combinations of the
  other four coordinates the grid has at its top log E.

  Args:
    min_loss: the table's lowest loss, nats/token.

  Returns:
    Starts, shape (4500 + 900·k, 5) in :data:`THETA_NAMES` order, with
    k = min(4, max(0, ceil((ln min_loss - 1) / 0.5))); :func:`chinchilla_grid` itself
    (k = 0) for ``min_loss`` <= e, not finite or not positive.
  """
  grid = chinchilla_grid()
  top = float(grid[:, 2].max())
  if not (np.isfinite(min_loss) and min_loss > 0):
    return grid
  target, extra = min(math.log(min_loss), MAX_DEFAULT_LOG_E), []
  while top + 0.5 * len(extra) < target:
    extra.append(top + 0.5 * (len(extra) + 1))
  rows = grid[np.isclose(grid[:, 2], top)]
  blocks = [grid]
  for e in extra:
    block = rows.copy()
    block[:, 2] = e
    blocks.append(block)
  return np.vstack(blocks)


def parse_grid(spec: str) -> dict[str, np.ndarray]:
  """Parses a start-grid spec ``"alpha=0:1:11,beta=0.2:0.6:5"`` (name=lo:hi:count, or
  name=v1/v2/... for listed values) into {name: values}.

  Names are those of :data:`THETA_NAMES`; the coordinates not named keep
  Chinchilla's values (:func:`start_grid`).

  Raises:
    ValueError: an unknown name, a malformed range, or a count below 1.
  """
  out: dict[str, np.ndarray] = {}
  for part in (p.strip() for p in spec.split(",") if p.strip()):
    name, sep, rhs = part.partition("=")
    name = name.strip()
    if not sep or name not in THETA_NAMES:
      raise ValueError(f"start grid {part!r}: expected NAME=lo:hi:count or NAME=v1/v2/... with "
                       f"NAME one of {', '.join(THETA_NAMES)}")
    try:
      if ":" in rhs:
        lo, hi, count = rhs.split(":")
        if int(count) < 1:
          raise ValueError
        values = np.linspace(float(lo), float(hi), int(count))
      else:
        values = np.array([float(v) for v in rhs.split("/")])
    except ValueError:
      raise ValueError(f"start grid {part!r}: expected NAME=lo:hi:count (count >= 1) or "
                       f"NAME=v1/v2/...") from None
    if not np.all(np.isfinite(values)):
      raise ValueError(f"start grid {part!r}: values must be finite")
    out[name] = np.unique(values)
  return out


def start_grid(values: dict[str, np.ndarray] | None = None) -> np.ndarray:
  """The product grid of L-BFGS starts, shape (S, 5) in :data:`THETA_NAMES` order.

  Args:
    values: {name: values} replacing Chinchilla's values of those coordinates
      (:func:`parse_grid`); None or {}: :func:`chinchilla_grid`.
  """
  if not values:
    return chinchilla_grid()
  axes = [np.asarray(values.get(n, g), dtype=np.float64) for n, g in zip(THETA_NAMES, _GRIDS)]
  return np.array(list(itertools.product(*axes)), dtype=np.float64)


def approach3_support(runs: Runs) -> str | None:
  """None if Approach 3 can run on ``runs``, else the reason it cannot."""
  if len(runs) < MIN_RUNS:
    return f"Approach 3 needs at least {MIN_RUNS} runs, got {len(runs)}"
  return None


def huber_objective(theta: np.ndarray, logN: np.ndarray, logD: np.ndarray, logL: np.ndarray,
                    delta: float = HUBER_DELTA, weight: np.ndarray | None = None,
                    asymmetry: float = 1.0) -> tuple[float, np.ndarray]:
  """Chinchilla's Approach-3 objective and its analytic gradient.

  f(theta) = sum_i Huber_delta(r_i), r_i = LSE(logA - alpha ln N_i,
  logB - beta ln D_i, logE) - ln L_i (Chinchilla eq. 3 / App. D.2), with
  Huber_delta(r) = r²/2 for |r| <= delta, else delta (|r| - delta/2).

  With softmax weights w_k of the three LSE terms and h = clip(r, -delta,
  delta) = Huber'(r): df/dlogA = sum h w_1, df/dalpha = -sum h w_1 ln N,
  df/dlogB = sum h w_2, df/dbeta = -sum h w_2 ln D, df/dlogE = sum h w_3.

  With per-run weights c_i (``weight`` times ``asymmetry`` where r_i < 0)
  the objective is sum_i c_i Huber_delta(r_i) and every h above is c_i h_i.
  ``asymmetry`` > 1 penalises a law that predicts a lower loss than observed
  (an optimistic one) more than one that predicts a higher loss.

  Args:
    theta: (logA, logB, logE, alpha, beta), shape (5,).
    logN: ln N per run, shape (R,).
    logD: ln D per run, shape (R,).
    logL: ln loss per run, shape (R,).
    delta: Huber threshold (Chinchilla: 1e-3).
    weight: optional weight per run, shape (R,); None: all 1.
    asymmetry: factor on the loss of runs with r < 0 (1: plain Huber).

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
  if weight is None and asymmetry == 1.0:
    f = float((h * (r - 0.5 * h)).sum())  # equals sum_i Huber_delta(r_i)
  else:
    c = np.ones_like(r) if weight is None else np.asarray(weight, dtype=np.float64)
    if asymmetry != 1.0:
      c = np.where(r < 0, asymmetry * c, c)
    f = float((c * h * (r - 0.5 * h)).sum())
    h = c * h
  u *= h / s                          # u[k] = Huber'(r) * softmax weight k
  g = u.sum(axis=1)
  # Elementwise products and sums, not np.dot: BLAS on such short vectors gains
  # nothing and can stall on thread wake-ups on a busy machine.
  grad = np.array([g[0], g[1], g[2], -(u[0] * logN).sum(), -(u[1] * logD).sum()])
  return f, grad


def _run_starts(starts: np.ndarray, logN: np.ndarray, logD: np.ndarray, logL: np.ndarray,
                delta: float, weight: np.ndarray | None = None, asymmetry: float = 1.0
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """L-BFGS (scipy L-BFGS-B, default tolerances) from each start; returns x, f, nit, success."""
  xs = np.empty_like(starts)
  fs = np.empty(len(starts))
  nit = np.empty(len(starts), dtype=np.int64)
  ok = np.empty(len(starts), dtype=bool)
  with single_threaded_blas():
    for i, x0 in enumerate(starts):
      res = scipy.optimize.minimize(huber_objective, x0,
                                    args=(logN, logD, logL, delta, weight, asymmetry),
                                    jac=True, method="L-BFGS-B")
      xs[i], fs[i], nit[i], ok[i] = res.x, res.fun, res.nit, res.success
  return xs, fs, nit, ok


def run_lbfgs_starts(starts: np.ndarray, logN, logD, logL, delta: float = HUBER_DELTA,
                     n_jobs: int = 1, weight: np.ndarray | None = None, asymmetry: float = 1.0):
  """Runs L-BFGS from every row of ``starts``, optionally over ``n_jobs`` processes.

  ``weight`` and ``asymmetry`` as in :func:`huber_objective`.

  Returns:
    (x, f, nit, success): final thetas (S, 5), objectives (S,), iterations
    (S,), scipy success flags (S,).
  """
  n_jobs = max(1, min(int(n_jobs), len(starts)))
  if n_jobs == 1:
    return _run_starts(starts, logN, logD, logL, delta, weight, asymmetry)
  chunks = np.array_split(starts, n_jobs)
  # fork is quick; once JAX (multithreaded) is loaded, a forked child can
  # deadlock, so spawn fresh interpreters instead.
  ctx = multiprocessing.get_context("spawn" if "jax" in sys.modules else "fork")
  pool = concurrent.futures.ProcessPoolExecutor(max_workers=n_jobs, mp_context=ctx)
  try:
    parts = list(pool.map(_run_starts, chunks, *([logN] * n_jobs, [logD] * n_jobs,
                                                 [logL] * n_jobs, [delta] * n_jobs,
                                                 [weight] * n_jobs, [asymmetry] * n_jobs)))
  except BaseException:
    # A Ctrl-C while the pool starts leaves its manager thread unstarted, and CPython's
    # shutdown then raises "cannot join thread before it is started" over the interrupt.
    try:
      pool.shutdown(wait=False, cancel_futures=True)
    except RuntimeError:
      pass
    raise
  pool.shutdown(wait=True)
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
    asymmetry: factor on the loss of under-predicted runs (1: plain Huber).
    weighted: whether per-run weights were used.
    starts: the L-BFGS starts, shape (S, 5).
    final_objectives: the objective each start's L-BFGS run ended at, shape (S,).
    grid_box: (lowest, highest) of each coordinate of the start grid, each shape (5,).
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
  asymmetry: float = 1.0
  weighted: bool = False
  starts: np.ndarray | None = None
  final_objectives: np.ndarray | None = None
  grid_box: tuple[np.ndarray, np.ndarray] | None = None

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
                  n_jobs: int = 1, polish: bool = True, grid: np.ndarray | None = None,
                  asymmetry: float = 1.0) -> Approach3Result:
  """Approach 3 exactly as Chinchilla App. D.2 describes it.

  Minimises the SUM over runs of Huber_delta(LSE(logA - alpha ln N,
  logB - beta ln D, logE) - ln L) with scipy's L-BFGS-B (analytic gradient,
  :func:`huber_objective`, scipy's default tolerances) from every start and
  keeps the lowest objective (the default starts are Chinchilla's 4500 unless every
  loss lies above e: :func:`default_grid`). Per-run weights (``runs.weight``) and
  ``asymmetry`` change the objective as :func:`huber_objective` says. With ``polish``, one more L-BFGS-B run from that
  optimum with tight tolerances (ftol 1e-15, gtol 1e-12) removes the last
  early-stopping error; it is kept only if it lowers the objective.

  Args:
    runs: finished runs (N, D, final loss).
    starts: L-BFGS starts, shape (S, 5) in :data:`THETA_NAMES` order; default
      ``grid``.
    delta: Huber threshold (Chinchilla: 1e-3).
    n_jobs: processes for the starts (1 = in this process).
    polish: refine the best optimum with tight tolerances.
    grid: a user-given grid of starts (:func:`start_grid`), shape (S, 5): the
      starts when ``starts`` is None, and the box the diagnostics compare the
      optimum and the best start with; default :func:`default_grid` for the
      table's lowest loss (Chinchilla's 4500 starts unless every loss is above e).
    asymmetry: factor on the loss of under-predicted runs (1: plain Huber).

  Returns:
    An :class:`Approach3Result`.

  Raises:
    ApproachUnsupported: fewer than 5 runs.
    FitError: the best optimum has alpha or beta <= 0, or E, A or B beyond float range.
  """
  reason = approach3_support(runs)
  if reason:
    raise ApproachUnsupported(reason)
  if not (delta > 0 and asymmetry > 0):
    raise FitError(f"Approach 3: the Huber delta and the asymmetry must be > 0, got {delta!r} "
                   f"and {asymmetry!r}")
  logN, logD, logL = np.log(runs.N), np.log(runs.D), np.log(runs.loss)
  grid = (default_grid(float(runs.loss.min())) if grid is None
          else np.atleast_2d(np.asarray(grid, dtype=np.float64)))
  if starts is None:
    starts = grid
  starts = np.atleast_2d(np.asarray(starts, dtype=np.float64))
  weight = runs.weight
  obj_args = (logN, logD, logL, delta, weight, asymmetry)
  t0 = time.perf_counter()
  xs, fs, nit, ok = run_lbfgs_starts(starts, logN, logD, logL, delta, n_jobs, weight, asymmetry)
  fs = np.where(np.isfinite(fs), fs, np.inf)
  best = int(np.argmin(fs))
  theta = xs[best]
  objective = float(fs[best])
  if polish and np.isfinite(objective):
    with single_threaded_blas():
      res = scipy.optimize.minimize(huber_objective, theta, args=obj_args,
                                    jac=True, method="L-BFGS-B",
                                    options={"ftol": 1e-15, "gtol": 1e-12, "maxiter": 2000})
    if np.isfinite(res.fun) and res.fun <= objective:
      theta, objective = res.x, float(res.fun)
  wall = time.perf_counter() - t0
  logA, logB, logE, alpha, beta = (float(v) for v in theta)
  if not (alpha > 0 and beta > 0):
    raise FitError(f"Approach 3: the best optimum has alpha = {alpha:.4g}, beta = {beta:.4g}; "
                   f"both must be > 0 (the data do not determine the law)")
  too_large = [f"{name} = {v:.4g}" for name, v in (("log E", logE), ("log A", logA),
                                                    ("log B", logB)) if not v < _MAX_LOG]
  if too_large:
    raise FitError(f"Approach 3: the best optimum has {', '.join(too_large)}, beyond what a "
                   f"float can hold (the data do not determine the law)")
  lo, hi = grid.min(axis=0), grid.max(axis=0)
  best_start = starts[best]
  edge = np.any(np.isclose(starts, lo) | np.isclose(starts, hi), axis=1)
  at_best = fs <= fs[best] * (1 + 1e-6) + 1e-15
  inside = bool(np.all((theta >= lo) & (theta <= hi)))
  E, A, B = math.exp(logE), math.exp(logA), math.exp(logB)
  law = laws.ParametricLaw(name="fit-approach3", E=E, A=A, B=B, alpha=alpha, beta=beta)
  pred = np.log(law.loss(runs.N, runs.D))
  C = runs.C
  return Approach3Result(
      E=E, A=A, B=B, alpha=alpha, beta=beta, theta=np.array(theta, dtype=np.float64),
      objective=objective,
      delta=delta, n_starts=len(starts),
      n_starts_at_best=int(at_best.sum()), n_interior_starts_at_best=int((at_best & ~edge).sum()),
      best_start=best_start.copy(), best_start_on_grid_edge=bool(edge[best]),
      optimum_inside_grid=inside,
      converged=bool(ok[best]), n_iter=int(nit[best]), residuals=pred - logL, wall_time_s=wall,
      fit_range_flops=(float(C.min()), float(C.max())), asymmetry=float(asymmetry),
      weighted=weight is not None, starts=starts, final_objectives=fs, grid_box=(lo, hi))
