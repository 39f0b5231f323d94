"""The language-model loss: cross-entropy and z-loss, whole or in chunks of the sequence.

:func:`loss_terms` takes the full logits [B, T, V] (the unchunked step).
:func:`chunked_row_sums` never holds them: the output projection and the loss
run over chunks of ``chunk`` sequence positions, each under ``jax.checkpoint``,
so the forward keeps only the hidden states [B, T, D] and the backward
recomputes one chunk's logits [B, chunk, V] at a time (the float32 logits of a
Llama-3-sized vocabulary, V = 128,256, take 0.5 MB per token; forward and
gradient together 1 GiB per 1,024 tokens). The chunks are a ``lax.scan`` (the
last, shorter chunk, when ``chunk`` does not divide T, runs after it).

Precision: the logsumexp, the target's logit and both terms are float32 whatever the logits'
dtype. Float32 logits (the CPU default) take plain autodiff. 16-bit logits (``compute_dtype``
bfloat16) go through :func:`token_terms`' custom gradient: its forward reads the 16-bit logits
once and keeps them (the one [B, T, V] buffer, the matmul's own output) with log Z [B, T] in
float32; its backward recomputes softmax in float32 from them and returns the logits' gradient
p·∂log Z + onehot·∂(target logit) in the logits' dtype, written once. Plain autodiff of the same
float32 arithmetic would materialise float32 copies of the logits and of their gradient beside
the 16-bit ones (the upcast's residual and the downcast's input).

Shape letters: B batch rows, T sequence length, C chunk length, D d_model, V vocabulary.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from chinchax.config import checks as config_checks
from chinchax.model import transformer as model_lib
from chinchax.model import sharding
from chinchax.cost import work

def resolve_chunk_size(value, backend: str, seq_len: int, vocab_size: int) -> int:
  """``train.loss_chunk_size`` as a number of sequence positions (0 = unchunked).

  Parses the knob (``config_checks.parse_loss_chunk_size``), then applies the one rule,
  ``work.resolve_loss_chunk`` (which the memory model uses too): "auto" is 0 on CPU (no
  accelerator memory to save; the unchunked step is the bitwise reference), else
  min(seq_len, 512) when ``vocab_size`` >= 32,768 and 0 below it; an integer is kept,
  capped at ``seq_len`` (one chunk of the whole sequence).

  Args:
    value: "auto" or an integer >= 0, or its digits as a string.
    backend: "cpu", "gpu" or "tpu" (the run's, or a compile target's).
    seq_len: T (tokens per sequence); vocab_size: V.
  Raises:
    ConfigError: any other value.
  """
  return work.resolve_loss_chunk(config_checks.parse_loss_chunk_size(value), backend, seq_len,
                                 vocab_size)


def _terms_f32(logits_BTV, targets_BT):
  logits_BTV = logits_BTV.astype(jnp.float32)
  log_z_BT = jax.nn.logsumexp(logits_BTV, axis=-1)
  target_logit_BT = jnp.take_along_axis(logits_BTV, targets_BT[..., None], axis=-1)[..., 0]
  return log_z_BT, target_logit_BT


def _terms_from_low(logits_BTV, targets_BT):
  # The max and the target's logit are exact in the logits' own dtype; only the exp-sum
  # upcasts, inside its reduction, so no float32 [B, T, V] copy has two readers to be kept for.
  max_BT = jax.lax.stop_gradient(jnp.max(logits_BTV, axis=-1)).astype(jnp.float32)
  sum_BT = jnp.sum(jnp.exp(logits_BTV.astype(jnp.float32) - max_BT[..., None]), axis=-1)
  target_BT = jnp.take_along_axis(logits_BTV, targets_BT[..., None], axis=-1)[..., 0]
  return max_BT + jnp.log(sum_BT), target_BT.astype(jnp.float32)


@jax.custom_vjp
def _terms_low_precision(logits_BTV, targets_BT):
  return _terms_from_low(logits_BTV, targets_BT)


def _terms_fwd(logits_BTV, targets_BT):
  log_z_BT, target_logit_BT = _terms_from_low(logits_BTV, targets_BT)
  return (log_z_BT, target_logit_BT), (logits_BTV, log_z_BT, targets_BT)


def _terms_bwd(res, cotangents):
  logits_BTV, log_z_BT, targets_BT = res
  d_log_z_BT, d_target_BT = cotangents
  # ∂log Z/∂logits = softmax; ∂(target logit)/∂logits = onehot(target): float32 inside one
  # elementwise pass, one output in the logits' dtype.
  p_BTV = jnp.exp(logits_BTV.astype(jnp.float32) - log_z_BT[..., None])
  onehot_BTV = jnp.arange(logits_BTV.shape[-1], dtype=targets_BT.dtype) == targets_BT[..., None]
  d_BTV = d_log_z_BT[..., None] * p_BTV + jnp.where(onehot_BTV, d_target_BT[..., None], 0.0)
  return d_BTV.astype(logits_BTV.dtype), None


_terms_low_precision.defvjp(_terms_fwd, _terms_bwd)


def token_terms(logits_BTV: jax.Array, targets_BT: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(log Z, target logit), float32 [B, T] each, of logits [B, T, V] and int targets [B, T].

  Float32 logits: plain autodiff of the float32 arithmetic (bitwise as it always was).
  Lower-precision logits: the same float32 values, with a custom gradient that keeps only
  the input logits and log Z for the backward and returns the logits' gradient in their own
  dtype (module docstring).
  """
  if logits_BTV.dtype == jnp.float32:
    return _terms_f32(logits_BTV, targets_BT)
  return _terms_low_precision(logits_BTV, targets_BT)


