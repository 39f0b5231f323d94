"""Figures of a fit, written as PNG and SVG (matplotlib, Agg backend).

* ``isoflop``: loss vs N per IsoFLOP budget with the fitted parabolas and
  their minima (Chinchilla Fig. 3); without usable budgets, the data coloured
  by C with the Approach-3 law's IsoFLOP slices (Chinchilla Fig. 4, right).
* ``frontier``: N_opt(C) and D_opt(C) of each fitted approach with its
  bootstrap band, and the published laws beside them (Chinchilla Fig. 1/A3).
* ``contours``: Approach-3 loss contours over (N, D) with the data, the
  compute-optimal frontier and IsoFLOP lines C = 6ND (Chinchilla Fig. 4, left).
* ``residuals``: ln L_pred - ln L of Approach 3 vs N and vs C (or the
  parabola residuals of Approach 2 when Approach 3 was not fitted).
* ``repeat`` (runs that repeat data): loss vs epochs per unique size with both
  repetition laws (:func:`analysis.repeat.report.plot_repeat`).
* ``starts`` (with a user-given Approach-3 start grid): the objective over
  the grid's (alpha, beta) plane, at the starts and where L-BFGS ended from
  them (lowest over the other coordinates), with the optimum marked.
"""

from __future__ import annotations

import os
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from chinchax.laws import parametric as laws
from analysis import figures as figures_lib
from analysis.isoflop.approach3 import THETA_NAMES, huber_objective  # noqa: E402
from analysis.isoflop.fit import FitReport  # noqa: E402
from analysis.repeat import report as repeat_report
from analysis.runs import flops_6nd, tokens_6nd  # noqa: E402

_APPROACH_COLORS = {"1": "tab:blue", "2": "tab:orange", "3": "tab:green"}
_PUBLISHED_STYLES = ("--", ":", "-.", (0, (5, 2, 1, 2)), (0, (1, 3)))


_save = repeat_report.save_figure


def _log_x(ax) -> None:
  """A log x axis labelled at 1, 2 and 5 × each decade only, as ``2e+04`` (no overprinting)."""
  ax.set_xscale("log")
  ax.xaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
  ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: f"{x:.0e}"))
  ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())


def _budget_colors(budgets: np.ndarray):
  logs = np.log10(budgets)
  span = max(float(logs.max() - logs.min()), 1e-9)
  cmap = plt.get_cmap("viridis")
  return {float(b): cmap(0.9 * (np.log10(b) - logs.min()) / span) for b in budgets}


