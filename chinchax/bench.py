"""``chinchax bench``: throughput and bottleneck sweep — tokens/s, MFU, memory, cost per point.

  chinchax bench [--config configs/bench.py:VARIANT] [--config.bench.timed_steps=10 ...]
                 [--config.sweeps.size.global_batch_size=8,16,32 ...]

A bench config (``chinchax.config.base_bench_config``) names model shapes
(``models``) and sub-grids (``sweeps``); each sweep's points are the product of
its lists of models, global_batch_size, seq_len, attention implementation,
mesh layout (pure data parallel ``dp``, ``fsdp``, tensor parallel ``tp``, or
mixed ``DATAxFSDPxTENSOR``), remat policy and compute dtype. Every point is a
full training config (``train_config`` with the point's values), and is
measured with the train step of ``chinchax train`` itself: the state from
``train.abstract_state`` sharded by ``sharding.state_shardings``, the step
from ``train.jit_train_step``, batches made global by ``train.global_batch``.
Only the input pipeline is left out: batches are random tokens already on
the host.

Per point: compile time (lower + compile of the step), the first step, then
``bench.warmup_steps`` untimed steps and ``bench.timed_steps`` timed steps in
the steady state of the training loop — step i+1 is queued before the devices
are waited on for step i, and each step's time runs from the completion of the
one before to its own — giving the median step time and its spread (min, max,
p10, p90, standard deviation) —, tokens/s, model
FLOPs/s (``budget.matmul_flops_per_token``, the numerator of ``chinchax
train``'s MFU) and MFU against the device peak, peak device memory
(``memory_stats()`` where the backend keeps it, else the compiled memory
analysis), XLA ``cost_analysis()`` FLOPs and bytes accessed per device, and
the cost per million tokens from the price table
(``chinchax/hardware_prices.json``).

Failures are results: a point whose mesh or batch does not fit the devices is
``invalid``; one whose compiled step needs more memory than a device has is
``oom`` without being run (and ``oom`` too if allocation fails); a failed
compile is ``compile_error``; with ``bench.isolate`` (each point in its own
process) a crash is ``crashed`` and a hang past ``bench.point_timeout_s`` is
``timeout``.

Outputs in ``workdir``: ``results.jsonl`` and ``results.csv`` (one row per
point), ``summary.md``, ``bench.json`` (devices, peak, price, step-time fits),
``tokens_per_s_vs_batch.png``, ``mfu_vs_size.png``, ``memory_vs_batch.png``
and, when ``bench.fit_sweep`` names a sweep, ``step_time.json`` — the step
times of that sweep in the format ``chinchax plan --step-time-model`` reads
(``chinchax.planning.step_time``). Two step-time models are scored on held-out points
of that sweep: t = t0 + a·FLOPs, and t = t0 + a·FLOPs + b·bytes ("Time
Matters", Inbar & Sernau 2024), each with the analytic features of
``chinchax.planning.work`` (what ``plan`` uses) and with XLA's own cost analysis.
"""

from __future__ import annotations

import csv
import dataclasses
import itertools
import json
import math
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import ml_collections
import numpy as np

from chinchax import budget
from chinchax import config as config_lib
from chinchax import hardware as hardware_lib
from chinchax.planning import step_time as step_time_lib
from chinchax.planning import work as work_lib

REPO = pathlib.Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = REPO / "configs" / "bench.py"
SWEEP_FIELDS = ("models", "global_batch_size", "seq_len", "attention", "mesh", "remat",
                "compute_dtype")
MESH_LAYOUTS = {"dp": (-1, 1, 1), "fsdp": (1, -1, 1), "tp": (1, 1, -1)}
STATUSES = ("ok", "invalid", "oom", "compile_error", "error", "timeout", "crashed")
CSV_COLUMNS = (
    "name", "sweeps", "status", "model", "d_model", "n_layers", "n_heads", "d_ff", "vocab_size",
    "params_total", "params_non_embedding", "global_batch_size", "seq_len", "tokens_per_step",
    "attention_requested", "attention", "mesh", "mesh_data", "mesh_fsdp", "mesh_tensor",
    "n_devices", "remat", "compute_dtype", "scan_layers", "compile_s", "first_step_s",
    "startup_s", "step_time_s",
    "step_time_min_s", "step_time_max_s", "step_time_p10_s", "step_time_p90_s",
    "step_time_std_s", "step_time_spread", "timed_steps", "tokens_per_s", "model_flops_per_step",
    "model_flops_per_s", "peak_flops", "mfu", "memory_peak_bytes", "memory_source",
    "compiled_memory_bytes", "memory_limit_bytes", "xla_flops", "xla_bytes_accessed",
    "price_per_hour", "cost_per_million_tokens", "loss_first", "loss_last", "error")


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
    attns = _split(s.attention, f"{where}.attention")
    meshes = _split(s.mesh, f"{where}.mesh")
    remats = _split(s.remat, f"{where}.remat")
    dtypes = _split(s.compute_dtype, f"{where}.compute_dtype")
    for a in attns:
      config_lib._check_choice(a, config_lib.ATTENTION_IMPLS, f"{where}.attention")
    for r in remats:
      config_lib._check_choice(r, config_lib.REMAT_POLICIES, f"{where}.remat")
    for d in dtypes:
      config_lib._check_choice(d, config_lib.COMPUTE_DTYPES, f"{where}.compute_dtype")
    for m in meshes:
      parse_mesh(m)
    for combo in itertools.product(models, batches, seqs, attns, meshes, remats, dtypes):
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
  config_lib._check_positive(b.warmup_steps, "bench.warmup_steps", allow_zero=True, integer=True)
  config_lib._check_positive(b.timed_steps, "bench.timed_steps", integer=True)
  config_lib._check_positive(b.point_timeout_s, "bench.point_timeout_s")
  config_lib._check_positive(b.memory_limit_gb, "bench.memory_limit_gb", allow_zero=True)
  config_lib._check_positive(b.fit_heldout, "bench.fit_heldout", integer=True)
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
      config_lib._check_positive(shape[k], f"models.{name}.{k}", integer=True)
  points = expand_points(cfg)
  if b.fit_sweep:
    if b.fit_sweep not in cfg.sweeps:
      raise config_lib.ConfigError(f"bench.fit_sweep={b.fit_sweep!r} is not a sweep; known: "
                                   f"{', '.join(cfg.sweeps.keys())} (or '' for no fit)")
    s = cfg.sweeps[b.fit_sweep]
    for f in ("attention", "mesh", "remat", "compute_dtype"):
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


