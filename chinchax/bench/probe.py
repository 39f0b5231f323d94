"""The devices a bench runs on: their kind, MFU peak, price and memory, before any step compiles."""

from __future__ import annotations

import jax

from chinchax.cost import hardware as hardware_lib
from chinchax import train as train_lib
from chinchax.bench.memory import device_memory_limit


def probe(c, hardware: str = "") -> dict:
  """Devices, MFU peak and price of this process's backend (no train step compiled).

  Args:
    c: a training config (its ``train.peak_flops_per_device`` > 0 fixes the peak).
    hardware: accelerator-table spec overriding the device kind, e.g. ``h200``.
  Returns:
    {"backend", "device_kind", "n_devices", "jax_version", "peak_flops"
    (total FLOP/s), "peak_flops_source", "accelerator", "hardware_spec",
    "price_per_hour" ($ for all devices, None if unknown), "memory_limit_bytes",
    "memory_limit_source"}.
  """
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
