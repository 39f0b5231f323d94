"""Accelerators, their prices, and step-time models for wall-clock and dollar budgets.

The accelerator table (peak dense bf16 FLOP/s per chip, HBM bandwidth, memory,
$/device-hour with the price's date and source) lives in the editable data
file ``chinchax/hardware_prices.json``; :func:`load_accelerators` reads it (or
another file with the same format).

Hardware specs name an accelerator and a device count:

* ``h100x8`` / ``8xh100`` / ``h100`` — 8, 8 and 1 GPUs;
* ``v5p-128``, ``v4-32`` — Cloud TPU slice names, where the number counts
  TensorCores (two per chip on v4 and v5p): v5p-128 is 64 chips;
* ``v5e-16``, ``v6e-8`` — the number counts chips (one TensorCore each).

A step-time model predicts the wall-clock seconds of one training step of a
shape at a global batch size. Two kinds:

* :class:`RooflineStepTime` — analytic: max(FLOPs / (peak · MFU),
  bytes / (HBM bandwidth · bandwidth efficiency)) per device, with the FLOPs
  of :func:`chinchax.budget.executed_matmul_flops_per_token` and the memory
  traffic of :func:`bytes_per_step`.
* :class:`LinearStepTime` — t = t0 + a·FLOPs + b·bytes per device, fitted by
  non-negative least squares to measured step times
  (:func:`fit_linear_step_time`); :class:`MeasuredStepTime` additionally
  returns the measured time for a measured shape.

Step-time file format (JSON), written by a benchmark and read by
:func:`load_step_time_model` (``chinchax plan --step-time-model PATH``)::

  {
    "format": "chinchax.step_time/1",
    "hardware": "cpu",            # the spec the measurements were taken on
    "n_devices": 1,               # devices the steps ran on
    "compute_dtype": "float32",   # float32 | bfloat16: activation bytes 4 | 2
    "attention": "xla",           # xla: scores materialised, full square
                                  # cudnn: flash kernel, causal half skipped
    "measurements": [             # at least 3 rows (to fit t0, a, b)
      {"d_model": 128, "n_layers": 4, "n_heads": 4, "d_ff": 336,
       "vocab_size": 257, "seq_len": 128, "global_batch_size": 16,
       "tie_embeddings": true, "step_time_s": 0.041,
       "startup_s": 6.5}          # optional: seconds before the steady state (set-up,
    ],                            # compile, first step); a time budget pays it once
    "fit": {"intercept_s": 0.002, "s_per_flop": 1e-11, "s_per_byte": 1e-10}
                                  # optional: use these instead of fitting
  }
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import re
from typing import Any, Iterable, Protocol

import numpy as np

from chinchax import budget
from chinchax import errors

DEFAULT_TABLE = pathlib.Path(__file__).with_name("hardware_prices.json")
STEP_TIME_FORMAT = "chinchax.step_time/1"

# Compute efficiency of the roofline: model FLOPs utilisation reached by a
# tuned JAX LLM trainer — MaxText Llama2-7B on one 8×H100 node runs at 492 of
# 989 TFLOP/s per chip, ≈ 50% (shared/reference/README.md).
DEFAULT_MFU = 0.5
# Fraction of peak HBM bandwidth that streaming kernels reach. An assumption
# (typical of bandwidth-bound kernels), not a measurement: replace it with a
# measured step-time model where one exists.
DEFAULT_BANDWIDTH_EFFICIENCY = 0.7


class HardwareError(errors.UserError):
  """An unknown or malformed hardware spec, or an unreadable accelerator table."""


class StepTimeError(errors.UserError):
  """A step-time model file that cannot be read or fitted."""


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
  """Reads the accelerator table (default: ``chinchax/hardware_prices.json``).

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
          aliases=tuple(a.lower() for a in e.get("aliases", ())))
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


# ----------------------------------------------------------------------------
# Per-step work: FLOPs and memory traffic.


