"""One bench point measured: ``chinchax train``'s step compiled, checked for memory and timed."""

from __future__ import annotations

import statistics
import time
from typing import Any

import jax
import numpy as np

from chinchax.cost import budget
from chinchax import config as config_lib
from chinchax.runtime import distributed as distributed_lib
from chinchax.model import sharding as sharding_lib
from chinchax import train as train_lib
from chinchax.train import mfu as mfu_lib
from chinchax.cost import work as work_lib
from chinchax.bench.memory import compiled_memory_bytes, device_memory_limit, is_oom, peak_memory

# A row's status: measured, or why not (``timeout`` and ``crashed`` only with bench.isolate).
STATUSES = ("ok", "invalid", "oom", "compile_error", "error", "timeout", "crashed")


def _percentile(xs, q):
  return float(np.percentile(np.asarray(xs, float), q))


def _failure(row: dict, err: Exception, status: str) -> dict:
  """The row of a point that raised: ``oom`` if the error reads so, else ``status``."""
  return {**row, "status": "oom" if is_oom(err) else status,
          "error": f"{type(err).__name__}: {str(err)[:2000]}"}


def measure_point(c, *, warmup_steps: int, timed_steps: int, memory_limit_gb: float = 0.0,
                  devices=None, seed: int = 0, profile_steps: int = 0,
                  profile_dir: str | None = None) -> dict:
  """Compiles and times ``chinchax train``'s step for the training config ``c``.

  Args:
    c: a full training ConfigDict (``point_config``); ``train.peak_flops_per_device``
      > 0 fixes the MFU denominator.
    warmup_steps: untimed steps after the first call, each waited for.
    timed_steps: steps timed from completion to completion, the next one queued.
    memory_limit_gb: see :func:`chinchax.bench.device_memory_limit`.
    devices: devices of the mesh (default: all).
    seed: seed of the random token batches.
    profile_steps: > 0: after the timed steps, this many more steps run under a
      ``jax.profiler`` trace written to ``profile_dir`` (so the trace never
      changes the timings); the row's ``profile_dir`` names it.
    profile_dir: the trace's directory (xprof / TensorBoard's profile plugin).
  Returns:
    a result row: ``status`` (one of :data:`STATUSES`), and for ``ok`` the
    timings (seconds; ``startup_s`` runs from this call to the end of the
    first step: set-up, tracing, compilation, state init, first step),
    tokens/s, MFU, memory (bytes per device) and XLA costs.
    Failures carry ``error``. Nothing raises for a failing point.
  """
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
    program = train_lib.build_program(c, spec, sharding_lib.make_mesh(spec.mesh, devices))
    t0 = time.perf_counter()
    compiled = program.lower().compile()  # the executable the timed calls below reuse
    row["compile_s"] = time.perf_counter() - t0
  except Exception as e:  # noqa: BLE001 — a failing point is a result
    return _failure(row, e, "compile_error")
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
  peak_total, peak_src = train_lib.peak_flops(c, n)
  flops_per_step = budget.matmul_flops_per_token(spec.shape()) * spec.tokens_per_step
  rows_range = distributed_lib.process_row_range(program.batch_sharding, spec.global_batch_size)
  rng = np.random.default_rng(seed)
  host_batches = [rng.integers(0, m.vocab_size, (rows_range[1] - rows_range[0], spec.seq_len + 1),
                               dtype=np.int32) for _ in range(min(4, timed_steps + 1))]
  times: list[float] = []
  try:
    state = program.init_state()

    def dispatch(i):
      nonlocal state
      state, metrics = program.step(state, program.global_batch(host_batches[i % len(host_batches)]))
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
    if profile_steps > 0 and profile_dir:
      jax.profiler.start_trace(profile_dir)
      try:
        for i in range(profile_steps):
          jax.block_until_ready(dispatch(i))
      finally:
        jax.profiler.stop_trace()
      row["profile_dir"] = profile_dir
    peak_mem = peak_memory(devices)
    del state
  except Exception as e:  # noqa: BLE001
    return _failure(row, e, "error")
  med = statistics.median(times)
  # a calibrated CPU peak that this point outruns read low: measured again (MFU stays <= 1)
  peak_total, _ = mfu_lib.checked_peak(flops_per_step / med, peak_total, peak_src)
  p10, p90 = _percentile(times, 10), _percentile(times, 90)
  row.update(
      status="ok", timed_steps=len(times), step_times_s=times, step_time_s=med,
      step_time_min_s=min(times), step_time_max_s=max(times),
      step_time_p10_s=p10, step_time_p90_s=p90, step_time_std_s=float(np.std(times)),
      step_time_spread=(p90 - p10) / med,
      tokens_per_s=spec.tokens_per_step / med, model_flops_per_step=flops_per_step,
      model_flops_per_s=flops_per_step / med, peak_flops=peak_total,
      mfu=flops_per_step / med / peak_total,
      memory_peak_bytes=peak_mem if peak_mem is not None else row["compiled_memory_bytes"],
      memory_source="memory_stats" if peak_mem is not None else "compiled memory_analysis")
  return row
