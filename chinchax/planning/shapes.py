"""The shape rule: a target parameter count N* → concrete transformer shapes.

One rule, used everywhere a shape is proposed (``chinchax plan`` and the
ladder's IsoFLOP grid), with its parameters in a :class:`ShapeRule`; the
named presets live in :data:`PRESETS`:

* ``"accelerator"`` — ``chinchax plan`` on TPUs/GPUs: d_model and d_ff are
  multiples of 128 (the MXU / tensor-core tile); head_dim is 64 below
  d_model = 1280 and 128 from there on (Chinchilla Table A9 switches kv_size
  from 64 to 128 at d_model = 1280).
* ``"cpu"`` — ``chinchax plan`` on CPU: multiples of 16; head_dim the largest
  of 64, 32, 16 that divides d_model into at least 4 heads (16 for the
  smallest widths).
* ``"ladder"`` — the IsoFLOP ladder's small models, one smooth family:
  a fixed depth (n_layers = 2) and the width d_model in steps of 4 from 8,
  so N grows strictly and smoothly with d_model along the grid (no depth
  jumps: loss along an IsoFLOP profile changes only through width). Two
  heads at every width (head_dim = d_model / 2: >= 16 from d_model 32 on):
  a head count that changes along the grid (1 → 2 → 3 heads, or back) puts
  steps into the loss. d_ff is the multiple of 4 nearest 8/3·d_model. Kaplan et al. 2020 (Sec. 3.1, Fig. 5) find loss at fixed N
  flat within a few percent over aspect ratios ~20–200, which the fixed
  depth spans for d_model 40–400.

Common to all: d_ff is the multiple of the width quantum nearest to
8/3·d_model, which keeps a SwiGLU MLP's parameters at the 2-matrix MLP's
8·d_model² (Shazeer 2020, Sec. 2). The plan presets keep n_layers >= 2 and
the aspect ratio d_model / n_layers in [16, 256]: Kaplan et al. 2020 (Sec.
3.1, Fig. 5) find loss at fixed N changes by only a few percent over a wide
range of aspect ratios (roughly 20–200); the preferred value is 64, about the
middle of Chinchilla Table A9 (64 to 109). Tiny models whose embedding leaves
no in-band shape drop the band. Shapes are ranked by
|ln(N / N*)| + 0.05·|ln(aspect / 64)| — a 2× aspect-ratio miss costs as much
as a 3.5% parameter miss; the ladder's fixed depth ranks by |ln(N / N*)|.
"""

from __future__ import annotations

import dataclasses
import math

from chinchax.cost import budget


@dataclasses.dataclass(frozen=True)
class ShapeRule:
  """The parameters of the shape rule (module docstring; presets in :data:`PRESETS`).

  Attributes:
    quantum: d_model and d_ff are multiples of it.
    head_dims: head_dim choices, preferred first: the first that divides
      d_model into at least ``min_heads`` heads, else the last.
    min_heads: see ``head_dims``.
    wide_head_dim: (d_model, head_dim): from this width on, this head_dim;
      None for no switch.
    min_width: the narrowest d_model tried.
    max_width: the widest d_model tried; None widens until the shapes
      outgrow the target (``min_layers`` layers > 4·N*) or grow far too
      shallow (d_model / depth > 2× the band's top).
    min_layers: fewest layers.
    aspect_band: (low, high) bounds of d_model / n_layers.
    aspect_target: the preferred d_model / n_layers.
    aspect_weight: cost = |ln(N / N*)| + aspect_weight·|ln(aspect / target)|
      (ties go to the aspect ratio nearer the target).
    error_decimals: |ln(N / N*)| is rounded to this many decimals in the
      cost; None leaves it unrounded.
    depths: ``"bracket"`` — per width the two depths whose N brackets N*;
      ``"band"`` — per width every depth inside the aspect band;
      ``"fixed"`` — ``min_layers`` layers at every width (the aspect band
      is not applied).
    n_heads: when set, every width gets this many heads (head_dim =
      d_model / n_heads; widths are multiples of 2·n_heads), and
      ``head_dims`` is not used.
    kv_heads_ratio: query heads per key/value head for grouped-query
      attention (Ainslie et al. 2023): n_kv_heads is the largest divisor of
      n_heads not above n_heads / kv_heads_ratio (:func:`kv_heads_for`);
      1 = multi-head, >= n_heads = multi-query. N counts the smaller k/v
      projections, so a grouped rule picks wider or deeper shapes for the same N*;
      :func:`propose_shapes` keeps only widths whose heads the ratio divides.
  """

  quantum: int
  head_dims: tuple[int, ...]
  min_heads: int
  wide_head_dim: tuple[int, int] | None
  min_width: int
  max_width: int | None
  min_layers: int
  aspect_band: tuple[float, float]
  aspect_target: float
  aspect_weight: float
  error_decimals: int | None
  depths: str
  n_heads: int | None = None
  kv_heads_ratio: int = 1


