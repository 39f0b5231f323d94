"""Device mesh and THE logical-axis-rules table.

Model code names array axes logically (``batch, seq, embed, norm, heads, kv_heads, kv,
mlp, vocab``; ``kv`` is head_dim, ``kv_heads`` the key/value heads of grouped-query attention,
``norm`` a norm scale's d_model); :data:`LOGICAL_AXIS_RULES` alone decides which mesh axes
(``data, fsdp, tensor``) each maps onto. Change sharding here, nowhere else.

  data    pure data parallelism: batch split, parameters replicated.
  fsdp    fully-sharded data parallelism (ZeRO-3): batch split and parameters
          (and optimizer state) split along their ``embed`` axis.
  tensor  tensor (Megatron) parallelism: heads (query and key/value), MLP hidden and
          vocab split.

Several slices (``mesh.dcn_data`` = K): the data axis is K groups of slices × the data
ways within one, the group its major part, so only data parallelism crosses the
data-center network and the rules table is the same (:func:`make_mesh`).
"""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from chinchax.config import checks as config_checks

MESH_AXES = ("data", "fsdp", "tensor")

# Ordered rules: logical axis → mesh axis (or tuple of mesh axes, or None).
LOGICAL_AXIS_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    ("batch", ("data", "fsdp")),
    ("layers", None),  # the stacked-layer axis of model.scan_layers: every device holds all layers
    ("seq", None),
    ("embed", "fsdp"),
    # a norm scale's d_model axis: replicated. Sharded like "embed" it would be gathered at
    # every use (forward and remat) and its gradient reduce-scattered by itself, a collective
    # of d_model/fsdp floats each time; replicated it costs 16 bytes × d_model per norm.
    ("norm", None),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),  # config validation refuses n_kv_heads not divisible by mesh.tensor
    ("kv", None),
    ("mlp", "tensor"),
    ("vocab", "tensor"),
)
_RULES = dict(LOGICAL_AXIS_RULES)


def make_mesh(sizes: dict[str, int], devices=None) -> Mesh:
  """Builds a (data, fsdp, tensor) mesh with Auto (compiler-propagated) axis types.

  With ``sizes["dcn_data"]`` = K > 1 (``mesh.dcn_data``) the mesh is K groups of whole
  slices (:func:`slice_groups`) × one ICI mesh of (data/K, fsdp, tensor) per group, stacked
  along ``data`` with the group as its major part: only the data axis spans the
  data-center network, and the logical rules are the same as for one slice.

  Args:
    sizes: {"data": int, "fsdp": int, "tensor": int[, "dcn_data": int]}, the first three
      multiplying to the number of devices; dcn_data divides data.
    devices: devices to use (default: all of ``jax.devices()``).
  Raises:
    ValueError: if the product does not equal the number of devices.
    ConfigError: a dcn_data that does not divide the slice count (:func:`slice_groups`).
  """
  devices = list(jax.devices() if devices is None else devices)
  shape = tuple(sizes[a] for a in MESH_AXES)
  if int(np.prod(shape)) != len(devices):
    raise ValueError(f"mesh shape {dict(zip(MESH_AXES, shape))} needs {int(np.prod(shape))} "
                     f"devices, have {len(devices)}")
  dcn = int(sizes.get("dcn_data", 1))
  device_array = device_grid(shape, devices) if dcn == 1 else hybrid_grid(shape, dcn, devices)
  return Mesh(device_array, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES))


def device_grid(shape: tuple[int, ...], devices: list) -> np.ndarray:
  """A [data, fsdp, tensor] array of ``devices`` laid out for the interconnect.

  ``mesh_utils.create_device_mesh`` where it knows the devices' topology, else their given
  order; process-major when that would split a process's batch rows (each process reads
  one contiguous block of them, :func:`batch_rows_contiguous`).
  """
  try:
    device_array = mesh_utils.create_device_mesh(shape, devices)
  except (ValueError, NotImplementedError, AssertionError):  # CPU / partial slices: plain order
    device_array = np.asarray(devices, dtype=object).reshape(shape)
  if not batch_rows_contiguous(device_array):
    ordered = sorted(devices, key=lambda d: (d.process_index, d.id))
    device_array = np.asarray(ordered, dtype=object).reshape(shape)
  return device_array


def slice_key(device) -> int:
  """The slice a device belongs to: on TPU its ``slice_index``; on CPU and GPU its process (host).

  A TPU device without a slice index is one of a single-slice topology (libtpu's
  compile-only devices of one slice carry none; those of a multi-slice topology do):
  slice 0, whatever host of the slice it sits on, since the hosts of one slice share its
  interconnect (ICI).
  """
  if device.platform == "tpu":
    index = getattr(device, "slice_index", None)
    return 0 if index is None else int(index)
  return int(device.process_index)


def slice_groups(devices: list, dcn_data: int) -> list[list]:
  """``devices`` split into ``dcn_data`` groups of whole slices, in slice order.

  S slices (:func:`slice_key`) make groups of S/dcn_data consecutive slices each.

  Raises:
    ConfigError: dcn_data does not divide S (the message lists the divisors), or the
      groups would hold unequal numbers of devices.
  """
  keys = sorted({slice_key(d) for d in devices})
  what = "TPU slices" if devices[0].platform == "tpu" else "processes (hosts)"
  if len(keys) % dcn_data:
    ok = [k for k in range(1, len(keys) + 1) if len(keys) % k == 0]
    raise config_checks.ConfigError(
        f"mesh.dcn_data={dcn_data} does not divide the {len(keys)} {what} of this run; use one "
        f"of {', '.join(map(str, ok))}")
  per = len(keys) // dcn_data
  rank = {k: i // per for i, k in enumerate(keys)}
  groups = [[d for d in devices if rank[slice_key(d)] == g] for g in range(dcn_data)]
  if len({len(g) for g in groups}) > 1:
    raise config_checks.ConfigError(
        f"mesh.dcn_data={dcn_data}: the groups of {what} hold {[len(g) for g in groups]} "
        f"devices; every group needs the same number (the same devices per process)")
  return groups


def hybrid_grid(shape: tuple[int, ...], dcn_data: int, devices: list) -> np.ndarray:
  """A [data, fsdp, tensor] array whose data index is (slice group) × data/dcn_data + (index
  within the group): ``dcn_data`` ICI grids (:func:`device_grid`) stacked along data.

  On TPU with one slice per group it is ``mesh_utils.create_hybrid_device_mesh``'s layout.
  """
  groups = slice_groups(devices, dcn_data)
  ici = (shape[0] // dcn_data, *shape[1:])
  if devices[0].platform == "tpu" and len({slice_key(d) for d in devices}) == dcn_data:
    try:
      hybrid = mesh_utils.create_hybrid_device_mesh(ici, (dcn_data, 1, 1), devices)
      if batch_rows_contiguous(hybrid):
        return hybrid
    except (ValueError, NotImplementedError, AssertionError):
      pass
  return np.concatenate([device_grid(ici, g) for g in groups], axis=0)


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
  (e.g. vocab 257 over tensor=2) rather than failing. Under ``jax.shard_map`` (the mesh's
  manual axes: the per-shard gradient of ``chinchax.train.step``) a manual axis is already
  split by hand and names nothing here.

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
      manual = set(getattr(mesh, "manual_axes", ()) or ())
      axes = tuple(a for a in axes if mesh.shape[a] > 1 and a not in manual)
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