# ----------------------------------------------------------------------------
# Measuring one point (in this process, or in a child process with isolate).


def _percentile(xs, q):
  return float(np.percentile(np.asarray(xs, float), q))


def _is_oom(err: BaseException) -> bool:
  text = f"{type(err).__name__} {err}".lower()
  return any(k in text for k in ("resource_exhausted", "resource exhausted", "out of memory",
                                 "failed to allocate", "memoryerror", "allocator"))


def _host_memory_bytes() -> float:
  try:
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
  except (ValueError, OSError, AttributeError):
    return float("inf")


def device_memory_limit(devices, memory_limit_gb: float) -> tuple[float, str]:
  """Bytes one device may use, and where the figure comes from.

  ``memory_limit_gb`` > 0 wins; else the smallest ``bytes_limit`` of the
  devices' ``memory_stats()``; else (CPU) half the host's RAM shared by the
  devices.
  """
  if memory_limit_gb > 0:
    return memory_limit_gb * 1e9, "bench.memory_limit_gb"
  limits = []
  for d in devices:
    stats = d.memory_stats() if hasattr(d, "memory_stats") else None
    if stats and stats.get("bytes_limit"):
      limits.append(float(stats["bytes_limit"]))
  if limits:
    return min(limits), "memory_stats bytes_limit"
  return 0.5 * _host_memory_bytes() / len(devices), "half the host RAM over the devices"


def compiled_memory_bytes(compiled) -> float | None:
  """Per-device bytes of a compiled program: arguments + outputs − aliased (donated) + temporaries."""
  try:
    m = compiled.memory_analysis()
  except Exception:  # some backends do not implement it
    return None
  if m is None:
    return None
  return float(m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
               + m.temp_size_in_bytes + m.generated_code_size_in_bytes)


def _peak_memory(devices) -> float | None:
  peaks = []
  for d in devices:
    stats = d.memory_stats() if hasattr(d, "memory_stats") else None
    if stats and "peak_bytes_in_use" in stats:
      peaks.append(float(stats["peak_bytes_in_use"]))
  return max(peaks) if peaks else None


