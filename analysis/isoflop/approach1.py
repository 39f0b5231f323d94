"""Approach 1 of Hoffmann et al. 2022 (arXiv 2203.15556, Sec. 3.1): the lower envelope.

The lower envelope of eval loss vs FLOPs over all runs' curves at 1500
log-spaced FLOP values; the sizes on and next to the envelope give N_opt(C)
(the winning size, or the minimum of a quadratic in ln N through it and its
neighbours) and D_opt = C / (6 N_opt); power laws N_opt = k_N C^a, D_opt = k_D C^b are fitted
by least squares in log space.

Units: N parameters, D tokens, C FLOPs, loss nats/token.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from chinchax.laws import parametric as laws
from analysis.errors import ApproachUnsupported, FitError, FitOptionError
from analysis.isoflop.powerlaw import AllocationParams, fit_allocation
from analysis.runs import Runs, tokens_6nd

APPROACH1_N_POINTS = 1500   # log-spaced FLOP values on the envelope (Chinchilla Sec. 3.1).
# Half-width, in ln(FLOPs), of the local-linear smoothing window of each eval curve: ±0.2 takes a
# point's neighbours on the ladder's curves (16 evals over a run's last decade, 0.15 apart).
APPROACH1_SMOOTH_HALF_WIDTH = 0.2
APPROACH1_ENVELOPES = ("quadratic", "argmin")
APPROACH1_QUADRATIC_SIZES = 2   # sizes either side of the winner in the "quadratic" envelope


@dataclasses.dataclass
class Approach1Result(AllocationParams):
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
    n_winning_sizes: distinct sizes with the lowest loss at some FLOP value.
    envelope: how N_opt was read off the envelope: "quadratic" or "argmin"
      (:func:`fit_approach1`).
  """

  C: np.ndarray
  N_env: np.ndarray
  D_env: np.ndarray
  loss_env: np.ndarray
  edge_fraction: float
  n_winning_sizes: int = 0
  envelope: str = "quadratic"

  @property
  def law(self) -> laws.PowerLawAllocation:
    return self._allocation_law("fit-approach1", "Approach 1 fit (lower envelope)",
                                (float(self.C[0]), float(self.C[-1])))


def smooth_curve(log_flops: np.ndarray, loss: np.ndarray,
                 half_width: float = APPROACH1_SMOOTH_HALF_WIDTH) -> np.ndarray:
  """Local-linear smoothing of one eval curve (Chinchilla Sec. 3.1 smooths each curve).

  Each point is replaced by the value at its ln(FLOPs) of a least-squares line
  through the points within ``half_width`` of it in ln(FLOPs). The window is a
  width in FLOPs, not a count of points, so a sparse curve (a few log-spaced
  evals) is left as measured instead of being bent along its own curvature: a
  5-point window over 8 evals spread across 2.6 decades put the final points
  of a ladder's curves 0.3–0.4 nats below their measured values. A point with
  fewer than 3 points in its window (a curve's ends, sparse stretches) is kept.

  Args:
    log_flops: ln FLOPs seen, increasing, shape (F,).
    loss: eval loss, nats/token, shape (F,).
    half_width: half-width of the window in ln(FLOPs); 0 returns ``loss`` unchanged.

  Returns:
    Smoothed loss, shape (F,).
  """
  out = np.array(loss, dtype=float)
  if half_width <= 0:
    return out
  for i in range(loss.shape[0]):
    near = np.abs(log_flops - log_flops[i]) <= half_width
    if near.sum() < 3:
      continue
    x, y = log_flops[near], loss[near]
    dx = x - x.mean()
    denom = (dx * dx).sum()     # 0 when every point in the window is at the same FLOPs
    slope = (dx * (y - y.mean())).sum() / denom if denom > 0 else 0.0
    out[i] = y.mean() + slope * (log_flops[i] - x.mean())
  return out


def check_envelope(envelope: str) -> None:
  """Raises FitOptionError unless ``envelope`` is one of :data:`APPROACH1_ENVELOPES`."""
  if envelope not in APPROACH1_ENVELOPES:
    raise FitOptionError(f"unknown Approach 1 envelope {envelope!r}; valid: "
                         f"{', '.join(APPROACH1_ENVELOPES)}")


def approach1_support(runs: Runs) -> str | None:
  """None if Approach 1 can run on ``runs``, else the reason it cannot."""
  if runs.curves is None:
    return ("Approach 1 needs each run's eval-loss curve (eval_curve: [[flops_seen, eval_loss], "
            "...]) and this table has none (a CSV of final losses, or JSONL rows without curves)")
  if np.unique(runs.N).size < 2:
    return "Approach 1 needs runs of at least 2 model sizes"
  return None


