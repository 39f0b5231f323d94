"""The fit's figures of training curves and of the law against held-out data (PNG and SVG).

* ``curves``: every run's eval loss vs the FLOPs it had spent (6 N × tokens seen), coloured by
  N, with Approach 1's envelope — the lowest loss reached at each FLOP count (Hoffmann et al.
  2022, Fig. 2 left). Each run's final loss carries its eval standard error.
* ``validation``: the fitted law against the runs and the held-out validation run: left, N_opt(C)
  with its bootstrap band and the validation run's N at its budget; right, L_opt(C) (the law's
  loss on its own frontier) with every run's final loss ± s.e., and the validation run's measured
  loss ± s.e. beside the law's prediction for it, with a prediction interval of ± 1.96 × the
  RMS of Approach 3's residuals in ln L. Drawn from ``fit.json``, so that
  :func:`analysis.pipeline.add_validation` redraws it once the validation run is trained.
"""

from __future__ import annotations

import numpy as np

from chinchax.laws import parametric as laws
from analysis.repeat import report as repeat_report
from analysis.runs import Runs

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import colors as mcolors  # noqa: E402

_save = repeat_report.save_figure


def plot_curves(runs: Runs, approach1, out_dir: str) -> list[str]:
  """Loss-vs-FLOPs training curves with Approach 1's envelope; [] when the table has no curves.

  Args:
    runs: the fitted runs (``curves``: per run an array (k, 2) of [FLOPs, eval loss]).
    approach1: Approach 1's result (``C``, ``loss_env``), or None when it was not fitted.
    out_dir: where ``curves.png`` / ``.svg`` go.
  """
  if not runs.curves or not any(len(c) for c in runs.curves):
    return []
  fig, ax = plt.subplots(figsize=(7.5, 5))
  norm = mcolors.LogNorm(vmin=runs.N.min(), vmax=max(runs.N.max(), runs.N.min() * 1.01))
  cmap = plt.get_cmap("viridis")
  for i, curve in enumerate(runs.curves):
    c = np.asarray(curve, dtype=float)
    if c.size == 0:
      continue
    col = cmap(norm(runs.N[i]))
    ax.plot(c[:, 0], c[:, 1], color=col, lw=1, alpha=0.85)
    se = None if runs.loss_se is None else runs.loss_se[i]
    ax.errorbar([6.0 * runs.N[i] * runs.D[i]], [runs.loss[i]],
                yerr=None if se is None or not np.isfinite(se) else [[se], [se]],
                fmt="o", ms=3, color=col, capsize=2, lw=0.8)
  if approach1 is not None and len(approach1.C):
    ax.plot(approach1.C, approach1.loss_env, color="k", lw=2, ls="--",
            label="Approach 1 envelope: lowest loss at each C")
  sm = plt.cm.ScalarMappable(norm=norm, cmap=cmap)
  fig.colorbar(sm, ax=ax, label="N (parameters)")
  ax.plot([], [], color="0.4", lw=1, label="a run's eval loss as it trains")
  ax.errorbar([], [], yerr=[], fmt="o", ms=3, color="0.4", capsize=2,
              label="its final loss ± eval s.e.")
  ax.set_xscale("log")
  ax.set_xlabel("FLOPs spent (6 N × tokens seen)")
  ax.set_ylabel("eval loss (nats/token)")
  lo = np.nanmin(runs.loss) - 0.15 * np.ptp(runs.loss) - 0.05
  ax.set_ylim(lo, np.nanmax(runs.loss) + 0.6 * max(np.ptp(runs.loss), 0.2))
  ax.set_title("Training curves of the IsoFLOP runs (Chinchilla Fig. 2, left)", fontsize=9)
  ax.grid(True, which="both", alpha=0.2)
  ax.legend(fontsize=7, loc="upper right")
  return _save(fig, out_dir, "curves")


def _frontier_band(data: dict, key: str, lo: float, hi: float):
  """(C, N_opt lower, N_opt upper) of ``fit.json``'s frontier for approach ``key`` within
  [lo, hi] FLOPs, or None."""
  pts = [(f["C"], *f[key]["N_opt_ci"]) for f in data.get("frontier") or []
         if lo <= f["C"] <= hi
         if isinstance(f.get(key), dict) and f[key].get("N_opt_ci")
         and None not in f[key]["N_opt_ci"]]
  return np.array(pts).T if len(pts) >= 2 else None