def plot_isoflop(report: FitReport, out_dir: str) -> list[str]:
  """IsoFLOP profiles: loss vs N per budget, parabolas and minima. Returns written paths."""
  runs = report.runs
  fig, ax = plt.subplots(figsize=(7, 5))
  a2 = report.results.get("2")
  a3 = report.results.get("3")
  if a2 is not None:
    colors = _budget_colors(np.array([p.C for p in a2.budgets]))
    for p in a2.budgets:
      sel = runs.budget == p.C
      col = colors[float(p.C)]
      se = None if runs.loss_se is None else np.nan_to_num(runs.loss_se[sel], nan=0.0)
      ax.errorbar(runs.N[sel], runs.loss[sel], yerr=se, fmt="o", ms=4, color=col, capsize=2,
                  lw=0.8, zorder=3, label=f"C = {p.C:.2g} FLOPs")
      if p.coeffs is not None:
        x = np.linspace(np.log(p.N_range[0]) - 0.2, np.log(p.N_range[1]) + 0.2, 100)
        ax.plot(np.exp(x), np.polyval(p.coeffs, x), color=col, lw=1.2)
      if p.status == "ok":
        ax.scatter([p.N_opt], [p.loss_opt], marker="*", s=140, color=col, edgecolor="k",
                   zorder=4)
      elif p.status == "edge" and np.isfinite(p.N_opt):
        ax.scatter([p.N_opt], [p.loss_opt], marker="X", s=80, color=col, edgecolor="k", zorder=4)
    edge = any(p.status == "edge" and np.isfinite(p.N_opt) for p in a2.budgets)
    ax.scatter([], [], marker="*", s=140, color="0.6", edgecolor="k", label="fitted minimum")
    if edge:
      ax.scatter([], [], marker="X", s=80, color="0.6", edgecolor="k",
                 label="minimum at the edge: left out")
    bars = " ± eval s.e." if runs.loss_se is not None else ""
    ax.set_title(f"IsoFLOP profiles (Approach 2): final loss{bars}, parabolas in ln N",
                 fontsize=9)
  else:
    if runs.loss_se is not None:
      ax.errorbar(runs.N, runs.loss, yerr=np.nan_to_num(runs.loss_se, nan=0.0), fmt="none",
                  ecolor="0.6", capsize=2, lw=0.8, zorder=2, label="final loss ± eval s.e.")
    sc = ax.scatter(runs.N, runs.loss, c=np.log10(runs.C), cmap="viridis", s=14, zorder=3)
    fig.colorbar(sc, ax=ax, label="log10 C (FLOPs)")
    if a3 is not None:
      law = a3.law
      for C in np.geomspace(runs.C.min(), runs.C.max(), 6):
        N = np.geomspace(runs.N.min() / 2, runs.N.max() * 2, 200)
        ax.plot(N, law.loss(N, tokens_6nd(C, N)), color="0.4", lw=0.8)
        n_opt, _ = law.optimal_allocation(C)
        ax.scatter([n_opt], [law.optimal_loss(C)], marker="*", s=80, color="k", zorder=4)
      ax.plot([], [], color="0.4", lw=0.8, label="the law's IsoFLOP slices (6 budgets)")
      ax.scatter([], [], marker="*", s=80, color="k", label="the law's optimum on each slice")
      ax.set_title("Data by C, with IsoFLOP slices of the Approach-3 law (★ optimum)", fontsize=9)
    else:
      ax.set_title("Data by C (no IsoFLOP budgets usable for parabolas)", fontsize=9)
  _log_x(ax)
  ax.set_xlabel("N (parameters)")
  ax.set_ylabel("final eval loss (nats/token)")
  if a2 is None or len(a2.budgets) <= 12:
    ax.legend(fontsize=7, loc="upper right")
  ax.grid(True, which="both", alpha=0.2)
  return _save(fig, out_dir, "isoflop")


def plot_frontier(report: FitReport, out_dir: str,
                  compare: Sequence[laws.Law] = ()) -> list[str]:
  """N_opt(C) and D_opt(C) of each fitted approach with its bootstrap band; the published laws
  (their own tokens and corpora: N_opt comparable, D and loss not) in a third, labelled panel.
  Returns the written paths."""
  C = report.frontier_C
  n_panels = 3 if compare else 2
  fig, axes = plt.subplots(1, n_panels, figsize=(6 * n_panels, 5))
  for k, res in sorted(report.results.items()):
    law = res.law
    n_opt, d_opt = law.optimal_allocation(C)
    col = _APPROACH_COLORS[k]
    axes[0].plot(C, n_opt, color=col, lw=2, label=f"Approach {k}: a = {law.a:.3f}")
    axes[1].plot(C, d_opt, color=col, lw=2, label=f"Approach {k}: b = {law.b:.3f}")
    boot = report.bootstraps.get(k)
    if boot is not None and np.all(np.isfinite(boot.frontier_N[0])):
      axes[0].fill_between(boot.frontier_C, *boot.frontier_N, color=col, alpha=0.2, lw=0,
                           label=f"Approach {k}: 95% bootstrap band")
      axes[1].fill_between(boot.frontier_C, *boot.frontier_D, color=col, alpha=0.2, lw=0)
    if k == "2":
      used = res.used
      for ax, y in ((axes[0], [p.N_opt for p in used]), (axes[1], [p.D_opt for p in used])):
        ax.scatter([p.C for p in used], y, color=col, s=30, edgecolor="k", zorder=4,
                   label="Approach 2: each budget's parabola minimum")
    if k == "1":
      step = max(1, len(res.C) // 60)
      for ax, y in ((axes[0], res.N_env[::step]), (axes[1], res.D_env[::step])):
        ax.scatter(res.C[::step], y, color=col, s=6, zorder=3,
                   label="Approach 1: the envelope's run at each C")
  cmin, cmax = report.runs.C.min(), report.runs.C.max()
  if compare:
    ours = report.results.get("3") or next(iter(report.results.values()))
    axes[2].plot(C, ours.law.optimal_allocation(C)[0], color="k", lw=2,
                 label=f"this fit: a = {ours.law.a:.3f}")
    colors = plt.get_cmap("tab10")
    for i, law in enumerate(compare):
      style = _PUBLISHED_STYLES[i % len(_PUBLISHED_STYLES)]
      axes[2].plot(C, law.optimal_allocation(C)[0], color=colors(i + 3), ls=style, lw=1.5,
                   label=f"{law.name} (a = {law.a:.3f})")
    axes[2].set_title("Published laws: fitted on their own tokens and corpora\n"
                      "(N_opt vs C is comparable; their D and loss are not)", fontsize=9)
  labels = ("N_opt (parameters)", "D_opt (tokens of this corpus)", "N_opt (parameters)")
  for ax, ylabel in zip(axes, labels):
    ax.axvspan(cmin, cmax, color="0.9", zorder=0)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("C (FLOPs, C = 6ND); grey span: the data")
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.2)
    ax.legend(fontsize=7)
  axes[0].set_title("Compute-optimal model size, N_opt ∝ C^a", fontsize=9)
  axes[1].set_title("Compute-optimal tokens, D_opt ∝ C^b", fontsize=9)
  return _save(fig, out_dir, "frontier")