@dataclasses.dataclass(frozen=True)
class ExecutionProfile:
  """How a train step executes, as far as FLOPs and bytes go.

  Attributes:
    activation_bytes: bytes per activation element (4 float32, 2 bfloat16).
    materialized_attention: the seq_len × seq_len attention probabilities are
      written to and read back from memory (chinchax's ``xla`` attention).
    causal_skip: the attention kernel skips the masked half (cuDNN flash).
  """

  activation_bytes: int = 2
  materialized_attention: bool = True
  causal_skip: bool = False

  @staticmethod
  def for_kind(kind: str) -> "ExecutionProfile":
    """chinchax's defaults: CPU float32 + xla attention; GPU bf16 + cuDNN; TPU bf16 + xla."""
    if kind == "cpu":
      return ExecutionProfile(4, True, False)
    if kind == "gpu":
      return ExecutionProfile(2, False, True)
    return ExecutionProfile(2, True, False)

  @staticmethod
  def from_names(compute_dtype: str, attention: str) -> "ExecutionProfile":
    """Profile from a config's compute dtype and attention implementation names."""
    if compute_dtype not in ("float32", "bfloat16"):
      raise StepTimeError(f"compute_dtype={compute_dtype!r} is not 'float32' or 'bfloat16'")
    if attention not in ("xla", "cudnn"):
      raise StepTimeError(f"attention={attention!r} is not 'xla' or 'cudnn'")
    return ExecutionProfile(4 if compute_dtype == "float32" else 2, attention == "xla",
                            attention == "cudnn")


# Bytes per parameter per step with float32 parameters and AdamW state:
# forward reads the weights (4), backward reads them again (4) and writes the
# gradient (4); AdamW reads parameter, gradient, m and v (16) and writes
# parameter, m and v (12).
PARAM_BYTES_PER_STEP = 40


def step_flops(shape: budget.ModelShape, global_batch_size: int, *, n_devices: int = 1,
               profile: ExecutionProfile = ExecutionProfile()) -> float:
  """Executed matmul FLOPs of one train step per device (data parallel over ``n_devices``)."""
  tokens = global_batch_size * shape.seq_len / n_devices
  return tokens * budget.executed_matmul_flops_per_token(shape, causal_skip=profile.causal_skip)


def bytes_per_step(shape: budget.ModelShape, global_batch_size: int, *, n_devices: int = 1,
                   profile: ExecutionProfile = ExecutionProfile()) -> float:
  """Estimated HBM traffic of one train step per device, bytes.

  Three parts:

  * weights and optimizer: :data:`PARAM_BYTES_PER_STEP` (40) bytes per
    parameter, every device holding a full replica (data parallelism);
  * activations: each tensor the backward pass needs is written in the
    forward and read in the backward. Per layer and token these are the two
    norm inputs and outputs (4·d_model), q, k, v and the attention output
    (4·n_heads·head_dim), the gate, up and gated MLP hiddens (3·d_ff) and,
    when attention is materialised, one row of probabilities per head
    (n_heads·seq_len) — the accounting of Korthikanti et al. 2022 (Sec. 4.1)
    for this block without dropout;
  * logits: float32 logits written, read by the loss, their gradient written
    and read: 16·vocab_size bytes per token.

  Fusion may remove some of this traffic and un-fused elementwise ops add
  more; fitted step-time models absorb the difference.
  """
  d, hk, L = shape.d_model, shape.n_heads * shape.kv_size, shape.n_layers
  tokens = global_batch_size * shape.seq_len / n_devices
  per_layer = 4 * d + 4 * hk + 3 * shape.d_ff
  if profile.materialized_attention:
    per_layer += shape.n_heads * shape.seq_len
  activations = 2 * profile.activation_bytes * L * per_layer
  logits = 16 * shape.vocab_size
  return PARAM_BYTES_PER_STEP * budget.param_counts(shape).total + tokens * (activations + logits)


def memory_per_device(shape: budget.ModelShape, global_batch_size: int, *, n_devices: int = 1,
                      profile: ExecutionProfile = ExecutionProfile()) -> float:
  """Rough peak memory per device, bytes: float32 parameters, gradients, AdamW m and v
  (16 bytes per parameter, replicated) plus saved activations and logits of the
  device's share of the batch (half the traffic of :func:`bytes_per_step`)."""
  d, hk, L = shape.d_model, shape.n_heads * shape.kv_size, shape.n_layers
  tokens = global_batch_size * shape.seq_len / n_devices
  per_layer = 4 * d + 4 * hk + 3 * shape.d_ff
  if profile.materialized_attention:
    per_layer += shape.n_heads * shape.seq_len
  acts = profile.activation_bytes * L * per_layer + 8 * shape.vocab_size
  return 16 * budget.param_counts(shape).total + tokens * acts


