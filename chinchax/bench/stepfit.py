"""Step-time models scored on one bench sweep, and its measurements written for ``chinchax plan``.

Two models, each with the analytic features of ``chinchax.cost.hardware`` (what
``plan`` uses) and with XLA's own cost analysis: t = t0 + a·FLOPs, and
t = t0 + a·FLOPs + b·bytes ("Time Matters", Inbar & Sernau 2024).
"""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np

from chinchax.cost import step_time as step_time_lib
from chinchax.cost import work as work_lib


def _measurement(r: dict) -> dict:
  """A bench row as one measurement of the step-time file (``hardware.write_step_time_file``)."""
  return {"d_model": r["d_model"], "n_layers": r["n_layers"], "n_heads": r["n_heads"],
          "d_ff": r["d_ff"], "vocab_size": r["vocab_size"], "seq_len": r["seq_len"],
          "global_batch_size": r["global_batch_size"], "tie_embeddings": True,
          "step_time_s": r["step_time_s"], "startup_s": r.get("startup_s")}


def heldout_indices(n: int, k: int) -> list[int]:
  """``k`` indices spread over the interior of ``range(n)`` (the ends stay in the fit)."""
  if n - k < 3:
    raise ValueError(f"{n} points cannot hold out {k} and keep 3 to fit")
  lo, hi = (1, n - 2) if n - 2 >= k else (0, n - 1)
  idx = sorted({int(round(x)) for x in np.linspace(lo, hi, k)})
  rest = [i for i in range(n) if i not in idx]
  while len(idx) < k:  # rounding merged two: take the nearest unused
    idx.append(rest.pop(len(rest) // 2))
  return sorted(idx)


def fit_step_time(rows: list[dict], *, sweep: str, n_heldout: int, hardware_spec: str,
                  path: pathlib.Path | None = None) -> dict:
  """Fits and scores the FLOPs-only and FLOPs+bytes step-time models on one sweep.

  Points are ordered by FLOPs; ``n_heldout`` interior ones are held out. The
  analytic features (``hardware.step_flops``, ``hardware.bytes_per_step``) are
  scored by ``hardware.heldout_errors``; XLA's ``cost_analysis`` FLOPs and
  bytes accessed per device are scored the same way. Every ok point of the
  sweep goes to ``path`` in the step-time file format (``plan
  --step-time-model``).

  Returns:
    {"sweep", "n_points", "heldout": {"flops_only": {...}, "flops_and_bytes":
    {...}, "xla_flops_only": {...}, "xla_flops_and_bytes": {...}}, each with
    "errors" (predicted / measured − 1 per held-out point), "mean_abs_error",
    "model"; "heldout_points"; "path"} — or with "skipped" saying why.
  """
  ok = [r for r in rows if r["status"] == "ok" and sweep in r["sweeps"].split(",")]
  out: dict[str, Any] = {"sweep": sweep, "n_points": len(ok), "path": None}
  if len(ok) < 3:
    out["skipped"] = f"{len(ok)} ok points in sweep {sweep!r}; a fit needs at least 3"
    return out
  r0 = ok[0]
  attention = "xla" if r0["attention"] == "xla" else "cudnn"
  profile = work_lib.ExecutionProfile.from_names(r0["compute_dtype"], attention)
  n_dev = r0["n_devices"]
  meas = [_measurement(r) for r in ok]
  proto = step_time_lib.LinearStepTime(0.0, 0.0, 0.0, profile, n_dev)
  order = sorted(range(len(ok)), key=lambda i: proto.features(
      *step_time_lib.measurement_shape(meas[i])[:2])[0])
  ok = [ok[i] for i in order]
  meas = [meas[i] for i in order]
  if path is not None:
    step_time_lib.write_step_time_file(path, meas, hardware=hardware_spec, n_devices=n_dev,
                                       compute_dtype=r0["compute_dtype"], attention=attention)
    out["path"] = str(path)
  try:
    held = heldout_indices(len(ok), n_heldout)
  except ValueError as e:
    out["skipped"] = str(e)
    return out
  out["heldout_points"] = [ok[i]["name"] for i in held]
  out["heldout"] = step_time_lib.heldout_errors(meas, held, profile=profile, n_devices=n_dev)
  if all(r.get("xla_flops") and r.get("xla_bytes_accessed") for r in ok):
    X = np.array([[1.0, r["xla_flops"], r["xla_bytes_accessed"]] for r in ok])
    y = np.array([r["step_time_s"] for r in ok])
    train = np.array([i not in held for i in range(len(ok))])
    for key, cols in (("xla_flops_only", [0, 1]), ("xla_flops_and_bytes", [0, 1, 2])):
      coef = step_time_lib.fit_relative(X[train][:, cols], y[train])
      errs = [float(X[i, cols] @ coef / y[i] - 1.0) for i in held]
      desc = f"t = {coef[0]:.3g} s + {coef[1]:.3g} s/FLOP"
      if len(cols) == 3:
        desc += f" + {coef[2]:.3g} s/byte (XLA cost analysis, per device)"
      out["heldout"][key] = {"errors": errs, "mean_abs_error": float(np.mean(np.abs(errs))),
                             "model": desc}
  return out