def plot_contours(report: FitReport, out_dir: str) -> list[str]:
  """Approach-3 loss contours over (N, D) with data and frontier. Returns paths ([] without A3)."""
  a3 = report.results.get("3")
  if a3 is None:
    return []
  law = a3.law
  runs = report.runs
  N = np.geomspace(runs.N.min() / 3, runs.N.max() * 3, 200)
  D = np.geomspace(runs.D.min() / 3, runs.D.max() * 3, 200)
  NN, DD = np.meshgrid(N, D)
  L = law.loss(NN, DD)
  fig, ax = plt.subplots(figsize=(7, 5.5))
  levels = np.quantile(L, np.linspace(0.02, 0.98, 14))
  cs = ax.contour(NN, DD, L, levels=np.unique(levels), cmap="magma", linewidths=0.8)
  ax.clabel(cs, fontsize=6, fmt="%.2f")
  sc = ax.scatter(runs.N, runs.D, c=runs.loss, cmap="magma", s=14, edgecolor="k", lw=0.3,
                  zorder=3)
  fig.colorbar(sc, ax=ax, label="observed loss (nats/token)")
  C = np.geomspace(flops_6nd(N.min(), D.min()), flops_6nd(N.max(), D.max()), 200)
  n_opt, d_opt = law.optimal_allocation(C)
  inside = (n_opt >= N.min()) & (n_opt <= N.max()) & (d_opt >= D.min()) & (d_opt <= D.max())
  ax.plot(n_opt[inside], d_opt[inside], color="tab:green", lw=2, label="frontier (Approach 3)")
  for Ci in np.geomspace(runs.C.min(), runs.C.max(), 5):
    ax.plot(N, tokens_6nd(Ci, N), color="0.5", lw=0.6, ls=":")
  ax.set_xlim(N.min(), N.max())
  ax.set_ylim(D.min(), D.max())
  ax.set_xscale("log")
  ax.set_yscale("log")
  ax.set_xlabel("N (parameters)")
  ax.set_ylabel("D (tokens)")
  ax.set_title("Loss contours of the fitted L(N, D); dotted: IsoFLOP lines C = 6ND", fontsize=9)
  ax.legend(fontsize=8, loc="upper right")
  return _save(fig, out_dir, "contours")