def measure_point(c, *, warmup_steps: int, timed_steps: int, memory_limit_gb: float = 0.0,
                  devices=None, seed: int = 0) -> dict:
  """Compiles and times ``chinchax train``'s step for the training config ``c``.

  Args:
    c: a full training ConfigDict (``point_config``); ``train.peak_flops_per_device``
      > 0 fixes the MFU denominator.
    warmup_steps: untimed steps after the first call, each waited for.
    timed_steps: steps timed from completion to completion, the next one queued.
    memory_limit_gb: see :func:`device_memory_limit`.
    devices: devices of the mesh (default: all).
    seed: seed of the random token batches.
  Returns:
    a result row: ``status`` (one of :data:`STATUSES`), and for ``ok`` the
    timings (seconds; ``startup_s`` runs from this call to the end of the
    first step: set-up, tracing, compilation, state init, first step),
    tokens/s, MFU, memory (bytes per device) and XLA costs.
    Failures carry ``error``. Nothing raises for a failing point.
  """
  import jax
  import jax.numpy as jnp
  from chinchax import distributed as distributed_lib
  from chinchax import sharding as sharding_lib
  from chinchax import train as train_lib

  t_begin = time.perf_counter()
  devices = list(jax.devices() if devices is None else devices)
  n = len(devices)
  row: dict[str, Any] = {"n_devices": n, "backend": jax.default_backend(),
                         "device_kind": devices[0].device_kind}
  try:
    spec = train_lib.resolve(c, n)
  except config_lib.ConfigError as e:
    return {**row, "status": "invalid", "error": str(e)}
  m, counts = spec.model, spec.counts
  row.update(vocab_size=m.vocab_size, params_total=counts.total,
             params_non_embedding=counts.non_embedding, attention=m.attention,
             compute_dtype=m.compute_dtype, scan_layers=m.scan_layers,
             mesh_data=spec.mesh["data"], mesh_fsdp=spec.mesh["fsdp"],
             mesh_tensor=spec.mesh["tensor"],
             tokens_per_step=spec.tokens_per_step)
  try:
    mesh = sharding_lib.make_mesh(spec.mesh, devices)
    tx, schedule = train_lib.make_optimizer(c, spec)
    graphdef, abs_state, init = train_lib.abstract_state(m, tx, c.seed)
    shardings = sharding_lib.state_shardings(abs_state, mesh)
    step_fn = train_lib.jit_train_step(graphdef, tx, schedule, c, shardings, mesh)
    batch_sh = sharding_lib.batch_sharding(mesh)
    batch_struct = jax.ShapeDtypeStruct((spec.global_batch_size, spec.seq_len + 1), jnp.int32,
                                        sharding=batch_sh)
    # Abstract inputs carrying their shardings lower to the very executable that the
    # jitted step's own call reuses, so the timed calls below do not compile again.
    sharded_state = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abs_state, shardings)
    t0 = time.perf_counter()
    compiled = step_fn.lower(sharded_state, batch_struct).compile()
    row["compile_s"] = time.perf_counter() - t0
  except Exception as e:  # noqa: BLE001 — a failing point is a result
    return {**row, "status": "oom" if _is_oom(e) else "compile_error",
            "error": f"{type(e).__name__}: {str(e)[:2000]}"}
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else {}
  cost = dict(cost or {})
  row["xla_flops"] = float(cost["flops"]) if "flops" in cost else None
  row["xla_bytes_accessed"] = (float(cost["bytes accessed"]) if "bytes accessed" in cost
                               else None)
  needed = compiled_memory_bytes(compiled)
  limit, limit_src = device_memory_limit(devices, memory_limit_gb)
  row.update(compiled_memory_bytes=needed, memory_limit_bytes=limit)
  if needed is None:  # no memory analysis: fall back on the analytic estimate
    needed = work_lib.memory_per_device(
        spec.shape(), spec.global_batch_size, n_devices=spec.mesh["data"] * spec.mesh["fsdp"],
        profile=work_lib.ExecutionProfile(4 if m.compute_dtype == "float32" else 2))
  if needed > limit:
    return {**row, "status": "oom",
            "error": f"the compiled train step needs {needed / 1e9:.3g} GB per device, over the "
                     f"{limit / 1e9:.3g} GB limit ({limit_src}); not run"}
  peak_total, _ = train_lib.peak_flops(c, n)
  flops_per_step = budget.matmul_flops_per_token(spec.shape()) * spec.tokens_per_step
  rows_range = distributed_lib.process_row_range(batch_sh, spec.global_batch_size)
  rng = np.random.default_rng(seed)
  host_batches = [rng.integers(0, m.vocab_size, (rows_range[1] - rows_range[0], spec.seq_len + 1),
                               dtype=np.int32) for _ in range(min(4, timed_steps + 1))]
  times: list[float] = []
  try:
    state = jax.jit(init, out_shardings=shardings)()

    def dispatch(i):
      nonlocal state
      state, metrics = step_fn(state, train_lib.global_batch(
          batch_sh, host_batches[i % len(host_batches)], spec.global_batch_size))
      return metrics

    t = time.perf_counter()
    metrics = jax.block_until_ready(dispatch(0))
    row["first_step_s"] = time.perf_counter() - t
    row["startup_s"] = time.perf_counter() - t_begin
    row["loss_first"] = float(jax.device_get(metrics["loss"]))
    for i in range(warmup_steps):
      jax.block_until_ready(dispatch(i + 1))
    # Steady state as `chinchax train` runs it: step i+1 is queued before step i is waited
    # for, and each step's time is the interval between the completions of consecutive
    # steps (its metrics are ready when its program has finished on every device).
    pending, t_prev = None, time.perf_counter()
    for i in range(timed_steps + 1):
      metrics = dispatch(i) if i < timed_steps else None
      if pending is not None:
        jax.block_until_ready(pending)
        now = time.perf_counter()
        times.append(now - t_prev)
        t_prev = now
      pending, last = metrics, pending
    metrics = last
    row["loss_last"] = float(jax.device_get(metrics["loss"]))
    peak_mem = _peak_memory(devices)
    del state
  except Exception as e:  # noqa: BLE001
    return {**row, "status": "oom" if _is_oom(e) else "error",
            "error": f"{type(e).__name__}: {str(e)[:2000]}"}
  med = statistics.median(times)
  row.update(
      status="ok", timed_steps=len(times), step_times_s=times, step_time_s=med,
      step_time_min_s=min(times), step_time_max_s=max(times),
      step_time_p10_s=_percentile(times, 10), step_time_p90_s=_percentile(times, 90),
      step_time_std_s=float(np.std(times)),
      step_time_spread=(_percentile(times, 90) - _percentile(times, 10)) / med,
      tokens_per_s=spec.tokens_per_step / med, model_flops_per_step=flops_per_step,
      model_flops_per_s=flops_per_step / med, peak_flops=peak_total,
      mfu=flops_per_step / med / peak_total,
      memory_peak_bytes=peak_mem if peak_mem is not None else row["compiled_memory_bytes"],
      memory_source="memory_stats" if peak_mem is not None else "compiled memory_analysis")
  return row


