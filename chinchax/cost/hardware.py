"""Accelerators: the table of chips (peak FLOP/s, bandwidth, memory, price) and hardware specs.

The accelerator table (peak dense bf16 FLOP/s per chip, HBM bandwidth, memory,
$/device-hour with the price's date and source) lives in the editable data
file ``chinchax/cost/hardware_prices.json``; :func:`load_accelerators` reads it (or
another file with the same format). It is the one source of peak FLOP/s:
the planner's rooflines, the benchmark's MFU and the trainer's MFU
(:func:`device_peak_flops`) all read it.

Hardware specs name an accelerator and a device count:

* ``h100x8`` / ``8xh100`` / ``h100`` — 8, 8 and 1 GPUs;
* ``v5p-128``, ``v4-32`` — Cloud TPU slice names, where the number counts
  TensorCores (two per chip on v4 and v5p): v5p-128 is 64 chips;
* ``v5e-16``, ``v6e-8`` — the number counts chips (one TensorCore each).

A JAX device kind (``jax.devices()[0].device_kind``, e.g. ``"NVIDIA H100
PCIe"``, ``"TPU v5 lite"``) is matched to its table entry by
:func:`match_accelerator`.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import pathlib
import platform
import re

from chinchax import errors

DEFAULT_TABLE = pathlib.Path(__file__).with_name("hardware_prices.json")


class HardwareError(errors.UserError):
  """An unknown or malformed hardware spec, or an unreadable accelerator table."""


@dataclasses.dataclass(frozen=True)
class Accelerator:
  """One accelerator chip.

  Attributes:
    name: canonical key in the table (e.g. ``"v5p"``, ``"h100"``).
    display_name: human name.
    kind: ``"tpu"``, ``"gpu"`` or ``"cpu"``.
    peak_flops: dense bf16 FLOP/s per chip (float32 for ``cpu``).
    hbm_bandwidth: bytes/s per chip.
    memory_bytes: HBM bytes per chip.
    price_per_device_hour: dollars per chip-hour, None when unknown.
    price_date: when the price was listed (YYYY-MM).
    price_source: where the price comes from.
    spec_source: where the performance figures come from.
    slice_counts: for TPU slice names ``NAME-K``: ``"cores"`` (K TensorCores,
      two per chip) or ``"chips"``.
    aliases: other accepted names.
    interconnect_bandwidth: chip-to-chip bytes/s per chip, both directions together
      (TPU ICI, NVLink; PCIe where a GPU has no NVLink), None when unknown; the
      ahead-of-time roofline (``chinchax.aot``) reads it.
    interconnect_source: where that figure comes from.
    dcn_bandwidth: bytes/s per chip in each direction over the data-center network between
      TPU slices or GPU hosts (None when unknown).
    dcn_source: where that figure comes from.
  """

  name: str
  display_name: str
  kind: str
  peak_flops: float
  hbm_bandwidth: float
  memory_bytes: float
  price_per_device_hour: float | None
  price_date: str | None
  price_source: str | None
  spec_source: str
  slice_counts: str = "chips"
  aliases: tuple[str, ...] = ()
  interconnect_bandwidth: float | None = None
  interconnect_source: str | None = None
  dcn_bandwidth: float | None = None
  dcn_source: str | None = None


@dataclasses.dataclass(frozen=True)
class Hardware:
  """``n_devices`` chips of one accelerator, as named by a spec such as ``v5p-128``."""

  accelerator: Accelerator
  n_devices: int
  spec: str

  @property
  def peak_flops(self) -> float:
    """Peak FLOP/s of all devices together."""
    return self.accelerator.peak_flops * self.n_devices

  @property
  def price_per_hour(self) -> float | None:
    """Dollars per hour for all devices, None when the table has no price."""
    p = self.accelerator.price_per_device_hour
    return None if p is None else p * self.n_devices

  @property
  def is_accelerator(self) -> bool:
    return self.accelerator.kind != "cpu"

  def to_dict(self) -> dict:
    a = self.accelerator
    return {"spec": self.spec, "accelerator": a.name, "display_name": a.display_name,
            "n_devices": self.n_devices, "peak_flops_per_device": a.peak_flops,
            "hbm_bandwidth_per_device": a.hbm_bandwidth, "memory_bytes_per_device": a.memory_bytes,
            "price_per_device_hour": a.price_per_device_hour, "price_per_hour": self.price_per_hour,
            "price_date": a.price_date, "price_source": a.price_source}


def load_accelerators(path: str | pathlib.Path | None = None) -> dict[str, Accelerator]:
  """Reads the accelerator table (default: ``chinchax/cost/hardware_prices.json``).

  Raises:
    HardwareError: a missing file, invalid JSON, or an entry without a
      required field.
  """
  path = pathlib.Path(path) if path is not None else DEFAULT_TABLE
  try:
    raw = json.loads(path.read_text())
  except FileNotFoundError:
    raise HardwareError(f"accelerator table {str(path)!r} does not exist") from None
  except json.JSONDecodeError as e:
    raise HardwareError(f"accelerator table {str(path)!r} is not valid JSON: {e}") from None
  entries = raw.get("accelerators") if isinstance(raw, dict) else None
  if not isinstance(entries, dict) or not entries:
    raise HardwareError(f"accelerator table {str(path)!r} has no 'accelerators' object")
  out = {}
  for name, e in entries.items():
    try:
      price = e.get("price_per_device_hour")
      acc = Accelerator(
          name=name.lower(), display_name=str(e.get("display_name", name)), kind=str(e["kind"]),
          peak_flops=float(e["peak_flops"]), hbm_bandwidth=float(e["hbm_bandwidth"]),
          memory_bytes=float(e["memory_bytes"]),
          price_per_device_hour=None if price is None else float(price),
          price_date=e.get("price_date"), price_source=e.get("price_source"),
          spec_source=str(e.get("spec_source", "")),
          slice_counts=str(e.get("slice_counts", "chips")),
          aliases=tuple(a.lower() for a in e.get("aliases", ())),
          interconnect_bandwidth=(None if e.get("interconnect_bandwidth") is None
                                  else float(e["interconnect_bandwidth"])),
          interconnect_source=e.get("interconnect_source"),
          dcn_bandwidth=None if e.get("dcn_bandwidth") is None else float(e["dcn_bandwidth"]),
          dcn_source=e.get("dcn_source"))
    except (KeyError, TypeError, ValueError) as err:
      raise HardwareError(f"accelerator {name!r} in {str(path)!r} is malformed: {err!r}") from None
    if acc.peak_flops <= 0 or acc.hbm_bandwidth <= 0:
      raise HardwareError(f"accelerator {name!r} in {str(path)!r}: peak_flops and "
                          f"hbm_bandwidth must be > 0")
    if acc.price_per_device_hour is not None and acc.price_per_device_hour <= 0:
      raise HardwareError(f"accelerator {name!r} in {str(path)!r}: price must be > 0 or null")
    out[acc.name] = acc
  return out


def _lookup(name: str, table: dict[str, Accelerator]) -> Accelerator | None:
  name = name.strip().lower()
  if name in table:
    return table[name]
  for acc in table.values():
    if name in acc.aliases:
      return acc
  return None


def hardware_examples(table: dict[str, Accelerator]) -> str:
  """A one-line list of valid names with example specs, for error messages."""
  names = ", ".join(sorted(table))
  return (f"known accelerators: {names} (specs like v5p-128 = 64 chips, v5e-16 = 16 chips, "
          f"h100x8 or 8xh100 = 8 GPUs, cpu)")


def parse_hardware(spec: str, table: dict[str, Accelerator] | None = None) -> Hardware:
  """Parses a hardware spec into an accelerator and a device count.

  Accepted forms: ``NAME`` (one device), ``NAMExK`` and ``KxNAME`` (K
  devices), and ``NAME-K`` — for TPUs the Cloud TPU slice name, where K
  counts TensorCores on v4/v5p (K/2 chips) and chips on v5e/v6e; for other
  kinds K devices.

  Raises:
    HardwareError: an unknown accelerator (the message lists the valid
      names), a zero count, or an odd core count for a two-core TPU.
  """
  if table is None:
    table = load_accelerators()
  if not isinstance(spec, str) or not spec.strip():
    raise HardwareError(f"empty hardware spec; {hardware_examples(table)}")
  s = spec.strip().lower().replace("×", "x").replace(" ", "")
  acc = _lookup(s, table)
  if acc is not None:
    return Hardware(acc, 1, spec)
  count, name, tpu_slice = None, None, False
  for pattern, order in ((r"(\d+)x(.+)", "count-first"), (r"(.+?)x(\d+)", "name-first"),
                         (r"(.+)-(\d+)", "slice")):
    m = re.fullmatch(pattern, s)
    if not m:
      continue
    a, b = m.groups()
    name, count = (b, int(a)) if order == "count-first" else (a, int(b))
    tpu_slice = order == "slice"
    acc = _lookup(name, table)
    if acc is not None:
      break
  if acc is None:
    raise HardwareError(f"unknown hardware {spec!r}; {hardware_examples(table)}")
  if count < 1:
    raise HardwareError(f"hardware {spec!r} names {count} devices; give at least 1")
  if tpu_slice and acc.kind == "tpu" and acc.slice_counts == "cores":
    if count % 2:
      raise HardwareError(f"{spec!r}: {acc.display_name} slice names count TensorCores, two per "
                          f"chip, so the number must be even (e.g. {acc.name}-8 = 4 chips)")
    count //= 2
  return Hardware(acc, count, spec)



def match_accelerator(device_kind: str, backend: str,
                      table: dict[str, Accelerator]) -> Accelerator | None:
  """The table's accelerator for a JAX device kind, or None.

  On the ``cpu`` backend the table's ``cpu`` entry. Otherwise the device kind,
  lower-cased with spaces as dashes (``"NVIDIA H100 PCIe"`` →
  ``"nvidia-h100-pcie"``), is searched for every name and alias of the
  table; the longest one found wins (``h100-pcie`` over ``h100``, ``l40s``
  over ``l4``).

  Args:
    device_kind: ``jax.Device.device_kind``.
    backend: ``jax.default_backend()`` (``"cpu"``, ``"gpu"``, ``"tpu"``).
    table: from :func:`load_accelerators`.
  """
  if backend == "cpu":
    return table.get("cpu")
  kind = device_kind.lower().replace(" ", "-")
  best, best_len = None, 0
  for acc in table.values():
    for name in (acc.name,) + acc.aliases:
      if name in kind and len(name) > best_len:
        best, best_len = acc, len(name)
  return best


def cpu_flops_cache() -> pathlib.Path:
  """``$XDG_CACHE_HOME/chinchax/cpu_peak_flops.json`` (default ``~/.cache``): the host's measured
  float32 matmul peak per device layout (``chinchax.train.mfu.host_cpu_flops`` writes it)."""
  root = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
  return pathlib.Path(os.path.expanduser(root)) / "chinchax" / "cpu_peak_flops.json"


def usable_cores() -> int:
  """The CPU cores this process may run on (its affinity; all of them where that is unknown)."""
  try:
    return len(os.sched_getaffinity(0))
  except (AttributeError, OSError):
    return os.cpu_count() or 1


def cpu_flops_key(jax_version: str, n_devices: int) -> str:
  """The key of one device layout in :func:`cpu_flops_cache`: host, CPU, cores it may use, JAX
  version and local device count; its value is the float32 matmul FLOP/s all of that layout's
  devices reach together."""
  return (f"{platform.node()}|{platform.processor() or platform.machine()}|{os.cpu_count()} "
          f"cores|{usable_cores()} usable|jax {jax_version}|{n_devices} devices|all at once")


def measured_cpu(hw: Hardware) -> Hardware:
  """``hw`` with this host's measured peak where ``hw`` is ``cpu``/``cpuxK`` and the cache
  (:func:`cpu_flops_cache`) holds a measurement of K devices with the installed JAX (the best
  of its calibrations, divided among the K devices); else ``hw`` unchanged (the table's
  nominal CPU). Reads a file and the installed JAX's version; starts no JAX."""
  if hw.accelerator.kind != "cpu":
    return hw
  try:
    version = importlib.metadata.version("jax")
    table = json.loads(cpu_flops_cache().read_text())
  except (importlib.metadata.PackageNotFoundError, OSError, ValueError):
    return hw
  entry = table.get(cpu_flops_key(version, hw.n_devices)) if isinstance(table, dict) else None
  best = entry.get("best") if isinstance(entry, dict) else entry
  if not isinstance(best, (int, float)) or best <= 0:
    return hw
  n = entry.get("measurements", 1) if isinstance(entry, dict) else 1
  acc = dataclasses.replace(
      hw.accelerator, peak_flops=float(best) / hw.n_devices,
      display_name=f"host CPU (measured: best of {n} float32 matmul calibrations)",
      spec_source=f"{cpu_flops_cache()}, {hw.n_devices} devices, jax {version}")
  return dataclasses.replace(hw, accelerator=acc)


def device_peak_flops(device_kind: str, backend: str,
                      table: dict[str, Accelerator] | None = None) -> tuple[float, str] | None:
  """Dense bf16 peak FLOP/s of one device of a JAX device kind, and where the figure comes from.

  The figure is the accelerator table's ``peak_flops`` (vendor data sheets,
  see each entry's ``spec_source``) of :func:`match_accelerator`'s entry.

  Args:
    device_kind: ``jax.Device.device_kind``, e.g. ``"NVIDIA H100 PCIe"``.
    backend: ``jax.default_backend()``.
    table: the accelerator table (default ``chinchax/cost/hardware_prices.json``).
  Returns:
    (FLOP/s per device, ``"data sheet (<device kind>, <peak> FLOP/s per
    device)"``), or None for an unknown device kind and on the ``cpu``
    backend, whose table entry is nominal (measure the host instead).
  Raises:
    HardwareError: an unreadable accelerator table.
  """
  if backend == "cpu":
    return None
  acc = match_accelerator(device_kind, backend, load_accelerators() if table is None else table)
  if acc is None or acc.kind == "cpu":
    return None
  return acc.peak_flops, f"data sheet ({device_kind}, {acc.peak_flops:.3g} FLOP/s per device)"
