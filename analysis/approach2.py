"""Approach 2 of Hoffmann et al. 2022 (arXiv 2203.15556, Sec. 3.2, Fig. 3): IsoFLOP parabolas.

Per IsoFLOP budget a parabola in ln N is fitted to the final losses; its
vertex is N_opt for that budget. Budgets whose minimum is not bracketed by the
sampled N are reported and left out; N_opt = k_N C^a and D_opt = k_D C^b are
fitted over the rest.

Units: N parameters, D tokens, C FLOPs, loss nats/token.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from chinchax import laws
from analysis.errors import ApproachUnsupported
from analysis.powerlaw import AllocationParams, fit_allocation
from analysis.runs import Runs, tokens_6nd


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
  res = BudgetParabola(C, len(N), int(sizes.size), rng, (p2, p1, p0), N_opt, tokens_6nd(C, N_opt),
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
class Approach2Result(AllocationParams):
  """Approach 2 (Chinchilla Sec. 3.2): IsoFLOP parabolas → N_opt per budget → power laws.

  Attributes:
    budgets: one :class:`BudgetParabola` per IsoFLOP budget (all, usable or not).
    k_N, a: N_opt = k_N · C^a fitted over the usable budgets.
    k_D, b: D_opt = k_D · C^b.
  """

  budgets: list[BudgetParabola]

  @property
  def used(self) -> list[BudgetParabola]:
    return [p for p in self.budgets if p.status == "ok"]

  @property
  def left_out(self) -> list[BudgetParabola]:
    return [p for p in self.budgets if p.status != "ok"]

  @property
  def law(self) -> laws.PowerLawAllocation:
    Cs = [p.C for p in self.used]
    return self._allocation_law("fit-approach2", "Approach 2 fit (IsoFLOP parabolas)",
                                (min(Cs), max(Cs)))


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
  k_N, a, k_D, b = fit_allocation(C, np.array([p.N_opt for p in usable]),
                                  np.array([p.D_opt for p in usable]), "Approach 2")
  return Approach2Result(budgets=parabolas, k_N=k_N, a=a, k_D=k_D, b=b)
