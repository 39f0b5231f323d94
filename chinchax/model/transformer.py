"""Decoder-only transformer in Flax NNX.

Architecture (Llama-style): token embedding → n_layers × [pre-norm RMSNorm →
causal multi-head (or grouped-query) attention with RoPE → residual; pre-norm RMSNorm → SwiGLU MLP
→ residual] → final RMSNorm → output head (tied to the embedding or not).
No biases. Parameters are float32; matmuls run in ``compute_dtype``, the embedding table is
cast to it before the gather (so its gradient, and the gradient's exchange, is in
``compute_dtype`` too); logits are in ``compute_dtype`` and the loss computes in float32 from
them (``chinchax.train.loss``: with 16-bit logits it keeps one 16-bit [B, T, V] buffer).

Tensor names carry their shapes. Letters:
  B batch, T sequence (tokens), D d_model, H heads, K head_dim,
  G key/value heads (``n_kv_heads``; G = H without grouping), F d_ff (MLP hidden), V vocab_size.
e.g. ``x_BTD`` is the residual stream, ``logits_BTV`` the output logits.

Every parameter carries logical axis names in its ``out_sharding`` metadata,
drawn from ``layers, embed, heads, kv_heads, kv, mlp, vocab``; ``chinchax.model.sharding``
maps them onto mesh axes through one rules table. No mesh axis name appears here.

Layers are either a list of blocks run by a Python loop (``scan_layers=False``:
parameters ``blocks/0/...``, ``blocks/1/...``) or one block whose parameters
are stacked on a leading ``layers`` axis [L, ...] and run by ``nnx.scan``
(``scan_layers=True``: parameters ``blocks/...``). Both compute the same
function; scanning makes the compiled program, and its compile time,
independent of ``n_layers``.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from chinchax.model import attention as attention_lib
from chinchax.cost import budget
from chinchax.model import sharding

# Logical names of the activations pinned with sharding.constrain: the residual stream
# (batch over data×fsdp, embed unsplit: fsdp is taken by the batch) and q, k, v by head.
_BTD = ("batch", "seq", "embed")
_BTHK = ("batch", "seq", "heads", "kv")
_BTGK = ("batch", "seq", "kv_heads", "kv")


@dataclasses.dataclass(frozen=True)
class ModelConfig(budget.ModelShape):
  """A model: its shape (``budget.ModelShape``, the architecture) plus its numerics.

  Attributes (beyond the shape's; see ``chinchax.config`` for their meaning):
    rope_theta: RoPE base (Su et al. 2021).
    norm_eps: RMSNorm epsilon.
    init_std: standard deviation of the normal initializer (output projections
      scaled by 1/sqrt(2·n_layers), GPT-2).
    compute_dtype: "float32" or "bfloat16" (parameters stay float32).
    attention: the resolved kernel ("xla", "cudnn", "splash").
    remat: "none", "full" or "dots".
    scan_layers: blocks stacked on a "layers" axis and run by ``nnx.scan``.
    document_mask: attention stays within a document of a packed window
      (documents end at ``eos_id``).
    eos_id: the tokenizer's end-of-document id (-1: none).
  """

  rope_theta: float = 10_000.0
  norm_eps: float = 1e-6
  init_std: float = 0.02
  compute_dtype: str = "float32"
  attention: str = "xla"
  remat: str = "none"
  scan_layers: bool = False
  document_mask: bool = False
  eos_id: int = -1

  def shape(self, seq_len: int) -> budget.ModelShape:
    """This model's shape for sequences of ``seq_len`` tokens (for FLOP and parameter counts)."""
    return budget.ModelShape(**{**self.arch(), "n_kv_heads": self.n_kv_heads}, seq_len=seq_len)


INIT_RULES = ("fixed", "small")  # model.init (chinchax.config declares the knob)


def init_std(rule: str, init_std: float, d_model: int) -> float:
  """The standard deviation of the normal initializer.

  Args:
    rule: "fixed" (``init_std`` at every width) or "small": SmallInit,
      sqrt(2 / (5 · d_model)) (Nguyen & Salazar 2019, "Transformers without Tears",
      Sec. 2.2), which is 0.023 at d_model 768 (GPT-2's 0.02) and 0.12 at d_model 28.
    init_std: the "fixed" standard deviation.
    d_model: residual width.

  Raises:
    ValueError: an unknown rule.
  """
  if rule == "fixed":
    return float(init_std)
  if rule == "small":
    return (2.0 / (5.0 * d_model)) ** 0.5
  raise ValueError(f"model.init={rule!r} is not one of {INIT_RULES}")


def _param(rngs: nnx.Rngs, shape, std: float, names: tuple[str, ...]) -> nnx.Param:
  init = jax.nn.initializers.normal(std)
  # Logical names only; placement happens in the jitted init (chinchax.train).
  return nnx.Param(init(rngs.params(), shape, jnp.float32), out_sharding=names,
                   eager_sharding=False)


class RMSNorm(nnx.Module):
  """RMSNorm (Zhang & Sennrich 2019): x / rms(x) · scale, computed in float32.

  ``recompute``: on a 16-bit input the backward recomputes the float32 upcast from the input
  (:data:`_rms_norm_low`); for norms that no enclosing remat recomputes already.
  """

  def __init__(self, d_model: int, eps: float, recompute: bool = True):
    self.eps = eps
    self.recompute = recompute
    self.scale = nnx.Param(jnp.ones((d_model,), jnp.float32), out_sharding=("norm",),
                           eager_sharding=False)

  def __call__(self, x_BTD: jax.Array) -> jax.Array:
    low = self.recompute and x_BTD.dtype != jnp.float32
    return (_rms_norm_low if low else _rms_norm)(x_BTD, self.scale[...], self.eps)


def _rms_norm(x_BTD: jax.Array, scale_D: jax.Array, eps: float) -> jax.Array:
  x32 = x_BTD.astype(jnp.float32)
  rms = jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
  return (x32 * rms * scale_D).astype(x_BTD.dtype)


# 16-bit input: the backward recomputes the float32 upcast and the normalised stream from the
# 16-bit input, which is kept anyway, instead of keeping both in float32 (8·d_model bytes per
# token each; XLA's GPU compiler kept them for every layer without remat, and the final norm's
# upcast lived through the loss on TPU). Same values: the forward is unchanged.
_rms_norm_low = jax.checkpoint(_rms_norm, static_argnums=(2,))


def _swiglu(gate_BTF: jax.Array, up_BTF: jax.Array) -> jax.Array:
  return jax.nn.silu(gate_BTF) * up_BTF


# 16-bit: silu's sigmoid and output are recomputed from the gate in the backward, not kept
# beside the gate and up projections (2·d_ff 16-bit values per token and layer on GPU).
# Only without remat: under remat the block's backward recomputes them anyway, and the nested
# checkpoints cost XLA's TPU program 24 MB more (configs/train.py:125m, remat full, v5e-16).
_swiglu_low = jax.checkpoint(_swiglu)


def rope_tables(seq_len: int, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
  """RoPE sin/cos tables (Su et al. 2021), each [T, K/2] float32."""
  inv_freq_K2 = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
  angles_TK2 = jnp.arange(seq_len, dtype=jnp.float32)[:, None] * inv_freq_K2[None, :]
  return jnp.sin(angles_TK2), jnp.cos(angles_TK2)


def apply_rope(x_BTHK: jax.Array, sin_TK2: jax.Array, cos_TK2: jax.Array) -> jax.Array:
  """Rotates pairs (first half, second half) of each head by position-dependent angles."""
  x1, x2 = jnp.split(x_BTHK.astype(jnp.float32), 2, axis=-1)
  sin, cos = sin_TK2[None, :, None, :], cos_TK2[None, :, None, :]
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_BTHK.dtype)


class Attention(nnx.Module):
  """Causal self-attention with RoPE, no biases: H query heads sharing G = ``n_kv_heads``
  key/value heads in groups of H/G (grouped-query attention, Ainslie et al. 2023; G = 1 is
  multi-query, Shazeer 2019; G = H multi-head).

  ``wk_DHK`` and ``wv_DHK`` are [D, G, K] (their names keep the multi-head spelling so
  checkpoints of multi-head runs keep their layout); their head axis is the ``kv_heads``
  logical axis.
  """

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
    D, H, G, K = cfg.d_model, cfg.n_heads, cfg.kv_heads, cfg.head_dim
    self.cfg = cfg
    self.wq_DHK = _param(rngs, (D, H, K), cfg.init_std, ("embed", "heads", "kv"))
    self.wk_DHK = _param(rngs, (D, G, K), cfg.init_std, ("embed", "kv_heads", "kv"))
    self.wv_DHK = _param(rngs, (D, G, K), cfg.init_std, ("embed", "kv_heads", "kv"))
    # Output projection scaled down by depth (GPT-2, Radford et al. 2019, Sec. 2.3).
    self.wo_HKD = _param(rngs, (H, K, D), cfg.init_std / (2 * cfg.n_layers) ** 0.5,
                         ("heads", "kv", "embed"))

  def __call__(self, x_BTD, sin_TK2, cos_TK2, segment_ids_BT=None):
    dt = x_BTD.dtype
    q_BTHK = jnp.einsum("btd,dhk->bthk", x_BTD, self.wq_DHK[...].astype(dt))
    k_BTGK = jnp.einsum("btd,dgk->btgk", x_BTD, self.wk_DHK[...].astype(dt))
    v_BTGK = jnp.einsum("btd,dgk->btgk", x_BTD, self.wv_DHK[...].astype(dt))
    q_BTHK = sharding.constrain(apply_rope(q_BTHK, sin_TK2, cos_TK2), _BTHK)
    k_BTGK = sharding.constrain(apply_rope(k_BTGK, sin_TK2, cos_TK2), _BTGK)
    v_BTGK = sharding.constrain(v_BTGK, _BTGK)
    out_BTHK = attention_lib.causal_attention(q_BTHK, k_BTGK, v_BTGK, impl=self.cfg.attention,
                                              segment_ids_BT=segment_ids_BT)
    return jnp.einsum("bthk,hkd->btd", out_BTHK, self.wo_HKD[...].astype(dt))


class MLP(nnx.Module):
  """SwiGLU MLP (Shazeer 2020): down(silu(gate(x)) · up(x)); no biases."""

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
    D, F = cfg.d_model, cfg.d_ff
    self.recompute = cfg.remat == "none"  # see _swiglu_low
    self.w_gate_DF = _param(rngs, (D, F), cfg.init_std, ("embed", "mlp"))
    self.w_up_DF = _param(rngs, (D, F), cfg.init_std, ("embed", "mlp"))
    self.w_down_FD = _param(rngs, (F, D), cfg.init_std / (2 * cfg.n_layers) ** 0.5,
                            ("mlp", "embed"))

  def __call__(self, x_BTD):
    dt = x_BTD.dtype
    gate_BTF = jnp.einsum("btd,df->btf", x_BTD, self.w_gate_DF[...].astype(dt))
    up_BTF = jnp.einsum("btd,df->btf", x_BTD, self.w_up_DF[...].astype(dt))
    swiglu = _swiglu_low if self.recompute and dt != jnp.float32 else _swiglu
    h_BTF = sharding.constrain(swiglu(gate_BTF, up_BTF), ("batch", "seq", "mlp"))
    return jnp.einsum("btf,fd->btd", h_BTF, self.w_down_FD[...].astype(dt))


class Block(nnx.Module):
  """Pre-norm transformer block: x + attn(norm(x)); x + mlp(norm(x))."""

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
    # under remat the block's backward recomputes its norms from its input already
    self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps, recompute=cfg.remat == "none")
    self.attn = Attention(cfg, rngs)
    self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps, recompute=cfg.remat == "none")
    self.mlp = MLP(cfg, rngs)

  def __call__(self, x_BTD, sin_TK2, cos_TK2, segment_ids_BT=None):
    x_BTD = sharding.constrain(x_BTD, _BTD)
    x_BTD = x_BTD + self.attn(self.attn_norm(x_BTD), sin_TK2, cos_TK2, segment_ids_BT)
    return x_BTD + self.mlp(self.mlp_norm(x_BTD))


