"""Causal attention behind one switch.

Implementations:
  xla    einsum + float32 softmax + einsum; runs everywhere.
  cudnn  ``jax.nn.dot_product_attention(implementation="cudnn")``: cuDNN flash
         attention on NVIDIA GPUs (bf16/fp16 only).
  splash the Pallas splash-attention kernel on TPU
         (``jax.experimental.pallas.ops.tpu.splash_attention``): block-sparse
         causal flash attention that skips the masked half. Under a mesh it
         runs per shard (``jax.shard_map``) with batch and heads split as
         ``chinchax.sharding``'s rules say.
  auto   cudnn on a GPU with a 16-bit compute dtype, else xla.

:func:`resolve_impl` turns the config value into the one that will run and
says why when it falls back.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from chinchax import console
from chinchax import sharding as sharding_lib

IMPLS = ("auto", "xla", "cudnn", "splash")
SPLASH_BLOCK = 128  # splash kernel block size (tokens); seq_len must be a multiple of it


def resolve_impl(impl: str, backend: str, compute_dtype: str, document_mask: bool = False) -> str:
  """Chooses the attention implementation that will actually run.

  Args:
    impl: requested implementation, one of ``IMPLS``.
    backend: ``jax.default_backend()`` ("cpu", "gpu", "tpu").
    compute_dtype: "float32" or "bfloat16".
    document_mask: attention within documents (segment ids): "xla" only.
  Returns:
    "xla", "cudnn" or "splash".
  Raises:
    ValueError: for an unknown ``impl``.
  """
  if impl not in IMPLS:
    raise ValueError(f"attention implementation {impl!r} is not one of {IMPLS}")
  if document_mask:
    if impl not in ("auto", "xla"):
      console.warn(f"attention={impl!r} has no document mask here; model.document_mask runs "
                   f"with 'xla'")
    return "xla"
  if impl == "splash":
    reason = splash_unavailable(backend)
    if reason:
      console.warn(f"attention='splash' {reason}; falling back to 'xla'")
      return "xla"
    return impl
  cudnn_ok = backend == "gpu" and compute_dtype in ("bfloat16", "float16")
  if impl == "auto":
    return "cudnn" if cudnn_ok else "xla"
  if impl == "cudnn" and not cudnn_ok:
    console.warn(f"attention='cudnn' needs an NVIDIA GPU and a 16-bit compute dtype "
                 f"(backend={backend}, compute_dtype={compute_dtype}); falling back to 'xla'")
    return "xla"
  return impl


def splash_unavailable(backend: str) -> str | None:
  """Why the splash kernel cannot run on ``backend`` (None when it can)."""
  if backend != "tpu":
    return f"(Pallas splash attention) needs a TPU, the backend is {backend!r}"
  try:
    from jax.experimental.pallas.ops.tpu import splash_attention  # noqa: F401
  except ImportError as e:
    return f"(Pallas splash attention) cannot be imported in this JAX ({e})"
  return None


def splash_attention(q_BTHK: jax.Array, k_BTHK: jax.Array, v_BTHK: jax.Array, *,
                     interpret: bool = False) -> jax.Array:
  """Causal attention with the Pallas splash kernel (TPU; ``interpret=True`` runs anywhere, slowly).

  Args:
    q_BTHK, k_BTHK, v_BTHK: [B, T, H, K]; T a multiple of :data:`SPLASH_BLOCK`
      (or smaller than it).
    interpret: run the kernel in the Pallas interpreter (for tests on CPU).
  Returns:
    [B, T, H, K] in the dtype of ``q_BTHK``.
  Raises:
    ValueError: T is not a multiple of the block size.
  """
  from jax.experimental.pallas.ops.tpu import splash_attention as splash

  T, K = q_BTHK.shape[1], q_BTHK.shape[3]
  block = min(SPLASH_BLOCK, T)
  if T % block:
    raise ValueError(f"splash attention needs seq_len a multiple of {SPLASH_BLOCK}, got {T}")

  def local(q_BTHK, k_BTHK, v_BTHK):
    H = q_BTHK.shape[2]  # heads of this shard
    mask = splash.MultiHeadMask([splash.CausalMask((T, T)) for _ in range(H)])
    sizes = splash.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block,
                              block_q_dkv=block, block_kv_dkv=block,
                              block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)
    kernel = splash.make_splash_mha(mask, head_shards=1, q_seq_shards=1, block_sizes=sizes,
                                    interpret=interpret)
    to_bhtk = lambda x: jnp.swapaxes(x, 1, 2)
    q_BHTK = to_bhtk(q_BTHK * jnp.asarray(K ** -0.5, q_BTHK.dtype))
    out_BHTK = jax.vmap(kernel)(q_BHTK, to_bhtk(k_BTHK), to_bhtk(v_BTHK))
    return jnp.swapaxes(out_BHTK, 1, 2).astype(q_BTHK.dtype)

  mesh = jax.typeof(q_BTHK).sharding.mesh
  if mesh.empty or mesh.size == 1:
    return local(q_BTHK, k_BTHK, v_BTHK)
  spec = sharding_lib.logical_to_spec(("batch", "seq", "heads", "kv"), q_BTHK.shape, mesh)
  return jax.shard_map(local, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec,
                       check_vma=False)(q_BTHK, k_BTHK, v_BTHK)


def causal_attention(q_BTHK: jax.Array, k_BTHK: jax.Array, v_BTHK: jax.Array, *,
                     impl: str = "xla", segment_ids_BT: jax.Array | None = None) -> jax.Array:
  """Causal multi-head attention softmax(q kᵀ / √K + mask) v.

  Args:
    q_BTHK, k_BTHK, v_BTHK: [B, T, H, K] queries, keys, values.
    impl: "xla", "cudnn" or "splash" (already resolved by :func:`resolve_impl`).
    segment_ids_BT: int [B, T] document index of each position; when given, a
      query attends only to earlier keys of its own document ("xla" only:
      :func:`resolve_impl` falls back to it). Its cost in XLA's cost analysis of a
      train step (d_model 128, 4 layers, T 512, batch 8, CPU): +0.10% FLOPs,
      +0.01% bytes accessed (the [B, T, T] comparison beside the causal mask).
  Returns:
    [B, T, H, K] attention output, in the dtype of ``q_BTHK``.
  Raises:
    ValueError: segment ids with an implementation other than "xla".
  """
  if segment_ids_BT is not None and impl != "xla":
    raise ValueError(f"document-masked attention runs with attention='xla', not {impl!r}")
  if impl == "splash":
    return splash_attention(q_BTHK, k_BTHK, v_BTHK)
  if impl == "cudnn":
    return jax.nn.dot_product_attention(q_BTHK, k_BTHK, v_BTHK, is_causal=True,
                                        implementation="cudnn")
  K = q_BTHK.shape[-1]
  T = q_BTHK.shape[1]
  scores_BHTT = jnp.einsum("bthk,bshk->bhts", q_BTHK, k_BTHK,
                           preferred_element_type=jnp.float32) / jnp.sqrt(jnp.float32(K))
  mask_BHTT = jnp.tril(jnp.ones((T, T), dtype=bool))[None, None]
  if segment_ids_BT is not None:
    mask_BHTT = mask_BHTT & (segment_ids_BT[:, None, :, None] == segment_ids_BT[:, None, None, :])
  scores_BHTT = jnp.where(mask_BHTT, scores_BHTT, jnp.finfo(jnp.float32).min)
  probs_BHTT = jax.nn.softmax(scores_BHTT, axis=-1).astype(v_BTHK.dtype)
  return jnp.einsum("bhts,bshk->bthk", probs_BHTT, v_BTHK)
