"""Power laws y = k · x^p fitted in log space, and the allocation laws of Approaches 1 and 2.

Approaches 1 and 2 of Hoffmann et al. 2022 ("Training Compute-Optimal Large
Language Models", arXiv 2203.15556, Sec. 3.1-3.2) both end in the same step:
per-budget optima N_opt(C), D_opt(C) are fitted with N_opt = k_N C^a and
D_opt = k_D C^b by least squares in log space (:func:`fit_allocation`).

Units: N parameters, D tokens, C FLOPs.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from chinchax.laws import parametric as laws
from analysis.errors import FitError


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



def fit_allocation(C: np.ndarray, N_opt: np.ndarray, D_opt: np.ndarray, what: str
                   ) -> tuple[float, float, float, float]:
  """Fits N_opt = k_N · C^a and D_opt = k_D · C^b (Chinchilla Sec. 3.1-3.2).

  Args:
    C: FLOPs of the optima, shape (K,).
    N_opt: compute-optimal parameters at each C, shape (K,).
    D_opt: compute-optimal tokens at each C, shape (K,).
    what: the approach, for error messages (e.g. "Approach 1").

  Returns:
    (k_N, a, k_D, b).

  Raises:
    FitError: the power-law fit fails, or a is outside (0, 1).
  """
  k_N, a = fit_power_law(C, N_opt)
  k_D, b = fit_power_law(C, D_opt)
  _check_exponent(a, what)
  return k_N, a, k_D, b


@dataclasses.dataclass
class AllocationParams:
  """The fitted allocation of Approaches 1 and 2 (the base of their results).

  Attributes:
    k_N, a: N_opt = k_N · C^a.
    k_D, b: D_opt = k_D · C^b.
  """

  k_N: float
  a: float
  k_D: float
  b: float

  def params(self) -> dict[str, float]:
    """{"k_N", "a", "k_D", "b"}: N_opt = k_N · C^a, D_opt = k_D · C^b."""
    return {"k_N": self.k_N, "a": self.a, "k_D": self.k_D, "b": self.b}

  def _allocation_law(self, name: str, source: str,
                      fit_range_flops: tuple[float, float]) -> laws.PowerLawAllocation:
    return laws.PowerLawAllocation(name=name, k_N=self.k_N, a=self.a, source=source,
                                   fit_range_flops=fit_range_flops)
