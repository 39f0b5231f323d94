"""Reads a checked HF Llama checkpoint (:mod:`chinchax.export.hf_source`) onto the mesh,
tensor by tensor.

The tensors are read largest first, each with ``safetensors.safe_open(framework="numpy")``
on its file (closed again at once, so no shard stays mapped into the process); each is
mapped by :mod:`chinchax.export.llama_table` to its chinchax parameter, widened to float32,
put on the devices with ``jax.device_put`` onto the parameter's sharding (the logical-axis
rules of :mod:`chinchax.model.sharding`), and its host copies dropped before the next is read.
Host memory beyond the placed parameters is one tensor (twice, while it is transposed),
and largest first that comes while little is placed; a ``model.scan_layers`` parameter
[n_layers, ...] is filled on the devices one layer at a time (a donated in-place update),
never stacked on the host. On CPU devices the placed parameters are themselves host
memory: ``benchmarks/hf_import_memory.py`` measures the peak (docs/export.md).
"""

from __future__ import annotations

import functools
import math

import jax
from jax.sharding import NamedSharding, PartitionSpec as P

from chinchax.export import llama_table
from chinchax.export.hf_source import HFSource


def param_name(path) -> str:
  """The dotted chinchax name (``blocks.0.attn.wq_DHK``) of a params-tree key path."""
  parts = []
  for k in path:
    key = getattr(k, "key", getattr(k, "idx", getattr(k, "name", None)))
    if key in (None, "value", "raw_value"):
      continue
    parts.append(str(key))
  return ".".join(parts)


@functools.lru_cache(maxsize=None)
def _setter(sharding, layer_sharding):
  """jitted (stacked [L, ...], layer [...], i) → stacked with row i replaced; donates stacked."""
  return jax.jit(lambda buf, x, i: jax.lax.dynamic_update_index_in_dim(buf, x, i, 0),
                 in_shardings=(sharding, layer_sharding, None), out_shardings=sharding,
                 donate_argnums=0)


def _place(host, sharding: NamedSharding) -> jax.Array:
  """``host`` onto ``sharding``: ``jax.device_put``; in a multi-process run, where the sharding
  spans other hosts' devices, each process puts only its own devices' slices
  (``make_array_from_callback``: no cross-host comparison of the whole tensor)."""
  if sharding.is_fully_addressable:
    return jax.device_put(host, sharding)
  return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def _layer_sharding(sharding: NamedSharding) -> NamedSharding:
  """The sharding of one layer of a stacked parameter: the stacked spec without its first axis."""
  return NamedSharding(sharding.mesh, P(*tuple(sharding.spec)[1:]))


def load_params(src: HFSource, abstract_params, shardings, n_layers: int):
  """The checkpoint's tensors as the run's params, placed on the mesh.

  Args:
    src: the checked directory (:func:`chinchax.export.hf_source.open_source`).
    abstract_params: the run's params tree (``nnx.State`` of ``ShapeDtypeStruct``s, the
      ``"params"`` of ``TrainProgram.abstract_state``).
    shardings: the same tree of ``NamedSharding``s (``TrainProgram.shardings["params"]``).
    n_layers: the model's layers (for a stacked, ``model.scan_layers``, tree).
  Returns:
    the params tree with float32 ``jax.Array`` leaves on their shardings; every value is the
    checkpoint's, bitwise (float32, or exactly widened from bfloat16/float16).
  """
  from safetensors import safe_open  # noqa: PLC0415 — the optional 'export' extra

  leaves, treedef = jax.tree_util.tree_flatten_with_path(abstract_params)
  shard_leaves = jax.tree_util.tree_leaves(shardings)
  # leaf index → (HF names, entry, shape, dtype, sharding); each HF name → (leaf, layer row).
  plan, where = [], {}
  for j, ((path, leaf), sh) in enumerate(zip(leaves, shard_leaves)):
    name = param_name(path)
    stacked = name.startswith("blocks.") and not name.split(".")[1].isdigit()
    names, entry = llama_table.hf_names(name, stacked, n_layers)
    plan.append((names, entry, tuple(leaf.shape), leaf.dtype, sh, stacked))
    for row, hf in enumerate(names):
      where[hf] = (j, row if stacked else None)
  out = [None] * len(plan)
  # Largest first: a big tensor's transient host copies come while little is placed yet.
  for hf in sorted(where, key=lambda n: (-math.prod(src.shapes[n]), n)):
    path = src.files[hf]
    j, row = where[hf]
    names, entry, shape, dtype, sh, stacked = plan[j]
    # Opened per tensor: closing unmaps the file, so no shard's pages stay in this
    # process's memory (and every host array is dropped before the next is read).
    with safe_open(str(path), framework="numpy") as f:
      raw = f.get_tensor(hf)
    host = llama_table.from_hf(raw, entry.transform, shape[1:] if stacked else shape)
    del raw
    host = host.astype(dtype, copy=False)
    if not stacked:
      out[j] = _place(host, sh)
    else:
      if out[j] is None:
        out[j] = jax.jit(lambda s=shape, d=dtype: jax.numpy.zeros(s, d), out_shardings=sh)()
      layer_sh = _layer_sharding(sh)
      out[j] = _setter(sh, layer_sh)(out[j], _place(host, layer_sh), row)
    del host
  return jax.tree_util.tree_unflatten(treedef, out)
