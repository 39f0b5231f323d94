"""Causal attention behind one switch.

Implementations:
  xla    einsum + float32 softmax + einsum; runs everywhere.
  cudnn  ``jax.nn.dot_product_attention(implementation="cudnn")``: cuDNN flash
         attention on NVIDIA GPUs (bf16/fp16 only).
  auto   cudnn on a GPU with a 16-bit compute dtype, else xla.

:func:`resolve_impl` turns the config value into the one that will run and
says why when it falls back.
"""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp

IMPLS = ("auto", "xla", "cudnn")


def resolve_impl(impl: str, backend: str, compute_dtype: str) -> str:
  """Chooses the attention implementation that will actually run.

  Args:
    impl: requested implementation, one of ``IMPLS``.
    backend: ``jax.default_backend()`` ("cpu", "gpu", "tpu").
    compute_dtype: "float32" or "bfloat16".
  Returns:
    "xla" or "cudnn".
  Raises:
    ValueError: for an unknown ``impl``.
  """
  if impl not in IMPLS:
    raise ValueError(f"attention implementation {impl!r} is not one of {IMPLS}")
  cudnn_ok = backend == "gpu" and compute_dtype in ("bfloat16", "float16")
  if impl == "auto":
    return "cudnn" if cudnn_ok else "xla"
  if impl == "cudnn" and not cudnn_ok:
    logging.warning("attention='cudnn' needs an NVIDIA GPU and a 16-bit compute dtype "
                    "(backend=%s, compute_dtype=%s); falling back to 'xla'", backend, compute_dtype)
    return "xla"
  return impl


def causal_attention(q_BTHK: jax.Array, k_BTHK: jax.Array, v_BTHK: jax.Array, *,
                     impl: str = "xla") -> jax.Array:
  """Causal multi-head attention softmax(q kᵀ / √K + mask) v.

  Args:
    q_BTHK, k_BTHK, v_BTHK: [B, T, H, K] queries, keys, values.
    impl: "xla" or "cudnn" (already resolved by :func:`resolve_impl`).
  Returns:
    [B, T, H, K] attention output, in the dtype of ``q_BTHK``.
  """
  if impl == "cudnn":
    return jax.nn.dot_product_attention(q_BTHK, k_BTHK, v_BTHK, is_causal=True,
                                        implementation="cudnn")
  K = q_BTHK.shape[-1]
  T = q_BTHK.shape[1]
  scores_BHTT = jnp.einsum("bthk,bshk->bhts", q_BTHK, k_BTHK,
                           preferred_element_type=jnp.float32) / jnp.sqrt(jnp.float32(K))
  mask_TT = jnp.tril(jnp.ones((T, T), dtype=bool))
  scores_BHTT = jnp.where(mask_TT[None, None], scores_BHTT, jnp.finfo(jnp.float32).min)
  probs_BHTT = jax.nn.softmax(scores_BHTT, axis=-1).astype(v_BTHK.dtype)
  return jnp.einsum("bhts,bshk->bthk", probs_BHTT, v_BTHK)