def probe(c, hardware: str = "") -> dict:
  """Devices, MFU peak and price of this process's backend (no train step compiled).

  Args:
    c: a training config (its ``train.peak_flops_per_device`` > 0 fixes the peak).
    hardware: accelerator-table spec overriding the device kind, e.g. ``h200``.
  Returns:
    {"backend", "device_kind", "n_devices", "jax_version", "peak_flops"
    (total FLOP/s), "peak_flops_source", "accelerator", "hardware_spec",
    "price_per_hour" ($ for all devices, None if unknown), "memory_limit_bytes"}.
  """
  import jax
  from chinchax import train as train_lib
  devices = jax.devices()
  n = len(devices)
  table = hardware_lib.load_accelerators()
  if hardware:
    hw = hardware_lib.parse_hardware(hardware, table)
    acc = hw.accelerator
  else:
    acc = hardware_lib.match_accelerator(devices[0].device_kind, jax.default_backend(), table)
  if c.train.peak_flops_per_device > 0 or not hardware:
    peak, src = train_lib.peak_flops(c, n)
  else:
    peak, src = acc.peak_flops * n, f"accelerator table ({acc.display_name})"
  price = None
  if acc is not None and acc.price_per_device_hour is not None:
    price = acc.price_per_device_hour * n
  name = acc.name if acc is not None else devices[0].device_kind.lower().replace(" ", "-")
  limit, limit_src = device_memory_limit(devices, 0.0)
  return {"backend": jax.default_backend(), "device_kind": devices[0].device_kind,
          "n_devices": n, "jax_version": jax.__version__, "peak_flops": peak,
          "peak_flops_source": src, "accelerator": acc.name if acc else None,
          "hardware_spec": f"{name}x{n}" if n > 1 else name, "price_per_hour": price,
          "memory_limit_bytes": limit, "memory_limit_source": limit_src}


# ----------------------------------------------------------------------------
# Child processes (bench.isolate).


def _overlay(c: ml_collections.ConfigDict, values: dict) -> ml_collections.ConfigDict:
  """Sets ``values`` (a nested dict) onto the declared config ``c``; other knobs keep defaults."""
  for k, v in values.items():
    if isinstance(v, dict) and k in c and isinstance(c[k], ml_collections.ConfigDict):
      _overlay(c[k], v)
    else:
      c[k] = v
  return c


def _child_main(argv: list[str]) -> int:
  """``python -m chinchax.bench --child IN.json OUT.json``: one probe or one point."""
  job = json.loads(pathlib.Path(argv[0]).read_text())
  c = _overlay(config_lib.base_config(), job["config"])
  from chinchax import cli
  cli.setup_cpu_devices(c.mesh.num_cpu_devices)
  if job["kind"] == "probe":
    out = probe(c, job["hardware"])
  else:
    out = measure_point(c, warmup_steps=job["warmup_steps"], timed_steps=job["timed_steps"],
                        memory_limit_gb=job["memory_limit_gb"])
  pathlib.Path(argv[1]).write_text(json.dumps(out))
  return 0


def _run_child(job: dict, timeout_s: float, tmp: pathlib.Path, tag: str) -> dict:
  """Runs one job in a fresh interpreter; a crash or timeout becomes a failed row."""
  inp, outp, errp = tmp / f"{tag}.in.json", tmp / f"{tag}.out.json", tmp / f"{tag}.err"
  inp.write_text(json.dumps(job))
  env = dict(os.environ)
  env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
  cmd = [sys.executable, "-m", "chinchax.bench", "--child", str(inp), str(outp)]
  with errp.open("w") as err:
    proc = subprocess.Popen(cmd, stdout=err, stderr=subprocess.STDOUT, env=env)
    try:
      proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
      return {"status": "timeout", "error": f"no result after {timeout_s:g} s "
                                            f"(bench.point_timeout_s)"}
    finally:  # a timeout or an interrupted bench leaves no child behind
      if proc.poll() is None:
        proc.kill()
        proc.wait()
  if proc.returncode == 0 and outp.exists():
    return json.loads(outp.read_text())
  tail = [l for l in errp.read_text(errors="replace").splitlines() if l.strip()][-6:]
  why = f"exit status {proc.returncode}"
  if proc.returncode == -9:
    why += " (SIGKILL: the kernel's out-of-memory killer?)"
  return {"status": "oom" if _is_oom(RuntimeError("\n".join(tail))) else "crashed",
          "error": f"{why}: " + " | ".join(tail)[-1500:]}


# ----------------------------------------------------------------------------
# The sweep, its tables, plots and step-time models.


def _base_row(cfg, p: Point) -> dict:
  shape = cfg.models[p.model]
  sizes = parse_mesh(p.mesh)
  return {"name": p.name, "sweeps": ",".join(p.sweeps), "model": p.model,
          "d_model": int(shape.d_model), "n_layers": int(shape.n_layers),
          "n_heads": int(shape.n_heads), "d_ff": int(shape.d_ff),
          "global_batch_size": p.global_batch_size, "seq_len": p.seq_len,
          "tokens_per_step": p.global_batch_size * p.seq_len, "attention_requested": p.attention,
          "attention": p.attention, "mesh": p.mesh, "mesh_data": sizes["data"],
          "mesh_fsdp": sizes["fsdp"], "mesh_tensor": sizes["tensor"], "remat": p.remat,
          "compute_dtype": p.compute_dtype}


