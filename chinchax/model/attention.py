"""Causal attention behind one switch.

Implementations:
  xla    einsum + softmax + einsum; runs everywhere (precision below).
  cudnn  ``jax.nn.dot_product_attention(implementation="cudnn")``: cuDNN flash
         attention on NVIDIA GPUs (bf16/fp16 only).
  splash the Pallas splash-attention kernel on TPU
         (``jax.experimental.pallas.ops.tpu.splash_attention``): block-sparse
         causal flash attention that skips the masked half. Under a mesh it
         runs per shard (``jax.shard_map``) with batch and heads split as
         ``chinchax.model.sharding``'s rules say.
  auto   splash on a TPU when seq_len suits its blocks (a multiple of 128), cudnn on a
         GPU with a 16-bit compute dtype, else xla (CPU: the float32 reference the
         equality tests compare against).

Splash blocks (:func:`splash_block`): the largest of 512, 256 and 128 tokens that
divides seq_len (the kernel computes key/value blocks in multiples of 128 lanes). Larger blocks mean fewer grid steps and
fuller MXU tiles; 512 is the block MaxText's splash configuration uses by default
(``sa_block_q`` … ``sa_block_kv_dq`` = 512, capped at seq_len).

Grouped-query attention (keys and values with G heads, G dividing the H query
heads; query head h reads key/value head h // (H/G)) runs natively in all three:
xla groups the queries [B, T, G, H/G, K] against k/v [B, T, G, K] (no repeated
copy of k/v); ``jax.nn.dot_product_attention`` takes k/v with fewer heads (GQA
when H is a multiple of G, its docs); the splash MHA kernel takes k/v of
[G, T, K] against q of [H, T, K] (``q_heads_per_kv_head`` in the kernel).

:func:`resolve_impl` turns the config value into the one that will run and
says why when it falls back.

Precision of the xla path, by the dtype of q, k, v:
  float32   scores q kᵀ, softmax and its gradient in float32, by plain autodiff (the CPU
            default; the bitwise reference every equality test holds the others to).
  bfloat16  q kᵀ is a bf16 matmul with bf16 output (accumulated in float32 by the MXU / tensor
            cores), as MaxText's default. The scale, mask, max, exp and sum run in float32
            inside one fusion whose outputs are the row sums l (float32 [.., t]) and the
            unnormalised exponentials e = exp(s − max) in (0, 1], stored once in bf16: the one
            [B, H, T, T] buffer, read by the e·v matmul (float32 accumulation) whose [B, T, H, K]
            output is divided by l (the normalisation after the matmul, as flash attention and
            MaxText's dot-product path do). :func:`_attend_low`'s custom gradient keeps e, l, v
            and the output, and computes p·(dp − rowsum(g ⊙ out)), p = e / l, in float32 inside
            its fusions, returning the scores' gradient in bf16; v's gradient is eᵀ·(g / l),
            the division again on the [B, T, H, K] side. Plain autodiff would keep the
            float32 exponentials (exp saves its output) beside the bf16 copy: 3× the bytes of
            the one bf16 buffer; normalising before the matmul made XLA write the float32
            exponentials too (a reduction and its broadcast consumer are two kernels on TPU:
            +0.4 GB of temporaries at 125M, 16 sequences of 1,024 per device). The statistics
            (max, sum) stay float32 because a bf16 sum of T terms loses about log2(T) of
            bf16's 8 bits; a bf16 score loses nothing the bf16 exponentials do not already lose.
  cudnn and splash keep their kernels' own numerics (float32 statistics, 16-bit tiles).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from chinchax import console
from chinchax.model import sharding as sharding_lib

IMPLS = ("auto", "xla", "cudnn", "splash")
SPLASH_BLOCK = 128  # smallest splash block (tokens, the TPU's lanes); seq_len must be a multiple
SPLASH_BLOCKS = (512, 256, SPLASH_BLOCK)  # tried largest first (see the module doc)


def splash_block(seq_len: int) -> int | None:
  """The splash kernel's block size (tokens) for ``seq_len``: the largest of
  :data:`SPLASH_BLOCKS` dividing it; None when seq_len is not a multiple of 128 (the
  kernel's key/value compute block must be a multiple of the TPU's 128 lanes)."""
  return next((b for b in SPLASH_BLOCKS if seq_len % b == 0), None)


def resolve_impl(impl: str, backend: str, compute_dtype: str, document_mask: bool = False,
                 seq_len: int | None = None) -> str:
  """Chooses the attention implementation that will actually run.

  Args:
    impl: requested implementation, one of ``IMPLS``.
    backend: ``jax.default_backend()`` ("cpu", "gpu", "tpu"), or the compile target's.
    compute_dtype: "float32" or "bfloat16".
    document_mask: attention within documents (segment ids): "xla" only.
    seq_len: tokens per sequence; ``auto`` picks splash on a TPU only when
      :func:`splash_block` has a block for it (None: assumed to).
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
    if not reason and seq_len is not None and splash_block(seq_len) is None:
      reason = f"needs seq_len a multiple of {SPLASH_BLOCK}, got {seq_len}"
    if reason:
      console.warn(f"attention='splash' {reason}; falling back to 'xla'")
      return "xla"
    return impl
  cudnn_ok = backend == "gpu" and compute_dtype in ("bfloat16", "float16")
  if impl == "auto":
    if backend == "tpu" and not splash_unavailable(backend) and (
        seq_len is None or splash_block(seq_len) is not None):
      return "splash"
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