def document_ids(tokens_BT: jax.Array, eos_id: int) -> jax.Array:
  """int32 [B, T]: the index of the document each position belongs to within its window.

  A document's EOS (its last token) belongs to it; the token after starts the next.
  """
  is_eos_BT = (tokens_BT == eos_id).astype(jnp.int32)
  return jnp.cumsum(is_eos_BT, axis=1) - is_eos_BT


class Transformer(nnx.Module):
  """The decoder-only language model.

  Call with ``tokens_BT`` (int32 [B, T]); returns logits [B, T, V] in ``compute_dtype``.
  With ``document_mask`` a position attends only to its own document in a
  packed window (segment ids from the ``eos_id`` positions, :func:`document_ids`).
  """

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
    self.cfg = cfg
    V, D = cfg.vocab_size, cfg.d_model
    self.embed_VD = _param(rngs, (V, D), cfg.init_std, ("vocab", "embed"))
    if cfg.scan_layers:
      @nnx.split_rngs(splits=cfg.n_layers)
      @nnx.vmap(in_axes=0, out_axes=0, transform_metadata={nnx.PARTITION_NAME: "layers"})
      def stacked_blocks(rngs: nnx.Rngs) -> Block:
        return Block(cfg, rngs)

      self.blocks = stacked_blocks(rngs)
    else:
      self.blocks = nnx.List([Block(cfg, rngs) for _ in range(cfg.n_layers)])
    self.final_norm = RMSNorm(D, cfg.norm_eps)
    if not cfg.tie_embeddings:
      self.head_DV = _param(rngs, (D, V), cfg.init_std, ("embed", "vocab"))

  def __call__(self, tokens_BT: jax.Array) -> jax.Array:
    """int32 [B, T] tokens → logits [B, T, V] in ``compute_dtype`` (:meth:`hidden` then
    :meth:`logits`)."""
    return self.logits(self.hidden(tokens_BT))

  def hidden(self, tokens_BT: jax.Array) -> jax.Array:
    """int32 [B, T] tokens → the final-normed residual stream [B, T, D] in ``compute_dtype``,
    the input of the output head (:meth:`logits`; the chunked loss, ``chinchax.train.loss``)."""
    cfg = self.cfg
    dt = jnp.dtype(cfg.compute_dtype)
    T = tokens_BT.shape[1]
    # Cast, then gather: the gather's gradient (a scatter-add into [V, D]) and the exchange
    # of the embedding's gradient run in compute_dtype; identical in float32.
    x_BTD = sharding.constrain(jnp.take(self.embed_VD[...].astype(dt), tokens_BT, axis=0), _BTD)
    sin_TK2, cos_TK2 = rope_tables(T, cfg.head_dim, cfg.rope_theta)
    segment_ids_BT = document_ids(tokens_BT, cfg.eos_id) if cfg.document_mask else None

    def block_fn(block, x_BTD):
      return block(x_BTD, sin_TK2, cos_TK2, segment_ids_BT)

    if cfg.remat == "full":
      block_fn = nnx.remat(block_fn)
    elif cfg.remat == "dots":
      block_fn = nnx.remat(block_fn, policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable)
    if cfg.scan_layers:
      @nnx.scan(in_axes=(0, nnx.Carry), out_axes=nnx.Carry,
                transform_metadata={nnx.PARTITION_NAME: "layers"})
      def run_layers(block, x_BTD):
        return block_fn(block, x_BTD)

      x_BTD = run_layers(self.blocks, x_BTD)
    else:
      for block in self.blocks:
        x_BTD = block_fn(block, x_BTD)
    return self.final_norm(x_BTD)

  def output_head(self) -> jax.Array:
    """The output projection [D, V] in ``compute_dtype``: the embedding transposed when tied,
    else ``head_DV``."""
    head_DV = self.embed_VD[...].T if self.cfg.tie_embeddings else self.head_DV[...]
    return head_DV.astype(jnp.dtype(self.cfg.compute_dtype))

  def logits(self, x_BTD: jax.Array) -> jax.Array:
    """The final-normed stream [B, T, D] (any T: a chunk of the sequence too) → logits
    [B, T, V] in ``compute_dtype``."""
    return project(x_BTD, self.output_head())