# ----------------------------------------------------------------------------
# Step-time models.


class StepTimeModel(Protocol):
  """Predicts seconds per train step."""

  name: str

  def predict(self, shape: budget.ModelShape, global_batch_size: int) -> float:
    ...

  def describe(self) -> str:
    ...


@dataclasses.dataclass(frozen=True)
class RooflineStepTime:
  """Analytic roofline: t = max(FLOPs / (peak · mfu), bytes / (bandwidth · bw_efficiency)).

  Per device, data parallel over ``hardware.n_devices``; gradient all-reduce
  is assumed to overlap compute (optimistic on slow interconnects).

  Attributes:
    hardware: the devices.
    mfu: fraction of peak FLOP/s reached (default 0.5, see :data:`DEFAULT_MFU`).
    bandwidth_efficiency: fraction of peak HBM bandwidth reached (default 0.7).
    profile: dtype and attention kernel; default follows the accelerator kind.
  """

  hardware: Hardware
  mfu: float = DEFAULT_MFU
  bandwidth_efficiency: float = DEFAULT_BANDWIDTH_EFFICIENCY
  profile: ExecutionProfile | None = None
  name: str = "roofline"

  def _profile(self) -> ExecutionProfile:
    return self.profile or ExecutionProfile.for_kind(self.hardware.accelerator.kind)

  def predict(self, shape: budget.ModelShape, global_batch_size: int) -> float:
    """Seconds per step."""
    acc, n, prof = self.hardware.accelerator, self.hardware.n_devices, self._profile()
    t_flops = step_flops(shape, global_batch_size, n_devices=n, profile=prof) / (
        acc.peak_flops * self.mfu)
    t_bytes = bytes_per_step(shape, global_batch_size, n_devices=n, profile=prof) / (
        acc.hbm_bandwidth * self.bandwidth_efficiency)
    return max(t_flops, t_bytes)

  def describe(self) -> str:
    a = self.hardware.accelerator
    return (f"analytic roofline on {self.hardware.n_devices}× {a.display_name}: "
            f"{a.peak_flops:.3g} FLOP/s × MFU {self.mfu:g}, {a.hbm_bandwidth:.3g} B/s × "
            f"{self.bandwidth_efficiency:g} per device")


@dataclasses.dataclass(frozen=True)
class LinearStepTime:
  """t = intercept_s + s_per_flop · FLOPs + s_per_byte · bytes, per device per step.

  Features are :func:`step_flops` and :func:`bytes_per_step` under
  ``profile`` on ``n_devices`` devices. ``s_per_byte = 0`` is the FLOPs-only model.
  """

  intercept_s: float
  s_per_flop: float
  s_per_byte: float
  profile: ExecutionProfile
  n_devices: int = 1
  name: str = "linear"

  def features(self, shape: budget.ModelShape, global_batch_size: int) -> tuple[float, float]:
    return (step_flops(shape, global_batch_size, n_devices=self.n_devices, profile=self.profile),
            bytes_per_step(shape, global_batch_size, n_devices=self.n_devices,
                           profile=self.profile))

  def predict(self, shape: budget.ModelShape, global_batch_size: int) -> float:
    """Seconds per step."""
    f, b = self.features(shape, global_batch_size)
    return self.intercept_s + self.s_per_flop * f + self.s_per_byte * b

  def describe(self) -> str:
    parts = []
    if self.s_per_flop > 0:
      parts.append(f"{1 / self.s_per_flop:.3g} FLOP/s")
    if self.s_per_byte > 0:
      parts.append(f"{1 / self.s_per_byte:.3g} B/s")
    eff = f" (≈ {', '.join(parts)})" if parts else ""
    return (f"linear step-time model t = {self.intercept_s:.3g} s + {self.s_per_flop:.3g} s/FLOP"
            f" + {self.s_per_byte:.3g} s/byte{eff}")


