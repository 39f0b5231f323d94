"""The denominator of MFU: peak FLOP/s of the devices a run uses."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp

from chinchax import hardware as hardware_lib

def peak_flops(config, n_devices: int) -> tuple[float, str]:
  """Peak FLOP/s of the devices a run uses (the MFU denominator), and its source.

  Order: ``train.peak_flops_per_device`` × devices if set; the dense bf16
  data-sheet peak of a known accelerator (the accelerator table,
  ``chinchax.hardware.device_peak_flops``) × devices; on CPU, where virtual
  devices share the host's cores, a measured float32 matmul throughput of the
  host × processes.
  """
  if config.train.peak_flops_per_device > 0:
    return float(config.train.peak_flops_per_device) * n_devices, "config"
  kind = jax.devices()[0].device_kind
  known = hardware_lib.device_peak_flops(kind, jax.default_backend())
  if known is not None:
    return known[0] * n_devices, known[1]
  if jax.default_backend() == "cpu":
    return calibrate_cpu_flops() * jax.process_count(), "CPU float32 matmul calibration of the host"
  return float("nan"), f"unknown device {kind!r}; set train.peak_flops_per_device"


def calibrate_cpu_flops(n: int = 1024, repeats: int = 5) -> float:
  """Host float32 matmul throughput in FLOP/s: best of ``repeats`` [n,n]@[n,n] on device 0."""
  a = jax.device_put(jnp.ones((n, n), jnp.float32), jax.local_devices()[0])
  f = jax.jit(lambda x: x @ x)
  f(a).block_until_ready()
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    f(a).block_until_ready()
    best = min(best, time.perf_counter() - t0)
  return 2 * n ** 3 / best