def splash_attention(q_BTHK: jax.Array, k_BTGK: jax.Array, v_BTGK: jax.Array, *,
                     interpret: bool = False) -> jax.Array:
  """Causal attention with the Pallas splash kernel (TPU; ``interpret=True`` runs anywhere, slowly).

  Args:
    q_BTHK: [B, T, H, K] queries; T a multiple of :data:`SPLASH_BLOCK`.
    k_BTGK, v_BTGK: [B, T, G, K] keys and values, G dividing H (G = H: multi-head).
    interpret: run the kernel in the Pallas interpreter (for tests on CPU).
  Returns:
    [B, T, H, K] in the dtype of ``q_BTHK``; every block size is :func:`splash_block` (T).
  Raises:
    ValueError: T is not a multiple of the block size.
  """
  from jax.experimental.pallas.ops.tpu import splash_attention as splash

  T, K = q_BTHK.shape[1], q_BTHK.shape[3]
  block = splash_block(T)
  if block is None:
    raise ValueError(f"splash attention needs seq_len a multiple of {SPLASH_BLOCK}, got {T}")

  def local(q_BTHK, k_BTGK, v_BTGK):
    H = q_BTHK.shape[2]  # heads of this shard
    mask = splash.MultiHeadMask([splash.CausalMask((T, T)) for _ in range(H)])
    sizes = splash.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block,
                              block_q_dkv=block, block_kv_dkv=block,
                              block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)
    kernel = splash.make_splash_mha(mask, head_shards=1, q_seq_shards=1, block_sizes=sizes,
                                    interpret=interpret)
    to_bhtk = lambda x: jnp.swapaxes(x, 1, 2)
    q_BHTK = to_bhtk(q_BTHK * jnp.asarray(K ** -0.5, q_BTHK.dtype))
    out_BHTK = jax.vmap(kernel)(q_BHTK, to_bhtk(k_BTGK), to_bhtk(v_BTGK))
    return jnp.swapaxes(out_BHTK, 1, 2).astype(q_BTHK.dtype)

  mesh = jax.typeof(q_BTHK).sharding.mesh
  if mesh.empty or mesh.size == 1:
    return local(q_BTHK, k_BTGK, v_BTGK)
  spec = sharding_lib.logical_to_spec(("batch", "seq", "heads", "kv"), q_BTHK.shape, mesh)
  kv_spec = sharding_lib.logical_to_spec(("batch", "seq", "kv_heads", "kv"), k_BTGK.shape, mesh)
  return jax.shard_map(local, mesh=mesh, in_specs=(spec, kv_spec, kv_spec), out_specs=spec,
                       check_vma=False)(q_BTHK, k_BTGK, v_BTGK)