@dataclasses.dataclass(frozen=True)
class MeasuredStepTime:
  """Measured step times for measured (shape, batch) pairs; a fitted linear model elsewhere.

  Attributes:
    table: step seconds by :meth:`key`.
    fallback: the fitted model for unmeasured steps.
    source: where the measurements came from.
    startup_table: start-up seconds by :meth:`key`, for rows that carry ``startup_s``.
  """

  table: dict
  fallback: LinearStepTime
  source: str = ""
  name: str = "measured"
  startup_table: dict = dataclasses.field(default_factory=dict)

  @staticmethod
  def key(shape: budget.ModelShape, global_batch_size: int) -> tuple:
    return (shape.d_model, shape.n_layers, shape.n_heads, shape.d_ff, shape.vocab_size,
            shape.seq_len, bool(shape.tie_embeddings), int(global_batch_size))

  def predict(self, shape: budget.ModelShape, global_batch_size: int) -> float:
    """Seconds per step: the measurement if this exact step was measured, else the fit."""
    hit = self.table.get(self.key(shape, global_batch_size))
    return float(hit) if hit is not None else self.fallback.predict(shape, global_batch_size)

  def startup_s(self, shape: budget.ModelShape, global_batch_size: int) -> float:
    """Seconds a run spends before its steady state: the measurement for this exact step,
    else the median of the measured start-ups, else 0 (the file has none)."""
    hit = self.startup_table.get(self.key(shape, global_batch_size))
    if hit is not None:
      return float(hit)
    return float(np.median(list(self.startup_table.values()))) if self.startup_table else 0.0

  def describe(self) -> str:
    return (f"measured step times ({len(self.table)} shapes from {self.source or 'a table'}), "
            f"elsewhere {self.fallback.describe()}")


_SHAPE_KEYS = ("d_model", "n_layers", "n_heads", "d_ff", "vocab_size", "seq_len")


def measurement_shape(row: dict) -> tuple[budget.ModelShape, int, float]:
  """(shape, global_batch_size, step_time_s) of one measurement row.

  Raises:
    StepTimeError: a missing or non-positive field.
  """
  try:
    vals = {k: int(row[k]) for k in _SHAPE_KEYS}
    gbs = int(row["global_batch_size"])
    t = float(row["step_time_s"])
  except (KeyError, TypeError, ValueError) as e:
    raise StepTimeError(f"measurement {row!r} lacks a field or has a bad value: {e!r}; each "
                        f"needs {', '.join(_SHAPE_KEYS)}, global_batch_size, step_time_s") from None
  if min(vals.values()) < 1 or gbs < 1 or not (math.isfinite(t) and t > 0):
    raise StepTimeError(f"measurement {row!r}: sizes and step_time_s must be positive")
  shape = budget.ModelShape(tie_embeddings=bool(row.get("tie_embeddings", True)), **vals)
  return shape, gbs, t


def fit_linear_step_time(rows: Iterable[dict], *, profile: ExecutionProfile, n_devices: int = 1,
                         use_bytes: bool = True) -> LinearStepTime:
  """Fits t = t0 + a·FLOPs + b·bytes (all ≥ 0) to measured step times by least squares.

  Relative errors are minimised (each row is divided by its measured time),
  so small and large shapes weigh alike.

  Args:
    rows: measurement dicts (see the module docstring).
    profile: how the measured steps executed.
    n_devices: devices the steps ran on.
    use_bytes: False fits the FLOPs-only model t = t0 + a·FLOPs.
  Raises:
    StepTimeError: fewer than 3 rows, or a malformed row.
  """
  from scipy import optimize  # scipy is a dependency of chinchax

  parsed = [measurement_shape(r) for r in rows]
  if len(parsed) < 3:
    raise StepTimeError(f"need at least 3 measured steps to fit a step-time model, got "
                        f"{len(parsed)}")
  proto = LinearStepTime(0.0, 0.0, 0.0, profile, n_devices)
  X, y = [], []
  for shape, gbs, t in parsed:
    f, b = proto.features(shape, gbs)
    X.append([1.0, f, b if use_bytes else 0.0])
    y.append(t)
  X, y = np.asarray(X), np.asarray(y)
  scale = np.maximum(np.abs(X).max(axis=0), 1e-30)
  coef, _ = optimize.nnls((X / scale) / y[:, None], np.ones_like(y))
  coef = coef / scale
  return LinearStepTime(float(coef[0]), float(coef[1]), float(coef[2]), profile, n_devices,
                        name="linear" if use_bytes else "linear-flops-only")