def fit_approach1(runs: Runs, n_points: int = APPROACH1_N_POINTS,
                  smooth: float = APPROACH1_SMOOTH_HALF_WIDTH,
                  envelope: str = "quadratic") -> Approach1Result:
  """Approach 1: envelope of loss vs FLOPs over all runs' curves → power laws.

  Each curve is smoothed (:func:`smooth_curve`) and interpolated linearly in
  ln(FLOPs) (no extrapolation); each model size's loss at a FLOP count is the
  lowest of its runs' (its horizons'). At ``n_points`` log-spaced FLOP values C
  between the smallest and the largest final FLOPs of the runs, N_opt(C) is
  (Chinchilla Sec. 3.1, Fig. 2):

  * ``envelope="argmin"``: the size with the lowest loss (Chinchilla's rule),
    a step function of C that can only take the ladder's sizes;
  * ``envelope="quadratic"`` (default): the minimum of a quadratic in ln N
    fitted by least squares to that size and up to
    :data:`APPROACH1_QUADRATIC_SIZES` sizes either side among those with a loss
    at C, kept within the sizes fitted; the winning size where it has no
    neighbour on one side or the quadratic is not convex. The step function's
    jumps are a grid's, not the law's: on synthetic ladders with a known law
    (4 budgets of 5 sizes, 0.4% noise per run) the quadratic's RMS error in a
    is 0.75–0.79 of the argmin's over 100–200 seeds (0.74 with 7 sizes, 0.66–0.71
    with 5 budgets; tests/test_analysis_fit.py).

  D_opt(C) = C / (6 N_opt). Chinchilla trained each N with 4 cosine horizons;
  in an IsoFLOP ladder a size has one horizon per budget it is in, so points
  between budgets are mid-schedule points of the next budget's runs.

  Args:
    runs: finished runs with eval curves (``runs.curves`` not None).
    n_points: FLOP values on the envelope.
    smooth: half-width of the smoothing window in ln(FLOPs) (0 = no smoothing).
    envelope: "quadratic" or "argmin" (:data:`APPROACH1_ENVELOPES`).

  Returns:
    An :class:`Approach1Result`.

  Raises:
    ApproachUnsupported: no curves, or fewer than 2 model sizes.
    FitOptionError: an unknown ``envelope``.
    FitError: the envelope is degenerate (a single winning size).
  """
  check_envelope(envelope)
  reason = approach1_support(runs)
  if reason:
    raise ApproachUnsupported(reason)
  ends = np.array([c[-1, 0] for c in runs.curves])
  lo, hi = float(ends.min()), float(ends.max())
  if not hi > lo:
    raise FitError("Approach 1 needs runs that end at different FLOP counts")
  C = np.exp(np.linspace(math.log(lo), math.log(hi), n_points))
  logC = np.log(C)
  sizes = np.unique(runs.N)
  loss = np.full((sizes.size, n_points), np.inf)   # each size's best run at each C
  for n, curve in zip(runs.N, runs.curves):
    log_f = np.log(curve[:, 0])
    k = np.searchsorted(sizes, n)
    loss[k] = np.minimum(loss[k], np.interp(logC, log_f, smooth_curve(log_f, curve[:, 1], smooth),
                                            left=np.inf, right=np.inf))
  win = np.argmin(loss, axis=0)
  loss_env = loss[win, np.arange(n_points)]
  ok = np.isfinite(loss_env)
  if ok.sum() < 2:
    raise FitError("Approach 1: the eval curves do not overlap the range of final FLOPs")
  C, win, loss, loss_env = C[ok], win[ok], loss[:, ok], loss_env[ok]
  if np.unique(win).size < 2:
    raise FitError(f"Approach 1: one model size (N = {sizes[win[0]]:.4g}) is on the envelope at "
                   f"every FLOP count, so no power law can be fitted")
  N_env = (np.exp(_quadratic_minimum(np.log(sizes), loss, win)) if envelope == "quadratic"
           else sizes[win])
  D_env = tokens_6nd(C, N_env)
  k_N, a, k_D, b = fit_allocation(C, N_env, D_env, "Approach 1")
  edge = (win == 0) | (win == sizes.size - 1)
  return Approach1Result(C=C, N_env=N_env, D_env=D_env, loss_env=loss_env, k_N=k_N, a=a,
                         k_D=k_D, b=b, edge_fraction=float(edge.mean()),
                         n_winning_sizes=int(np.unique(win).size), envelope=envelope)


def _quadratic_minimum(log_sizes: np.ndarray, loss: np.ndarray, win: np.ndarray,
                       k: int | None = None) -> np.ndarray:
  """ln N of the minimum of a least-squares quadratic in ln N at each FLOP value.

  Args:
    log_sizes: ln N of the distinct sizes, increasing, shape (S,).
    loss: each size's loss at each FLOP value, inf where it has none, shape (S, P).
    win: the size with the lowest loss at each FLOP value, shape (P,).
    k: sizes either side of the winner (among those with a loss); default
      :data:`APPROACH1_QUADRATIC_SIZES`.

  Returns:
    ln N_opt, shape (P,): the winner's ln N where it lacks a neighbour on a side
    or the fit is not convex, else the quadratic's minimum clipped to the
    sizes fitted.
  """
  k = APPROACH1_QUADRATIC_SIZES if k is None else k
  P = loss.shape[1]
  cols = np.arange(P)
  defined = np.isfinite(loss)
  rank = np.cumsum(defined, axis=0) - 1                     # place among the defined sizes
  pos = rank[win, cols]
  inside = defined & (np.abs(rank - pos) <= k)              # (S, P): the sizes fitted
  x = np.where(inside, log_sizes[:, None] - log_sizes[win][None, :], 0.0)
  y = np.where(inside, loss, 0.0)
  w = inside.astype(float)
  m = [(w * x ** i).sum(axis=0) for i in range(5)]          # moments of x, each (P,)
  t = [(w * x ** i * y).sum(axis=0) for i in range(3)]
  A = np.stack([np.stack([m[i + j] for j in range(3)], axis=-1) for i in range(3)], axis=-2)
  rhs = np.stack(t, axis=-1)
  interior = (pos > 0) & (pos < defined.sum(axis=0) - 1)
  out = log_sizes[win].copy()
  if not interior.any():
    return out
  coef = np.linalg.solve(A[interior], rhs[interior][..., None])[..., 0]   # c0, c1, c2
  c1, c2 = coef[:, 1], coef[:, 2]
  lo = np.where(inside, x, np.inf).min(axis=0)[interior]
  hi = np.where(inside, x, -np.inf).max(axis=0)[interior]
  vertex = np.where(c2 > 0, np.clip(-c1 / (2 * np.where(c2 > 0, c2, 1.0)), lo, hi), 0.0)
  out[interior] += vertex
  return out