ASPECT_RATIO_TARGET = 64.0
ASPECT_RATIO_BAND = (16.0, 256.0)
ASPECT_RATIO_WEIGHT = 0.05
MIN_LAYERS = 2
ACCELERATOR_QUANTUM = 128
CPU_QUANTUM = 16

PRESETS: dict[str, ShapeRule] = {
    "accelerator": ShapeRule(
        quantum=ACCELERATOR_QUANTUM, head_dims=(64,), min_heads=1, wide_head_dim=(1280, 128),
        min_width=ACCELERATOR_QUANTUM, max_width=None, min_layers=MIN_LAYERS,
        aspect_band=ASPECT_RATIO_BAND, aspect_target=ASPECT_RATIO_TARGET,
        aspect_weight=ASPECT_RATIO_WEIGHT, error_decimals=None, depths="bracket"),
    "cpu": ShapeRule(
        quantum=CPU_QUANTUM, head_dims=(64, 32, 16), min_heads=4, wide_head_dim=None,
        min_width=2 * CPU_QUANTUM,  # at least two heads of 16
        max_width=None, min_layers=MIN_LAYERS, aspect_band=ASPECT_RATIO_BAND,
        aspect_target=ASPECT_RATIO_TARGET, aspect_weight=ASPECT_RATIO_WEIGHT,
        error_decimals=None, depths="bracket"),
    "ladder": ShapeRule(
        quantum=4, head_dims=(), min_heads=1, wide_head_dim=None, min_width=8, max_width=1024,
        min_layers=2, aspect_band=(0.0, math.inf), aspect_target=64.0, aspect_weight=0.0,
        error_decimals=None, depths="fixed", n_heads=2),
}


def rule_for(accelerator: bool) -> ShapeRule:
  """The plan's preset: ``"accelerator"`` or ``"cpu"``."""
  return PRESETS["accelerator" if accelerator else "cpu"]


@dataclasses.dataclass(frozen=True)
class ShapeCandidate:
  """A proposed shape with its exact parameter counts.

  Attributes:
    shape: the model shape.
    N: total parameters (Chinchilla's N), exact.
    non_embedding: parameters outside vocab-sized matrices (Kaplan's N).
    rel_error: N / N_target - 1.
  """

  shape: budget.ModelShape
  N: int
  non_embedding: int
  rel_error: float

  @property
  def aspect_ratio(self) -> float:
    """d_model / n_layers."""
    return self.shape.d_model / self.shape.n_layers

  @property
  def key(self) -> tuple[int, int]:
    """(d_model, n_layers): what tells candidates of one rule apart."""
    return (self.shape.d_model, self.shape.n_layers)

  def to_dict(self) -> dict:
    s = self.shape
    return {"d_model": s.d_model, "n_layers": s.n_layers, "n_heads": s.n_heads, "d_ff": s.d_ff,
            "head_dim": s.head_dim, "vocab_size": s.vocab_size, "seq_len": s.seq_len,
            "tie_embeddings": s.tie_embeddings, "N": self.N, "non_embedding": self.non_embedding,
            "aspect_ratio": round(self.aspect_ratio, 2), "rel_error": self.rel_error,
            **({"n_kv_heads": s.kv_heads} if s.kv_heads != s.n_heads else {})}


