"""The precision a planned IsoFLOP grid gives the exponent a, before any run (synthetic ladders).

:func:`expected_a_interval` takes the grid's (N, D, C) points, draws their final losses
from a known law with per-run noise on ln L (:func:`analysis.isoflop.synthetic.synthetic_runs_at`),
fits Approach 2 (N_opt = k_N·C^a from one parabola per budget) to each of many such
ladders, and reports the spread of the fitted a: the interval the planned grid can be
expected to give at that noise. The truth is Epoch AI's refit of Chinchilla's law
(Besiroglu et al. 2024, ``chinchax.laws.parametric``'s ``epoch``), a ≈ 0.5.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from chinchax import errors
from chinchax.laws import parametric as laws
from analysis.isoflop import approach2
from analysis.isoflop import synthetic

TRUE_LAW = "epoch"
REPLICATES = 200
LEVEL = 0.95


def expected_a_interval(N: Sequence[float], D: Sequence[float], budget: Sequence[float], *,
                        noise: float, law: str = TRUE_LAW, replicates: int = REPLICATES,
                        seed: int = 0, level: float = LEVEL) -> dict:
  """The central ``level`` interval of Approach 2's a over ``replicates`` synthetic ladders.

  Args:
    N, D, budget: the grid's runs (parameters, tokens, FLOP budget of each; the validation
      run left out).
    noise: standard deviation of ln(final loss) per run (``ladder.fit_noise``).
    law: the true law's name (a published ParametricLaw).
    replicates: synthetic ladders fitted.
    seed: seed of the first ladder's noise (replicate i uses seed + i).
    level: the interval's coverage.
  Returns:
    {"law", "a_true", "noise", "replicates", "fitted", "a_median", "lo", "hi", "width"}; lo,
    hi and width are None when fewer than half the replicates could be fitted.
  """
  truth = laws.get_law(law)
  a_true = float(truth.a)  # N_opt ∝ C^(β/(α+β)) (Chinchilla, eq. 4)
  fitted = []
  for i in range(replicates):
    runs = synthetic.synthetic_runs_at(truth, N, D, budget, noise=noise, seed=seed + i)
    try:
      fitted.append(approach2.fit_approach2(runs).a)
    except (errors.UserError, ValueError, np.linalg.LinAlgError):
      continue
  out = {"law": law, "a_true": a_true, "noise": float(noise), "replicates": replicates,
         "fitted": len(fitted), "a_median": None, "lo": None, "hi": None, "width": None}
  if len(fitted) * 2 < replicates:
    return out
  q = 100.0 * (1.0 - level) / 2.0
  lo, med, hi = np.percentile(fitted, [q, 50.0, 100.0 - q])
  out.update(a_median=float(med), lo=float(lo), hi=float(hi), width=float(hi - lo))
  return out
