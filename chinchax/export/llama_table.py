"""The one table between chinchax parameters and HF Llama (``LlamaForCausalLM``) tensors.

``chinchax export`` (:func:`chinchax.export.to_llama`) reads it from chinchax to HF and
``train.init_from=hf:DIR`` (:mod:`chinchax.export.hf_load`) from HF to chinchax, so the
two directions cannot drift apart. Letters: D d_model, H heads, G key/value heads, K
head_dim, F d_ff, V vocab_size, i the layer::

  embed_VD [V,D]                ↔ model.embed_tokens.weight [V,D]
  blocks.i.attn_norm.scale [D]  ↔ model.layers.i.input_layernorm.weight [D]
  blocks.i.attn.wq_DHK [D,H,K]  ↔ model.layers.i.self_attn.q_proj.weight [H·K,D]  reshape(D,H·K)ᵀ
  blocks.i.attn.wk_DHK [D,G,K]  ↔ model.layers.i.self_attn.k_proj.weight [G·K,D]  reshape(D,G·K)ᵀ
  blocks.i.attn.wv_DHK [D,G,K]  ↔ model.layers.i.self_attn.v_proj.weight [G·K,D]  reshape(D,G·K)ᵀ
  blocks.i.attn.wo_HKD [H,K,D]  ↔ model.layers.i.self_attn.o_proj.weight [D,H·K]  reshape(H·K,D)ᵀ
  blocks.i.mlp_norm.scale [D]   ↔ model.layers.i.post_attention_layernorm.weight [D]
  blocks.i.mlp.w_gate_DF [D,F]  ↔ model.layers.i.mlp.gate_proj.weight [F,D]       ᵀ
  blocks.i.mlp.w_up_DF [D,F]    ↔ model.layers.i.mlp.up_proj.weight [F,D]         ᵀ
  blocks.i.mlp.w_down_FD [F,D]  ↔ model.layers.i.mlp.down_proj.weight [D,F]       ᵀ
  final_norm.scale [D]          ↔ model.norm.weight [D]
  head_DV [D,V] (untied only)   ↔ lm_head.weight [V,D]                            ᵀ

Every transform is a transpose and a reshape, so both directions are exact (bitwise) in
float32. A ``model.scan_layers`` model holds ``blocks.<name>`` stacked [n_layers, ...]:
row i of each is layer i's tensor.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

IDENTITY, TRANSPOSE, HEADS_IN, HEADS_OUT = "identity", "T", "heads_in", "heads_out"
# How each transform is written in export_info.json's "mapping" (H·K for q; G·K for k, v).
_SPELLING = {IDENTITY: "identity", TRANSPOSE: "T", HEADS_IN: "reshape(D, {n}*K).T",
             HEADS_OUT: "reshape(H*K, D).T"}


@dataclasses.dataclass(frozen=True)
class Entry:
  """One row of the table.

  Attributes:
    chinchax: the parameter's dotted name; ``blocks.i.`` marks a per-layer one.
    hf: the HF tensor name; ``layers.i.`` marks a per-layer one.
  transform: IDENTITY, TRANSPOSE, HEADS_IN ([D, n, K]  ↔ [n·K, D]) or
  HEADS_OUT ([H, K, D]          ↔ [D, H·K]).
    heads: the letter of the head axis of a HEADS_IN tensor ("H" or "G"), for the spelling.
  """

  chinchax: str
  hf: str
  transform: str
  heads: str = ""

  @property
  def per_layer(self) -> bool:
    return self.chinchax.startswith("blocks.i.")


TABLE = (
    Entry("embed_VD", "model.embed_tokens.weight", IDENTITY),
    Entry("blocks.i.attn_norm.scale", "model.layers.i.input_layernorm.weight", IDENTITY),
    Entry("blocks.i.attn.wq_DHK", "model.layers.i.self_attn.q_proj.weight", HEADS_IN, "H"),
    Entry("blocks.i.attn.wk_DHK", "model.layers.i.self_attn.k_proj.weight", HEADS_IN, "G"),
    Entry("blocks.i.attn.wv_DHK", "model.layers.i.self_attn.v_proj.weight", HEADS_IN, "G"),
    Entry("blocks.i.attn.wo_HKD", "model.layers.i.self_attn.o_proj.weight", HEADS_OUT),
    Entry("blocks.i.mlp_norm.scale", "model.layers.i.post_attention_layernorm.weight", IDENTITY),
    Entry("blocks.i.mlp.w_gate_DF", "model.layers.i.mlp.gate_proj.weight", TRANSPOSE),
    Entry("blocks.i.mlp.w_up_DF", "model.layers.i.mlp.up_proj.weight", TRANSPOSE),
    Entry("blocks.i.mlp.w_down_FD", "model.layers.i.mlp.down_proj.weight", TRANSPOSE),
    Entry("final_norm.scale", "model.norm.weight", IDENTITY),
    Entry("head_DV", "lm_head.weight", TRANSPOSE),
)
HEAD = "head_DV"  # present only with untied embeddings (tie_word_embeddings false)


def mapping() -> list:
  """The table as export_info.json records it: [chinchax parameter, HF tensor, transform]."""
  return [[e.chinchax + (" (untied only)" if e.chinchax == HEAD else ""), e.hf,
           _SPELLING[e.transform].format(n=e.heads)] for e in TABLE]


def pairs(n_layers: int, tie_embeddings: bool) -> list[tuple[str, str, Entry]]:
  """Every (chinchax name, HF name, entry) of a model, layers unrolled (``blocks.3.attn...``),
  in the order HF checkpoints list them (embedding, layer 0 … n_layers-1, norm, head)."""
  fixed = {e.chinchax: e for e in TABLE if not e.per_layer}
  out = [("embed_VD", fixed["embed_VD"].hf, fixed["embed_VD"])]
  for i in range(n_layers):
    out += [(e.chinchax.replace(".i.", f".{i}.", 1), e.hf.replace(".i.", f".{i}.", 1), e)
            for e in TABLE if e.per_layer]
  out.append(("final_norm.scale", fixed["final_norm.scale"].hf, fixed["final_norm.scale"]))
  if not tie_embeddings:
    out.append((HEAD, fixed[HEAD].hf, fixed[HEAD]))
  return out


def hf_names(name: str, stacked: bool, n_layers: int) -> tuple[list[str], Entry]:
  """The HF tensor(s) of one chinchax parameter.

  Args:
    name: its dotted name: ``blocks.3.attn.wq_DHK`` (layers as a list), ``blocks.attn.wq_DHK``
      (``stacked``, model.scan_layers), ``embed_VD``, ...
    stacked: the parameter stacks the layers on a leading axis.
    n_layers: layers of the model.
  Returns:
    ([HF name] for an unstacked parameter; [layer 0's, …, layer n_layers-1's] for a stacked
    one, the entry).
  Raises:
    KeyError: a name the table does not know.
  """
  parts = name.split(".")
  if parts[0] != "blocks":
    (entry,) = [e for e in TABLE if e.chinchax == name] or [None]
    if entry is None:
      raise KeyError(name)
    return [entry.hf], entry
  rest = ".".join(parts[1:] if stacked else parts[2:])
  (entry,) = [e for e in TABLE if e.chinchax == "blocks.i." + rest] or [None]
  if entry is None:
    raise KeyError(name)
  layers = range(n_layers) if stacked else [int(parts[1])]
  return [entry.hf.replace(".i.", f".{i}.", 1) for i in layers], entry


def hf_shape(shape: tuple[int, ...], transform: str) -> tuple[int, ...]:
  """The HF tensor's shape for a chinchax (one-layer) parameter of ``shape``."""
  if transform == IDENTITY:
    return tuple(shape)
  if transform == TRANSPOSE:
    return tuple(reversed(shape))
  if transform == HEADS_IN:   # [D, n, K] → [n·K, D]
    return (math.prod(shape[1:]), shape[0])
  if transform == HEADS_OUT:  # [H, K, D] → [D, H·K]
    return (shape[-1], math.prod(shape[:-1]))
  raise ValueError(transform)


def to_hf(x: np.ndarray, transform: str) -> np.ndarray:
  """A chinchax (one-layer) parameter → its HF tensor (contiguous; same dtype)."""
  x = np.asarray(x)
  if transform == HEADS_IN:
    x = x.reshape(x.shape[0], -1).T
  elif transform == HEADS_OUT:
    x = x.reshape(-1, x.shape[-1]).T
  elif transform == TRANSPOSE:
    x = x.T
  return np.ascontiguousarray(x)


def from_hf(x: np.ndarray, transform: str, shape: tuple[int, ...]) -> np.ndarray:
  """An HF tensor → the chinchax (one-layer) parameter of ``shape`` (contiguous; same dtype).

  The inverse of :func:`to_hf`: ``from_hf(to_hf(p, t), t, p.shape)`` equals ``p`` bitwise.
  """
  if transform == IDENTITY:
    return np.ascontiguousarray(x).reshape(shape)
  return np.ascontiguousarray(np.asarray(x).T).reshape(shape)
