"""Scaling laws: the parametric loss law, power-law allocations, published laws.

Units throughout: N parameters (Chinchilla counts all parameters), D training
tokens, C training FLOPs with C = 6·N·D (Kaplan et al. 2020, eq. 2.1; Hoffmann
et al. 2022, "Chinchilla", Sec. 3), loss in nats/token.

Two kinds of law:

* :class:`ParametricLaw` — L(N, D) = E + A / N^alpha + B / D^beta (Chinchilla
  eq. 2, fitted by Approach 3). It predicts loss and gives the compute-optimal
  frontier in closed form (Chinchilla eq. 4 and App. D.2).
* :class:`PowerLawAllocation` — N_opt(C) = k_N · C^a, D_opt = C / (6 N_opt)
  (Chinchilla Approaches 1 and 2, Sec. 3.1–3.2). It allocates compute but does
  not predict loss.

:data:`PUBLISHED_LAWS` holds the published laws by name and :func:`get_law`
returns one by name or loads a fit JSON written by ``chinchax fit``.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import ClassVar, Union

import numpy as np

from chinchax.laws import units as law_units
from chinchax.laws.units import LossUnits
from chinchax.laws.law_file import read_law_file  # noqa: F401 (laws.read_law_file)


@dataclasses.dataclass(frozen=True)
class ParametricLaw:
  """L(N, D) = E + A / N^alpha + B / D^beta (Chinchilla, Hoffmann et al. 2022, eq. 2).

  Attributes:
    name: short identifier, e.g. ``"chinchilla-approach3"``.
    E: irreducible loss, nats/token.
    A: coefficient of the model-size term (nats/token · params^alpha).
    B: coefficient of the data term (nats/token · tokens^beta).
    alpha: model-size exponent (> 0).
    beta: data exponent (> 0).
    source: citation of the paper, table or file the numbers come from.
    fit_range_flops: (C_min, C_max) of the data the law was fitted on, FLOPs;
      None when unknown. Predictions far outside it are extrapolations.
    units: what its loss is measured in (:class:`chinchax.laws.units.LossUnits`).
  """

  name: str
  E: float
  A: float
  B: float
  alpha: float
  beta: float
  source: str = ""
  fit_range_flops: tuple[float, float] | None = None
  units: LossUnits = LossUnits.unknown()

  has_loss: ClassVar[bool] = True

  def __post_init__(self):
    for field in ("A", "B", "alpha", "beta"):
      value = getattr(self, field)
      if not (math.isfinite(value) and value > 0):
        raise ValueError(f"ParametricLaw {self.name!r}: {field} must be a finite positive "
                         f"number, got {value!r}")
    if not math.isfinite(self.E):
      raise ValueError(f"ParametricLaw {self.name!r}: E must be finite, got {self.E!r}")

  def loss(self, N, D):
    """Predicted loss at N parameters trained on D tokens.

    Args:
      N: parameters, scalar or array (broadcasts with D).
      D: training tokens, scalar or array.

    Returns:
      Loss in nats/token: a float for scalar inputs, else an ndarray of the
      broadcast shape.
    """
    N = np.asarray(N, dtype=np.float64)
    D = np.asarray(D, dtype=np.float64)
    out = self.E + self.A * N ** (-self.alpha) + self.B * D ** (-self.beta)
    return float(out) if out.ndim == 0 else out

  @property
  def a(self) -> float:
    """Exponent of N_opt ∝ C^a: a = beta / (alpha + beta) (Chinchilla eq. 4)."""
    return self.beta / (self.alpha + self.beta)

  @property
  def b(self) -> float:
    """Exponent of D_opt ∝ C^b: b = alpha / (alpha + beta) (Chinchilla eq. 4)."""
    return self.alpha / (self.alpha + self.beta)

  @property
  def G(self) -> float:
    """G = (alpha·A / (beta·B))^(1 / (alpha + beta)) (Chinchilla eq. 4)."""
    return (self.alpha * self.A / (self.beta * self.B)) ** (1.0 / (self.alpha + self.beta))

  def optimal_allocation(self, C):
    """Compute-optimal (N, D) for C FLOPs under C = 6·N·D.

    Minimising L(N, C / (6N)) over N gives N_opt = G (C/6)^a and
    D_opt = G^-1 (C/6)^b (Chinchilla eq. 4, derived in App. D.2).

    Args:
      C: training FLOPs, scalar or array (> 0).

    Returns:
      (N_opt, D_opt): parameters and tokens, floats or arrays shaped like C.
    """
    C = _positive_array(C, "C")
    x = C / 6.0
    n_opt = self.G * x ** self.a
    d_opt = x ** self.b / self.G
    if n_opt.ndim == 0:
      return float(n_opt), float(d_opt)
    return n_opt, d_opt

  def optimal_loss(self, C):
    """Loss on the compute-optimal frontier at C FLOPs, nats/token (float or array)."""
    n_opt, d_opt = self.optimal_allocation(C)
    return self.loss(n_opt, d_opt)

  def tokens_per_param(self, C):
    """D_opt / N_opt at C FLOPs (float or array)."""
    n_opt, d_opt = self.optimal_allocation(C)
    return d_opt / n_opt

  def to_dict(self) -> dict:
    """JSON-ready dict with the parameters named E, A, B, alpha, beta plus a, b, G."""
    return {"name": self.name, "kind": "parametric", "E": self.E, "A": self.A, "B": self.B,
            "alpha": self.alpha, "beta": self.beta, "a": self.a, "b": self.b, "G": self.G,
            "source": self.source, "units": self.units.to_dict(),
            "fit_range_flops": list(self.fit_range_flops) if self.fit_range_flops else None}


@dataclasses.dataclass(frozen=True)
class AspectLaw(ParametricLaw):
  """L(N, D, r) = E + A / N^alpha + B / D^beta + P · (r / aspect0)^kappa, r = d_model / n_layers.

  Chinchilla's form plus a shape term fitted on an IsoTime ladder (``analysis.isotime.aspect_law``):
  at equal N and D, shallow-wide shapes lose more the shallower they are. Kaplan et al.
  2020 (Sec. 3.1, Fig. 5) find the loss at fixed N within a few percent over aspect ratios
  ~20–200 at their sizes; at the ladder's (d_model 8–124, 1–4 layers) one-layer models of
  aspect ≥ 50 sat 3–9% above L(N, D). ``loss(N, D)`` is the shape-free part (what code that
  knows no shape reads); :meth:`loss_shape` adds the term.

  Attributes:
    P: the term at r = aspect0, nats/token (>= 0).
    kappa: its exponent in r (> 0).
    aspect0: the reference aspect ratio (64, the plan rule's target).
  """

  P: float = 0.0
  kappa: float = 1.0
  aspect0: float = 64.0

  def __post_init__(self):
    super().__post_init__()
    if not (math.isfinite(self.P) and self.P >= 0 and math.isfinite(self.kappa)
            and self.kappa > 0 and self.aspect0 > 0):
      raise ValueError(f"AspectLaw {self.name!r}: P >= 0, kappa > 0 and aspect0 > 0 are "
                       f"needed, got {self.P!r}, {self.kappa!r}, {self.aspect0!r}")

  def aspect_term(self, aspect):
    """P · (aspect / aspect0)^kappa in nats/token (aspect: d_model / n_layers, scalar or array)."""
    out = self.P * (np.asarray(aspect, dtype=np.float64) / self.aspect0) ** self.kappa
    return float(out) if out.ndim == 0 else out

  def loss_shape(self, N, D, aspect):
    """Loss (nats/token) at N parameters, D tokens and aspect ratio d_model / n_layers."""
    return self.loss(N, D) + self.aspect_term(aspect)


@dataclasses.dataclass(frozen=True)
class PowerLawAllocation:
  """N_opt(C) = k_N · C^a and D_opt(C) = C / (6 N_opt) (Chinchilla Approaches 1 and 2).

  This kind of law only allocates compute; it has no loss prediction, so
  ``loss`` is None and :meth:`optimal_loss` raises NotImplementedError.

  Attributes:
    name: short identifier, e.g. ``"chinchilla-approach1"``.
    k_N: coefficient of N_opt = k_N · C^a (params / FLOPs^a).
    a: exponent of N_opt ∝ C^a; D_opt ∝ C^b with b = 1 - a.
    source: citation.
    fit_range_flops: (C_min, C_max) of the data it was fitted on, or None.
    units: the tokens of the runs it was fitted on (:class:`chinchax.laws.units.LossUnits`).
  """

  name: str
  k_N: float
  a: float
  source: str = ""
  fit_range_flops: tuple[float, float] | None = None
  units: LossUnits = LossUnits.unknown()

  loss: ClassVar[None] = None
  has_loss: ClassVar[bool] = False

  def __post_init__(self):
    if not (math.isfinite(self.k_N) and self.k_N > 0):
      raise ValueError(f"PowerLawAllocation {self.name!r}: k_N must be a finite positive "
                       f"number, got {self.k_N!r}")
    if not (math.isfinite(self.a) and 0 < self.a < 1):
      raise ValueError(f"PowerLawAllocation {self.name!r}: a must lie in (0, 1), got {self.a!r}")

  @property
  def b(self) -> float:
    """Exponent of D_opt ∝ C^b; b = 1 - a because C = 6·N·D."""
    return 1.0 - self.a

  @property
  def k_D(self) -> float:
    """Coefficient of D_opt = k_D · C^b, k_D = 1 / (6 k_N)."""
    return 1.0 / (6.0 * self.k_N)

  def optimal_allocation(self, C):
    """Compute-optimal (N, D) for C FLOPs.

    Args:
      C: training FLOPs, scalar or array (> 0).

    Returns:
      (N_opt, D_opt) = (k_N C^a, C / (6 N_opt)), floats or arrays shaped like C.
    """
    C = _positive_array(C, "C")
    n_opt = self.k_N * C ** self.a
    d_opt = C / (6.0 * n_opt)
    if n_opt.ndim == 0:
      return float(n_opt), float(d_opt)
    return n_opt, d_opt

  def optimal_loss(self, C):
    """Not available: a power-law allocation (Approach 1/2) does not predict loss."""
    raise NotImplementedError(
        f"law {self.name!r} is a power-law allocation (Chinchilla Approach 1/2 style): it gives "
        f"N_opt(C) and D_opt(C) but no loss; use a ParametricLaw (Approach 3) such as "
        f"'chinchilla-approach3' or 'epoch' for loss predictions")

  def tokens_per_param(self, C):
    """D_opt / N_opt at C FLOPs (float or array)."""
    n_opt, d_opt = self.optimal_allocation(C)
    return d_opt / n_opt

  def to_dict(self) -> dict:
    """JSON-ready dict (k_N, a, b, k_D)."""
    return {"name": self.name, "kind": "power_law_allocation", "k_N": self.k_N, "a": self.a,
            "b": self.b, "k_D": self.k_D, "source": self.source, "units": self.units.to_dict(),
            "fit_range_flops": list(self.fit_range_flops) if self.fit_range_flops else None}


Law = Union[ParametricLaw, PowerLawAllocation]


def _positive_array(x, name: str) -> np.ndarray:
  arr = np.asarray(x, dtype=np.float64)
  if not np.all(np.isfinite(arr)) or np.any(arr <= 0):
    raise ValueError(f"{name} must be finite and > 0, got {x!r}")
  return arr


# Chinchilla (Hoffmann et al. 2022) Table 3: (N params, C FLOPs, D tokens), the
# Approach-1 projections. Note that the table's own numbers are rounded: the 67B
# row has 6·N·D = 6.03e23, 4.7% above its stated 5.76e23 FLOPs.
CHINCHILLA_TABLE3 = (
    (400e6, 1.92e19, 8.0e9),
    (1e9, 1.21e20, 20.2e9),
    (10e9, 1.23e22, 205.1e9),
    (67e9, 5.76e23, 1.5e12),
    (175e9, 3.85e24, 3.7e12),
    (280e9, 9.90e24, 5.9e12),
    (520e9, 3.43e25, 11.0e12),
    (1e12, 1.27e26, 21.2e12),
    (10e12, 1.30e28, 216.2e12),
)

# The range of Training FLOP in Epoch AI's extraction of Chinchilla Fig. 4 (Besiroglu et al.
# 2024, arXiv 2404.10102, data release): the Approach-3 data.
_CHINCHILLA_FIG4_FLOPS = (1.4e18, 1.3e22)
# Chinchilla Fig. 3 IsoFLOP budgets (Approach 2): 6e18 ... 3e21 FLOPs.
_CHINCHILLA_ISOFLOP_BUDGETS = (6e18, 3e21)


def _approach1_k_N(a: float = 0.50) -> float:
  """k_N for N_opt = k_N C^0.50 reproducing Chinchilla Table 3's 400M/1B/10B/67B rows.

  Each row gives k_i = sqrt(C_i) / (6 D_i) (from D = C / (6 k C^a) with a = 0.5);
  the geometric midpoint of the smallest and largest k_i minimises the largest
  relative error in D over those rows (about ±4%, most of it the 67B row's own
  rounding, see :data:`CHINCHILLA_TABLE3`).
  """
  ks = [C ** (1.0 - a) / (6.0 * D) for (_, C, D) in CHINCHILLA_TABLE3[:4]]
  return math.sqrt(min(ks) * max(ks))


_GOPHER_FLOPS = 5.76e23  # Gopher's training budget (Chinchilla Table 3 / Fig. 3).

PUBLISHED_LAWS: dict[str, Law] = {
    "chinchilla-approach1": PowerLawAllocation(
        name="chinchilla-approach1", k_N=_approach1_k_N(0.50), a=0.50,
        source="Hoffmann et al. 2022 (arXiv 2203.15556), Approach 1: a = 0.50 (Table 2); "
               "k_N calibrated on Table 3's 400M/1B/10B/67B rows",
        units=law_units.MASSIVETEXT),
    "chinchilla-approach2": PowerLawAllocation(
        name="chinchilla-approach2", k_N=63e9 / _GOPHER_FLOPS ** 0.49, a=0.49,
        source="Hoffmann et al. 2022 (arXiv 2203.15556), Approach 2: a = 0.49 (Table 2); "
               "k_N set so N_opt(5.76e23 FLOPs) = 63B, the Gopher-budget projection of Fig. 3",
        fit_range_flops=_CHINCHILLA_ISOFLOP_BUDGETS,
        units=law_units.MASSIVETEXT),
    "chinchilla-approach3": ParametricLaw(
        name="chinchilla-approach3", E=1.69, A=406.4, B=410.7, alpha=0.34, beta=0.28,
        source="Hoffmann et al. 2022 (arXiv 2203.15556), Approach 3, Sec. 3.3 (rounded); "
               "these rounded constants give N_opt about 20% below the paper's own Approach-3 "
               "allocations (Table A3): use chinchilla-approach3-unrounded to reproduce them",
        fit_range_flops=_CHINCHILLA_FIG4_FLOPS,
        units=law_units.MASSIVETEXT),
    "chinchilla-approach3-unrounded": ParametricLaw(
        name="chinchilla-approach3-unrounded", E=1.69337368, A=406.401018, B=410.722827,
        alpha=0.33917084, beta=0.2849083,
        source="Hoffmann et al. 2022 (arXiv 2203.15556), Approach 3, unrounded values from "
               "the paper's source files (they reproduce its Table A3 allocations)",
        fit_range_flops=_CHINCHILLA_FIG4_FLOPS,
        units=law_units.MASSIVETEXT),
    "epoch": ParametricLaw(
        name="epoch", E=1.817, A=482.01, B=2085.43, alpha=0.348, beta=0.366,
        source="Besiroglu et al. 2024 (arXiv 2404.10102), 'Chinchilla Scaling: A replication "
               "attempt', refit of Approach 3 on the Fig. 4 data (5 highest losses dropped)",
        fit_range_flops=_CHINCHILLA_FIG4_FLOPS,
        units=law_units.MASSIVETEXT),
}

# Epoch's 95% bootstrap intervals for its refit (Besiroglu et al. 2024, arXiv 2404.10102).
EPOCH_CI95 = {
    "E": (1.769, 1.871),
    "A": (285.0, 744.0),
    "B": (1042.0, 5810.0),
    "alpha": (0.317, 0.373),
    "beta": (0.331, 0.415),
}

_PARAM_KEYS = ("E", "A", "B", "alpha", "beta")


def law_units_of(d: dict) -> LossUnits:
  """The loss units of a law dict: its ``units``, else those of its ``recipe`` (a fit file,
  ``chinchax.laws.recipe``), else unknown (an old fit file: nobody recorded its tokenizer)."""
  if isinstance(d.get("units"), dict):
    return LossUnits.from_dict(d["units"])
  if isinstance(d.get("recipe"), dict):
    return LossUnits.from_recipe(d["recipe"], d.get("bytes_per_token"))
  return LossUnits.unknown()


def law_from_dict(d: dict, name: str = "fit", source: str = "",
                  units: LossUnits | None = None) -> Law:
  """Builds a law from a dict.

  Accepts ``{E, A, B, alpha, beta}`` (-> ParametricLaw; with an ``aspect_term``
  ``{P, kappa, aspect0}`` -> :class:`AspectLaw`), ``{k_N, a}``
  (-> PowerLawAllocation), or a report written by ``chinchax fit``: its
  top-level E..beta, else its ``approach3`` section, else ``approach2``.
  The law's units are ``units``, else :func:`law_units_of` ``d``.

  Raises:
    ValueError: no recognisable law in ``d``.
  """
  units = units if units is not None else law_units_of(d)
  if all(k in d for k in _PARAM_KEYS) and d.get("E") is not None:
    fr = d.get("fit_range_flops")
    term = d.get("aspect_term")
    if isinstance(term, dict) and term.get("P") is not None:
      return AspectLaw(name=str(d.get("name", name)), E=float(d["E"]), A=float(d["A"]),
                       B=float(d["B"]), alpha=float(d["alpha"]), beta=float(d["beta"]),
                       source=source or str(d.get("source", "")),
                       fit_range_flops=tuple(fr) if fr else None, P=float(term["P"]),
                       kappa=float(term["kappa"]), aspect0=float(term.get("aspect0", 64.0)),
                       units=units)
    return ParametricLaw(name=str(d.get("name", name)), E=float(d["E"]), A=float(d["A"]),
                         B=float(d["B"]), alpha=float(d["alpha"]), beta=float(d["beta"]),
                         source=source or str(d.get("source", "")),
                         fit_range_flops=tuple(fr) if fr else None, units=units)
  if "k_N" in d and "a" in d and d.get("k_N") is not None:
    fr = d.get("fit_range_flops")
    return PowerLawAllocation(name=str(d.get("name", name)), k_N=float(d["k_N"]), a=float(d["a"]),
                              source=source or str(d.get("source", "")),
                              fit_range_flops=tuple(fr) if fr else None, units=units)
  for section in ("approach3", "approach2", "approach1"):
    sub = d.get(section)
    if isinstance(sub, dict) and sub.get("status", "ok") == "ok":
      try:
        return law_from_dict(sub, name=f"{name}-{section}", source=source, units=units)
      except ValueError:
        continue
  raise ValueError(f"no law found in {source or 'dict'}: expected keys {list(_PARAM_KEYS)} "
                   f"(Approach 3) or k_N and a (Approach 1/2), or an 'approach3' section")


def get_law(name_or_path: str) -> Law:
  """Returns a published law by name, or loads one from a fit JSON file.

  Args:
    name_or_path: a key of :data:`PUBLISHED_LAWS` (e.g. ``"epoch"``,
      ``"chinchilla-approach3"``), or the path of a JSON file written by
      ``chinchax fit`` (its Approach-3 parameters E, A, B, alpha, beta are
      used) or any JSON object with those keys.

  Returns:
    A :class:`ParametricLaw` or :class:`PowerLawAllocation`.

  Raises:
    ValueError: an unknown name (the message lists the valid names), or a
      file without a recognisable law.
  """
  if name_or_path in PUBLISHED_LAWS:
    return PUBLISHED_LAWS[name_or_path]
  d = read_law_file(name_or_path)  # local or gs://
  if d is not None:
    if not isinstance(d, dict):
      raise ValueError(f"law file {name_or_path!r} must hold a JSON object")
    base = os.path.splitext(os.path.basename(name_or_path.rstrip("/")))[0]
    return law_from_dict(d, name=base, source=name_or_path)
  raise ValueError(f"unknown law {name_or_path!r}: not a published law nor an existing file; "
                   f"valid names: {', '.join(sorted(PUBLISHED_LAWS))}")