def plot_residuals(report: FitReport, out_dir: str) -> list[str]:
  """Residuals of Approach 3 (or the Approach-2 parabolas). Returns paths ([] if neither)."""
  runs = report.runs
  a3 = report.results.get("3")
  a2 = report.results.get("2")
  if a3 is None and a2 is None:
    return []
  fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
  se = runs.loss_se if runs.loss_se is not None else np.full(len(runs), np.nan)
  if a3 is not None:
    res = a3.residuals
    ylabel = "ln L_pred − ln L (Approach 3)"
    noise = se / runs.loss  # the eval s.e. in ln L
  else:
    res = np.full(len(runs), np.nan)
    for p in a2.budgets:
      if p.coeffs is not None:
        sel = runs.budget == p.C
        res[sel] = np.polyval(p.coeffs, np.log(runs.N[sel])) - runs.loss[sel]
    ylabel = "parabola − loss (Approach 2, nats/token)"
    noise = se
  noise = noise[np.isfinite(noise)]
  for ax, x, xlabel in ((axes[0], runs.N, "N (parameters)"), (axes[1], runs.C, "C (FLOPs)")):
    sc = ax.scatter(x, res, s=14, c=np.log10(runs.C), cmap="viridis", zorder=3)
    ax.axhline(0, color="k", lw=0.8)
    if noise.size:
      m = float(np.median(noise))
      ax.axhspan(-m, m, color="0.6", alpha=0.2, lw=0,
                 label=f"± the runs' median eval s.e. ({m:.2g})")
      ax.legend(fontsize=7, loc="upper right")
    _log_x(ax)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.2)
  fig.colorbar(sc, ax=axes, label="log10 C (FLOPs)", fraction=0.03)
  finite = res[np.isfinite(res)]
  rms = float(np.sqrt(np.mean(finite ** 2))) if finite.size else float("nan")
  fig.suptitle(f"Residuals of the fit, coloured by budget (RMS {rms:.4f})", fontsize=10)
  return _save(fig, out_dir, "residuals")


def _plane_min(alpha: np.ndarray, beta: np.ndarray, values: np.ndarray):
  """Lowest value per (alpha, beta) pair: (alpha axis, beta axis, grid (n_beta, n_alpha))."""
  ax_a, ax_b = np.unique(alpha), np.unique(beta)
  out = np.full((ax_b.size, ax_a.size), np.inf)
  ia, ib = np.searchsorted(ax_a, alpha), np.searchsorted(ax_b, beta)
  np.minimum.at(out, (ib, ia), values)
  return ax_a, ax_b, out


def plot_starts(report: FitReport, out_dir: str) -> list[str]:
  """The Approach-3 objective over a user-given start grid. Returns paths ([] without one)."""
  a3 = report.results.get("3")
  if a3 is None or report.options.grid is None or a3.starts is None:
    return []
  runs = report.runs
  args = (np.log(runs.N), np.log(runs.D), np.log(runs.loss), a3.delta, runs.weight,
          a3.asymmetry)
  at_start = np.array([huber_objective(x0, *args)[0] for x0 in a3.starts])
  ia, ib = THETA_NAMES.index("alpha"), THETA_NAMES.index("beta")
  fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
  for ax, values, title in ((axes[0], at_start, "objective at the start"),
                            (axes[1], a3.final_objectives, "objective where L-BFGS ended")):
    xa, xb, grid = _plane_min(a3.starts[:, ia], a3.starts[:, ib], values)
    shown = np.log10(np.where(np.isfinite(grid) & (grid > 0), grid, np.nan))
    mesh = ax.pcolormesh(xa, xb, shown, shading="nearest", cmap="viridis")
    fig.colorbar(mesh, ax=ax, label="log10 objective (lowest over logA, logB, logE)")
    ax.scatter([a3.alpha], [a3.beta], marker="*", s=160, color="tab:red", edgecolor="k",
               zorder=4, label=f"optimum (alpha {a3.alpha:.3f}, beta {a3.beta:.3f})")
    ax.set_xlabel("alpha")
    ax.set_ylabel("beta")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="upper right")
  fig.suptitle(f"Approach 3 over the start grid ({len(a3.starts)} starts)", fontsize=10)
  return _save(fig, out_dir, "starts")


def make_figures(report: FitReport, out_dir: str,
                 compare: Sequence[laws.Law] = ()) -> list[str]:
  """Writes every figure that the fitted approaches allow; returns the paths (PNG and SVG)."""
  os.makedirs(out_dir, exist_ok=True)
  paths = []
  paths += plot_isoflop(report, out_dir)
  paths += figures_lib.plot_curves(report.runs, report.results.get("1"), out_dir)
  if report.results:
    paths += plot_frontier(report, out_dir, compare)
  paths += plot_contours(report, out_dir)
  paths += plot_residuals(report, out_dir)
  paths += plot_starts(report, out_dir)
  if report.repeat is not None and not isinstance(report.repeat, dict):
    paths += repeat_report.plot_repeat(report.repeat, out_dir)
  return paths
