"""Chinchilla's three approaches by key: whether one can run on a table, and fitting it.

Keys: "1" (lower envelope, :mod:`analysis.isoflop.approach1`), "2" (IsoFLOP
parabolas, :mod:`analysis.isoflop.approach2`) and "3" (parametric law,
:mod:`analysis.isoflop.approach3`), after Hoffmann et al. 2022 ("Training
Compute-Optimal Large Language Models", arXiv 2203.15556, Sec. 3.1-3.3).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from analysis.isoflop.approach1 import (Approach1Result, approach1_support, check_envelope,
                                fit_approach1)
from analysis.isoflop.approach2 import Approach2Result, approach2_support, fit_approach2
from analysis.isoflop.approach3 import (HUBER_DELTA, Approach3Result, approach3_support, fit_approach3)
from analysis.errors import FitOptionError
from analysis.runs import Runs

APPROACHES = ("1", "2", "3")
LOSSES = ("huber", "asymmetric")

ApproachResult = Approach1Result | Approach2Result | Approach3Result


@dataclasses.dataclass(frozen=True)
class FitOptions:
  """Choices of the fits beyond Chinchilla's defaults (the defaults reproduce them).

  Attributes:
    window: Approach 2: fit each parabola only on the sizes within ``window``
      places of the size with the lowest observed loss; None: all sizes.
    huber_delta: Approach 3: the Huber threshold (Chinchilla: 1e-3).
    loss: Approach 3: "huber" (Chinchilla) or "asymmetric" (Huber with the
      loss of under-predicted runs multiplied by ``asymmetry``).
    asymmetry: factor of the asymmetric loss (> 0; ignored for "huber").
    grid: Approach 3: a user-given start grid, shape (S, 5)
      (:func:`analysis.isoflop.approach3.start_grid`); None: the default grid
      (:func:`analysis.isoflop.approach3.default_grid`: Chinchilla's 4500 starts unless every loss
      lies above e).
    envelope: Approach 1: how N_opt is read off the lower envelope,
      "quadratic" (default: a quadratic in ln N through the winning size and
      its neighbours) or "argmin" (Chinchilla's winning size);
      :func:`analysis.isoflop.approach1.fit_approach1`.

  Per-run weights are a column of the table (``Runs.weight``), not an option.
  """

  window: int | None = None
  huber_delta: float = HUBER_DELTA
  loss: str = "huber"
  asymmetry: float = 2.0
  grid: np.ndarray | None = None
  envelope: str = "quadratic"

  def __post_init__(self):
    check_envelope(self.envelope)
    if self.window is not None and self.window < 1:
      raise FitOptionError(f"the parabola window must be >= 1 size either side, got "
                           f"{self.window}")
    if not self.huber_delta > 0:
      raise FitOptionError(f"the Huber delta must be > 0, got {self.huber_delta}")
    if self.loss not in LOSSES:
      raise FitOptionError(f"unknown loss {self.loss!r}; valid: {', '.join(LOSSES)}")
    if not self.asymmetry > 0:
      raise FitOptionError(f"the asymmetry must be > 0, got {self.asymmetry}")

  @property
  def effective_asymmetry(self) -> float:
    """The factor on under-predicted runs: 1 for "huber"."""
    return float(self.asymmetry) if self.loss == "asymmetric" else 1.0


def check_approach(approach: str) -> None:
  """Raises ValueError unless ``approach`` is one of :data:`APPROACHES`."""
  if approach not in APPROACHES:
    raise ValueError(f"unknown approach {approach!r}; valid: {', '.join(APPROACHES)}")


def support_reason(runs: Runs, approach: str, options: FitOptions | None = None) -> str | None:
  """None if ``approach`` can run on ``runs`` (with ``options``), else the reason.

  Raises:
    ValueError: ``approach`` is not one of :data:`APPROACHES`.
  """
  check_approach(approach)
  if approach == "2":
    return approach2_support(runs, window=(options or FitOptions()).window)
  return {"1": approach1_support, "3": approach3_support}[approach](runs)


def fit_approach(runs: Runs, approach: str, *, starts: np.ndarray | None = None,
                 n_jobs: int = 1, options: FitOptions | None = None) -> ApproachResult:
  """Fits one approach to ``runs`` with its defaults.

  Args:
    runs: finished runs.
    approach: "1", "2" or "3".
    starts: Approach 3 only: L-BFGS starts, shape (S, 5); default the
      grid of :func:`analysis.isoflop.approach3.default_grid`.
    n_jobs: Approach 3 only: processes for the starts.
    options: :class:`FitOptions`; None: Chinchilla's choices.

  Returns:
    The approach's result (:class:`~analysis.isoflop.approach1.Approach1Result`,
    :class:`~analysis.isoflop.approach2.Approach2Result` or
    :class:`~analysis.Approach3Result`).

  Raises:
    ApproachUnsupported: the table cannot support the approach.
    FitError: the fit failed (the message says why).
    ValueError: ``approach`` is not one of :data:`APPROACHES`.
  """
  check_approach(approach)
  opts = options or FitOptions()
  if approach == "1":
    return fit_approach1(runs, envelope=opts.envelope)
  if approach == "2":
    return fit_approach2(runs, window=opts.window)
  return fit_approach3(runs, starts=starts, n_jobs=n_jobs, delta=opts.huber_delta,
                       grid=opts.grid, asymmetry=opts.effective_asymmetry)
