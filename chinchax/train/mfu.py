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
  host × processes, measured once per host and cached (:func:`host_cpu_flops`),
  so the MFU of identical runs is comparable.
  """
  if config.train.peak_flops_per_device > 0:
    return float(config.train.peak_flops_per_device) * n_devices, "config"
  kind = jax.devices()[0].device_kind
  known = hardware_lib.device_peak_flops(kind, jax.default_backend())
  if known is not None:
    return known[0] * n_devices, known[1]
  if jax.default_backend() == "cpu":
    flops, where = host_cpu_flops()
    return flops * jax.process_count(), f"CPU float32 matmul calibration of the host ({where})"
  return float("nan"), f"unknown device {kind!r}; set train.peak_flops_per_device"


def cpu_flops_cache() -> pathlib.Path:
  """``$XDG_CACHE_HOME/chinchax/cpu_peak_flops.json`` (default ``~/.cache``)."""
  root = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
  return pathlib.Path(os.path.expanduser(root)) / "chinchax" / "cpu_peak_flops.json"


def host_cpu_flops() -> tuple[float, str]:
  """(FLOP/s, where it came from): the cached calibration of this host, else a new one, cached.

  The key is the host name, CPU, core count, the cores this process may run on
  (a worker pinned to one core measures that core), JAX version and local device
  count; a cache that cannot be read or written is ignored (then each run measures).
  A single measurement varies between runs (the host's load): the first one is kept.
  """
  path = cpu_flops_cache()
  key = (f"{platform.node()}|{platform.processor() or platform.machine()}|{os.cpu_count()} cores|"
         f"{usable_cores()} usable|jax {jax.__version__}|{jax.local_device_count()} devices|"
         f"all at once")
  try:
    table = json.loads(path.read_text())
  except (OSError, ValueError):
    table = {}
  if isinstance(table.get(key), (int, float)) and table[key] > 0:
    return float(table[key]), f"measured once, cached in {path}"
  flops = calibrate_cpu_flops()
  try:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps({**table, key: flops}, indent=2))
    os.replace(tmp, path)
    return flops, f"measured now, cached in {path}"
  except OSError:
    return flops, "measured now; not cached"


def usable_cores() -> int:
  """The CPU cores this process may run on (its affinity; all of them where that is unknown)."""
  try:
    return len(os.sched_getaffinity(0))
  except (AttributeError, OSError):
    return os.cpu_count() or 1


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
