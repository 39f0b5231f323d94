"""Compute-optimal allocation: a FLOP budget C and a scaling law → N*, D* and the frontier loss.

The law objects come from ``chinchax.laws.parametric`` (published fits and fit files);
C = 6·N·D (Kaplan et al. 2020, eq. 2.1; Hoffmann et al. 2022, Sec. 3).
Units: N parameters, D tokens, C FLOPs, loss nats/token.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from chinchax.laws import parametric as laws_lib


@dataclasses.dataclass(frozen=True)
class Allocation:
  """The compute-optimal split of a FLOP budget under a law.

  Attributes:
    law: the law's name.
    C: the budget, FLOPs (C = 6·N·D).
    N: N*, parameters.
    D: D*, tokens.
    tokens_per_param: D* / N*.
    loss: predicted loss on the frontier, nats/token; None for an
      allocation-only law (Chinchilla Approaches 1 and 2).
    warnings: e.g. C far outside the range the law was fitted on.
  """

  law: str
  C: float
  N: float
  D: float
  tokens_per_param: float
  loss: float | None
  warnings: tuple[str, ...] = ()


# A budget more than this factor outside a law's fit range gets a warning.
FIT_RANGE_WARN_FACTOR = 10.0


def resolve_law(law: Any):
  """Returns a law object: ``law`` itself, or ``chinchax.laws.parametric.get_law(law)`` for a name or path.

  Raises:
    ValueError: an unknown name, or a file without a recognisable law.
    FileNotFoundError / OSError: an unreadable file.
  """
  if isinstance(law, str):
    return laws_lib.get_law(law)
  return law


def fit_range_warning(C: float, law: Any, factor: float = FIT_RANGE_WARN_FACTOR) -> str | None:
  """A warning when C lies more than ``factor``× outside the law's fit range, else None.

  Args:
    C: FLOP budget.
    law: a law with ``fit_range_flops`` = (C_min, C_max) or None (unknown range:
      no warning).
    factor: how far outside the range is tolerated.
  """
  rng = getattr(law, "fit_range_flops", None)
  if not rng:
    return None
  lo, hi = float(rng[0]), float(rng[1])
  if C < lo / factor:
    return (f"C = {C:.3g} FLOPs is {lo / C:.3g}× below the smallest budget law "
            f"{law.name!r} was fitted on ({lo:.3g} FLOPs): an extrapolation")
  if C > hi * factor:
    return (f"C = {C:.3g} FLOPs is {C / hi:.3g}× above the largest budget law "
            f"{law.name!r} was fitted on ({hi:.3g} FLOPs): an extrapolation")
  return None


def law_loss(law: Any, N: float, D: float, aspect: float | None = None) -> float | None:
  """L(N, D) in nats/token for a law that predicts loss; None for an allocation-only law.
  A law with a shape term (:class:`chinchax.laws.parametric.AspectLaw`) adds it at ``aspect``
  (d_model / n_layers) when given."""
  if not getattr(law, "has_loss", callable(getattr(law, "loss", None))):
    return None
  if aspect is not None and hasattr(law, "loss_shape"):
    return float(law.loss_shape(N, D, aspect))
  return float(law.loss(N, D))


def allocate(C: float, law: Any) -> Allocation:
  """Compute-optimal N*, D* for a budget of C FLOPs under ``law``.

  Args:
    C: FLOPs (> 0).
    law: a law object from ``chinchax.laws.parametric`` or its name / fit-file path.
  Returns:
    The :class:`Allocation`; ``loss`` is the closed-form frontier loss
    L(N*, D*) (Chinchilla eq. 4) for a parametric law, None otherwise.
  Raises:
    ValueError: C not a positive finite number, or an unknown law.
  """
  if not (isinstance(C, (int, float)) and math.isfinite(C) and C > 0):
    raise ValueError(f"the FLOP budget C must be a positive finite number, got {C!r}")
  law = resolve_law(law)
  n_opt, d_opt = law.optimal_allocation(float(C))
  warn = fit_range_warning(float(C), law)
  return Allocation(law=law.name, C=float(C), N=float(n_opt), D=float(d_opt),
                    tokens_per_param=float(d_opt) / float(n_opt),
                    loss=law_loss(law, n_opt, d_opt), warnings=(warn,) if warn else ())


def predicts_loss(law: Any) -> bool:
  """Whether ``law`` predicts a loss L(N, D) (parametric laws) or only an allocation."""
  return law_loss(law, 1e9, 1e10) is not None
