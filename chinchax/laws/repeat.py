"""Scaling laws for repeated data: training for more than one epoch over U unique tokens.

Units as in :mod:`chinchax.laws.parametric`: N parameters, D training tokens (all of them, repeats
included), U unique tokens (D / U epochs), C = 6·N·D FLOPs, loss nats/token.

Two forms, each a Chinchilla law (:class:`chinchax.laws.parametric.ParametricLaw`, the "base", fitted
on single-epoch runs) plus repetition terms:

* :class:`MuennighoffLaw` — Muennighoff et al. 2023, "Scaling Data-Constrained Language
  Models" (arXiv 2305.16264), Sec. 3: repeated tokens and excess parameters are worth less,
  through an effective data D' and effective parameters N',
  D' = U_D + U_D·R_D*·(1 − exp(−R_D / R_D*)), R_D = D / U_D − 1 (repetitions past the
  first epoch), and N' = U_N + U_N·R_N*·(1 − exp(−R_N / R_N*)), U_N = min(N, N_opt(U_D))
  (U_D = min(U, D), the unique tokens seen; N_opt(U_D): the base law's compute-optimal N
  for U_D tokens), R_N = N / U_N − 1;
  L = E + A / N'^alpha + B / D'^beta. Their fitted constants
  (:data:`MUENNIGHOFF_R_D_STAR`, :data:`MUENNIGHOFF_R_N_STAR`) are those of the "Parametric
  Fit" section of the paper's repository (github.com/huggingface/datablations, README).
* :class:`OverfitLaw` — an additive overfitting penalty with one coefficient P, described
  after Lovelace et al. 2026, "Prescriptive Scaling Laws for Data Constrained Training"
  (arXiv 2605.01640): excess loss under repetition as one additive term whose coefficient
  isolates overfitting (strong weight decay shrinks it), so that past some number of epochs
  more repetition raises the loss and compute is better spent on N. THE FORM OF THE TERM IS
  OURS, not that paper's published equation (its text was not at hand):
  L = E + A / N^alpha + B / D^beta + P · ln(D / U_D) · B / U_D^beta, U_D = min(U, D).
  P is dimensionless: the penalty per e-fold of epochs as a fraction of the data term at U
  tokens, so it is 0 at one epoch and grows without bound but ever more slowly (a penalty
  linear in the repetitions D / U − 1 missed the first 23 runs of the repeat ladder, whose
  loss climbs steeply over the first few epochs and slowly after: leave-one-unique-size-out
  RMS error 54% against 8% with ln). At fixed N and U the loss is lowest at
  epochs* = (beta / P)^(1 / beta) (d/de of B U^-beta (e^-beta + P ln e) = 0), the same for
  every N and U; P >= beta: one epoch.

Both reduce to the base law at one epoch or less, Muennighoff's for N at or below the
compute-optimal size of its tokens (above it, R_N > 0: excess parameters are worth less
even at one epoch, as in the paper's law). :class:`DataLimitedLaw` fixes U and gives the law
the interface of :mod:`chinchax.laws.parametric` (``loss(N, D)``, ``optimal_allocation(C)``) by a
numeric search over N, which ``chinchax plan --unique-tokens`` plans with.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar, Union

import numpy as np
import scipy.optimize

from chinchax.laws import parametric as laws

# Muennighoff et al. 2023 (arXiv 2305.16264), Sec. 3, fitted on their ~400 runs; the unrounded
# values printed in the "Parametric Fit" section of github.com/huggingface/datablations
# (README): rd_star = 15.387756, rn_star = 5.309743 (the paper rounds them to 15.4 and 5.3).
MUENNIGHOFF_R_D_STAR = 15.387756
MUENNIGHOFF_R_N_STAR = 5.309743
MUENNIGHOFF_SOURCE = ("Muennighoff et al. 2023 (arXiv 2305.16264), Sec. 3: published "
                      "R_D* = 15.387756, R_N* = 5.309743 (github.com/huggingface/datablations, "
                      "README 'Parametric Fit')")
FORMS = ("muennighoff", "overfit")


def _arr(x) -> np.ndarray:
  return np.asarray(x, dtype=np.float64)


def _out(x: np.ndarray):
  return float(x) if x.ndim == 0 else x


def repetitions(D, U):
  """R = max(D / U − 1, 0): repetitions past the first epoch (D tokens over U unique tokens;
  scalars or arrays, broadcast)."""
  return _out(np.maximum(_arr(D) / _arr(U) - 1.0, 0.0))


def effective(U, R, R_star):
  """U + U·R*·(1 − exp(−R / R*)) (Muennighoff et al. 2023, Sec. 3): the worth of U unique
  items seen R more times, with decay constant R* (> 0); R* = inf gives U·(1 + R)."""
  U, R = _arr(U), _arr(R)
  if R_star is None or not math.isfinite(R_star):
    return _out(U * (1.0 + R))
  return _out(U + U * R_star * -np.expm1(-R / R_star))


# ln of the largest and smallest values the laws' terms are allowed to reach before exp():
# inside float64's range with room for the products that follow.
_LOG_CLIP = 600.0


def tokens_to_params(base: laws.ParametricLaw, D):
  """The base law's compute-optimal N for D tokens: N = G·(D·G)^(beta/alpha) (inverting
  Chinchilla eq. 4, D_opt = G^-1 (C/6)^b, N_opt = G (C/6)^a); D scalar or array.

  Evaluated in log space, ln N = ln G + (beta/alpha)·(ln D + ln G) with
  ln G = (ln(alpha·A) − ln(beta·B)) / (alpha + beta), and ln N clipped to ±600 before exp:
  a far trial point of a fit (alpha + beta near 0) gives a huge N, never an OverflowError."""
  D = _arr(D)
  log_g = ((math.log(base.alpha) + math.log(base.A) - math.log(base.beta) - math.log(base.B))
           / (base.alpha + base.beta))
  with np.errstate(divide="ignore"):
    log_n = log_g + (base.beta / base.alpha) * (np.log(D) + log_g)
  return _out(np.exp(np.clip(log_n, -_LOG_CLIP, _LOG_CLIP)))


def _check_positive(name: str, value, allow_none: bool = False) -> None:
  if value is None and allow_none:
    return
  if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
    raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


@dataclasses.dataclass(frozen=True)
class MuennighoffLaw:
  """L(N, D, U) = E + A / N'^alpha + B / D'^beta (Muennighoff et al. 2023, Sec. 3).

  Attributes:
    base: the single-epoch law (E, A, B, alpha, beta).
    R_D_star: decay constant of repeated tokens (> 0).
    R_N_star: decay constant of excess parameters (> 0); None: N' = N (not fitted).
    name: identifier.
    source: where the constants come from.
  """

  base: laws.ParametricLaw
  R_D_star: float
  R_N_star: float | None = MUENNIGHOFF_R_N_STAR
  name: str = "muennighoff"
  source: str = MUENNIGHOFF_SOURCE

  form: ClassVar[str] = "muennighoff"

  def __post_init__(self):
    _check_positive("R_D_star", self.R_D_star)
    _check_positive("R_N_star", self.R_N_star, allow_none=True)

  def effective_data(self, D, U):
    """D' in tokens: U_D + U_D·R_D*·(1 − exp(−R_D / R_D*)), U_D = min(U, D) (the unique tokens
    seen), R_D = D / U_D − 1; D itself at one epoch or less. Scalar or array (U may be inf)."""
    U_D = np.minimum(_arr(U), _arr(D))
    return effective(U_D, repetitions(D, U_D), self.R_D_star)

  def effective_params(self, N, D, U):
    """N' in parameters: U_N + U_N·R_N*·(1 − exp(−R_N / R_N*)), U_N = min(N, N_opt(U_D)) with
    U_D = min(U, D), R_N = N / U_N − 1; N itself when R_N* is None. Scalar or array."""
    N = _arr(N)
    U_D = np.minimum(_arr(U), _arr(D))
    if self.R_N_star is None:
      return _out(N * np.ones_like(U_D))
    U_N = np.minimum(N, _arr(tokens_to_params(self.base, U_D)))
    return effective(U_N, repetitions(N, U_N), self.R_N_star)

  def loss(self, N, D, U):
    """Predicted loss, nats/token, at N parameters, D tokens, U unique tokens (broadcast)."""
    b = self.base
    with np.errstate(over="ignore", under="ignore"):  # inf where a far trial point overflows
      out = (b.E + b.A * _arr(self.effective_params(N, D, U)) ** (-b.alpha)
             + b.B * _arr(self.effective_data(D, U)) ** (-b.beta))
    return _out(out)

  def params(self) -> dict:
    """{"R_D_star", "R_N_star"}."""
    return {"R_D_star": self.R_D_star, "R_N_star": self.R_N_star}

  def to_dict(self) -> dict:
    """JSON-ready: form, params, base law, source."""
    return {"form": self.form, "name": self.name, "params": self.params(),
            "base": self.base.to_dict(), "source": self.source}


@dataclasses.dataclass(frozen=True)
class OverfitLaw:
  """L(N, D, U) = E + A / N^alpha + B / D^beta + P · ln(D / U_D) · B / U_D^beta, U_D =
  min(U, D) (our form, described after Lovelace et al. 2026, arXiv 2605.01640; module
  docstring).

  Attributes:
    base: the single-epoch law.
    P: the overfitting coefficient (>= 0, dimensionless).
    name, source: identifier and citation.
  """

  base: laws.ParametricLaw
  P: float
  name: str = "overfit"
  source: str = ("additive overfitting penalty P·ln(D/U)·B/U^beta: a one-coefficient form of "
                 "ours described after Lovelace et al. 2026 (arXiv 2605.01640), not its "
                 "equation")

  form: ClassVar[str] = "overfit"

  def __post_init__(self):
    if not (isinstance(self.P, (int, float)) and math.isfinite(self.P) and self.P >= 0):
      raise ValueError(f"P must be a finite number >= 0, got {self.P!r}")

  def penalty(self, D, U):
    """P · ln(D / U_D) · B / U_D^beta, U_D = min(U, D), nats/token (0 at one epoch or
    less); scalar or array."""
    U_D = np.minimum(_arr(U), _arr(D))
    with np.errstate(over="ignore", under="ignore"):
      return _out(self.P * np.log(_arr(D) / U_D) * self.base.B * U_D ** (-self.base.beta))

  def loss(self, N, D, U):
    """Predicted loss, nats/token, at N parameters, D tokens, U unique tokens (broadcast)."""
    return _out(_arr(self.base.loss(N, D)) + _arr(self.penalty(D, U)))

  @property
  def optimal_epochs(self) -> float:
    """Epochs D / U of lowest loss at fixed N and U: (beta / P)^(1 / beta) (1 when P >= beta);
    inf for P = 0."""
    if self.P == 0:
      return math.inf
    return max(1.0, (self.base.beta / self.P) ** (1.0 / self.base.beta))

  def params(self) -> dict:
    """{"P"}."""
    return {"P": self.P}

  def to_dict(self) -> dict:
    """JSON-ready: form, params, optimal epochs, base law, source."""
    return {"form": self.form, "name": self.name, "params": self.params(),
            "optimal_epochs": self.optimal_epochs if self.P > 0 else None,
            "base": self.base.to_dict(), "source": self.source}


RepeatLaw = Union[MuennighoffLaw, OverfitLaw]

# The search for the data-limited optimum: N over this many decades either side of the base
# law's unconstrained N_opt, on a grid of this many points per decade, then Brent's method
# between the grid neighbours of the best point.
SEARCH_DECADES = 4.0
SEARCH_POINTS_PER_DECADE = 100
# Grid points within this relative loss of the lowest are ties; with more than two (a flat
# stretch, where the repetition terms have saturated) the tie nearest the base law's N_opt wins.
FLAT_RTOL = 1e-9


@dataclasses.dataclass(frozen=True)
class DataLimitedLaw:
  """A repetition law at a fixed number of unique tokens U, with the interface of
  :class:`chinchax.laws.parametric.ParametricLaw` (``loss(N, D)``, ``optimal_allocation(C)``).

  Attributes:
    law: a :class:`MuennighoffLaw` or :class:`OverfitLaw`.
    unique_tokens: U, tokens (> 0).
  """

  law: RepeatLaw
  unique_tokens: float

  has_loss: ClassVar[bool] = True

  def __post_init__(self):
    _check_positive("unique_tokens", self.unique_tokens)

  @property
  def name(self) -> str:
    return f"{self.law.base.name}+{self.law.form}(U={self.unique_tokens:.4g})"

  @property
  def source(self) -> str:
    return f"{self.law.base.source}; repetition: {self.law.source}"

  @property
  def units(self):
    return self.law.base.units

  @property
  def fit_range_flops(self):
    return self.law.base.fit_range_flops

  def loss(self, N, D):
    """Loss, nats/token, at N parameters trained on D tokens drawn from U unique ones."""
    return self.law.loss(N, D, self.unique_tokens)

  def _optimum(self, C: float) -> tuple[float, float]:
    n0 = self.law.base.optimal_allocation(C)[0]
    x = math.log(n0) + np.linspace(-SEARCH_DECADES, SEARCH_DECADES,
                                   int(2 * SEARCH_DECADES * SEARCH_POINTS_PER_DECADE) + 1
                                   ) * math.log(10.0)
    f = lambda lx: self.loss(np.exp(lx), C / (6.0 * np.exp(lx)))
    values = f(x)
    i = int(np.argmin(values))
    flat = np.flatnonzero(values <= values[i] * (1.0 + FLAT_RTOL))
    if len(flat) > 2:  # the law does not choose (its terms saturate): keep the base's split
      i = int(flat[np.argmin(np.abs(x[flat] - math.log(n0)))])
      N = math.exp(float(x[i]))
      return N, C / (6.0 * N)
    lo, hi = x[max(i - 1, 0)], x[min(i + 1, len(x) - 1)]
    res = scipy.optimize.minimize_scalar(f, bounds=(lo, hi), method="bounded",
                                         options={"xatol": 1e-10})
    best = float(res.x) if res.fun <= values[i] else float(x[i])
    N = math.exp(best)
    return N, C / (6.0 * N)

  def optimal_allocation(self, C):
    """The (N, D) of lowest loss at C = 6·N·D FLOPs with U unique tokens (numeric search:
    :data:`SEARCH_DECADES` decades either side of the base law's N_opt; on a flat stretch of
    ties, :data:`FLAT_RTOL`, the one nearest that N_opt); floats or arrays."""
    C = laws._positive_array(C, "C")
    if C.ndim == 0:
      return self._optimum(float(C))
    pairs = np.array([self._optimum(float(c)) for c in C.reshape(-1)])
    return pairs[:, 0].reshape(C.shape), pairs[:, 1].reshape(C.shape)

  def optimal_loss(self, C):
    """Loss at :meth:`optimal_allocation`, nats/token."""
    n, d = self.optimal_allocation(C)
    return self.loss(n, d)

  def tokens_per_param(self, C):
    """D / N at the data-limited optimum."""
    n, d = self.optimal_allocation(C)
    return d / n

  def epochs(self, C):
    """D / U at the data-limited optimum."""
    return self.optimal_allocation(C)[1] / self.unique_tokens

  def to_dict(self) -> dict:
    """JSON-ready: the repetition law and U."""
    return {"name": self.name, "kind": "data_limited", "unique_tokens": self.unique_tokens,
            "repeat": self.law.to_dict(), "source": self.source}


def law_from_block(block: dict, base: laws.ParametricLaw, form: str | None = None) -> RepeatLaw:
  """The repetition law of a fit's ``repeat`` block (``chinchax fit``'s fit.json).

  Args:
    block: {"form": the better form, "muennighoff": {"params": {...}}, "overfit": {...}}.
    base: the base law.
    form: "muennighoff" or "overfit"; None: the block's ``form``.

  Raises:
    ValueError: no such form in the block, or unusable parameters.
  """
  form = form or block.get("form")
  sub = block.get(form) if form in FORMS else None
  if not isinstance(sub, dict) or not isinstance(sub.get("params"), dict):
    raise ValueError(f"the repeat block has no fitted {form!r} form (valid: {', '.join(FORMS)})")
  p = sub["params"]
  if form == "muennighoff":
    rn = p.get("R_N_star")
    return MuennighoffLaw(base=base, R_D_star=float(p["R_D_star"]),
                          R_N_star=None if rn is None else float(rn), name="fit-muennighoff",
                          source="chinchax fit: R_D*, R_N* fitted (Muennighoff et al. 2023 form)")
  return OverfitLaw(base=base, P=float(p["P"]), name="fit-overfit",
                    source="chinchax fit: P fitted (additive overfitting penalty, our form)")
