"""Budgets: parameter counts, FLOP counts, compute-optimal allocation, shapes, batch and LR.

Three FLOP counts are kept apart on purpose, each named after its use:

* ``flops_6nd`` / :func:`flops_6nd_shape` — the scaling-law count C = 6·N·D
  (Kaplan et al. 2020, eq. 2.1; Chinchilla, Hoffmann et al. 2022, Sec. 3).
  Which N enters is always said: Chinchilla counts every parameter
  (``n_kind="total"``), Kaplan et al. leave the embedding out
  (``n_kind="non_embedding"``; Pearce & Song 2024 show this choice explains
  most of the gap between the two papers' exponents at small scale).
* :func:`chinchilla_flops_per_sequence` — Chinchilla Appendix F: embeddings,
  attention (QKV, logits, softmax, values, output), dense block and final
  logits, with the backward pass counted as 2× the forward. For tables and
  for comparison with the paper.
* ``matmul_flops_per_token`` — every matmul of a training step (forward + 2×
  backward) with causal attention counted at half its square: the numerator
  of MFU (PaLM, Chowdhery et al. 2022, App. B, with causal halving).
  :func:`executed_matmul_flops_per_token` is the same count without the
  halving, i.e. what a dense attention kernel actually executes.

Model shape conventions follow ``chinchax.model``: no biases, RMSNorm scales of
size d_model (two per layer plus a final one), SwiGLU MLP (three d_model×d_ff
matrices), attention with n_heads heads of head_dim = d_model / n_heads.

Beyond counting, this module turns a FLOP budget C and a law into N*, D*
(:func:`allocate`), N* into concrete shapes (:func:`propose_shapes`) and a
shape and D into batch, steps, peak learning rate and warmup
(:func:`plan_batch`). Units: N parameters, D tokens, C FLOPs.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from chinchax import laws as laws_lib


@dataclasses.dataclass(frozen=True)
class ModelShape:
  """The shape of a decoder-only transformer as chinchax builds it.

  Attributes:
    d_model: residual width.
    n_layers: number of transformer blocks.
    n_heads: attention heads; head_dim = d_model // n_heads unless given.
    d_ff: hidden width of the SwiGLU MLP (each of the gate, up and down matrices).
    vocab_size: rows of the token embedding (and columns of the output head).
    seq_len: tokens per training sequence (only FLOP counts use it).
    tie_embeddings: output head shares the embedding matrix.
    head_dim: per-head width; None means d_model // n_heads.
  """

  d_model: int
  n_layers: int
  n_heads: int
  d_ff: int
  vocab_size: int
  seq_len: int = 1024
  tie_embeddings: bool = True
  head_dim: int | None = None

  @property
  def kv_size(self) -> int:
    return self.head_dim if self.head_dim is not None else self.d_model // self.n_heads


@dataclasses.dataclass(frozen=True)
class ParamCounts:
  """Parameter counts, three ways.

  ``embedding`` counts every vocab-sized matrix: the token embedding, plus the
  output head when it is not tied. ``non_embedding = total - embedding``
  (Kaplan et al. 2020's N also leaves these out; Chinchilla's N is ``total``).
  """

  total: int
  non_embedding: int
  embedding: int


def param_counts(shape: ModelShape) -> ParamCounts:
  """Counts parameters of ``shape`` without building the model.

  Per layer: attention q, k, v, o (4·d_model·n_heads·head_dim), SwiGLU
  (3·d_model·d_ff), two RMSNorm scales (2·d_model). Plus a final norm
  (d_model), the embedding (vocab_size·d_model) and, if untied, the head.
  """
  d, hk = shape.d_model, shape.n_heads * shape.kv_size
  per_layer = 4 * d * hk + 3 * d * shape.d_ff + 2 * d
  embedding = shape.vocab_size * d * (1 if shape.tie_embeddings else 2)
  non_embedding = shape.n_layers * per_layer + d
  return ParamCounts(total=non_embedding + embedding, non_embedding=non_embedding,
                     embedding=embedding)


def n_of_kind(counts: ParamCounts, n_kind: str = "total") -> int:
  """The N of a scaling law: ``"total"`` (Chinchilla) or ``"non_embedding"`` (Kaplan et al. 2020).

  Raises:
    ValueError: for another ``n_kind``.
  """
  if n_kind == "total":
    return counts.total
  if n_kind == "non_embedding":
    return counts.non_embedding
  raise ValueError(f"n_kind={n_kind!r} is not 'total' or 'non_embedding'")


def flops_6nd(n_params: float, tokens: float) -> float:
  """Scaling-law training compute C = 6·N·D in FLOPs (Kaplan et al. 2020, eq. 2.1)."""
  return 6.0 * float(n_params) * float(tokens)


def flops_6nd_shape(shape: ModelShape, tokens: float, n_kind: str = "total") -> float:
  """C = 6·N·D FLOPs for ``shape`` trained on ``tokens`` tokens.

  Args:
    shape: the model shape.
    tokens: D, training tokens.
    n_kind: ``"total"`` — every parameter, as Chinchilla (Hoffmann et al. 2022,
      Sec. 3) counts N; or ``"non_embedding"`` — Kaplan et al. 2020's N
      (Sec. 2.1), without the vocab-sized matrices.
  """
  return flops_6nd(n_of_kind(param_counts(shape), n_kind), tokens)


def matmul_flops_per_token(shape: ModelShape) -> float:
  """Training matmul FLOPs per token (forward + backward = 3 × forward), for MFU.

  Forward per token: 2 × (every weight matrix used in a matmul, including the
  output head even when tied) + causal attention scores and values,
  2·2·seq_len·n_heads·head_dim per layer halved for the causal mask.
  Norms, softmax and the embedding gather are not matmuls and are left out.
  """
  d, hk, L = shape.d_model, shape.n_heads * shape.kv_size, shape.n_layers
  dense = L * (4 * d * hk + 3 * d * shape.d_ff) + d * shape.vocab_size
  attention = L * 2 * shape.seq_len * hk  # (QK^T + AV) · causal ½ · 2 FLOPs/MAC
  return 3.0 * (2.0 * dense + attention)


def executed_matmul_flops_per_token(shape: ModelShape, *, causal_skip: bool = False) -> float:
  """Training matmul FLOPs per token that a kernel actually executes (forward + 2× backward).

  Same count as :func:`matmul_flops_per_token`, except that the attention
  score and value matmuls are counted over the full seq_len × seq_len square
  unless ``causal_skip`` says the kernel skips the masked half (block-sparse
  flash kernels such as cuDNN's causal attention). ``chinchax.attention``'s
  ``xla`` implementation computes the full square and masks afterwards, so
  XLA's ``cost_analysis()`` of its train step sees the unhalved count.

  Args:
    shape: the model shape.
    causal_skip: the attention kernel skips fully masked blocks.
  Returns:
    FLOPs per training token.
  """
  d, hk, L = shape.d_model, shape.n_heads * shape.kv_size, shape.n_layers
  dense = L * (4 * d * hk + 3 * d * shape.d_ff) + d * shape.vocab_size
  attention = L * 2 * shape.seq_len * hk * (1 if causal_skip else 2)
  return 3.0 * (2.0 * dense + attention)


# ----------------------------------------------------------------------------
# Chinchilla Appendix F.


def chinchilla_forward_flops(*, d_model: int, n_layers: int, n_heads: int, kv_size: int,
                             d_ff: int, vocab_size: int, seq_len: int,
                             ffw_matrices: int = 2) -> dict[str, float]:
  """Forward-pass FLOPs of one sequence, term by term (Hoffmann et al. 2022, Appendix F).

  With S = seq_len, V = vocab_size, d = d_model, H = n_heads, k = kv_size,
  f = d_ff:

  * embeddings 2·S·V·d;
  * per layer: QKV projections 2·3·S·d·(k·H), key·query logits 2·S²·(k·H),
    softmax 3·H·S², softmax·value 2·S²·(k·H), output projection 2·S·(k·H)·d;
  * per layer dense block 2·S·(d·f + d·f) — two matrices in Chinchilla's MLP;
    ``ffw_matrices=3`` counts a SwiGLU MLP (gate, up, down) as chinchax builds;
  * final logits 2·S·d·V.

  Returns:
    {"embeddings", "attention", "dense", "logits"} (attention and dense summed
    over layers) and "total", in FLOPs per sequence.
  """
  S, V, d, kh, f = seq_len, vocab_size, d_model, kv_size * n_heads, d_ff
  attention = (2 * 3 * S * d * kh + 2 * S * S * kh + 3 * n_heads * S * S + 2 * S * S * kh
               + 2 * S * kh * d)
  dense = 2 * S * ffw_matrices * d * f
  out = {"embeddings": 2.0 * S * V * d, "attention": float(n_layers * attention),
         "dense": float(n_layers * dense), "logits": 2.0 * S * d * V}
  out["total"] = sum(out.values())
  return out


def chinchilla_flops_per_sequence(*, d_model: int, n_layers: int, n_heads: int, kv_size: int,
                                  d_ff: int, vocab_size: int, seq_len: int,
                                  include_embeddings_and_logits: bool = True,
                                  ffw_matrices: int = 2) -> float:
  """Training FLOPs of one sequence by Chinchilla's Appendix F (forward + backward = 3× forward).

  The backward pass costs twice the forward pass (Hoffmann et al. 2022, App. F,
  following Kaplan et al. 2020).

  Args:
    d_model, n_layers, n_heads, kv_size, d_ff, vocab_size, seq_len: the shape.
    include_embeddings_and_logits: count the embedding and final-logit terms.
      The formula as printed includes them; Chinchilla's Table A4 ratios are
      reproduced (within 0.01) only without them, together with N as counted
      by :func:`chinchilla_param_count` — so the table was computed without
      these two terms.
    ffw_matrices: 2 for Chinchilla's MLP, 3 for a SwiGLU MLP.
  Returns:
    FLOPs per sequence of ``seq_len`` tokens.
  """
  parts = chinchilla_forward_flops(d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                                   kv_size=kv_size, d_ff=d_ff, vocab_size=vocab_size,
                                   seq_len=seq_len, ffw_matrices=ffw_matrices)
  forward = parts["attention"] + parts["dense"]
  if include_embeddings_and_logits:
    forward += parts["embeddings"] + parts["logits"]
  return 3.0 * forward


def chinchilla_flops_per_token(shape: ModelShape, *,
                               include_embeddings_and_logits: bool = True) -> float:
  """Appendix F training FLOPs per token for a chinchax shape (SwiGLU: three MLP matrices)."""
  return chinchilla_flops_per_sequence(
      d_model=shape.d_model, n_layers=shape.n_layers, n_heads=shape.n_heads,
      kv_size=shape.kv_size, d_ff=shape.d_ff, vocab_size=shape.vocab_size,
      seq_len=shape.seq_len, include_embeddings_and_logits=include_embeddings_and_logits,
      ffw_matrices=3) / shape.seq_len


def chinchilla_param_count(*, d_model: int, n_layers: int, n_heads: int, kv_size: int,
                           d_ff: int, vocab_size: int,
                           relative_position_matrix: bool = True) -> int:
  """Parameters of a Chinchilla/Gopher-style model, as Chinchilla's Tables A4 and A9 count them.

  Counted: per layer, the q, k, v and output projections (4·d_model·kv_size·
  n_heads), plus — when ``relative_position_matrix`` — a fifth matrix of the
  same size, the projection of the relative position encodings of
  Transformer-XL attention (Dai et al. 2019) that Gopher and Chinchilla use
  (Rae et al. 2021, Sec. 3); the two MLP matrices (2·d_model·d_ff); and one
  vocab_size × d_model matrix. Norm scales and biases are left out (< 0.1%).

  With these assumptions all 50 shapes of Table A9 come within 1% of the
  table's parameter counts; with four attention matrices they come out 5–8%
  low, and with two vocab-sized matrices up to 30% high.
  """
  kh = kv_size * n_heads
  n_attn = 5 if relative_position_matrix else 4
  return n_layers * (n_attn * d_model * kh + 2 * d_model * d_ff) + vocab_size * d_model


# ----------------------------------------------------------------------------
# Compute-optimal allocation.


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
  """Returns a law object: ``law`` itself, or ``chinchax.laws.get_law(law)`` for a name or path.

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


def law_loss(law: Any, N: float, D: float) -> float | None:
  """L(N, D) in nats/token for a law that predicts loss; None for an allocation-only law."""
  if not getattr(law, "has_loss", callable(getattr(law, "loss", None))):
    return None
  return float(law.loss(N, D))


def allocate(C: float, law: Any) -> Allocation:
  """Compute-optimal N*, D* for a budget of C FLOPs under ``law``.

  Args:
    C: FLOPs (> 0).
    law: a law object from ``chinchax.laws`` or its name / fit-file path.
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


# ----------------------------------------------------------------------------
# Shapes.
#
# The rule (one rule, used everywhere a shape is proposed):
# * d_model is a multiple of 128 on accelerators (the MXU / tensor-core tile)
#   and of 16 on CPU; d_ff is the multiple of the same quantum nearest to
#   8/3·d_model, which keeps a SwiGLU MLP's parameters at the 2-matrix MLP's
#   8·d_model² (Shazeer 2020, Sec. 2).
# * head_dim is 64 below d_model = 1280 and 128 from there on accelerators
#   (Chinchilla Table A9 switches kv_size from 64 to 128 at d_model = 1280);
#   on CPU the largest of 64, 32, 16 that divides d_model into at least 4 heads
#   (16 for the smallest widths).
# * n_layers >= 2, and the aspect ratio d_model / n_layers lies in [16, 256]:
#   Kaplan et al. 2020 (Sec. 3.1, Fig. 5) find loss at fixed N changes by only a
#   few percent over a wide range of aspect ratios (roughly 20–200); the
#   preferred value is 64, about the middle of Chinchilla Table A9 (64 to 109).
#   Tiny models whose embedding leaves no in-band shape drop the band.
# * Among those, shapes are ranked by |ln(N / N*)| + 0.05·|ln(aspect / 64)|:
#   a 2× aspect-ratio miss costs as much as a 3.5% parameter miss.

ASPECT_RATIO_TARGET = 64.0
ASPECT_RATIO_BAND = (16.0, 256.0)
ASPECT_RATIO_WEIGHT = 0.05
MIN_LAYERS = 2
ACCELERATOR_QUANTUM = 128
CPU_QUANTUM = 16


@dataclasses.dataclass(frozen=True)
class ShapeCandidate:
  """A proposed shape with its exact parameter counts.

  Attributes:
    shape: the model shape.
    N: total parameters (Chinchilla's N), exact.
    non_embedding: parameters outside vocab-sized matrices (Kaplan's N).
    rel_error: N / N_target - 1.
  """

  shape: ModelShape
  N: int
  non_embedding: int
  rel_error: float

  @property
  def aspect_ratio(self) -> float:
    """d_model / n_layers."""
    return self.shape.d_model / self.shape.n_layers

  def to_dict(self) -> dict:
    s = self.shape
    return {"d_model": s.d_model, "n_layers": s.n_layers, "n_heads": s.n_heads, "d_ff": s.d_ff,
            "head_dim": s.kv_size, "vocab_size": s.vocab_size, "seq_len": s.seq_len,
            "tie_embeddings": s.tie_embeddings, "N": self.N, "non_embedding": self.non_embedding,
            "aspect_ratio": round(self.aspect_ratio, 2), "rel_error": self.rel_error}


def width_quantum(accelerator: bool) -> int:
  """Multiple that d_model and d_ff are rounded to: 128 on accelerators, 16 on CPU."""
  return ACCELERATOR_QUANTUM if accelerator else CPU_QUANTUM


def head_dim_for(d_model: int, accelerator: bool) -> int:
  """head_dim by the shape rule (see the comment above :data:`ASPECT_RATIO_TARGET`)."""
  if accelerator:
    return 64 if d_model < 1280 else 128
  for hd in (64, 32, 16):
    if d_model % hd == 0 and d_model // hd >= 4:
      return hd
  return 16


def d_ff_for(d_model: int, accelerator: bool) -> int:
  """SwiGLU hidden width: the multiple of the width quantum nearest 8/3·d_model (ties round up)."""
  q = width_quantum(accelerator)
  return max(q, q * math.floor(8.0 * d_model / (3.0 * q) + 0.5))


def shape_for(d_model: int, n_layers: int, *, vocab_size: int, seq_len: int, accelerator: bool,
              tie_embeddings: bool = True) -> ModelShape:
  """The rule's shape for a given d_model and n_layers (n_heads and d_ff follow)."""
  hd = head_dim_for(d_model, accelerator)
  return ModelShape(d_model=d_model, n_layers=n_layers, n_heads=d_model // hd,
                    d_ff=d_ff_for(d_model, accelerator), vocab_size=vocab_size, seq_len=seq_len,
                    tie_embeddings=tie_embeddings)


def _check_positive_int(value, name: str) -> None:
  if not isinstance(value, int) or isinstance(value, bool) or value < 1:
    raise ValueError(f"{name} must be a positive integer, got {value!r}")


def propose_shapes(n_target: float, *, vocab_size: int, seq_len: int, accelerator: bool,
                   k: int = 5, aspect_ratio: float = ASPECT_RATIO_TARGET,
                   tie_embeddings: bool = True) -> list[ShapeCandidate]:
  """The ``k`` shapes nearest ``n_target`` total parameters under the shape rule.

  For every width d_model (multiples of the width quantum) the depths whose
  exact N brackets ``n_target`` are tried; shapes are kept when n_layers >= 2
  and d_model / n_layers lies in :data:`ASPECT_RATIO_BAND` and ranked by
  |ln(N / n_target)| + 0.05·|ln(aspect / aspect_ratio)| (see the module's
  shape-rule comment). Works from tiny models (N ~ 1e5 with vocab 257) to
  ~1e12.

  Args:
    n_target: N*, total parameters (> 0).
    vocab_size: tokenizer vocabulary (257 for chinchax's byte tokenizer).
    seq_len: tokens per sequence (recorded in the shapes; N does not depend on it).
    accelerator: multiples of 128 (True) or of 16 (False, CPU).
    k: how many candidates to return.
    aspect_ratio: preferred d_model / n_layers (64 by default; the time
      planner also asks for deeper and wider variants).
    tie_embeddings: output head tied to the embedding (chinchax's default).
  Returns:
    Up to ``k`` :class:`ShapeCandidate`, best first, distinct (d_model, n_layers).
  Raises:
    ValueError: a non-positive target, vocab_size, seq_len or k.
  """
  if not (isinstance(n_target, (int, float)) and math.isfinite(n_target) and n_target > 0):
    raise ValueError(f"n_target must be a positive finite number, got {n_target!r}")
  _check_positive_int(vocab_size, "vocab_size")
  _check_positive_int(seq_len, "seq_len")
  _check_positive_int(k, "k")
  if not aspect_ratio > 0:
    raise ValueError(f"aspect_ratio must be > 0, got {aspect_ratio!r}")
  q = width_quantum(accelerator)
  d_start = q if accelerator else 2 * q  # at least two heads of 16 on CPU
  found: dict[tuple[int, int], ShapeCandidate] = {}
  d_model = d_start
  while True:
    base = shape_for(d_model, 1, vocab_size=vocab_size, seq_len=seq_len,
                     accelerator=accelerator, tie_embeddings=tie_embeddings)
    one = param_counts(base).total
    zero = param_counts(dataclasses.replace(base, n_layers=0)).total
    per_layer = one - zero
    if zero + MIN_LAYERS * per_layer > 4.0 * n_target and d_model > d_start:
      break
    depth = (n_target - zero) / per_layer
    if d_model > d_start and d_model / max(depth, MIN_LAYERS) > 2 * ASPECT_RATIO_BAND[1]:
      break  # wider widths only get shallower: far outside the band
    for L in {max(MIN_LAYERS, math.floor(depth)), max(MIN_LAYERS, math.ceil(depth))}:
      counts = param_counts(dataclasses.replace(base, n_layers=L))
      found[(d_model, L)] = ShapeCandidate(
          shape=dataclasses.replace(base, n_layers=L), N=counts.total,
          non_embedding=counts.non_embedding, rel_error=counts.total / n_target - 1.0)
    d_model += q
  lo, hi = ASPECT_RATIO_BAND
  in_band = [c for c in found.values() if lo <= c.aspect_ratio <= hi]
  pool = in_band or list(found.values())

  def cost(c: ShapeCandidate) -> float:
    return (abs(math.log(c.N / n_target))
            + ASPECT_RATIO_WEIGHT * abs(math.log(c.aspect_ratio / aspect_ratio)))

  return sorted(pool, key=cost)[:k]


# ----------------------------------------------------------------------------
# Batch size, steps, learning rate, warmup.
#
# Batch size and peak learning rate follow DeepSeek LLM's compute scaling fits
# (Bi et al. 2024, arXiv 2401.02954, Sec. 3.1, eq. 1):
#   B_opt = 0.2920 · C^0.3271 tokens,   eta_opt = 0.3118 · C^-0.1250,
# fitted on 1e17–2e19 FLOPs (their C counts non-embedding FLOPs per token; we
# use 6·N·D). Outside that range they are extrapolations, so the batch is
# capped at 4M tokens (Llama 2's batch; Chinchilla used 1.5M→3M) and the peak
# LR at 3e-3 (chinchax's default for tiny CPU models), floored at 1e-4.
# Warmup lasts about N tokens (Porian et al. 2024, Sec. 3), at most 10% of the
# run (chinchax.train caps it there too).

BATCH_TOKENS_CAP = 4 * 1024 * 1024
PEAK_LR_RANGE = (1e-4, 3e-3)
MIN_STEPS = 100


def batch_size_tokens(C: float) -> float:
  """Tokens per step B = 0.2920·C^0.3271 (DeepSeek LLM, Bi et al. 2024, eq. 1), ≤ 4M tokens."""
  return min(0.2920 * float(C) ** 0.3271, float(BATCH_TOKENS_CAP))


def peak_learning_rate(C: float) -> float:
  """Peak LR eta = 0.3118·C^-0.1250 (DeepSeek LLM, Bi et al. 2024, eq. 1) in [1e-4, 3e-3]."""
  lo, hi = PEAK_LR_RANGE
  return min(hi, max(lo, 0.3118 * float(C) ** -0.1250))


@dataclasses.dataclass(frozen=True)
class BatchPlan:
  """How D tokens are cut into steps.

  Attributes:
    global_batch_size: sequences per step (all devices).
    seq_len: tokens per sequence.
    steps: round(D_target / tokens_per_step), at least 1.
    tokens: tokens actually seen = steps × global_batch_size × seq_len.
    peak_lr: AdamW peak learning rate.
    warmup_steps: linear warmup steps.
  """

  global_batch_size: int
  seq_len: int
  steps: int
  tokens: int
  peak_lr: float
  warmup_steps: int

  @property
  def tokens_per_step(self) -> int:
    return self.global_batch_size * self.seq_len


def plan_batch(D: float, *, N: float, seq_len: int, C: float | None = None,
               batch_multiple: int = 1, min_steps: int = MIN_STEPS) -> BatchPlan:
  """Batch, steps, peak LR and warmup for training N parameters on D tokens.

  The batch of :func:`batch_size_tokens` in sequences is rounded to
  ``batch_multiple`` × a power of two, then shrunk (by powers of two, not
  below ``batch_multiple``) until the run has at least ``min_steps`` steps.
  steps = round(D / tokens_per_step) (at least 1); the tokens seen are
  steps × tokens_per_step. Warmup is ceil(N / tokens_per_step) steps, capped
  at 10% of the steps.

  Args:
    D: target tokens (> 0).
    N: parameters (for warmup).
    seq_len: tokens per sequence.
    C: the FLOP budget the batch and LR rules read; defaults to 6·N·D.
    batch_multiple: the batch must divide over this many data-parallel devices.
    min_steps: shrink the batch so the run has at least this many steps.
  Raises:
    ValueError: a non-positive D, N, seq_len or batch_multiple.
  """
  if not (math.isfinite(D) and D > 0):
    raise ValueError(f"D must be a positive finite number of tokens, got {D!r}")
  if not (math.isfinite(N) and N > 0):
    raise ValueError(f"N must be a positive finite number, got {N!r}")
  _check_positive_int(seq_len, "seq_len")
  _check_positive_int(batch_multiple, "batch_multiple")
  C = flops_6nd(N, D) if C is None else float(C)
  per_device_seqs = batch_size_tokens(C) / seq_len / batch_multiple
  power = max(0, round(math.log2(per_device_seqs))) if per_device_seqs > 1 else 0
  gbs = batch_multiple * 2 ** power
  while gbs > batch_multiple and D / (gbs * seq_len) < min_steps:
    gbs = max(batch_multiple, gbs // 2)
  tps = gbs * seq_len
  steps = max(1, int(round(D / tps)))
  warmup = min(int(math.ceil(N / tps)), steps // 10)
  return BatchPlan(global_batch_size=gbs, seq_len=seq_len, steps=steps, tokens=steps * tps,
                   peak_lr=peak_learning_rate(C), warmup_steps=warmup)


def tokens_for_budget(n_params: int, *, tokens_per_param: float | None = None,
                      flops: float | None = None) -> float:
  """Token count D for a model of N parameters.

  Exactly one of ``tokens_per_param`` (D = ratio·N; Chinchilla's ≈20, Hoffmann
  et al. 2022, Table 3) or ``flops`` (D = C / (6N)) must be given.

  Raises:
    ValueError: if neither or both are given, or a value is not positive.
  """
  if (tokens_per_param is None) == (flops is None):
    raise ValueError("give exactly one of tokens_per_param or flops")
  if n_params <= 0:
    raise ValueError(f"n_params must be positive, got {n_params}")
  if tokens_per_param is not None:
    if not tokens_per_param > 0:
      raise ValueError(f"tokens_per_param must be > 0, got {tokens_per_param}")
    return float(tokens_per_param) * n_params
  if not flops > 0 or not math.isfinite(flops):
    raise ValueError(f"flops must be a positive finite number, got {flops}")
  return float(flops) / (6.0 * n_params)
