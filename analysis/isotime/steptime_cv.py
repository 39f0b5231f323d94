"""Step-time predictors compared leave-one-shape-out on an IsoTime table's measured steps.

"Time Matters" (Inbar & Sernau 2024, arXiv 2406.18922) predicts the wall-clock
seconds of a train step from its memory traffic (bytes) better than from its
FLOPs. This module scores that claim on measured rows: each predictor is fitted
on all shapes but one and predicts the held-out shape's step time (seconds),
for every shape in turn (leave-one-shape-out, LOSO).

Predictors (features per device per step, :mod:`chinchax.cost.work` under the row's
compute dtype, attention kernel and device count):

* ``flops``: t = t0 + a·FLOPs (executed matmul FLOPs);
* ``bytes``: t = t0 + b·bytes (analytic HBM traffic, the paper's proxy);
* ``flops+bytes``: t = t0 + a·FLOPs + b·bytes;
* ``flops+bytes+layers``: t = t0 + a·FLOPs + b·bytes + c·n_layers — each layer's fixed
  cost (its kernels' launch and dispatch), which FLOPs and bytes miss on narrow models;
* ``roofline``: the analytic :class:`chinchax.cost.step_time.RooflineStepTime` of the
  row's hardware (not fitted);
* ``xla-flops``, ``xla-bytes``: t = t0 + a·x with x XLA's cost analysis of the
  compiled step (``probe.xla_flops``, ``probe.xla_bytes_accessed``), when every
  row has it. They need a compiled step, so they cannot price an unseen shape.

Fits minimise relative errors with non-negative coefficients
(:func:`chinchax.cost.step_time.fit_relative`). Scores on the held-out predictions:
MAPE (mean |predicted / measured − 1|), R² (1 − SS_res / SS_tot on seconds)
and the largest absolute error (seconds).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from chinchax.cost import budget
from chinchax import errors as errors_lib
from chinchax.cost import hardware as hardware_lib
from chinchax.cost import step_time as step_time_lib
from chinchax.cost import work

FITTED = ("flops", "bytes", "flops+bytes", "flops+bytes+layers")
XLA = ("xla-flops", "xla-bytes")
ANALYTIC = ("roofline",)
# Coefficient names of each fitted predictor's features after the intercept.
_COEFS = {"flops": ("s_per_flop",), "bytes": ("s_per_byte",),
          "flops+bytes": ("s_per_flop", "s_per_byte"),
          "flops+bytes+layers": ("s_per_flop", "s_per_byte", "s_per_layer"),
          "xla-flops": ("s_per_xla_flop",),
          "xla-bytes": ("s_per_xla_byte",)}
MIN_SHAPES = 3  # a held-out shape plus at least two to fit an intercept and a slope on
_SHAPE_KEYS = ("d_model", "n_layers", "n_heads", "d_ff", "vocab_size", "seq_len")


def row_shape(row: dict) -> tuple[budget.ModelShape, int]:
  """(shape, global_batch_size) of an IsoTime results row."""
  s = row["shape"]
  shape = budget.ModelShape(tie_embeddings=bool(s.get("tie_embeddings", True)),
                            **{k: int(s[k]) for k in _SHAPE_KEYS})
  return shape, int(row["hparams"]["global_batch_size"])


def shape_key(row: dict) -> tuple:
  """What tells shapes apart: (d_model, n_layers, n_heads, d_ff, vocab_size, seq_len, batch)."""
  shape, gbs = row_shape(row)
  return tuple(getattr(shape, k) for k in _SHAPE_KEYS) + (gbs,)


def row_profile(row: dict) -> work.ExecutionProfile:
  """How the row's step executed (activation bytes, attention kernel)."""
  return work.ExecutionProfile.from_names(str(row.get("compute_dtype", "float32")),
                                          str(row.get("attention", "xla")))


def analytic_features(row: dict) -> tuple[float, float]:
  """(executed matmul FLOPs, HBM bytes) of one train step per device (:mod:`chinchax.cost.work`)."""
  shape, gbs = row_shape(row)
  n, prof = int(row.get("n_devices", 1)), row_profile(row)
  return (work.step_flops(shape, gbs, n_devices=n, profile=prof),
          work.bytes_per_step(shape, gbs, n_devices=n, profile=prof))


def has_xla_features(rows: list[dict]) -> bool:
  """Whether every row's probe carries XLA's FLOPs and bytes accessed (positive numbers)."""
  def ok(r):
    p = r.get("probe") or {}
    return all(isinstance(p.get(k), (int, float)) and p[k] > 0
               for k in ("xla_flops", "xla_bytes_accessed"))
  return bool(rows) and all(ok(r) for r in rows)


