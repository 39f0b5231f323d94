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

Model shape conventions follow ``chinchax.model.transformer``: no biases, RMSNorm scales of
size d_model (two per layer plus a final one), SwiGLU MLP (three d_model×d_ff
matrices), attention with n_heads query heads of head_dim = d_model / n_heads and
n_kv_heads key/value heads (grouped-query attention, Ainslie et al. 2023; = n_heads
for multi-head attention): q and o are d_model·n_heads·head_dim each, k and v
d_model·n_kv_heads·head_dim each.

Beside the counts: D for a model and a budget (:func:`tokens_for_budget`),
whole steps for D tokens (:func:`steps_for_tokens`) and the 10% warmup cap
(:func:`max_warmup_steps`), which the trainer and the planner share. Choosing
N*, D*, shapes, batch and LR is ``chinchax.planning``'s job. Units: N
parameters, D tokens, C FLOPs.
"""

from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class ModelShape:
  """The shape of a decoder-only transformer as chinchax builds it: the one shape type.

  ``chinchax.model.transformer.ModelConfig`` is a ModelShape plus the model's numerics;
  the planner, the ladder, the benchmark and the FLOP counts all pass
  ModelShapes, and :meth:`from_config` / :meth:`arch` convert to and from the
  ``model`` section of a config (or a results row).

  Attributes:
    d_model: residual width.
    n_layers: number of transformer blocks.
    n_heads: attention heads, each of head_dim = d_model // n_heads.
    d_ff: hidden width of the SwiGLU MLP (each of the gate, up and down matrices).
    vocab_size: rows of the token embedding (and columns of the output head).
    seq_len: tokens per training sequence (only FLOP counts use it).
    tie_embeddings: output head shares the embedding matrix.
    n_kv_heads: key/value heads G (grouped-query attention; 1 = multi-query); 0 means
      n_heads (multi-head attention). Must divide n_heads. :attr:`kv_heads` resolves it.
  """

  d_model: int
  n_layers: int
  n_heads: int
  d_ff: int
  vocab_size: int
  seq_len: int = 1024
  tie_embeddings: bool = True
  n_kv_heads: int = 0

  @property
  def head_dim(self) -> int:
    """Per-head width K = d_model // n_heads."""
    return self.d_model // self.n_heads

  @property
  def kv_heads(self) -> int:
    """G, the key/value heads: ``n_kv_heads``, or ``n_heads`` when it is 0."""
    return self.n_kv_heads or self.n_heads

  def arch(self) -> dict:
    """The architecture as a plain dict: the keys of :data:`ARCH_KEYS` (JSON, config updates),
    plus ``n_kv_heads`` for a grouped shape (G < n_heads) only, so multi-head shapes keep
    the rows and plan files they always had."""
    out = {k: getattr(self, k) for k in ARCH_KEYS}
    if self.kv_heads != self.n_heads:
      out["n_kv_heads"] = self.kv_heads
    return out

  @classmethod
  def from_config(cls, model, *, seq_len: int, vocab_size: int | None = None) -> "ModelShape":
    """The shape of a config's ``model`` section (a ConfigDict or a dict with :data:`ARCH_KEYS`).

    Args:
      model: ``config.model``, a results row's ``shape``, or a bench model.
      seq_len: tokens per sequence.
      vocab_size: overrides ``model["vocab_size"]`` (e.g. the tokenizer's when the config says 0).
    """
    get = model.get if hasattr(model, "get") else lambda k, d=None: getattr(model, k, d)
    return cls(d_model=int(get("d_model")), n_layers=int(get("n_layers")),
               n_heads=int(get("n_heads")), d_ff=int(get("d_ff")),
               vocab_size=int(get("vocab_size") if vocab_size is None else vocab_size),
               seq_len=int(seq_len), tie_embeddings=bool(get("tie_embeddings", True)),
               n_kv_heads=int(get("n_kv_heads", 0) or 0))


# The architecture keys shared by ModelShape, the config's model section and results rows.
ARCH_KEYS = ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "tie_embeddings")


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


def layer_matmul_params(shape: ModelShape) -> int:
  """Weights in one block's matmuls: q and o (2·d_model·n_heads·head_dim), k and v
  (2·d_model·n_kv_heads·head_dim), SwiGLU (3·d_model·d_ff)."""
  d, hk, gk = shape.d_model, shape.n_heads * shape.head_dim, shape.kv_heads * shape.head_dim
  return 2 * d * hk + 2 * d * gk + 3 * d * shape.d_ff


def param_counts(shape: ModelShape) -> ParamCounts:
  """Counts parameters of ``shape`` without building the model.

  Per layer: attention q, o (2·d_model·n_heads·head_dim) and k, v
  (2·d_model·n_kv_heads·head_dim), SwiGLU
  (3·d_model·d_ff), two RMSNorm scales (2·d_model). Plus a final norm
  (d_model), the embedding (vocab_size·d_model) and, if untied, the head.
  """
  d = shape.d_model
  per_layer = layer_matmul_params(shape) + 2 * d
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
  2·2·seq_len·n_heads·head_dim per layer halved for the causal mask (every query
  head scores and mixes all positions, so grouped k/v heads do not shrink this term).
  Norms, softmax and the embedding gather are not matmuls and are left out.
  """
  return _training_matmul_flops(shape, causal_half=True)


def executed_matmul_flops_per_token(shape: ModelShape, *, causal_skip: bool = False) -> float:
  """Training matmul FLOPs per token that a kernel actually executes (forward + 2× backward).

  Same count as :func:`matmul_flops_per_token`, except that the attention
  score and value matmuls are counted over the full seq_len × seq_len square
  unless ``causal_skip`` says the kernel skips the masked half (block-sparse
  flash kernels such as cuDNN's causal attention). ``chinchax.model.attention``'s
  ``xla`` implementation computes the full square and masks afterwards, so
  XLA's ``cost_analysis()`` of its train step sees the unhalved count.

  Args:
    shape: the model shape.
    causal_skip: the attention kernel skips fully masked blocks.
  Returns:
    FLOPs per training token.
  """
  return _training_matmul_flops(shape, causal_half=causal_skip)


def _training_matmul_flops(shape: ModelShape, *, causal_half: bool) -> float:
  """3 × forward matmul FLOPs per token; attention over half the square when ``causal_half``."""
  hk, L = shape.n_heads * shape.head_dim, shape.n_layers
  dense = L * layer_matmul_params(shape) + shape.d_model * shape.vocab_size
  attention = L * 2 * shape.seq_len * hk * (1 if causal_half else 2)  # (QK^T + AV), 2 FLOPs/MAC
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
      kv_size=shape.head_dim, d_ff=shape.d_ff, vocab_size=shape.vocab_size,
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


def check_positive_int(value, name: str) -> None:
  """Raises ValueError unless ``value`` is an int (not a bool) >= 1; the message names ``name``."""
  if not isinstance(value, int) or isinstance(value, bool) or value < 1:
    raise ValueError(f"{name} must be a positive integer, got {value!r}")


def steps_for_tokens(tokens: float, tokens_per_step: int) -> int:
  """Whole training steps for ``tokens`` tokens: round(D / tokens_per_step) (may be 0)."""
  return int(round(tokens / tokens_per_step))


def max_warmup_steps(steps: int) -> int:
  """The warmup cap shared by chinchax.train and the planner: 10% of ``steps``, rounded down."""
  return steps // 10
