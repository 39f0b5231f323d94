"""The denominator of MFU: peak FLOP/s of the devices a run uses."""

from __future__ import annotations

import json
import os
import pathlib
import platform
import time

import jax
import jax.numpy as jnp

from chinchax.cost import hardware as hardware_lib

def peak_flops(config, n_devices: int) -> tuple[float, str]:
  """Peak FLOP/s of the devices a run uses (the MFU denominator), and its source.

  Order: ``train.peak_flops_per_device`` × devices if set; the dense bf16
  data-sheet peak of a known accelerator (the accelerator table,
  ``chinchax.cost.hardware.device_peak_flops``) × devices; on CPU, where virtual
  devices share the host's cores, a measured float32 matmul throughput of the
  host × processes, the best of a few measurements cached per host and device layout
  (:func:`host_cpu_flops`), so the MFU of identical runs is comparable; :func:`checked_peak`
  keeps MFU at or below 1 there.
  """
  if config.train.peak_flops_per_device > 0:
    return float(config.train.peak_flops_per_device) * n_devices, "config"
  kind = jax.devices()[0].device_kind
  known = hardware_lib.device_peak_flops(kind, jax.default_backend())
  if known is not None:
    return known[0] * n_devices, known[1]
  if jax.default_backend() == "cpu":
    flops, where = host_cpu_flops()
    return flops * jax.process_count(), f"{CPU_SOURCE} ({where})"
  return float("nan"), f"unknown device {kind!r}; set train.peak_flops_per_device"


cpu_flops_cache = hardware_lib.cpu_flops_cache


CALIBRATIONS = 3  # a host's peak is measured this many times (across runs), the best kept
CPU_SOURCE = "CPU float32 matmul calibration of the host"


def _cache_key() -> str:
  """The cache key of this process's device layout: host, CPU, cores it may use, JAX version
  and local device count. Every key's value means the same thing: the float32 matmul FLOP/s
  that all of that layout's devices reach together (:func:`calibrate_cpu_flops`)."""
  return hardware_lib.cpu_flops_key(jax.__version__, jax.local_device_count())


def _read_cache(path: pathlib.Path) -> dict:
  try:
    table = json.loads(path.read_text())
  except (OSError, ValueError):
    return {}
  return table if isinstance(table, dict) else {}


def _entry(value) -> tuple[float, int]:
  """(best FLOP/s, measurements) of a cache entry; an older entry (a bare number) counts once."""
  if isinstance(value, (int, float)) and value > 0:
    return float(value), 1
  if isinstance(value, dict) and isinstance(value.get("best"), (int, float)) and value["best"] > 0:
    return float(value["best"]), int(value.get("measurements", 1))
  return 0.0, 0


def _store(path: pathlib.Path, key: str, best: float, n: int, why: str = "") -> bool:
  """Writes one entry (re-reading the table so other keys are kept); False if it cannot."""
  try:
    table = _read_cache(path)
    entry = {"best": best, "measurements": n}
    if why:
      entry["raised"] = why
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps({**table, key: entry}, indent=2))
    os.replace(tmp, path)
    return True
  except OSError:
    return False


def host_cpu_flops() -> tuple[float, str]:
  """(FLOP/s, where it came from): this host's best calibration (:func:`calibrate_cpu_flops`).

  One measurement under load reads low, so a low peak would make MFU read high: the host is
  measured again by each of its first :data:`CALIBRATIONS` runs and the cache (key:
  :func:`_cache_key`) keeps the best; later runs read it. :func:`checked_peak` raises it when a
  run goes faster than it. A cache that cannot be read or written is ignored (then each run
  measures).
  """
  path, key = cpu_flops_cache(), _cache_key()
  best, n = _entry(_read_cache(path).get(key))
  if n >= CALIBRATIONS:
    return best, f"best of {n} measurements, cached in {path}"
  best = max(best, calibrate_cpu_flops())
  if _store(path, key, best, n + 1):
    return best, f"best of {n + 1} measurement(s), cached in {path}"
  return best, "measured now; not cached"


def checked_peak(achieved: float, peak: float, source: str) -> tuple[float, str]:
  """The peak to divide ``achieved`` FLOP/s by, so that MFU never exceeds 1 on a measured CPU.

  When a run's ``achieved`` throughput exceeds a calibrated host peak (``source`` is
  :data:`CPU_SOURCE`'s), the calibration read low (it ran on a loaded host): the host is measured
  again, and the best of the cached peak, the new measurement and ``achieved`` is cached and
  returned. A configured or data-sheet peak is returned as it is (MFU above 1 then says that
  number is wrong).
  """
  if not (achieved > peak > 0) or not source.startswith(CPU_SOURCE):
    return peak, source
  path, key = cpu_flops_cache(), _cache_key()
  best, n = _entry(_read_cache(path).get(key))
  per_process = peak / max(jax.process_count(), 1)
  new = max(best, per_process, calibrate_cpu_flops(), achieved / max(jax.process_count(), 1))
  _store(path, key, new, n + 1, why=f"a run reached {achieved:.3g} FLOP/s over the peak "
                                    f"{peak:.3g}")
  return (new * jax.process_count(),
          f"{CPU_SOURCE} (re-measured: a run went faster than the cached {peak:.3g} FLOP/s)")


usable_cores = hardware_lib.usable_cores


def calibrate_cpu_flops(n: int = 1024, repeats: int = 5) -> float:
  """Host float32 matmul throughput in FLOP/s: the best of ``repeats`` rounds of one
  [n,n]@[n,n] on every local device at once.

  Virtual CPU devices share the host's cores (XLA gives each a part of them), so a matmul on
  one of k devices measures about 1/k of the host; all k at once measure the host, which is
  what the run's k devices together can reach.
  """
  devices = jax.local_devices()
  xs = [jax.device_put(jnp.ones((n, n), jnp.float32), d) for d in devices]
  f = jax.jit(lambda x: x @ x)
  jax.block_until_ready([f(x) for x in xs])
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready([f(x) for x in xs])
    best = min(best, time.perf_counter() - t0)
  return 2 * n ** 3 * len(devices) / best