def project(x_BTD: jax.Array, head_DV: jax.Array) -> jax.Array:
  """Output projection: [B, T, D] · [D, V] → logits [B, T, V] in the dtype of ``x_BTD``
  (``compute_dtype``), batch over data×fsdp and vocab over tensor (the sharding rules of
  ``chinchax.model.sharding``).

  16-bit logits, not float32: the head's output and its gradient are the largest activations
  of a small model (V·4 bytes per token each in float32), and the head's gradient exchange
  (FSDP) moves 16-bit values. The matmul still accumulates in float32 on TPU and GPU; the loss
  (``chinchax.train.loss``) does its logsumexp in float32 from these logits.

  16-bit gradient: :func:`_project_low` computes both of the head's gradients, the stream's
  and the weights', before either leaves it, so the logits' gradient [B, T, V] dies before
  the layers' backward starts (plain autodiff left XLA's GPU scheduler free to postpone the
  weights' matmul, and its all-reduce, past the backward loop, holding the [B, T, V] buffer
  beside the loop's gradient accumulators)."""
  if x_BTD.dtype != jnp.float32:
    return _project_low(x_BTD, head_DV)
  return _project(x_BTD, head_DV)


def _project(x_BTD, head_DV):
  logits_BTV = jnp.einsum("btd,dv->btv", sharding.constrain(x_BTD, _BTD), head_DV,
                          preferred_element_type=x_BTD.dtype)
  return sharding.constrain(logits_BTV, ("batch", "seq", "vocab"))


