"""Step-time models: seconds per train step of a shape at a global batch size, and their files.

A step-time model predicts the wall-clock seconds of one training step of a
shape at a global batch size. Two kinds:

* :class:`RooflineStepTime` — analytic: max(FLOPs / (peak · MFU),
  bytes / (HBM bandwidth · bandwidth efficiency)) per device, with the FLOPs
  of :func:`chinchax.cost.budget.executed_matmul_flops_per_token` and the memory
  traffic of :func:`chinchax.cost.work.bytes_per_step`.
* :class:`LinearStepTime` — t = t0 + a·FLOPs + b·bytes per device, fitted by
  non-negative least squares to measured step times
  (:func:`fit_linear_step_time`); :class:`MeasuredStepTime` additionally
  returns the measured time for a measured shape.

:func:`model_from_dict` builds either from a fit's ``step_time`` section (an
IsoTime fit, ``analysis.isotime.fit``: its chosen predictor).

Step-time file format (JSON), written by a benchmark and read by
:func:`load_step_time_model` (``chinchax plan --step-time-model PATH``)::

  {
    "format": "chinchax.cost.step_time/1",
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
from typing import Any, Iterable, Protocol

import numpy as np

from chinchax.cost import budget
from chinchax.cost import hardware as hardware_lib
from chinchax.cost import work
from chinchax.cost.work import StepTimeError

STEP_TIME_FORMAT = "chinchax.cost.step_time/1"

# Compute efficiency of the roofline: model FLOPs utilisation reached by a
# tuned JAX LLM trainer — MaxText Llama2-7B on one 8×H100 node runs at 492 of
# 989 TFLOP/s per chip, ≈ 50% (MaxText's published performance figures).
DEFAULT_MFU = 0.5
# Fraction of peak HBM bandwidth that streaming kernels reach. An assumption
# (typical of bandwidth-bound kernels), not a measurement: replace it with a
# measured step-time model where one exists.
DEFAULT_BANDWIDTH_EFFICIENCY = 0.7


class StepTimeModel(Protocol):
  """Predicts seconds per train step."""

  name: str

  def predict(self, shape: budget.ModelShape, global_batch_size: int, microbatches: int = 1
              ) -> float: ...

  def describe(self) -> str: ...


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

  hardware: hardware_lib.Hardware
  mfu: float = DEFAULT_MFU
  bandwidth_efficiency: float = DEFAULT_BANDWIDTH_EFFICIENCY
  profile: work.ExecutionProfile | None = None
  name: str = "roofline"
  note: str = ""  # where the model came from (e.g. a fit's predictor), prefixed to describe()
  s_per_layer: float = 0.0

  def predict(self, shape: budget.ModelShape, global_batch_size: int,
              microbatches: int = 1) -> float:
    """Seconds per step; ``microbatches`` M re-reads the weights M times
    (:func:`chinchax.cost.work.param_bytes_per_step`)."""
    acc, n = self.hardware.accelerator, self.hardware.n_devices
    # the given profile, else what attention=auto runs on the kind at this seq_len
    prof = self.profile or work.ExecutionProfile.for_kind(acc.kind, shape.seq_len)
    t_flops = work.step_flops(shape, global_batch_size, n_devices=n, profile=prof) / (
        acc.peak_flops * self.mfu)
    t_bytes = work.bytes_per_step(shape, global_batch_size, n_devices=n, profile=prof,
                                  microbatches=microbatches) / (
        acc.hbm_bandwidth * self.bandwidth_efficiency)
    return max(t_flops, t_bytes)

  def describe(self) -> str:
    a = self.hardware.accelerator
    text = (f"analytic roofline on {self.hardware.n_devices}× {a.display_name}: "
            f"{a.peak_flops:.3g} FLOP/s × MFU {self.mfu:g}, {a.hbm_bandwidth:.3g} B/s × "
            f"{self.bandwidth_efficiency:g} per device")
    return f"{self.note}: {text}" if self.note else text


@dataclasses.dataclass(frozen=True)
class LinearStepTime:
  """t = intercept_s + s_per_flop · FLOPs + s_per_byte · bytes (+ s_per_layer · n_layers),
  per device per step.

  Features are :func:`chinchax.cost.work.step_flops` and
  :func:`chinchax.cost.work.bytes_per_step` under ``profile`` on
  ``n_devices`` devices. ``s_per_byte = 0`` is the FLOPs-only model. ``s_per_layer``
  prices each layer's fixed cost (its kernels' launch and dispatch, whatever their
  size), which sets the step time of narrow models.
  """

  intercept_s: float
  s_per_flop: float
  s_per_byte: float
  profile: work.ExecutionProfile
  n_devices: int = 1
  name: str = "linear"
  note: str = ""  # where the model came from (e.g. a fit's predictor), prefixed to describe()
  s_per_layer: float = 0.0

  def features(self, shape: budget.ModelShape, global_batch_size: int,
               microbatches: int = 1) -> tuple[float, float]:
    return (work.step_flops(shape, global_batch_size, n_devices=self.n_devices,
                            profile=self.profile),
            work.bytes_per_step(shape, global_batch_size, n_devices=self.n_devices,
                                profile=self.profile, microbatches=microbatches))

  def predict(self, shape: budget.ModelShape, global_batch_size: int,
              microbatches: int = 1) -> float:
    """Seconds per step (``microbatches`` M: the weights' bytes M times)."""
    f, b = self.features(shape, global_batch_size, microbatches)
    return (self.intercept_s + self.s_per_flop * f + self.s_per_byte * b
            + self.s_per_layer * shape.n_layers)

  def describe(self) -> str:
    parts = []
    if self.s_per_flop > 0:
      parts.append(f"{1 / self.s_per_flop:.3g} FLOP/s")
    if self.s_per_byte > 0:
      parts.append(f"{1 / self.s_per_byte:.3g} B/s")
    eff = f" (≈ {', '.join(parts)})" if parts else ""
    text = (f"linear step-time model t = {self.intercept_s:.3g} s + {self.s_per_flop:.3g} s/FLOP"
            f" + {self.s_per_byte:.3g} s/byte"
            + (f" + {self.s_per_layer:.3g} s/layer" if self.s_per_layer else "") + eff)
    return f"{self.note}: {text}" if self.note else text


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

  def predict(self, shape: budget.ModelShape, global_batch_size: int,
              microbatches: int = 1) -> float:
    """Seconds per step: the measurement if this exact step was measured (scaled by the
    fit's M-microbatch over one-batch ratio for ``microbatches`` > 1), else the fit."""
    hit = self.table.get(self.key(shape, global_batch_size))
    fit = self.fallback.predict(shape, global_batch_size, microbatches)
    return fit if hit is None else hit * fit / self.fallback.predict(shape, global_batch_size)

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


def fit_relative(X: np.ndarray, y: np.ndarray) -> np.ndarray:
  """Non-negative coefficients minimising Σ((X·coef)/y − 1)² (relative errors).

  Columns are scaled to a maximum of 1 before the non-negative least-squares
  solve (``scipy.optimize.nnls``, Lawson & Hanson 1974) and the coefficients
  scaled back.

  Args:
    X: [n_rows, n_features] features (e.g. 1, FLOPs, bytes per step).
    y: [n_rows] measured seconds (> 0).
  Returns:
    [n_features] coefficients, all >= 0.
  """
  from scipy import optimize  # scipy is a dependency of chinchax; imported when fitting

  scale = np.maximum(np.abs(X).max(axis=0), 1e-30)
  coef, _ = optimize.nnls((X / scale) / y[:, None], np.ones_like(y))
  return coef / scale


def fit_linear_step_time(rows: Iterable[dict], *, profile: work.ExecutionProfile,
                         n_devices: int = 1, use_bytes: bool = True) -> LinearStepTime:
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
  coef = fit_relative(np.asarray(X), np.asarray(y))
  return LinearStepTime(float(coef[0]), float(coef[1]), float(coef[2]), profile, n_devices,
                        name="linear" if use_bytes else "linear-flops-only")


def heldout_errors(rows: list[dict], test_indices: Iterable[int], *,
                   profile: work.ExecutionProfile, n_devices: int = 1) -> dict:
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
  profile = work.ExecutionProfile.from_names(str(raw.get("compute_dtype", "float32")),
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


# Fitted linear predictors by name: (uses FLOPs, uses bytes). "Time Matters" (Inbar & Sernau
# 2024, arXiv 2406.18922) compares FLOPs with memory traffic as the predictor of step time.
# Linear predictors: (uses FLOPs, uses bytes, uses n_layers).
LINEAR_PREDICTORS = {"flops": (True, False, False), "bytes": (False, True, False),
                     "flops+bytes": (True, True, False), "flops+bytes+layers": (True, True, True)}


def _field(d: dict, key: str, what: str, *, number: bool = True, default: Any = None):
  """d[key] (a finite number >= 0 when ``number``); StepTimeError naming a missing/bad key."""
  value = d.get(key, default)
  if value is None:
    raise StepTimeError(f"{what} lacks {key!r}")
  if number and (isinstance(value, bool) or not isinstance(value, (int, float))
                 or not math.isfinite(value) or value < 0):
    raise StepTimeError(f"{what}: {key}={value!r} must be a finite number >= 0")
  return value


def model_from_dict(d: dict, *, source: str = "") -> StepTimeModel:
  """The step-time model that a fit's ``step_time`` section describes (seconds per step).

  Linear predictors t = intercept_s + s_per_flop · FLOPs + s_per_byte · bytes per device
  per step (:class:`LinearStepTime`, features of :mod:`chinchax.cost.work`)::

    {"predictor": "flops" | "bytes" | "flops+bytes" | "flops+bytes+layers", "intercept_s": s,
     "s_per_flop": s/FLOP, "s_per_byte": s/byte, "s_per_layer": s/layer (those it uses),
     "compute_dtype": "float32" | "bfloat16", "attention": "xla" | "cudnn", "n_devices": int}

  or the analytic roofline (:class:`RooflineStepTime`)::

    {"predictor": "roofline", "hardware": spec (e.g. "cpu"), "compute_dtype", "attention",
     "mfu": fraction (default 0.5), "bandwidth_efficiency": fraction (default 0.7)}

  Optional ``label`` (e.g. "IsoTime fit's bytes predictor") and ``heldout_mape`` (mean |predicted
  / measured − 1| on held-out shapes) go into :meth:`describe`, with ``source``; ``name`` is the
  predictor's.

  Raises:
    StepTimeError: not a dict, an unknown predictor, or a missing or bad key (named).
  """
  what = f"step-time section{f' of {source}' if source else ''}"
  if not isinstance(d, dict):
    raise StepTimeError(f"{what} must be a JSON object, got {type(d).__name__}")
  predictor = _field(d, "predictor", what, number=False)
  if predictor not in LINEAR_PREDICTORS and predictor != "roofline":
    raise StepTimeError(f"{what}: predictor={predictor!r} is not one of "
                        f"{', '.join([*LINEAR_PREDICTORS, 'roofline'])}")
  profile = work.ExecutionProfile.from_names(str(_field(d, "compute_dtype", what, number=False)),
                                             str(_field(d, "attention", what, number=False)))
  note = str(d.get("label") or f"{predictor} step-time predictor")
  mape = d.get("heldout_mape")
  if isinstance(mape, (int, float)) and math.isfinite(mape):
    note += f" (held-out MAPE {100 * mape:.1f}%)"
  if source:
    note += f" from {source}"
  if predictor == "roofline":
    hw = hardware_lib.parse_hardware(str(_field(d, "hardware", what, number=False)))
    mfu = float(_field(d, "mfu", what, default=DEFAULT_MFU))
    bw = float(_field(d, "bandwidth_efficiency", what, default=DEFAULT_BANDWIDTH_EFFICIENCY))
    if not (0 < mfu <= 1 and 0 < bw <= 1):
      raise StepTimeError(f"{what}: mfu={mfu!r} and bandwidth_efficiency={bw!r} must lie in (0, 1]")
    return RooflineStepTime(hw, mfu=mfu, bandwidth_efficiency=bw, profile=profile, note=note)
  uses_flops, uses_bytes, uses_layers = LINEAR_PREDICTORS[predictor]
  n_devices = _field(d, "n_devices", what)
  if int(n_devices) != n_devices or n_devices < 1:
    raise StepTimeError(f"{what}: n_devices={n_devices!r} must be an integer >= 1")
  return LinearStepTime(
      float(_field(d, "intercept_s", what)),
      float(_field(d, "s_per_flop", what)) if uses_flops else 0.0,
      float(_field(d, "s_per_byte", what)) if uses_bytes else 0.0,
      profile, int(n_devices), name=predictor, note=note,
      s_per_layer=float(_field(d, "s_per_layer", what)) if uses_layers else 0.0)


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


def model_startup_s(model: Any, shape: budget.ModelShape, global_batch_size: int) -> float:
  """Start-up seconds a model predicts before the steady state (0 for a model without any)."""
  f = getattr(model, "startup_s", None)
  return float(f(shape, global_batch_size)) if f is not None else 0.0