def width_quantum(accelerator: bool) -> int:
  """Multiple that d_model and d_ff are rounded to: 128 on accelerators, 16 on CPU."""
  return rule_for(accelerator).quantum


def head_dim_for(d_model: int, accelerator: bool | None = None, *,
                 rule: ShapeRule | None = None) -> int:
  """head_dim by the shape rule (``rule``, else the plan preset for ``accelerator``)."""
  rule = rule or rule_for(bool(accelerator))
  if rule.n_heads is not None:
    return d_model // rule.n_heads
  if rule.wide_head_dim is not None and d_model >= rule.wide_head_dim[0]:
    return rule.wide_head_dim[1]
  for hd in rule.head_dims:
    if d_model % hd == 0 and d_model // hd >= rule.min_heads:
      return hd
  return rule.head_dims[-1]


def d_ff_for(d_model: int, accelerator: bool | None = None, *,
             rule: ShapeRule | None = None) -> int:
  """SwiGLU hidden width: the multiple of the width quantum nearest 8/3·d_model (ties round up)."""
  q = (rule or rule_for(bool(accelerator))).quantum
  return max(q, q * math.floor(8.0 * d_model / (3.0 * q) + 0.5))


def kv_heads_for(n_heads: int, kv_heads_ratio: int) -> int:
  """n_kv_heads for ``n_heads`` query heads at ``kv_heads_ratio`` query heads per k/v head:
  the largest divisor of n_heads that is at most n_heads / kv_heads_ratio (at least 1), so
  every k/v head serves the same number of query heads."""
  limit = max(1, n_heads // max(1, int(kv_heads_ratio)))
  return max(g for g in range(1, limit + 1) if n_heads % g == 0)


def groups_evenly(n_heads: int, kv_heads_ratio: int) -> bool:
  """Whether ``n_heads`` query heads split into groups of exactly ``kv_heads_ratio`` (or the
  ratio reaches n_heads: one k/v head, multi-query)."""
  return kv_heads_ratio <= 1 or n_heads % kv_heads_ratio == 0 or kv_heads_ratio >= n_heads


def shape_for(d_model: int, n_layers: int, *, vocab_size: int, seq_len: int,
              accelerator: bool | None = None, rule: ShapeRule | None = None,
              tie_embeddings: bool = True) -> budget.ModelShape:
  """The rule's shape for a given d_model and n_layers (n_heads and d_ff follow).

  Args:
    d_model, n_layers: width and depth.
    vocab_size, seq_len: recorded in the shape.
    accelerator: the plan preset to use when ``rule`` is not given.
    rule: a :class:`ShapeRule`.
    tie_embeddings: output head tied to the embedding.
  """
  rule = rule or rule_for(bool(accelerator))
  hd = head_dim_for(d_model, rule=rule)
  n_heads = d_model // hd
  grouped = kv_heads_for(n_heads, rule.kv_heads_ratio) if rule.kv_heads_ratio > 1 else n_heads
  return budget.ModelShape(d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                           d_ff=d_ff_for(d_model, rule=rule), vocab_size=vocab_size,
                           seq_len=seq_len, tie_embeddings=tie_embeddings,
                           n_kv_heads=grouped if grouped < n_heads else 0)


def _depths(rule: ShapeRule, d_model: int, depth: float) -> list[int]:
  """The depths tried at one width (``depth``: the fractional depth whose N is N*)."""
  if rule.depths == "fixed":
    return [rule.min_layers]
  if rule.depths == "bracket":
    return list({max(rule.min_layers, math.floor(depth)), max(rule.min_layers, math.ceil(depth))})
  lo_aspect, hi_aspect = rule.aspect_band
  lo = max(rule.min_layers, math.ceil(d_model / hi_aspect))
  hi = max(lo, math.floor(d_model / lo_aspect))
  return list(range(lo, hi + 1))


def propose_shapes(n_target: float, *, vocab_size: int, seq_len: int,
                   accelerator: bool | None = None, rule: ShapeRule | None = None, k: int = 5,
                   aspect_ratio: float | None = None, tie_embeddings: bool = True,
                   exclude: frozenset[int] = frozenset()) -> list[ShapeCandidate]:
  """The ``k`` shapes nearest ``n_target`` total parameters under the shape rule.

  For every width d_model (multiples of the rule's quantum) the rule's depths
  are tried (``"bracket"``: the two whose exact N brackets ``n_target``;
  ``"band"``: all inside the aspect band); shapes are kept when d_model /
  n_layers lies in the rule's aspect band (all of them when none does) and
  ranked by the rule's cost (module docstring). Works from tiny models (N ~
  1e5 with vocab 257) to ~1e12.

  Args:
    n_target: N*, total parameters (> 0).
    vocab_size: tokenizer vocabulary (257 for chinchax's byte tokenizer).
    seq_len: tokens per sequence (recorded in the shapes; N does not depend on it).
    accelerator: the plan preset, multiples of 128 (True) or of 16 (False, CPU),
      when ``rule`` is not given.
    rule: a :class:`ShapeRule`, e.g. ``PRESETS["ladder"]``.
    k: how many candidates to return.
    aspect_ratio: preferred d_model / n_layers (default: the rule's; the time
      planner also asks for deeper and wider variants).
    tie_embeddings: output head tied to the embedding (chinchax's default).
    exclude: total parameter counts to skip (the ladder never repeats a size
      within a budget).
  Returns:
    Up to ``k`` :class:`ShapeCandidate`, best first, distinct (d_model, n_layers).
  Raises:
    ValueError: a non-positive target, vocab_size, seq_len, k or aspect_ratio.
  """
  if not (isinstance(n_target, (int, float)) and math.isfinite(n_target) and n_target > 0):
    raise ValueError(f"n_target must be a positive finite number, got {n_target!r}")
  budget.check_positive_int(vocab_size, "vocab_size")
  budget.check_positive_int(seq_len, "seq_len")
  budget.check_positive_int(k, "k")
  rule = rule or rule_for(bool(accelerator))
  aspect_ratio = rule.aspect_target if aspect_ratio is None else aspect_ratio
  if not aspect_ratio > 0:
    raise ValueError(f"aspect_ratio must be > 0, got {aspect_ratio!r}")
  band_lo, band_hi = rule.aspect_band
  # (d_model, n_layers, N, non-embedding N), in the order found.
  found: list[tuple[int, int, int, int]] = []
  bases: dict[int, budget.ModelShape] = {}
  d_model = rule.min_width
  while rule.max_width is None or d_model <= rule.max_width:
    base = shape_for(d_model, 0, vocab_size=vocab_size, seq_len=seq_len, rule=rule,
                     tie_embeddings=tie_embeddings)
    if not groups_evenly(base.n_heads, rule.kv_heads_ratio):
      d_model += rule.quantum  # a grouped rule keeps widths whose heads split into its groups
      continue
    zero = budget.param_counts(base)
    per_layer = budget.param_counts(dataclasses.replace(base, n_layers=1)).total - zero.total
    depth = (n_target - zero.total) / per_layer
    if (d_model > rule.min_width and len(found) >= k
        and zero.total + rule.min_layers * per_layer > 4.0 * n_target):
      break  # wider widths only grow further past the target
    if rule.max_width is None and d_model > rule.min_width:
      if d_model / max(depth, rule.min_layers) > 2 * band_hi:
        break  # wider widths only get shallower: far outside the band
    bases[d_model] = base
    for L in _depths(rule, d_model, depth):
      n = zero.total + L * per_layer
      if n not in exclude:
        found.append((d_model, L, n, zero.non_embedding + L * per_layer))
    d_model += rule.quantum
  in_band = [f for f in found if band_lo <= f[0] / f[1] <= band_hi]
  pool = in_band or found

  def cost(f: tuple[int, int, int, int]) -> tuple[float, float]:
    err = abs(math.log(f[2] / n_target))
    if rule.error_decimals is not None:
      err = round(err, rule.error_decimals)
    off = abs(math.log(f[0] / f[1] / aspect_ratio))
    return (err + rule.aspect_weight * off, off)

  return [ShapeCandidate(shape=dataclasses.replace(bases[d], n_layers=L), N=n,
                         non_embedding=ne, rel_error=n / n_target - 1.0)
          for d, L, n, ne in sorted(pool, key=cost)[:k]]