@jax.custom_vjp
def _project_low(x_BTD, head_DV):
  return _project(x_BTD, head_DV)


def _project_low_fwd(x_BTD, head_DV):
  return _project(x_BTD, head_DV), (x_BTD, head_DV)


def _project_low_bwd(res, g_BTV):
  x_BTD, head_DV = res
  g_BTV = sharding.constrain(g_BTV, ("batch", "seq", "vocab"))
  dx_BTD = sharding.constrain(jnp.einsum("btv,dv->btd", g_BTV, head_DV,
                                         preferred_element_type=x_BTD.dtype), _BTD)
  dhead_DV = jnp.einsum("btd,btv->dv", sharding.constrain(x_BTD, _BTD), g_BTV,
                        preferred_element_type=head_DV.dtype)
  # one barrier over both: neither gradient is released until both matmuls ran
  return tuple(jax.lax.optimization_barrier((dx_BTD, dhead_DV)))


_project_low.defvjp(_project_low_fwd, _project_low_bwd)


# Every parameter's role, by its leaf name: the weight-decay mask (chinchax.train.optim) reads
# roles, never ranks, since stacking layers (scan_layers) gives norm scales a leading axis.
PARAM_ROLES = {
    "embed_VD": "embedding", "head_DV": "embedding",
    "wq_DHK": "matrix", "wk_DHK": "matrix", "wv_DHK": "matrix", "wo_HKD": "matrix",
    "w_gate_DF": "matrix", "w_up_DF": "matrix", "w_down_FD": "matrix",
    "scale": "norm",
}