def feature_matrix(rows: list[dict], predictor: str) -> np.ndarray:
  """[n_rows, 1 + k] features of a fitted predictor: a column of ones (the intercept t0, seconds)
  then FLOPs and/or bytes per device per step."""
  cols = []
  for r in rows:
    if predictor in XLA:
      p = r["probe"]
      cols.append([1.0, float(p["xla_flops" if predictor == "xla-flops" else
                                 "xla_bytes_accessed"])])
      continue
    f, b = analytic_features(r)
    uses_f, uses_b, uses_l = step_time_lib.LINEAR_PREDICTORS[predictor]
    cols.append([1.0] + ([f] if uses_f else []) + ([b] if uses_b else [])
                + ([float(r["shape"]["n_layers"])] if uses_l else []))
  return np.asarray(cols, dtype=np.float64)


def measured_step_time(row: dict) -> float:
  """The shape's measured seconds per step: the geometric mean of the run's own step time
  (``step_time_s``) and its probe's (``probe.step_time_s``: the same program, timed on the same
  core just before the run) when the row has both, else the run's.

  Two timings of one program on this kind of host differ by 6-8% (the pace of a pinned core
  drifts between calls), so the mean of two halves the variance a predictor is scored against;
  the run's own figure alone is scored too (``heldout_mape_vs_run``).
  """
  run = float(row["step_time_s"])
  probe = (row.get("probe") or {}).get("step_time_s")
  if isinstance(probe, (int, float)) and not isinstance(probe, bool) and probe > 0:
    return float(np.sqrt(run * float(probe)))
  return run


def scores(pred: np.ndarray, measured: np.ndarray) -> dict:
  """MAPE, R² (on seconds) and the largest absolute error (seconds and relative)."""
  rel = pred / measured - 1.0
  ss_tot = float(np.sum((measured - measured.mean()) ** 2))
  ss_res = float(np.sum((pred - measured) ** 2))
  return {"heldout_mape": float(np.mean(np.abs(rel))),
          "heldout_r2": 1.0 - ss_res / ss_tot if ss_tot > 0 else None,
          "heldout_max_abs_error_s": float(np.max(np.abs(pred - measured))),
          "heldout_max_abs_rel_error": float(np.max(np.abs(rel)))}


def _coef_dict(predictor: str, coef: np.ndarray) -> dict:
  out = {"intercept_s": float(coef[0])}
  out.update({name: float(c) for name, c in zip(_COEFS[predictor], coef[1:])})
  return out


def _fitted(rows: list[dict], predictor: str, groups: list[tuple]) -> dict:
  X = feature_matrix(rows, predictor)
  y = np.array([measured_step_time(r) for r in rows])
  keys = [shape_key(r) for r in rows]
  pred = np.empty_like(y)
  for g in groups:
    test = np.array([k == g for k in keys])
    coef = step_time_lib.fit_relative(X[~test], y[~test])
    pred[test] = X[test] @ coef
  coef = step_time_lib.fit_relative(X, y)
  in_sample = X @ coef
  return {"kind": "fitted", "status": "ok", **scores(pred, y),
          "heldout_mape_vs_run": _mape_vs_run(pred, rows),
          "in_sample_mape": float(np.mean(np.abs(in_sample / y - 1.0))),
          "coefficients": _coef_dict(predictor, coef),
          "heldout_predictions_s": pred.tolist()}


def roofline_hardware(row: dict, table: dict) -> hardware_lib.Hardware:
  """The row's accelerator (its ``hardware`` spec) on the row's ``n_devices`` devices."""
  hw = hardware_lib.parse_hardware(str(row.get("hardware")), table)
  n = int(row.get("n_devices", hw.n_devices))
  if n == hw.n_devices:
    return hw
  return hardware_lib.Hardware(hw.accelerator, n, f"{n}x{hw.accelerator.name}")


def _mape_vs_run(pred: np.ndarray, rows: list[dict]) -> float:
  """Held-out MAPE against the runs' own step times alone."""
  run = np.array([float(r["step_time_s"]) for r in rows])
  return float(np.mean(np.abs(pred / run - 1.0)))


def _roofline(rows: list[dict], table: dict) -> dict:
  y = np.array([measured_step_time(r) for r in rows])
  pred = []
  for r in rows:
    hw = roofline_hardware(r, table)
    model = step_time_lib.RooflineStepTime(hw, profile=row_profile(r))
    pred.append(model.predict(*row_shape(r)))
  pred = np.asarray(pred)
  return {"kind": "analytic", "status": "ok", **scores(pred, y),
          "heldout_mape_vs_run": _mape_vs_run(pred, rows),
          "in_sample_mape": float(np.mean(np.abs(pred / y - 1.0))),
          "coefficients": {"mfu": step_time_lib.DEFAULT_MFU,
                           "bandwidth_efficiency": step_time_lib.DEFAULT_BANDWIDTH_EFFICIENCY},
          "heldout_predictions_s": pred.tolist()}


