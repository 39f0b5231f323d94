"""The bench grid: sweeps expanded into points, each point's training config, the config check."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import ml_collections

from chinchax import config as config_lib
from chinchax.cost import hardware as hardware_lib

# The config ``chinchax bench`` reads when no --config is given.
MESH_LAYOUTS = {"dp": (-1, 1, 1), "fsdp": (1, -1, 1), "tp": (1, 1, -1)}
# A sweep's fields, in Point's order: the ones after seq_len are lists of names, and three of
# those have a fixed set of choices.
_LIST_FIELDS = ("attention", "mesh", "remat", "compute_dtype")
SWEEP_FIELDS = ("models", "global_batch_size", "seq_len") + _LIST_FIELDS
_CHOICE_FIELDS = (("attention", config_lib.ATTENTION_IMPLS), ("remat", config_lib.REMAT_POLICIES),
                  ("compute_dtype", config_lib.COMPUTE_DTYPES))


@dataclasses.dataclass(frozen=True)
class Point:
  """One grid point: a model shape at a batch, sequence length, kernel, layout, remat and dtype."""

  model: str
  global_batch_size: int
  seq_len: int
  attention: str
  mesh: str
  remat: str
  compute_dtype: str
  sweeps: tuple[str, ...] = ()

  @property
  def name(self) -> str:
    return (f"{self.model}_b{self.global_batch_size}_t{self.seq_len}_{self.attention}_"
            f"{self.mesh}_{self.remat}_{self.compute_dtype}")

  def key(self) -> tuple:
    return dataclasses.astuple(dataclasses.replace(self, sweeps=()))


def parse_mesh(layout: str) -> dict[str, int]:
  """``dp`` | ``fsdp`` | ``tp`` | ``DATAxFSDPxTENSOR`` → {"data", "fsdp", "tensor"} (one may be -1).

  Raises:
    ConfigError: an unknown name, not three sizes, a size that is 0 or below
      -1, or more than one -1.
  """
  layout = str(layout).strip()
  if layout in MESH_LAYOUTS:
    sizes = MESH_LAYOUTS[layout]
  else:
    parts = layout.split("x")
    try:
      sizes = tuple(int(p) for p in parts)
    except ValueError:
      sizes = ()
    if len(sizes) != 3 or any(s == 0 or s < -1 for s in sizes) or sizes.count(-1) > 1:
      raise config_lib.ConfigError(
          f"mesh layout {layout!r} is not one of {', '.join(MESH_LAYOUTS)} or DATAxFSDPxTENSOR "
          f"with positive sizes (one may be -1), e.g. 2x2x2 or -1x1x2")
  return dict(zip(config_lib.MESH_AXES, sizes))


def _split(value: Any, name: str) -> list[str]:
  items = [v.strip() for v in str(value).split(",") if v.strip()]
  if not items:
    raise config_lib.ConfigError(f"{name}={value!r} is empty; give a comma-separated list")
  return items


def _ints(value: Any, name: str) -> list[int]:
  out = []
  for item in _split(value, name):
    try:
      n = int(item)
    except ValueError:
      n = 0
    if n < 1:
      raise config_lib.ConfigError(f"{name}={value!r}: {item!r} is not a positive integer")
    out.append(n)
  return out


def expand_points(cfg) -> list[Point]:
  """The grid's points in sweep order, duplicates merged (a point lists every sweep it is in).

  Raises:
    ConfigError: an empty grid, a sweep missing a field or naming an unknown
      model, or a value that is not a valid choice.
  """
  if not cfg.sweeps or not len(cfg.sweeps):
    raise config_lib.ConfigError("the bench config has no sweeps; add one to config.sweeps")
  points: dict[tuple, Point] = {}
  for sweep_name, s in cfg.sweeps.items():
    where = f"sweeps.{sweep_name}"
    if not isinstance(s, ml_collections.ConfigDict):
      raise config_lib.ConfigError(f"{where}={s!r} must be a sweep (chinchax.config.bench_sweep)")
    missing = [f for f in SWEEP_FIELDS if f not in s]
    if missing:
      raise config_lib.ConfigError(f"{where} lacks {', '.join(missing)}")
    models = _split(s.models, f"{where}.models")
    for m in models:
      if m not in cfg.models:
        raise config_lib.ConfigError(f"{where}.models names {m!r}, which is not in config.models "
                                     f"({', '.join(cfg.models.keys()) or 'empty'})")
    batches = _ints(s.global_batch_size, f"{where}.global_batch_size")
    seqs = _ints(s.seq_len, f"{where}.seq_len")
    lists = {f: _split(s[f], f"{where}.{f}") for f in _LIST_FIELDS}
    for field, choices in _CHOICE_FIELDS:
      for v in lists[field]:
        config_lib.check_choice(v, choices, f"{where}.{field}")
    for m in lists["mesh"]:
      parse_mesh(m)
    for combo in itertools.product(models, batches, seqs, *lists.values()):
      p = Point(*combo, sweeps=(sweep_name,))
      if p.key() in points:
        old = points[p.key()]
        points[p.key()] = dataclasses.replace(old, sweeps=old.sweeps + (sweep_name,))
      else:
        points[p.key()] = p
  return list(points.values())


def point_config(cfg, point: Point) -> ml_collections.ConfigDict:
  """The full training config of a point: ``cfg.train_config`` with the point's values."""
  c = ml_collections.ConfigDict(cfg.train_config.to_dict())
  shape = cfg.models[point.model]
  c.model.update(d_model=int(shape.d_model), n_layers=int(shape.n_layers),
                 n_heads=int(shape.n_heads), d_ff=int(shape.d_ff), attention=point.attention,
                 remat=point.remat, compute_dtype=point.compute_dtype)
  c.train.update(global_batch_size=point.global_batch_size, seq_len=point.seq_len)
  c.mesh.update(parse_mesh(point.mesh))
  return c