def param_role(path) -> str:
  """The role of the parameter at pytree ``path``: "embedding", "matrix" or "norm".

  Decided by the parameter's own (last) name, so the unscanned layout
  (``blocks/0/attn_norm/scale`` [D]) and the scanned one (``blocks/attn_norm/scale``
  [L, D]) agree.

  Raises:
    KeyError: a parameter absent from :data:`PARAM_ROLES` (a new parameter must be given a role).
  """
  names = [getattr(k, "key", getattr(k, "name", None)) for k in path]
  names = [n for n in names if isinstance(n, str) and n != "value"]
  if not names or names[-1] not in PARAM_ROLES:
    raise KeyError(f"parameter {'/'.join(map(str, names))!r} has no role in model.PARAM_ROLES")
  return PARAM_ROLES[names[-1]]


def count_params(model: nnx.Module) -> budget.ParamCounts:
  """Counts the built model's parameters: total, non-embedding, embedding (see budget.ParamCounts)."""
  params = nnx.state(model, nnx.Param)
  total = sum(int(x.size) for x in jax.tree.leaves(params))
  embedding = int(model.embed_VD.size) + (0 if model.cfg.tie_embeddings else int(model.head_DV.size))
  return budget.ParamCounts(total=total, non_embedding=total - embedding, embedding=embedding)
