"""Chinchilla's three approaches by key: whether one can run on a table, and fitting it.

Keys: "1" (lower envelope, :mod:`analysis.approach1`), "2" (IsoFLOP
parabolas, :mod:`analysis.approach2`) and "3" (parametric law,
:mod:`analysis.approach3`), after Hoffmann et al. 2022 ("Training
Compute-Optimal Large Language Models", arXiv 2203.15556, Sec. 3.1-3.3).
"""

from __future__ import annotations

import numpy as np

from analysis.approach1 import Approach1Result, approach1_support, fit_approach1
from analysis.approach2 import Approach2Result, approach2_support, fit_approach2
from analysis.approach3 import Approach3Result, approach3_support, fit_approach3
from analysis.runs import Runs

APPROACHES = ("1", "2", "3")

ApproachResult = Approach1Result | Approach2Result | Approach3Result


def check_approach(approach: str) -> None:
  """Raises ValueError unless ``approach`` is one of :data:`APPROACHES`."""
  if approach not in APPROACHES:
    raise ValueError(f"unknown approach {approach!r}; valid: {', '.join(APPROACHES)}")


def support_reason(runs: Runs, approach: str) -> str | None:
  """None if ``approach`` can run on ``runs``, else the reason.

  Raises:
    ValueError: ``approach`` is not one of :data:`APPROACHES`.
  """
  check_approach(approach)
  support = {"1": approach1_support, "2": approach2_support, "3": approach3_support}[approach]
  return support(runs)


def fit_approach(runs: Runs, approach: str, *, starts: np.ndarray | None = None,
                 n_jobs: int = 1) -> ApproachResult:
  """Fits one approach to ``runs`` with its defaults.

  Args:
    runs: finished runs.
    approach: "1", "2" or "3".
    starts: Approach 3 only: L-BFGS starts, shape (S, 5); default the
      4500-point grid (:func:`analysis.approach3.chinchilla_grid`).
    n_jobs: Approach 3 only: processes for the starts.

  Returns:
    The approach's result (:class:`~analysis.approach1.Approach1Result`,
    :class:`~analysis.approach2.Approach2Result` or
    :class:`~analysis.Approach3Result`).

  Raises:
    ApproachUnsupported: the table cannot support the approach.
    FitError: the fit failed (the message says why).
    ValueError: ``approach`` is not one of :data:`APPROACHES`.
  """
  check_approach(approach)
  if approach == "1":
    return fit_approach1(runs)
  if approach == "2":
    return fit_approach2(runs)
  return fit_approach3(runs, starts=starts, n_jobs=n_jobs)