def validate_bench(cfg) -> list[Point]:
  """Checks the bench config before any device is touched; returns the grid's points.

  Raises:
    ConfigError: a bad knob, sweep, model or point (message names the value);
      a fit sweep that varies the attention, mesh, remat or dtype; an unknown
      ``bench.hardware``.
  """
  b = cfg.bench
  config_lib.check_positive(b.warmup_steps, "bench.warmup_steps", allow_zero=True, integer=True)
  config_lib.check_positive(b.timed_steps, "bench.timed_steps", integer=True)
  config_lib.check_positive(b.point_timeout_s, "bench.point_timeout_s")
  config_lib.check_positive(b.memory_limit_gb, "bench.memory_limit_gb", allow_zero=True)
  config_lib.check_positive(b.fit_heldout, "bench.fit_heldout", integer=True)
  config_lib.check_positive(b.profile_steps, "bench.profile_steps", allow_zero=True, integer=True)
  if not cfg.workdir:
    raise config_lib.ConfigError("workdir is empty; give a directory for the bench results")
  if b.hardware:
    try:
      hardware_lib.parse_hardware(b.hardware)
    except hardware_lib.HardwareError as e:
      raise config_lib.ConfigError(f"bench.hardware={b.hardware!r}: {e}") from None
  for name, shape in cfg.models.items():
    for k in ("d_model", "n_layers", "n_heads", "d_ff"):
      if k not in shape:
        raise config_lib.ConfigError(f"models.{name} lacks {k}")
      config_lib.check_positive(shape[k], f"models.{name}.{k}", integer=True)
  points = expand_points(cfg)
  if b.fit_sweep:
    if b.fit_sweep not in cfg.sweeps:
      raise config_lib.ConfigError(f"bench.fit_sweep={b.fit_sweep!r} is not a sweep; known: "
                                   f"{', '.join(cfg.sweeps.keys())} (or '' for no fit)")
    s = cfg.sweeps[b.fit_sweep]
    for f in _LIST_FIELDS:
      if len(_split(s[f], f)) != 1:
        raise config_lib.ConfigError(
            f"bench.fit_sweep={b.fit_sweep!r} varies {f} ({s[f]!r}); a step-time model is "
            f"fitted at one {f}: give the fit sweep a single value")
  for p in points:
    try:
      config_lib.validate(point_config(cfg, p))
    except config_lib.ConfigError as e:
      raise config_lib.ConfigError(f"bench point {p.name}: {e}") from None
  return points