def _say(verbose: bool, msg: str) -> None:
  if verbose:
    print(msg, flush=True)


def _fmt_row(r: dict) -> str:
  if r["status"] != "ok":
    return f"{r['status']}: {str(r.get('error', ''))[:160]}"
  return (f"ok  {1e3 * r['step_time_s']:.1f} ms/step (p10-p90 {1e3 * r['step_time_p10_s']:.1f}-"
          f"{1e3 * r['step_time_p90_s']:.1f})  {r['tokens_per_s']:,.0f} tokens/s  "
          f"MFU {100 * r['mfu']:.2f}%  compile {r['compile_s']:.1f}s  "
          f"mem {(r['memory_peak_bytes'] or 0) / 2**20:,.0f} MiB/device")


def run_bench(cfg, points: list[Point] | None = None, *, verbose: bool = True) -> dict:
  """Runs the sweep and writes every output to ``cfg.workdir``.

  Args:
    cfg: a bench ConfigDict (``chinchax.config.base_bench_config``).
    points: the validated grid (default: :func:`validate_bench`).
    verbose: print one line per point.
  Returns:
    {"rows": [one dict per point], "meta": devices, peak, price, fits, wall time}.
  Raises:
    ConfigError: an invalid bench config (before anything runs).
  """
  t_start = time.time()
  points = validate_bench(cfg) if points is None else points
  b = cfg.bench
  workdir = pathlib.Path(os.path.expanduser(cfg.workdir)).resolve()
  workdir.mkdir(parents=True, exist_ok=True)
  for old in ("results.jsonl", "results.csv", "step_time.json"):
    (workdir / old).unlink(missing_ok=True)
  with tempfile.TemporaryDirectory(prefix="chinchax-bench-") as tmp_name:
    tmp = pathlib.Path(tmp_name)
    base = ml_collections.ConfigDict(cfg.train_config.to_dict())
    if b.isolate:
      info = _run_child({"kind": "probe", "config": base.to_dict(), "hardware": b.hardware},
                        b.point_timeout_s, tmp, "probe")
      if "backend" not in info:
        raise RuntimeError(f"the device probe failed: {info.get('error')}")
    else:
      info = probe(base, b.hardware)
    n_dev = info["n_devices"]
    per_device_peak = info["peak_flops"] / n_dev
    _say(verbose, f"bench   {len(points)} points on {n_dev} {info['backend']} device(s) "
                  f"({info['device_kind']}); peak {info['peak_flops']:.3g} FLOP/s "
                  f"({info['peak_flops_source']}); price "
                  f"{'unknown' if info['price_per_hour'] is None else '$%.2f/hour' % info['price_per_hour']}")
    rows = []
    interrupted = False
    for i, p in enumerate(points):
      c = point_config(cfg, p)
      c.train.peak_flops_per_device = per_device_peak
      row = _base_row(cfg, p)
      try:
        config_lib.validate(c, n_dev)
        invalid = None
      except config_lib.ConfigError as e:
        invalid = str(e)
      try:
        if invalid is not None:
          result = {"status": "invalid", "error": invalid}
        elif b.isolate:
          result = _run_child({"kind": "point", "config": c.to_dict(),
                               "warmup_steps": b.warmup_steps, "timed_steps": b.timed_steps,
                               "memory_limit_gb": b.memory_limit_gb},
                              b.point_timeout_s, tmp, f"p{i}")
        else:
          result = measure_point(c, warmup_steps=b.warmup_steps, timed_steps=b.timed_steps,
                                 memory_limit_gb=b.memory_limit_gb)
      except KeyboardInterrupt:  # Ctrl-C or SIGTERM: keep what is measured, write the outputs
        _say(verbose, f"interrupted at point {i + 1}/{len(points)}; writing what was measured")
        interrupted = True
        break
      row.update(result)
      row["peak_flops_source"] = info["peak_flops_source"]
      if row["status"] == "ok":
        price = info["price_per_hour"]
        row["price_per_hour"] = price
        row["cost_per_million_tokens"] = (None if price is None
                                          else price / 3600 / row["tokens_per_s"] * 1e6)
      rows.append(row)
      _say(verbose, f"[{i + 1}/{len(points)}] {p.name}: {_fmt_row(row)}")
      write_tables(workdir, rows)
    fits = None
    if b.fit_sweep:
      fits = fit_step_time(rows, sweep=b.fit_sweep, n_heldout=b.fit_heldout,
                           hardware_spec=info["hardware_spec"], path=workdir / "step_time.json")
    meta = {"probe": info, "points": len(rows), "interrupted": interrupted,
            "ok": sum(r["status"] == "ok" for r in rows),
            "warmup_steps": b.warmup_steps, "timed_steps": b.timed_steps,
            "isolate": bool(b.isolate), "fits": fits, "wall_s": time.time() - t_start,
            "config": cfg.to_dict()}
    plots = write_plots(workdir, rows) if b.plots else []
    meta["plots"] = [p.name for p in plots]
    meta["wall_s"] = time.time() - t_start
    (workdir / "bench.json").write_text(json.dumps(meta, indent=1, default=str))
    (workdir / "summary.md").write_text(summary_markdown(rows, meta))
  _say(verbose, f"wrote   {workdir}/results.jsonl, results.csv, summary.md, bench.json"
                + (", step_time.json" if fits and fits.get("path") else "")
                + "".join(f", {p.name}" for p in plots) + f" ({meta['wall_s']:.0f} s)")
  if not b.fit_sweep:
    _say(verbose, "fit     none: bench.fit_sweep is empty, so no step_time.json for plan "
                  "--step-time-model (name a sweep, e.g. --config.bench.fit_sweep=size)")
  elif not (fits and fits.get("path")):
    why = (fits or {}).get("skipped", "no fit")
    _say(verbose, f"fit     none: {why}, so no step_time.json")
  if fits and fits.get("heldout"):
    for key, res in fits["heldout"].items():
      _say(verbose, f"fit     {key}: held-out mean |error| {100 * res['mean_abs_error']:.1f}% "
                    f"on {len(res['errors'])} points")
  return {"rows": rows, "meta": meta}