def loss_terms(logits_BTV: jax.Array, targets_BT: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Mean cross-entropy (nats/token) and mean (log Z)² over [B, T], in float32 (logits of any
  float dtype, :func:`token_terms`)."""
  log_z_BT, target_logit_BT = token_terms(logits_BTV, targets_BT)
  return jnp.mean(log_z_BT - target_logit_BT), jnp.mean(log_z_BT ** 2)


def row_sums(logits_BTV: jax.Array, targets_BT: jax.Array) -> tuple[jax.Array, jax.Array]:
  """float32 [B] each: every row's summed cross-entropy (nats) and summed (log Z)² over T
  (logits of any float dtype, :func:`token_terms`)."""
  log_z_BT, target_logit_BT = token_terms(logits_BTV, targets_BT)
  return jnp.sum(log_z_BT - target_logit_BT, axis=1), jnp.sum(log_z_BT ** 2, axis=1)


@jax.checkpoint
def _chunk_sums(x_BCD, head_DV, targets_BC):
  # Under jax.checkpoint only the inputs are kept for the backward: the chunk's logits
  # [B, C, V] are recomputed there, one chunk at a time.
  return row_sums(model_lib.project(x_BCD, head_DV), targets_BC)


def chunked_row_sums(x_BTD: jax.Array, head_DV: jax.Array, targets_BT: jax.Array,
                     chunk: int) -> tuple[jax.Array, jax.Array]:
  """:func:`row_sums` of the logits ``x_BTD · head_DV``, computed ``chunk`` positions at a time.

  Equal to ``row_sums(model.project(x_BTD, head_DV), targets_BT)`` up to float32 round-off
  (summed per chunk), with and without a gradient, while at most one chunk's logits
  [B, chunk, V] exist at once.

  Args:
    x_BTD: the final-normed hidden states [B, T, D] (``Transformer.hidden``).
    head_DV: the output projection [D, V] (``Transformer.output_head``).
    targets_BT: int32 [B, T] next tokens.
    chunk: positions per chunk, 1 <= chunk; one that does not divide T leaves a last,
      shorter chunk of T mod chunk positions.
  Returns:
    (cross-entropy sums, (log Z)² sums), float32 [B] each (nats; nats²).
  Raises:
    ValueError: chunk < 1.
  """
  if chunk < 1:
    raise ValueError(f"loss chunk of {chunk} positions; use >= 1")
  B, T, D = x_BTD.shape
  n, rest = divmod(T, chunk)
  ce_B = z2_B = jnp.zeros((B,), jnp.float32)
  if n:
    # [B, n·C, D] → [n, B, C, D]: the batch rows stay where they are (over data×fsdp).
    xs = jnp.swapaxes(x_BTD[:, :n * chunk].reshape(B, n, chunk, D), 0, 1)
    xs = sharding.constrain(xs, (None, "batch", "seq", "embed"))
    ts = jnp.swapaxes(targets_BT[:, :n * chunk].reshape(B, n, chunk), 0, 1)

    def body(carry, xt):
      ce, z2 = _chunk_sums(xt[0], head_DV, xt[1])
      return (carry[0] + ce, carry[1] + z2), None

    (ce_B, z2_B), _ = jax.lax.scan(body, (ce_B, z2_B), (xs, ts))
  if rest:
    ce, z2 = _chunk_sums(x_BTD[:, n * chunk:], head_DV, targets_BT[:, n * chunk:])
    ce_B, z2_B = ce_B + ce, z2_B + z2
  return ce_B, z2_B


def model_row_sums(model, inputs_BT: jax.Array, targets_BT: jax.Array,
                   chunk: int) -> tuple[jax.Array, jax.Array]:
  """The model's per-row loss sums, float32 [B] each (cross-entropy nats, (log Z)²): through
  :func:`chunked_row_sums` when ``chunk`` > 0, else from the full logits [B, T, V]."""
  if chunk:
    return chunked_row_sums(model.hidden(inputs_BT), model.output_head(), targets_BT, chunk)
  return row_sums(model(inputs_BT), targets_BT)