def heldout_errors(rows: list[dict], test_indices: Iterable[int], *,
                   profile: ExecutionProfile, n_devices: int = 1) -> dict:
  """Fits the FLOPs-only and FLOPs+bytes models on the other rows; errors on the held-out ones.

  Returns:
    {"flops_only": {...}, "flops_and_bytes": {...}}, each with "errors" (the
    signed relative error predicted/measured - 1 per held-out row) and
    "mean_abs_error".
  """
  test = set(test_indices)
  train = [r for i, r in enumerate(rows) if i not in test]
  held = [rows[i] for i in sorted(test)]
  out = {}
  for key, use_bytes in (("flops_only", False), ("flops_and_bytes", True)):
    model = fit_linear_step_time(train, profile=profile, n_devices=n_devices, use_bytes=use_bytes)
    errs = []
    for r in held:
      shape, gbs, t = measurement_shape(r)
      errs.append(model.predict(shape, gbs) / t - 1.0)
    out[key] = {"errors": errs, "mean_abs_error": float(np.mean(np.abs(errs))) if errs else None,
                "model": model.describe()}
  return out


def load_step_time_model(path: str | pathlib.Path) -> MeasuredStepTime:
  """Reads a step-time file (format in the module docstring) into a model.

  Raises:
    StepTimeError: a missing file, invalid JSON, wrong format tag, too few or
      malformed measurements.
  """
  path = pathlib.Path(path)
  try:
    raw = json.loads(path.read_text())
  except FileNotFoundError:
    raise StepTimeError(f"step-time model file {str(path)!r} does not exist") from None
  except (OSError, json.JSONDecodeError) as e:
    raise StepTimeError(f"step-time model file {str(path)!r} cannot be read: {e}") from None
  if not isinstance(raw, dict) or raw.get("format") != STEP_TIME_FORMAT:
    raise StepTimeError(f"step-time model file {str(path)!r} must be a JSON object with "
                        f"\"format\": \"{STEP_TIME_FORMAT}\"")
  profile = ExecutionProfile.from_names(str(raw.get("compute_dtype", "float32")),
                                        str(raw.get("attention", "xla")))
  n_devices = int(raw.get("n_devices", 1))
  if n_devices < 1:
    raise StepTimeError(f"{str(path)!r}: n_devices must be >= 1")
  rows = raw.get("measurements") or []
  if not isinstance(rows, list):
    raise StepTimeError(f"{str(path)!r}: 'measurements' must be a list")
  fit = raw.get("fit")
  if fit is not None:
    try:
      linear = LinearStepTime(float(fit["intercept_s"]), float(fit["s_per_flop"]),
                              float(fit.get("s_per_byte", 0.0)), profile, n_devices)
    except (KeyError, TypeError, ValueError) as e:
      raise StepTimeError(f"{str(path)!r}: 'fit' needs intercept_s, s_per_flop and s_per_byte: "
                          f"{e!r}") from None
  else:
    linear = fit_linear_step_time(rows, profile=profile, n_devices=n_devices)
  table, startup = {}, {}
  for r in rows:
    shape, gbs, t = measurement_shape(r)
    table[MeasuredStepTime.key(shape, gbs)] = t
    if r.get("startup_s") is not None:
      s = r["startup_s"]
      if isinstance(s, bool) or not (isinstance(s, (int, float)) and math.isfinite(s)
                                     and s >= 0):
        raise StepTimeError(f"{str(path)!r}: measurement {r!r} has startup_s={s!r}; it must be "
                            f"a number of seconds >= 0")
      startup[MeasuredStepTime.key(shape, gbs)] = float(s)
  return MeasuredStepTime(table=table, fallback=linear, source=str(path), startup_table=startup)


def write_step_time_file(path: str | pathlib.Path, rows: list[dict], *, hardware: str,
                         n_devices: int = 1, compute_dtype: str = "float32",
                         attention: str = "xla") -> None:
  """Writes measured step times in the step-time file format (for benchmarks)."""
  pathlib.Path(path).write_text(json.dumps(
      {"format": STEP_TIME_FORMAT, "hardware": hardware, "n_devices": n_devices,
       "compute_dtype": compute_dtype, "attention": attention, "measurements": rows}, indent=2))


def describe_model(model: Any) -> str:
  """The model's one-line description."""
  return model.describe() if hasattr(model, "describe") else repr(model)