def plot_validation(data: dict, runs: Runs, out_dir: str) -> list[str]:
  """N_opt(C) and L_opt(C) of the fitted law with the runs and the validation run (module doc).

  Args:
    data: the fit's ``fit.json`` dict (its law, frontier, residual RMS and ``validation``).
    runs: the fitted runs (N, D, loss, loss_se).
    out_dir: where ``validation.png`` / ``.svg`` go.
  Returns:
    The paths written; [] when ``data`` holds no law with a loss (no Approach 3).
  """
  try:
    law = laws.law_from_dict(data, name="fit")
  except ValueError:
    return []
  if not isinstance(law, laws.ParametricLaw):
    return []
  v = data.get("validation") or None
  C_runs = 6.0 * runs.N * runs.D
  c_hi = max(C_runs.max(), v["C"] if v else 0.0) * 3
  C = np.geomspace(C_runs.min() / 3, c_hi, 200)
  key = str(data.get("law_from") or "approach3")
  fig, (ax_n, ax_l) = plt.subplots(1, 2, figsize=(12, 4.8))
  ax_n.plot(C, law.optimal_allocation(C)[0], color="tab:green", lw=2,
            label=f"N_opt(C) of the fit ({key.replace('approach', 'Approach ')}), "
                  f"a = {law.a:.3f}")
  band = _frontier_band(data, key, C[0], C[-1])
  if band is not None:
    ax_n.fill_between(band[0], band[1], band[2], color="tab:green", alpha=0.2, lw=0,
                      label="95% bootstrap band")
  ax_n.scatter(C_runs, runs.N, s=10, color="0.5", label="the grid's runs")
  if v:
    ax_n.scatter([v["C"]], [v["N"]], marker="*", s=160, color="tab:red", edgecolor="k",
                 zorder=4, label=f"validation run (C = {v['C']:.3g})")
  ax_n.set_yscale("log")
  ax_n.set_ylabel("N (parameters)")
  ax_n.set_title("Compute-optimal model size and the held-out run", fontsize=9)
  ax_l.plot(C, law.optimal_loss(C), color="tab:green", lw=2, label="L_opt(C): the law on its "
                                                                    "frontier")
  se = runs.loss_se if runs.loss_se is not None else np.full(len(runs), np.nan)
  ax_l.errorbar(C_runs, runs.loss, yerr=np.where(np.isfinite(se), se, 0), fmt="o", ms=3,
                color="0.5", capsize=2, lw=0.8, label="the grid's runs ± eval s.e.")
  rms = (data.get("approach3") or {}).get("residual_rms")
  if v and v.get("predicted_loss") is not None:
    pred = v["predicted_loss"]
    if rms:
      lo, hi = pred * np.exp(-1.96 * rms), pred * np.exp(1.96 * rms)
      ax_l.errorbar([v["C"] / 1.08], [pred], yerr=[[pred - lo], [hi - pred]], fmt="D", ms=6,
                    mfc="white", color="tab:green", capsize=4, zorder=4,
                    label=f"predicted {pred:.3f} ± 1.96 × residual RMS")
    else:
      ax_l.scatter([v["C"] / 1.08], [pred], marker="D", s=36, facecolor="white",
                   edgecolor="tab:green", zorder=4, label=f"predicted {pred:.3f}")
    mse = v.get("measured_se") or 0.0
    ax_l.errorbar([v["C"] * 1.08], [v["measured_loss"]], yerr=[[mse], [mse]], fmt="*", ms=12,
                  color="tab:red", mec="k", capsize=4, zorder=5,
                  label=f"measured {v['measured_loss']:.3f}" + (f" ± {mse:.3f}" if mse else "")
                  + f" ({100 * v['rel_error']:+.1f}%)")
  ax_l.set_ylabel(f"eval loss ({(data.get('units') or {}).get('loss', 'nats/token')})")
  ax_l.set_title("Loss on the frontier, L_opt(C), and the held-out run", fontsize=9)
  for ax in (ax_n, ax_l):
    ax.axvspan(C_runs.min(), C_runs.max(), color="0.93", zorder=0)
    ax.set_xscale("log")
    ax.set_xlabel("C (FLOPs, 6ND); grey span: the grid's budgets")
    ax.grid(True, which="both", alpha=0.2)
    ax.legend(fontsize=7)
  return _save(fig, out_dir, "validation")
