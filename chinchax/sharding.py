"""Device mesh and THE logical-axis-rules table.

Model code names array axes logically (``batch, seq, embed, heads, kv_heads, kv,
mlp, vocab``; ``kv`` is head_dim, ``kv_heads`` the key/value heads of grouped-query attention); :data:`LOGICAL_AXIS_RULES` alone decides which mesh axes
(``data, fsdp, tensor``) each maps onto. Change sharding here, nowhere else.

  data    pure data parallelism: batch split, parameters replicated.
  fsdp    fully-sharded data parallelism (ZeRO-3): batch split and parameters
          (and optimizer state) split along their ``embed`` axis.
  tensor  tensor (Megatron) parallelism: heads (query and key/value), MLP hidden and
          vocab split.
"""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")

# Ordered rules: logical axis → mesh axis (or tuple of mesh axes, or None).
LOGICAL_AXIS_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    ("batch", ("data", "fsdp")),
    ("layers", None),  # the stacked-layer axis of model.scan_layers: every device holds all layers
    ("seq", None),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),  # config validation refuses n_kv_heads not divisible by mesh.tensor
    ("kv", None),
    ("mlp", "tensor"),
    ("vocab", "tensor"),
)
_RULES = dict(LOGICAL_AXIS_RULES)


def make_mesh(sizes: dict[str, int], devices=None) -> Mesh:
  """Builds a (data, fsdp, tensor) mesh with Auto (compiler-propagated) axis types.

  Args:
    sizes: {"data": int, "fsdp": int, "tensor": int}, product = number of devices.
    devices: devices to use (default: all of ``jax.devices()``).
  Raises:
    ValueError: if the product does not equal the number of devices.
  """
  devices = list(jax.devices() if devices is None else devices)
  shape = tuple(sizes[a] for a in MESH_AXES)
  if int(np.prod(shape)) != len(devices):
    raise ValueError(f"mesh shape {dict(zip(MESH_AXES, shape))} needs {int(np.prod(shape))} "
                     f"devices, have {len(devices)}")
  try:
    device_array = mesh_utils.create_device_mesh(shape, devices)
  except (ValueError, NotImplementedError, AssertionError):  # CPU / partial slices: plain order
    device_array = np.asarray(devices, dtype=object).reshape(shape)
  if not batch_rows_contiguous(device_array):
    # Each process must hold one contiguous block of batch rows (it reads only those):
    # fall back to process-major order, which guarantees it.
    ordered = sorted(devices, key=lambda d: (d.process_index, d.id))
    device_array = np.asarray(ordered, dtype=object).reshape(shape)
  return Mesh(device_array, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES))


def batch_rows_contiguous(device_array: np.ndarray) -> bool:
  """True if every process's devices cover one contiguous run of batch shards.

  The batch is split over (data, fsdp) in row-major order, so the shard of the
  device at mesh index (d, f, t) is d·fsdp + f.

  Args:
    device_array: [data, fsdp, tensor] array of devices.
  """
  n_fsdp = device_array.shape[1]
  shards: dict[int, set[int]] = {}
  for (d, f, _), device in np.ndenumerate(device_array):
    shards.setdefault(device.process_index, set()).add(d * n_fsdp + f)
  return all(max(s) - min(s) + 1 == len(s) for s in shards.values())


def logical_to_spec(names: tuple[str | None, ...], shape: tuple[int, ...] | None = None,
                    mesh: Mesh | None = None) -> P:
  """Maps logical axis names to a PartitionSpec through :data:`LOGICAL_AXIS_RULES`.

  A mesh axis is used at most once per array. When ``shape`` and ``mesh`` are
  given, an array dimension not divisible by its mesh axes stays replicated
  (e.g. vocab 257 over tensor=2) rather than failing.

  Raises:
    KeyError: for a logical name missing from the rules table.
  """
  used: set[str] = set()
  out = []
  for i, name in enumerate(names):
    if name is None:
      out.append(None)
      continue
    if name not in _RULES:
      raise KeyError(f"logical axis {name!r} has no rule; known: {sorted(_RULES)}")
    target = _RULES[name]
    axes = () if target is None else (target if isinstance(target, tuple) else (target,))
    axes = tuple(a for a in axes if a not in used)
    if mesh is not None:
      axes = tuple(a for a in axes if mesh.shape[a] > 1)
      if shape is not None and axes and shape[i] % int(np.prod([mesh.shape[a] for a in axes])):
        axes = ()
    used.update(axes)
    out.append(None if not axes else (axes[0] if len(axes) == 1 else axes))
  return P(*out)


def constrain(x: jax.Array, names: tuple[str | None, ...]) -> jax.Array:
  """Pins an activation's sharding to its logical axis names, under the abstract mesh in context.

  Model code calls this on the activations whose layout decides the collectives (the
  residual stream ``x_BTD``, the attention heads, the MLP hidden, the logits): with the
  batch split over (data, fsdp) the compiler must all-gather parameters sharded on
  ``fsdp`` (ZeRO-3) instead of gathering the batch and splitting activations by
  ``embed``, which it otherwise may choose. Outside a mesh context (no
  ``jax.sharding.use_abstract_mesh``; e.g. a model called eagerly) it returns ``x``
  unchanged.

  Args:
    x: an array whose rank equals ``len(names)``.
    names: logical axis names (see :data:`LOGICAL_AXIS_RULES`), None for unsplit.
  """
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return x
  return jax.lax.with_sharding_constraint(x, logical_to_spec(names, x.shape, mesh))


def under_mesh(fn, mesh: Mesh):
  """``fn`` traced with ``mesh``'s abstract mesh in context, so :func:`constrain` applies."""

  def wrapped(*args, **kwargs):
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
      return fn(*args, **kwargs)

  wrapped.__name__ = getattr(fn, "__name__", "wrapped")
  wrapped.__doc__ = fn.__doc__
  return wrapped


def state_shardings(abstract_tree, mesh: Mesh):
  """NamedShardings for a tree of NNX Variables (or plain arrays) from their logical names.

  Variables carry logical names in ``out_sharding`` metadata; a plain array
  leaf (e.g. an optimizer step count) is replicated.
  """

  def one(x):
    if isinstance(x, nnx.Variable):
      names = x.get_metadata().get("out_sharding") or (None,) * len(x.shape)
      return x.replace(NamedSharding(mesh, logical_to_spec(tuple(names), x.shape, mesh)))
    return NamedSharding(mesh, P())

  return jax.tree.map(one, abstract_tree, is_leaf=lambda x: isinstance(x, nnx.Variable))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Sharding of a [B, T] token batch: batch over (data, fsdp), sequence unsplit."""
  return NamedSharding(mesh, logical_to_spec(("batch", "seq")))