def compare_predictors(rows: list[dict], *, warn: Callable[[str], None] = lambda m: None,
                       hardware_table: dict | None = None) -> dict:
  """Scores every step-time predictor leave-one-shape-out on measured rows.

  Args:
    rows: finished IsoTime rows (shape, hparams.global_batch_size, step_time_s in seconds,
      hardware, n_devices, compute_dtype, attention, optionally probe).
    warn: printer for a predictor that cannot be scored (e.g. unknown hardware).
    hardware_table: accelerator table for the roofline (default: chinchax's).
  Returns:
    {"predictors": {name: {kind, status, heldout_mape, heldout_r2, heldout_max_abs_error_s,
    heldout_max_abs_rel_error, in_sample_mape, coefficients (the all-rows fit; seconds per
    FLOP or byte), heldout_predictions_s (per row, in ``rows`` order)}}, "chosen": the name
    :func:`choose` picks (lowest held-out MAPE, the simplest within 5%), "n_shapes": distinct
    shapes}. A predictor that could not
    be scored has status "skipped" and a "reason".
  Raises:
    ValueError: fewer than :data:`MIN_SHAPES` distinct shapes.
  """
  groups = list(dict.fromkeys(shape_key(r) for r in rows))
  if len(groups) < MIN_SHAPES:
    raise ValueError(f"comparing step-time predictors leave-one-shape-out needs at least "
                     f"{MIN_SHAPES} distinct shapes (d_model, n_layers, ..., batch), got "
                     f"{len(groups)}")
  names = list(FITTED) + (list(XLA) if has_xla_features(rows) else [])
  out = {name: _fitted(rows, name, groups) for name in names}
  try:
    out["roofline"] = _roofline(rows, hardware_table or hardware_lib.load_accelerators())
  except errors_lib.UserError as e:
    out["roofline"] = {"kind": "analytic", "status": "skipped", "reason": str(e)}
    warn(f"step-time predictor roofline skipped: {e}")
  return {"predictors": out, "chosen": choose(out), "n_shapes": len(groups)}


# A predictor with more features must beat a simpler one's held-out MAPE by more than this
# (relative) to be chosen: on a table whose truth is bytes alone, flops+bytes(+layers) fits
# the noise too and can edge ahead by a hair out of sample.
PARSIMONY = 0.05


def n_params(name: str, predictor: dict) -> int:
  """Coefficients a predictor fits (the roofline: none)."""
  return len(predictor.get("coefficients", {})) if predictor.get("kind") == "fitted" else 0


def choose(predictors: dict) -> str:
  """The predictor to use: the fewest coefficients among those whose held-out MAPE is within
  :data:`PARSIMONY` of the lowest, then the lowest MAPE."""
  ok = {k: v for k, v in predictors.items() if v["status"] == "ok"}
  best = min(v["heldout_mape"] for v in ok.values())
  near = [k for k, v in ok.items() if v["heldout_mape"] <= best * (1.0 + PARSIMONY)]
  return min(near, key=lambda k: (n_params(k, ok[k]), ok[k]["heldout_mape"], k))


def best_analytic(predictors: dict) -> str:
  """The predictor with the lowest held-out MAPE among those that price any shape (not XLA's)."""
  ok = {k: v for k, v in predictors.items() if v["status"] == "ok" and k not in XLA}
  return min(ok, key=lambda k: (ok[k]["heldout_mape"], k))


def step_time_section(predictors: dict, chosen: str, rows: list[dict]) -> dict:
  """The fit's ``step_time`` section for ``chinchax.cost.step_time.model_from_dict``.

  The chosen predictor's all-rows coefficients (seconds, seconds per FLOP, seconds per byte)
  with the profile and device count of the rows (the most common when they differ). An
  XLA-feature predictor cannot price an unseen shape: the best analytic one stands in and
  ``fallback_from`` names the chosen one.
  """
  name = chosen if chosen not in XLA else best_analytic(predictors)
  p = predictors[name]
  common = {key: most_common([str(r.get(key, default)) for r in rows])
            for key, default in (("compute_dtype", "float32"), ("attention", "xla"),
                                 ("n_devices", 1), ("hardware", None))}
  sec = {"predictor": name, "label": f"IsoTime fit's {name} predictor",
         "heldout_mape": p["heldout_mape"], "heldout_r2": p["heldout_r2"],
         "compute_dtype": common["compute_dtype"], "attention": common["attention"],
         "n_devices": int(common["n_devices"]),
         "hardware": None if common["hardware"] == "None" else common["hardware"],
         "fallback_from": chosen if name != chosen else None}
  if name == "roofline":
    sec.update(p["coefficients"])
    if sec["hardware"] and sec["n_devices"] > 1:
      sec["hardware"] = roofline_hardware(
          {"hardware": sec["hardware"], "n_devices": sec["n_devices"]},
          hardware_lib.load_accelerators()).spec
  else:
    c = p["coefficients"]
    sec.update({"intercept_s": c["intercept_s"], "s_per_flop": c.get("s_per_flop", 0.0),
                "s_per_byte": c.get("s_per_byte", 0.0), "s_per_layer": c.get("s_per_layer", 0.0)})
  if sec["fallback_from"]:
    sec["note"] = (f"{chosen} (lowest held-out MAPE) needs XLA's cost analysis of a compiled "
                   f"step, which an unseen shape lacks; {name} is the best predictor that "
                   f"prices any shape")
  return sec


def most_common(values: list[str]) -> str:
  """The most frequent value (the first seen among equals)."""
  return max(dict.fromkeys(values), key=values.count)
