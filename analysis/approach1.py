"""Approach 1 of Hoffmann et al. 2022 (arXiv 2203.15556, Sec. 3.1): the lower envelope.

The lower envelope of eval loss vs FLOPs over all runs' curves at 1500
log-spaced FLOP values; the run on the envelope gives N_opt(C) and
D_opt = C / (6 N_opt); power laws N_opt = k_N C^a, D_opt = k_D C^b are fitted
by least squares in log space.

Units: N parameters, D tokens, C FLOPs, loss nats/token.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from chinchax import laws
from analysis.errors import ApproachUnsupported, FitError
from analysis.powerlaw import AllocationParams, fit_allocation
from analysis.runs import Runs, tokens_6nd

APPROACH1_N_POINTS = 1500   # log-spaced FLOP values on the envelope (Chinchilla Sec. 3.1).
# Half-width, in ln(FLOPs), of the local-linear smoothing window of each eval curve: ±0.2 takes a
# point's neighbours on the ladder's curves (16 evals over a run's last decade, 0.15 apart).
APPROACH1_SMOOTH_HALF_WIDTH = 0.2


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
  """

  C: np.ndarray
  N_env: np.ndarray
  D_env: np.ndarray
  loss_env: np.ndarray
  edge_fraction: float

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
    slope = (dx * (y - y.mean())).sum() / (dx * dx).sum()
    out[i] = y.mean() + slope * (log_flops[i] - x.mean())
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
                  smooth: float = APPROACH1_SMOOTH_HALF_WIDTH) -> Approach1Result:
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
    smooth: half-width of the smoothing window in ln(FLOPs) (0 = no smoothing).

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
  D_env = tokens_6nd(C, N_env)
  k_N, a, k_D, b = fit_allocation(C, N_env, D_env, "Approach 1")
  edge = (N_env == runs.N.min()) | (N_env == runs.N.max())
  return Approach1Result(C=C, N_env=N_env, D_env=D_env, loss_env=loss_env, k_N=k_N, a=a,
                         k_D=k_D, b=b, edge_fraction=float(edge.mean()))
