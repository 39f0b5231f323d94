"""The run's eval: mean eval loss over fixed batches, or over fixed windows with its s.e."""

from __future__ import annotations

import math

import jax
import numpy as np

import chinchax.train.step as step_lib
from chinchax.train.rundata import RunData


def evaluate_batches(program: step_lib.TrainProgram, params, evals) -> float:
  """Mean eval cross-entropy (nats/token) over the fixed eval batches."""
  losses = [program.eval_step(params, program.global_batch(b)) for b in evals]
  return float(np.mean(jax.device_get(losses)))


def window_stats(losses) -> tuple[float, float]:
  """(mean, standard error of the mean) of per-window losses, nats/token.

  SE = s / √n with s the sample standard deviation (n - 1 in its denominator)
  of the n per-window mean losses, treating windows as independent draws; NaN
  for one window.
  """
  x = np.asarray(losses, dtype=np.float64)
  se = float(np.std(x, ddof=1) / math.sqrt(x.size)) if x.size > 1 else float("nan")
  return float(np.mean(x)), se


class Evaluator:
  """The run's eval: (params) → (mean eval loss, its standard error or None).

  ``train.eval_windows`` = 0: :func:`evaluate_batches` over the eval batches (no SE).
  Otherwise one jitted per-row eval (``step.jit_eval_rows``) per chunk of the
  fixed windows, all dispatched before one fetch; the padded rows are dropped
  and :func:`window_stats` gives the mean and SE over the windows. With
  ``train.curve_eval_windows`` = k > 0 the evals before the last step (the
  loss-vs-compute curve) read only about k of the windows: whole chunks
  evenly spaced over the set, the same chunks at every step; the final eval
  reads them all.
  """

  def __init__(self, program: step_lib.TrainProgram, data: RunData, curve_windows: int = 0):
    self.program, self.data = program, data
    self._rows = None if data.windows is None else step_lib.jit_eval_rows(program)
    self._curve_chunks = None
    w = data.windows
    if w is not None and 0 < curve_windows < w.n_windows:
      n_full = max(1, w.n_windows // w.chunk_rows)
      k = min(n_full, -(-curve_windows // w.chunk_rows))
      self._curve_chunks = sorted({int(i) for i in np.linspace(0, n_full - 1, k).round()})

  def evaluate_state(self, state, final: bool = True) -> tuple[float, float | None]:
    """The eval of a train state's params (the loop's call; see ``trials.TrialsEvaluator``)."""
    return self(state["params"], final)

  def row_fields(self) -> dict:
    """Metric-row fields of the last eval beyond its loss (none for one run)."""
    return {}

  def __call__(self, params, final: bool = True) -> tuple[float, float | None]:
    w = self.data.windows
    if w is None:
      return evaluate_batches(self.program, params, self.data.evals), None
    sh = self.program.batch_sharding
    idx = range(len(w.chunks)) if final or self._curve_chunks is None else self._curve_chunks
    out = jax.device_get([self._rows(params, step_lib.global_batch(sh, w.chunks[i], w.chunk_rows))
                          for i in idx])
    if len(idx) == len(w.chunks):
      return window_stats(w.losses(out))
    return window_stats(np.concatenate([np.asarray(c, dtype=np.float64) for c in out]))
