"""Device memory for the bench: the per-device limit, a compiled step's need, the peak, OOM errors."""

from __future__ import annotations

import os

_OOM_MARKERS = ("resource_exhausted", "resource exhausted", "out of memory", "failed to allocate",
                "memoryerror", "allocator")


def is_oom(err: BaseException) -> bool:
  """Whether an exception (type name and message) reads as a failed memory allocation."""
  text = f"{type(err).__name__} {err}".lower()
  return any(k in text for k in _OOM_MARKERS)


def _host_memory_bytes() -> float:
  try:
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
  except (ValueError, OSError, AttributeError):
    return float("inf")


def _memory_stats(device) -> dict | None:
  """A device's ``memory_stats()``, or None where the backend keeps none (CPU)."""
  return device.memory_stats() if hasattr(device, "memory_stats") else None


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
    stats = _memory_stats(d)
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


def peak_memory(devices) -> float | None:
  """The largest ``peak_bytes_in_use`` over the devices (bytes), or None where none is kept."""
  peaks = []
  for d in devices:
    stats = _memory_stats(d)
    if stats and "peak_bytes_in_use" in stats:
      peaks.append(float(stats["peak_bytes_in_use"]))
  return max(peaks) if peaks else None
