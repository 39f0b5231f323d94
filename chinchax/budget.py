"""Budgets: parameter counts, FLOP counts and compute-optimal allocation.

Two FLOP counts are kept apart on purpose:

* ``flops_6nd`` — the scaling-law count C = 6·N·D (Kaplan et al. 2020, eq. 2.1;
  Chinchilla, Hoffmann et al. 2022, Sec. 3). Which N is used (total or
  non-embedding) is always said by the caller.
* ``matmul_flops_per_token`` — every matmul of a training step (forward + 2×
  backward) with causal attention counted at half its square, the numerator of
  MFU (PaLM, Chowdhery et al. 2022, App. B, with causal halving).

Model shape conventions follow ``chinchax.model``: no biases, RMSNorm scales of
size d_model (two per layer plus a final one), SwiGLU MLP (three d_model×d_ff
matrices), attention with n_heads heads of head_dim = d_model / n_heads.
"""

from __future__ import annotations

import dataclasses
import math


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


def flops_6nd(n_params: float, tokens: float) -> float:
  """Scaling-law training compute C = 6·N·D in FLOPs (Kaplan et al. 2020, eq. 2.1)."""
  return 6.0 * float(n_params) * float(tokens)


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