def causal_attention(q_BTHK: jax.Array, k_BTGK: jax.Array, v_BTGK: jax.Array, *,
                     impl: str = "xla", segment_ids_BT: jax.Array | None = None) -> jax.Array:
  """Causal multi-head or grouped-query attention softmax(q kᵀ / √K + mask) v.

  Args:
    q_BTHK: [B, T, H, K] queries.
    k_BTGK, v_BTGK: [B, T, G, K] keys and values; G divides H and query head h reads
      key/value head h // (H/G) (G = H: multi-head, computed exactly as before grouping).
    impl: "xla", "cudnn" or "splash" (already resolved by :func:`resolve_impl`).
    segment_ids_BT: int [B, T] document index of each position; when given, a
      query attends only to earlier keys of its own document ("xla" only:
      :func:`resolve_impl` falls back to it). Its cost in XLA's cost analysis of a
      train step (d_model 128, 4 layers, T 512, batch 8, CPU): +0.10% FLOPs,
      +0.01% bytes accessed (the [B, T, T] comparison beside the causal mask).
  Returns:
    [B, T, H, K] attention output, in the dtype of ``q_BTHK``.
  Raises:
    ValueError: segment ids with an implementation other than "xla"; G not dividing H.
  """
  B, T, H, K = q_BTHK.shape
  G = k_BTGK.shape[2]
  if H % G:
    raise ValueError(f"{G} key/value heads do not divide {H} query heads")
  if segment_ids_BT is not None and impl != "xla":
    raise ValueError(f"document-masked attention runs with attention='xla', not {impl!r}")
  if impl == "splash":
    return splash_attention(q_BTHK, k_BTGK, v_BTGK)
  if impl == "cudnn":
    return jax.nn.dot_product_attention(q_BTHK, k_BTGK, v_BTGK, is_causal=True,
                                        implementation="cudnn")
  mask_TT = jnp.tril(jnp.ones((T, T), dtype=bool))
  same_doc_BTT = (None if segment_ids_BT is None
                  else segment_ids_BT[:, :, None] == segment_ids_BT[:, None, :])
  low = q_BTHK.dtype != jnp.float32
  score_dtype = q_BTHK.dtype if low else jnp.float32
  if G == H:  # multi-head
    scores_BHTT = jnp.einsum("bthk,bshk->bhts", q_BTHK, k_BTGK,
                             preferred_element_type=score_dtype)
    mask_BHTT = mask_TT[None, None]
    if same_doc_BTT is not None:
      mask_BHTT = mask_BHTT & same_doc_BTT[:, None]
    return _attend(scores_BHTT, mask_BHTT, v_BTGK, K, ("bhts", "bshk", "bthk"))
  # Grouped: the R = H/G query heads of a group share its key/value head.
  q_BTGRK = q_BTHK.reshape(B, T, G, H // G, K)
  scores_BGRTT = jnp.einsum("btgrk,bsgk->bgrts", q_BTGRK, k_BTGK,
                            preferred_element_type=score_dtype)
  mask_BGRTT = mask_TT[None, None, None]
  if same_doc_BTT is not None:
    mask_BGRTT = mask_BGRTT & same_doc_BTT[:, None, None]
  out_BTGRK = _attend(scores_BGRTT, mask_BGRTT, v_BTGK, K, ("bgrts", "bsgk", "btgrk"))
  return out_BTGRK.reshape(B, T, H, K)


def _attend(scores, mask, v, head_dim: int, specs: tuple[str, str, str]):
  """softmax(scores / √head_dim, masked) · v, in the dtype of ``v``; ``specs`` are the einsum
  letters of scores ([..., t, s]), v and the output.

  float32 scores: plain autodiff of softmax then the p·v einsum (the reference). 16-bit
  scores: :func:`_attend_low` (module docstring).
  """
  s_spec, v_spec, o_spec = specs
  if scores.dtype == jnp.float32:
    scores = jnp.where(mask, scores / jnp.sqrt(jnp.float32(head_dim)), jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    return jnp.einsum(f"{s_spec},{v_spec}->{o_spec}", probs, v)
  return _attend_low(scores, mask, v, head_dim, specs)


def _attend_low_fwd(scores, mask, v, head_dim, specs):
  s_spec, v_spec, o_spec = specs
  s32 = jnp.where(mask, scores.astype(jnp.float32) / jnp.sqrt(jnp.float32(head_dim)),
                  jnp.finfo(jnp.float32).min)
  e32 = jnp.exp(s32 - jnp.max(s32, axis=-1, keepdims=True))  # masked: 0
  l = jnp.sum(e32, axis=-1)  # float32 [..., t]: the normaliser, applied after the p·v matmul
  e = e32.astype(scores.dtype)  # the one [.., t, s] buffer: unnormalised, in (0, 1]
  out32 = jnp.einsum(f"{s_spec},{v_spec}->{o_spec}", e, v, preferred_element_type=jnp.float32)
  l_o = jnp.einsum(f"{s_spec[:-1]}->{o_spec[:-1]}", l)
  out = (out32 / l_o[..., None]).astype(v.dtype)
  return out, (e, l, v, out)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _attend_low(scores, mask, v, head_dim, specs):
  """Masked softmax · v of 16-bit scores: float32 statistics, one 16-bit [.., t, s] buffer
  (the unnormalised exponentials), normalised after the p·v matmul (module docstring)."""
  return _attend_low_fwd(scores, mask, v, head_dim, specs)[0]


def _attend_low_bwd(head_dim, specs, res, g):
  # p = e / l; dv = pᵀ·g; dp = g·vᵀ; dscores = p (dp − rowsum(g ⊙ out)) / √head_dim
  # (rowsum(p ⊙ dp) = g·out, the flash-attention identity: no second pass over [t, s]).
  # dv = Σ_t e_ts (g_t / l_t): the division on the [.., t, k] side, so no p [.., t, s] is written.
  s_spec, v_spec, o_spec = specs
  e, l, v, out = res
  inv_l = 1.0 / l
  p32 = e.astype(jnp.float32) * inv_l[..., None]
  g_l = g.astype(jnp.float32) / jnp.einsum(f"{s_spec[:-1]}->{o_spec[:-1]}", l)[..., None]
  dv = jnp.einsum(f"{s_spec},{o_spec}->{v_spec}", e, g_l.astype(e.dtype),
                  preferred_element_type=jnp.float32)
  dp = jnp.einsum(f"{o_spec},{v_spec}->{s_spec}", g.astype(e.dtype), v)
  d_o = jnp.einsum(f"{o_spec},{o_spec}->{o_spec[:-1]}", g.astype(jnp.float32),
                   out.astype(jnp.float32))
  d = jnp.einsum(f"{o_spec[:-1]}->{s_spec[:-1]}", d_o)
  ds = p32 * (dp.astype(jnp.float32) - d[..., None]) / jnp.sqrt(jnp.float32(head_dim))
  return ds.astype(e.dtype), None, dv.astype(v.dtype)


_attend_low.defvjp(_attend_low_fwd, _attend_low_bwd)