def write_tables(workdir: pathlib.Path, rows: list[dict]) -> None:
  """``results.jsonl`` (every field) and ``results.csv`` (:data:`CSV_COLUMNS`)."""
  (workdir / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  with (workdir / "results.csv").open("w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=CSV_COLUMNS, extrasaction="ignore")
    w.writeheader()
    for r in rows:
      w.writerow({k: r.get(k) for k in CSV_COLUMNS})


def _measurement(r: dict) -> dict:
  return {"d_model": r["d_model"], "n_layers": r["n_layers"], "n_heads": r["n_heads"],
          "d_ff": r["d_ff"], "vocab_size": r["vocab_size"], "seq_len": r["seq_len"],
          "global_batch_size": r["global_batch_size"], "tie_embeddings": True,
          "step_time_s": r["step_time_s"], "startup_s": r.get("startup_s")}


def heldout_indices(n: int, k: int) -> list[int]:
  """``k`` indices spread over the interior of ``range(n)`` (the ends stay in the fit)."""
  if n - k < 3:
    raise ValueError(f"{n} points cannot hold out {k} and keep 3 to fit")
  lo, hi = (1, n - 2) if n - 2 >= k else (0, n - 1)
  idx = sorted({int(round(x)) for x in np.linspace(lo, hi, k)})
  rest = [i for i in range(n) if i not in idx]
  while len(idx) < k:  # rounding merged two: take the nearest unused
    idx.append(rest.pop(len(rest) // 2))
  return sorted(idx)


def fit_step_time(rows: list[dict], *, sweep: str, n_heldout: int, hardware_spec: str,
                  path: pathlib.Path | None = None) -> dict:
  """Fits and scores the FLOPs-only and FLOPs+bytes step-time models on one sweep.

  Points are ordered by FLOPs; ``n_heldout`` interior ones are held out. The
  analytic features (``work.step_flops``, ``work.bytes_per_step``) are
  scored by ``step_time.heldout_errors``; XLA's ``cost_analysis`` FLOPs and
  bytes accessed per device are scored the same way. Every ok point of the
  sweep goes to ``path`` in the step-time file format (``plan
  --step-time-model``).

  Returns:
    {"sweep", "n_points", "heldout": {"flops_only": {...}, "flops_and_bytes":
    {...}, "xla_flops_only": {...}, "xla_flops_and_bytes": {...}}, each with
    "errors" (predicted / measured − 1 per held-out point), "mean_abs_error",
    "model"; "heldout_points"; "path"} — or with "skipped" saying why.
  """
  ok = [r for r in rows if r["status"] == "ok" and sweep in r["sweeps"].split(",")]
  out: dict[str, Any] = {"sweep": sweep, "n_points": len(ok), "path": None}
  if len(ok) < 3:
    out["skipped"] = f"{len(ok)} ok points in sweep {sweep!r}; a fit needs at least 3"
    return out
  r0 = ok[0]
  attention = "xla" if r0["attention"] == "xla" else "cudnn"
  profile = work_lib.ExecutionProfile.from_names(r0["compute_dtype"], attention)
  n_dev = r0["n_devices"]
  meas = [_measurement(r) for r in ok]
  proto = step_time_lib.LinearStepTime(0.0, 0.0, 0.0, profile, n_dev)
  order = sorted(range(len(ok)), key=lambda i: proto.features(
      *step_time_lib.measurement_shape(meas[i])[:2])[0])
  ok = [ok[i] for i in order]
  meas = [meas[i] for i in order]
  if path is not None:
    step_time_lib.write_step_time_file(path, meas, hardware=hardware_spec, n_devices=n_dev,
                                       compute_dtype=r0["compute_dtype"], attention=attention)
    out["path"] = str(path)
  try:
    held = heldout_indices(len(ok), n_heldout)
  except ValueError as e:
    out["skipped"] = str(e)
    return out
  out["heldout_points"] = [ok[i]["name"] for i in held]
  out["heldout"] = step_time_lib.heldout_errors(meas, held, profile=profile, n_devices=n_dev)
  if all(r.get("xla_flops") and r.get("xla_bytes_accessed") for r in ok):
    X = np.array([[1.0, r["xla_flops"], r["xla_bytes_accessed"]] for r in ok])
    y = np.array([r["step_time_s"] for r in ok])
    train = np.array([i not in held for i in range(len(ok))])
    for key, cols in (("xla_flops_only", [0, 1]), ("xla_flops_and_bytes", [0, 1, 2])):
      coef = step_time_lib.fit_relative(X[train][:, cols], y[train])
      errs = [float(X[i, cols] @ coef / y[i] - 1.0) for i in held]
      desc = f"t = {coef[0]:.3g} s + {coef[1]:.3g} s/FLOP"
      if len(cols) == 3:
        desc += f" + {coef[2]:.3g} s/byte (XLA cost analysis, per device)"
      out["heldout"][key] = {"errors": errs, "mean_abs_error": float(np.mean(np.abs(errs))),
                             "model": desc}
  return out


_LABEL_PREFIX = {"global_batch_size": "b", "seq_len": "T", "mesh": "mesh ", "remat": "remat "}


def _attention_label(r: dict) -> str:
  """The kernel that ran, with the requested one when the switch fell back (``cudnn→xla``)."""
  if r["attention"] == r["attention_requested"]:
    return r["attention"]
  return f"{r['attention_requested']}→{r['attention']}"


def _group_lines(rows, x_key, y_fn, group_keys):
  groups: dict[tuple, list] = {}
  for r in rows:
    r = {**r, "attention": _attention_label(r)}
    y = y_fn(r)
    if y is None:
      continue
    groups.setdefault(tuple(r[k] for k in group_keys), []).append((r[x_key], y))
  return {k: sorted(v) for k, v in groups.items()}


def _label(key: tuple, keys: tuple, rows: list[dict]) -> str:
  varying = [k for k in keys if len({_attention_label(r) if k == "attention" else r[k]
                                     for r in rows}) > 1] or [keys[0]]
  return " ".join(f"{_LABEL_PREFIX.get(k, '')}{v}" for k, v in zip(keys, key) if k in varying)


def write_plots(workdir: pathlib.Path, rows: list[dict]) -> list[pathlib.Path]:
  """The three PNGs: tokens/s vs batch per attention kernel, MFU vs size, memory vs batch."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  ok = [r for r in rows if r["status"] == "ok"]
  out = []
  specs = (
      ("tokens_per_s_vs_batch.png", "global_batch_size", lambda r: r["tokens_per_s"],
       ("model", "attention", "seq_len", "mesh", "remat", "compute_dtype"),
       "global batch size (sequences)", "tokens/s", "Throughput vs batch, per attention kernel",
       True),
      ("mfu_vs_size.png", "params_total", lambda r: 100 * r["mfu"],
       ("attention", "global_batch_size", "seq_len", "mesh", "remat", "compute_dtype"),
       "parameters (total)", "MFU (%)", "MFU vs model size", True),
      ("memory_vs_batch.png", "global_batch_size",
       lambda r: r["memory_peak_bytes"] / 2**20 if r.get("memory_peak_bytes") else None,
       ("model", "remat", "attention", "mesh", "seq_len", "compute_dtype"),
       "global batch size (sequences)", "peak memory per device (MiB)",
       "Peak device memory vs batch", True),
  )
  for fname, x_key, y_fn, keys, xlabel, ylabel, title, logx in specs:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.set_prop_cycle(color=plt.cm.tab20.colors)
    for key, pts in sorted(_group_lines(ok, x_key, y_fn, keys).items(), key=lambda kv: str(kv[0])):
      xs, ys = zip(*pts)
      ax.plot(xs, ys, marker="o", label=_label(key, keys, ok))
    if logx and ok:
      ax.set_xscale("log", base=2 if x_key == "global_batch_size" else 10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title + ("" if ok else " (no successful points)"))
    ax.grid(True, alpha=0.3)
    if ok:
      ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(workdir / fname, dpi=110)
    plt.close(fig)
    out.append(workdir / fname)
  return out


def _fmt(v, fmt: str, scale: float = 1.0) -> str:
  if v is None or (isinstance(v, float) and not math.isfinite(v)):
    return "–"
  return format(v * scale if scale != 1.0 else v, fmt)


def summary_markdown(rows: list[dict], meta: dict) -> str:
  """A short report: devices, the point table, failures, the best points, the step-time fits."""
  info = meta["probe"]
  price = info["price_per_hour"]
  lines = [
      "# chinchax bench", "",
      f"- devices: {info['n_devices']} × {info['device_kind']} ({info['backend']}), "
      f"jax {info['jax_version']}",
      f"- MFU peak: {info['peak_flops']:.4g} FLOP/s in all ({info['peak_flops_source']}); "
      f"MFU numerator: matmul FLOPs with causal-halved attention (budget.matmul_flops_per_token)",
      f"- price: {'unknown' if price is None else f'${price:.2f}/hour'} "
      f"(accelerator table entry: {info['accelerator']})",
      f"- per point: compile, 1 first step, {meta['warmup_steps']} warm-up steps, "
      f"{meta['timed_steps']} timed steps (completion to completion, the next step queued); "
      f"{'each point in its own process' if meta['isolate'] else 'all points in one process'}",
      f"- {meta['ok']} of {meta['points']} points ok; wall {meta['wall_s']:.0f} s"
      + ("; **interrupted**: later points were not run" if meta.get("interrupted") else ""), "",
      "| point | status | params | batch×seq | attention | mesh d×f×t | remat | dtype | compile s "
      "| step ms median (p10–p90) | tokens/s | MFU % | peak MiB/device | XLA GFLOP/device "
      "| XLA GB accessed/device | $/M tokens |",
      "|" + "---|" * 16,
  ]
  for r in rows:
    ok = r["status"] == "ok"
    attn = _attention_label(r)
    step = (f"{1e3 * r['step_time_s']:.2f} ({1e3 * r['step_time_p10_s']:.2f}–"
            f"{1e3 * r['step_time_p90_s']:.2f})" if ok else "–")
    lines.append(
        f"| {r['name']} | {r['status']} | {_fmt(r.get('params_total'), ',')} | "
        f"{r['global_batch_size']}×{r['seq_len']} | {attn} | "
        f"{r['mesh_data']}×{r['mesh_fsdp']}×{r['mesh_tensor']} | {r['remat']} | "
        f"{r['compute_dtype']} | {_fmt(r.get('compile_s'), '.1f')} | {step} | "
        f"{_fmt(r.get('tokens_per_s'), ',.0f')} | {_fmt(r.get('mfu'), '.2f', 100)} | "
        f"{_fmt(r.get('memory_peak_bytes'), ',.0f', 2**-20)} | "
        f"{_fmt(r.get('xla_flops'), '.3g', 1e-9)} | "
        f"{_fmt(r.get('xla_bytes_accessed'), '.3g', 1e-9)} | "
        f"{_fmt(r.get('cost_per_million_tokens'), '.4f')} |")
  failed = [r for r in rows if r["status"] != "ok"]
  if failed:
    lines += ["", "## Failed points", ""]
    lines += [f"- `{r['name']}` — **{r['status']}**: {str(r.get('error', ''))[:300]}"
              for r in failed]
  ok_rows = [r for r in rows if r["status"] == "ok"]
  if ok_rows:
    lines += ["", "## Fastest point per model (tokens/s)", ""]
    for model in dict.fromkeys(r["model"] for r in ok_rows):
      best = max((r for r in ok_rows if r["model"] == model), key=lambda r: r["tokens_per_s"])
      lines.append(f"- {model}: `{best['name']}` — {best['tokens_per_s']:,.0f} tokens/s, "
                   f"MFU {100 * best['mfu']:.2f}%")
  fits = meta.get("fits")
  if fits:
    lines += ["", f"## Step-time models (sweep `{fits['sweep']}`, {fits['n_points']} ok points)", ""]
    if fits.get("path"):
      lines.append(f"Measurements written to `{pathlib.Path(fits['path']).name}` "
                   f"(`chinchax plan --step-time-model`).")
    if fits.get("skipped"):
      lines.append(f"Not scored: {fits['skipped']}.")
    if fits.get("heldout"):
      lines += ["", f"Held out: {', '.join(fits['heldout_points'])}.", "",
                "| features | held-out mean abs error | errors (predicted/measured − 1) | model |",
                "|---|---|---|---|"]
      names = {"flops_only": "FLOPs (analytic)", "flops_and_bytes": "FLOPs + bytes (analytic)",
               "xla_flops_only": "FLOPs (XLA cost analysis)",
               "xla_flops_and_bytes": "FLOPs + bytes accessed (XLA cost analysis)"}
      for key, res in fits["heldout"].items():
        errs = ", ".join(f"{100 * e:+.1f}%" for e in res["errors"])
        lines.append(f"| {names.get(key, key)} | {100 * res['mean_abs_error']:.1f}% | {errs} | "
                     f"{res['model']} |")
  if meta.get("plots"):
    lines += ["", "## Plots", ""] + [f"![{p}]({p})" for p in meta["plots"]]
  return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
  """``chinchax bench``: parse the config, check it, run the sweep; exit 2 on a config error."""
  argv = list(sys.argv[1:] if argv is None else argv)
  if argv[:1] == ["--child"]:
    return _child_main(argv[1:])
  from chinchax import cli
  cfg = cli._parse_config(argv, DEFAULT_CONFIG, "chinchax-bench")
  if cfg is None:
    return 2
  points: list[Point] = []

  def check():
    points.extend(validate_bench(cfg))

  if cli._run_guarded(check):
    return 2
  if not cfg.bench.isolate:  # this process runs the points: set up its devices first
    cli.setup_cpu_devices(cfg.train_config.mesh.num_cpu_devices)

  def on_sigterm(signum, frame):
    raise KeyboardInterrupt

  signal.signal(signal.SIGTERM, on_sigterm)  # e.g. `timeout`: stop, write the partial outputs
  return cli._run_guarded(lambda: run_bench(cfg, points))


if __name__ == "__main__":
  sys.exit(main())
