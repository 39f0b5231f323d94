"""The model's forward pass over a fixed-size key/value cache (prefill and one-token decode steps).

The cache holds S positions (S = the run's ``seq_len``): keys and values of every layer,
``k_LBSGK`` / ``v_LBSGK`` [L, B, S, G, K] (G key/value heads: ``n_heads``, or fewer where the
attention parameters are grouped), and with ``model.document_mask`` the document index of each
cached position, ``doc_BS`` [B, S]. :func:`forward` runs T new tokens at positions
``pos … pos + T − 1``: it writes their keys and values into the cache and attends to cached
positions ≤ its own (and of its own document). Prefill is T = the prompt's length at pos 0;
a decode step is T = 1.

It reuses the model's own layers: the blocks' RMSNorms and MLPs are called as they are, q/k/v
and the output projection are the blocks' attention parameters, RoPE is
``chinchax.model.transformer.rope_tables`` / ``apply_rope``; only attention over the cache is written here,
the same arithmetic as ``chinchax.model.attention``'s "xla" path (float32 scores scaled by 1/√K, a
float32 softmax). Letters as in ``chinchax.model.transformer``, plus L layers, S cache positions,
G key/value heads.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from chinchax.model import transformer as model_lib


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class KVCache:
  """Keys and values of every layer for S positions, and (document_mask) each position's document.

  Attributes:
    k_LBSGK, v_LBSGK: [L, B, S, G, K] in the model's compute dtype; positions not yet written hold 0.
    doc_BS: int32 [B, S] document index of each written position (model.document_ids: EOS tokens
      before it); 0 everywhere when the model has no document mask.
    docs_B: int32 [B] EOS tokens among the written positions (the next position's document).
  """
  k_LBSGK: jax.Array
  v_LBSGK: jax.Array
  doc_BS: jax.Array
  docs_B: jax.Array


def kv_heads(model: model_lib.Transformer) -> int:
  """G, the number of key/value heads: the key projection's head axis (n_heads, or fewer
  where the model groups its key/value heads)."""
  attn = model.blocks.attn if model.cfg.scan_layers else model.blocks[0].attn
  return attn.wk_DHK.shape[-2]


def init_cache(model: model_lib.Transformer, batch: int, positions: int) -> KVCache:
  """An empty cache of ``positions`` (S) positions for ``batch`` (B) sequences.

  Memory: 2 · L · B · S · G · K values of the compute dtype.
  """
  cfg = model.cfg
  shape = (cfg.n_layers, batch, positions, kv_heads(model), cfg.head_dim)
  dt = jnp.dtype(cfg.compute_dtype)
  return KVCache(jnp.zeros(shape, dt), jnp.zeros(shape, dt),
                 jnp.zeros((batch, positions), jnp.int32), jnp.zeros((batch,), jnp.int32))


def _attend(q_BTHK, k_BSGK, v_BSGK, mask_BTS):
  """softmax(q kᵀ / √K + mask) v over the cache; H query heads share G key/value heads in
  groups of H/G (query head h reads key/value head h // (H/G))."""
  B, T, H, K = q_BTHK.shape
  G = k_BSGK.shape[2]
  q_BTGRK = q_BTHK.reshape(B, T, G, H // G, K)
  scores_BGRTS = jnp.einsum("btgrk,bsgk->bgrts", q_BTGRK, k_BSGK,
                            preferred_element_type=jnp.float32) / jnp.sqrt(jnp.float32(K))
  scores_BGRTS = jnp.where(mask_BTS[:, None, None], scores_BGRTS, jnp.finfo(jnp.float32).min)
  probs_BGRTS = jax.nn.softmax(scores_BGRTS, axis=-1).astype(v_BSGK.dtype)
  out_BTGRK = jnp.einsum("bgrts,bsgk->btgrk", probs_BGRTS, v_BSGK)
  return out_BTGRK.reshape(B, T, H, K)


def _layer(block, x_BTD, k_BSGK, v_BSGK, pos, sin_TK2, cos_TK2, mask_BTS):
  """One block on the new positions; returns (x_BTD, k_BSGK, v_BSGK) with the cache updated."""
  dt = x_BTD.dtype
  attn = block.attn
  h_BTD = block.attn_norm(x_BTD)
  q_BTHK = jnp.einsum("btd,dhk->bthk", h_BTD, attn.wq_DHK[...].astype(dt))
  k_BTGK = jnp.einsum("btd,dgk->btgk", h_BTD, attn.wk_DHK[...].astype(dt))
  v_BTGK = jnp.einsum("btd,dgk->btgk", h_BTD, attn.wv_DHK[...].astype(dt))
  q_BTHK = model_lib.apply_rope(q_BTHK, sin_TK2, cos_TK2)
  k_BTGK = model_lib.apply_rope(k_BTGK, sin_TK2, cos_TK2)
  k_BSGK = jax.lax.dynamic_update_slice(k_BSGK, k_BTGK.astype(k_BSGK.dtype), (0, pos, 0, 0))
  v_BSGK = jax.lax.dynamic_update_slice(v_BSGK, v_BTGK.astype(v_BSGK.dtype), (0, pos, 0, 0))
  out_BTHK = _attend(q_BTHK, k_BSGK, v_BSGK, mask_BTS)
  x_BTD = x_BTD + jnp.einsum("bthk,hkd->btd", out_BTHK, attn.wo_HKD[...].astype(dt))
  return x_BTD + block.mlp(block.mlp_norm(x_BTD)), k_BSGK, v_BSGK


def forward(model: model_lib.Transformer, tokens_BT: jax.Array, cache: KVCache,
            pos, n_valid=None) -> tuple[jax.Array, KVCache]:
  """Runs T new tokens at positions pos … pos + T − 1 through the model over the cache.

  Args:
    model: the transformer (its ``cfg`` decides compute dtype, RoPE, document mask, layer layout).
    tokens_BT: int32 [B, T] the new tokens.
    cache: the cache after positions 0 … pos − 1 (:func:`init_cache` at pos 0).
    pos: int (traced or not) position of the first new token; pos + T ≤ S.
    n_valid: int (traced or not) ≤ T: only the first n_valid tokens are real, the rest padding
      (a prompt padded to a bucket's length); None = all T. Padding changes no real position's
      logits (it comes later, and causal attention never reads it), is not counted as a
      document's EOS, and its cache entries are overwritten by the decode steps that follow
      before any position attends to them.
  Returns:
    (float32 logits [B, T, V] of the new positions, the cache with them written).
    Equal to ``model(tokens)`` at those positions, up to float rounding.
  """
  cfg = model.cfg
  dt = jnp.dtype(cfg.compute_dtype)
  T = tokens_BT.shape[1]
  S = cache.k_LBSGK.shape[2]
  x_BTD = jnp.take(model.embed_VD[...], tokens_BT, axis=0).astype(dt)
  sin_SK2, cos_SK2 = model_lib.rope_tables(S, cfg.head_dim, cfg.rope_theta)
  sin_TK2 = jax.lax.dynamic_slice_in_dim(sin_SK2, pos, T, axis=0)
  cos_TK2 = jax.lax.dynamic_slice_in_dim(cos_SK2, pos, T, axis=0)
  t_T = pos + jnp.arange(T)
  mask_BTS = jnp.broadcast_to(jnp.arange(S)[None, None, :] <= t_T[None, :, None],
                              (tokens_BT.shape[0], T, S))
  doc_BS, docs_B = cache.doc_BS, cache.docs_B
  if cfg.document_mask:
    # A position's document = the EOS tokens before it (model.document_ids): an EOS ends its own.
    is_eos_BT = (tokens_BT == cfg.eos_id).astype(jnp.int32)
    if n_valid is not None:
      is_eos_BT = is_eos_BT * (jnp.arange(T) < n_valid).astype(jnp.int32)[None]
    doc_BT = docs_B[:, None] + jnp.cumsum(is_eos_BT, axis=1) - is_eos_BT
    doc_BS = jax.lax.dynamic_update_slice(doc_BS, doc_BT, (0, pos))
    docs_B = docs_B + is_eos_BT.sum(axis=1)
    mask_BTS = mask_BTS & (doc_BS[:, None, :] == doc_BT[:, :, None])
  x_BTD, k_LBSGK, v_LBSGK = _run_layers(model, x_BTD, cache, pos, sin_TK2, cos_TK2, mask_BTS)
  x_BTD = model.final_norm(x_BTD)
  head_DV = model.embed_VD[...].T if cfg.tie_embeddings else model.head_DV[...]
  logits_BTV = jnp.einsum("btd,dv->btv", x_BTD, head_DV.astype(dt),
                          preferred_element_type=jnp.float32)
  return logits_BTV, KVCache(k_LBSGK, v_LBSGK, doc_BS, docs_B)


def _run_layers(model, x_BTD, cache: KVCache, pos, sin_TK2, cos_TK2, mask_BTS):
  """Every block in turn: a Python loop over ``blocks/i`` or, for a ``model.scan_layers``
  model, ``lax.scan`` over the stacked blocks with each layer's cache slice."""
  def layer(block, x_BTD, k_BSGK, v_BSGK):
    return _layer(block, x_BTD, k_BSGK, v_BSGK, pos, sin_TK2, cos_TK2, mask_BTS)

  if model.cfg.scan_layers:  # one block's parameters per step of a scan over the stacked ones
    block_def, stacked = nnx.split(model.blocks)

    def step(x_BTD, layer_in):
      params, k_BSGK, v_BSGK = layer_in
      x_BTD, k_BSGK, v_BSGK = layer(nnx.merge(block_def, params), x_BTD, k_BSGK, v_BSGK)
      return x_BTD, (k_BSGK, v_BSGK)

    x_BTD, (k_LBSGK, v_LBSGK) = jax.lax.scan(step, x_BTD, (stacked, cache.k_LBSGK, cache.v_LBSGK))
    return x_BTD, k_LBSGK, v_LBSGK
  k_LBSGK, v_LBSGK = cache.k_LBSGK, cache.v_LBSGK
  for i, block in enumerate(model.blocks):
    x_BTD, k_BSGK, v_BSGK = layer(block, x_BTD, k_LBSGK[i], v_LBSGK[i])
    k_LBSGK = k_LBSGK.at[i].set(k_BSGK)
    v_LBSGK = v_LBSGK.at[i].set(v_BSGK)
  return x_BTD, k_LBSGK, v_LBSGK
