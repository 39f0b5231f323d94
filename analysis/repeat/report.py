"""The repetition fits of a results table: both forms, intervals, held-out errors, the
validation run, the ``repeat`` block of ``fit.json``, its ``fit.md`` section and figure.

:func:`fit_repeat` runs :mod:`analysis.repeat.fit`'s steps for both forms of
:mod:`chinchax.laws.repeat` (Muennighoff et al. 2023's effective data and parameters; our
one-coefficient additive overfitting penalty described after Lovelace et al. 2026) and says
which fits better: the lower leave-one-unique-size-out RMS relative error (the in-sample
residual RMS when there are fewer than two unique sizes to hold out).
Units: N parameters, D and U tokens, loss nats/token.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import Callable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from chinchax.laws import parametric as laws
from chinchax.laws import repeat as lr
from analysis import io as io_lib
from analysis.isoflop import approach3
from analysis import profile as pl
from analysis.repeat import fit as fr
from analysis.repeat import profile as rprof
from analysis.runs import Runs  # noqa: E402

_FORM_TITLES = {"muennighoff": "Muennighoff et al. 2023 (effective D', N')",
                "overfit": "additive overfitting penalty (our form, after Lovelace et al. 2026)"}
_FORM_STYLES = {"muennighoff": "-", "overfit": "--"}


@dataclasses.dataclass
class RepeatReport:
  """Both forms fitted to one table.

  Attributes:
    base: the single-epoch law; base_from: where it came from (words).
    rows: every run fitted (repeated and not).
    forms: form -> {"law", "theta", "bootstrap", "profile", "loo", "residual_rms",
      "identified"}.
    base_errors: the base law's errors on the repeated runs (repetition ignored).
    validation: per held-out validation run: its N, D, U, epochs, measured loss and each
      form's prediction and relative error.
    better: the better form; verdict: one sentence saying by how much.
  """

  base: laws.ParametricLaw
  base_from: str
  rows: fr.RepeatRows
  forms: dict
  base_errors: dict
  validation: list
  better: str
  verdict: str
  base_mode: str = "fixed"

  @property
  def base_text(self) -> str:
    """Which procedure ran and which base numbers the fitted laws hold, in words."""
    if self.base_mode == "fixed":
      return (f"base held fixed (two-stage, as Muennighoff et al. 2023): {_base_numbers(self.base)}"
              f" from {self.base_from}")
    each = "; ".join(f"{form}: {_base_numbers(f['law'].base)}" for form, f in self.forms.items())
    return (f"base refitted jointly with the repetition constants (--repeat-base joint), from "
            f"{_base_numbers(self.base)} ({self.base_from}) to {each}")

  def to_dict(self) -> dict:
    """The ``repeat`` block of fit.json."""
    forms = {}
    for form, f in self.forms.items():
      forms[form] = {"params": f["law"].params(), "ci": f["bootstrap"]["ci"],
                     "profile": f["profile"],
                     "base": {k: getattr(f["law"].base, k) for k in ("E", "A", "B", "alpha",
                                                                     "beta")},
                     "identified": f["identified"], "residual_rms": f["residual_rms"],
                     "leave_one_unique_out": f["loo"], "bootstrap": {
                         k: v for k, v in f["bootstrap"].items() if k != "ci"},
                     "source": f["law"].source, "title": _FORM_TITLES[form]}
      if form == "overfit":
        forms[form]["optimal_epochs"] = _finite(f["law"].optimal_epochs)
    r = self.rows
    return {"status": "ok", "form": self.better, "verdict": self.verdict,
            "base_mode": self.base_mode, "base_text": self.base_text,
            "base": dict(self.base.to_dict(), fitted_on=self.base_from),
            "input": {"n_runs": len(r.N), "n_repeated": int(r.repeated.sum()),
                      "unique_sizes": sorted({float(u) for u in r.U[r.repeated]}),
                      "max_epochs": float(r.epochs[r.repeated].max())},
            "base_only_on_repeated": self.base_errors, "validation": self.validation,
            "published": {"R_D_star": lr.MUENNIGHOFF_R_D_STAR,
                          "R_N_star": lr.MUENNIGHOFF_R_N_STAR, "source": lr.MUENNIGHOFF_SOURCE},
            **forms}


def _finite(x):
  return float(x) if x is not None and math.isfinite(x) else None


def _base_numbers(b) -> str:
  return (f"E = {b.E:.4g}, A = {b.A:.4g}, B = {b.B:.4g}, alpha = {b.alpha:.4g}, "
          f"beta = {b.beta:.4g}")


def _identified(value: float, ci, prof: dict | None = None) -> bool:
  """Whether a decay constant is pinned down: its profile closes inside the search box on
  both sides (:mod:`analysis.repeat.profile`); without a profile, its optimum inside the box
  and its bootstrap interval off both ends (above 2× the lower bound, below half the upper)."""
  if prof is not None and "identified" in prof:
    return bool(prof["identified"])
  lo, hi = math.log(fr.R_STAR_BOUNDS[0]), math.log(fr.R_STAR_BOUNDS[1])
  inside = lo + 1e-3 < math.log(value) < hi - 1e-3
  return bool(inside and ci is not None and ci[0] > 2 * fr.R_STAR_BOUNDS[0]
              and ci[1] < 0.5 * fr.R_STAR_BOUNDS[1])


def fit_repeat(runs: Runs, base: laws.ParametricLaw | None = None, *, n_bootstrap: int = 200,
               seed: int = 0, log: Callable[[str], None] | None = None,
               base_from: str = "given", base_mode: str = "fixed",
               level: float = pl.CI_LEVEL, refit_base: bool | None = None) -> RepeatReport:
  """Fits both repetition forms to ``runs`` (module docstring; :mod:`analysis.repeat.fit`).

  Args:
    runs: the table, with ``unique_tokens`` (some run must have D > U).
    base: the single-epoch law; None: Approach 3 on the runs of one epoch or less.
    n_bootstrap: bootstrap replicates per form (0: no intervals).
    seed: bootstrap seed.
    log: progress printer.
    base_from: where a given ``base`` comes from, in words (fit.json's ``base.fitted_on``).
    base_mode: "fixed" (the base held: the papers' two-stage procedure) or "joint" (polished
      with the repetition terms); :data:`analysis.repeat.fit.BASE_MODES`.
    level: the profile intervals' confidence level.
    refit_base: with the base held, refit it on each bootstrap replicate's single-epoch runs
      before holding it (a base fitted on this table: its own error belongs in the interval);
      None: True when ``base`` is None (fitted here), False for a given one (a ``--law`` base).

  Raises:
    FitError: no repeated run, or a form that cannot be fitted.
    ApproachUnsupported: fewer than 5 single-epoch runs to fit the base on.
  """
  say = log or (lambda msg: None)
  if base_mode not in fr.BASE_MODES:
    raise ValueError(f"unknown base mode {base_mode!r}; valid: {', '.join(fr.BASE_MODES)}")
  joint = base_mode == "joint"
  refit = base is None if refit_base is None else bool(refit_base)
  base_runs = fr.single_epoch(runs)
  if base is None:
    base = approach3.fit_approach3(base_runs).law
    base_from = f"Approach 3 on the {len(base_runs)} runs of one epoch or less"
  rows = fr.RepeatRows.from_runs(runs)
  forms = {}
  for form in lr.FORMS:
    t0 = time.perf_counter()
    law, theta = fr.fit_form(form, base, rows, joint=joint)
    boot = (fr.bootstrap_form(form, rows, law, theta, n=n_bootstrap, seed=seed, joint=joint,
                              refit_base=refit)
            if n_bootstrap > 0 else {"ci": {k: None for k in law.params()}})
    if boot.get("n_failed"):
      say(f"repeat: {form}: {boot['n_failed']} of {n_bootstrap} bootstrap replicates could not "
          f"be fitted and are left out ({'; '.join(f'{n}x {w}' for w, n in boot['failures'].items())})")
    prof = rprof.profile_form(form, base, rows, law, theta, joint=joint, level=level)
    loo = fr.leave_one_unique_out(form, base, rows, theta, joint=joint)
    for fold in loo.get("failed_folds", []):
      say(f"repeat: {form}: leave-one-out fold U = {fold['unique_tokens']:.4g} could not be "
          f"fitted ({fold['reason']}); left out")
    with np.errstate(all="ignore"):
      resid = np.log(np.asarray(law.loss(rows.N, rows.D, rows.U))) - np.log(rows.loss)
    ident = {}
    for k, v in law.params().items():
      if form == "muennighoff" or k in prof:
        ident[k] = False if v is None else _identified(v, boot["ci"].get(k), prof.get(k))
    forms[form] = {"law": law, "theta": theta, "bootstrap": boot, "loo": loo, "profile": prof,
                   "residual_rms": float(np.sqrt(np.mean(resid ** 2))), "identified": ident}
    say(f"repeat: {form}: {_params_text(law)} fitted with intervals and leave-one-out in "
        f"{time.perf_counter() - t0:.1f} s")
    for line in rprof.profile_lines(form, prof):
      say(f"repeat: {form}: {line}")
  better, verdict = _verdict(forms)
  report = RepeatReport(base=base, base_from=base_from, rows=rows, forms=forms,
                        base_errors=fr.base_only_errors(base, rows),
                        validation=[_validation(row, base, forms) for row in runs.held_out],
                        better=better, verdict=verdict, base_mode=base_mode)
  say(f"repeat: {report.base_text}")
  return report


def _params_text(law) -> str:
  return ", ".join(f"{k} = {v:.4g}" if v is not None else f"{k} not fitted"
                   for k, v in law.params().items())


def _verdict(forms: dict) -> tuple[str, str]:
  key = "rms_rel_error"
  loo = {f: forms[f]["loo"].get(key) for f in forms}
  if all(v is not None for v in loo.values()):
    what, vals = "leave-one-unique-size-out RMS relative error", loo
  else:
    what, vals = "in-sample RMS residual in ln L", {f: forms[f]["residual_rms"] for f in forms}
  better = min(vals, key=vals.get)
  other = next(f for f in vals if f != better)
  ratio = vals[other] / vals[better] if vals[better] > 0 else math.inf
  return better, (f"{better} fits better: {what} {100 * vals[better]:.2f}% vs "
                  f"{100 * vals[other]:.2f}% for {other} ({ratio:.2f}× lower)")


def validation_from_block(block: dict, row: dict) -> dict:
  """A held-out row predicted by the laws of a fit.json ``repeat`` block (each form with its
  own base): the entry :func:`fit_repeat` writes in the block's ``validation``."""
  b = block["base"]
  base = laws.ParametricLaw(name="base", E=b["E"], A=b["A"], B=b["B"], alpha=b["alpha"],
                            beta=b["beta"])
  forms = {}
  for form in lr.FORMS:
    if isinstance(block.get(form), dict):
      fb = block[form].get("base") or b
      form_base = laws.ParametricLaw(name="base", E=fb["E"], A=fb["A"], B=fb["B"],
                                     alpha=fb["alpha"], beta=fb["beta"])
      forms[form] = {"law": lr.law_from_block(block, form_base, form)}
  return _validation(row, base, forms)


def _validation(row: dict, base, forms: dict) -> dict:
  N, D = float(row["N"]), float(row["D"])
  U = float(row["unique_tokens"]) if row.get("unique_tokens") else math.inf
  measured = float(row["final_eval_loss"])
  se = row.get("final_eval_loss_se")
  out = {"run_id": row.get("run_id"), "N": N, "D": D, "unique_tokens": _finite(U),
         "epochs": _finite(D / U), "measured_loss": measured,
         "measured_se": float(se) if se is not None else None, "predictions": {}}
  preds = {"base (no repetition)": float(base.loss(N, D))}
  for form, f in forms.items():
    preds[form] = float(f["law"].loss(N, D, U))
  for k, p in preds.items():
    out["predictions"][k] = {"predicted_loss": p, "rel_error": (measured - p) / p}
  return out


def se_text(v: dict) -> str:
  """" ± SE (s.e.)" for a validation entry's measured loss (its eval windows' standard error;
  "" when the run did not measure one)."""
  se = v.get("measured_se")
  return f" ± {se:.4f} (s.e.)" if se else ""


def _ci_text(ci) -> str:
  return f" [{ci[0]:.4g}, {ci[1]:.4g}]" if ci else ""


def markdown(block: dict) -> list[str]:
  """fit.md's "Data-constrained runs" section of a ``repeat`` block."""
  inp = block["input"]
  lines = ["## Data-constrained runs (repeated data)", "",
           f"{inp['n_repeated']} of {inp['n_runs']} runs repeat data (up to "
           f"{inp['max_epochs']:.3g} epochs) over {len(inp['unique_sizes'])} unique sizes. "
           f"{_first_upper(block.get('base_text') or 'base law: ' + block['base']['fitted_on'])}.",
           "", "| form | parameters (95% bootstrap CI) | 95% profile | identified "
           "| LOO-U RMS rel. error | in-sample RMS ln L |",
           "|---|---|---|---|---|---|"]
  for form in lr.FORMS:
    d = block.get(form)
    if not d:
      continue
    ps = "; ".join(f"{k} = {v:.4g}{_ci_text((d['ci'] or {}).get(k))}" if v is not None
                   else f"{k}: not fitted (no run has excess parameters)"
                   for k, v in d["params"].items())
    ident = ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in d["identified"].items()) or "–"
    loo = d["leave_one_unique_out"].get("rms_rel_error")
    prof = "; ".join(rprof.profile_lines(form, d.get("profile") or {})) or "–"
    lines.append(f"| {d['title']} | {ps} | {prof} | {ident} | "
                 f"{'–' if loo is None else f'{100 * loo:.2f}%'} | {d['residual_rms']:.4g} |")
  pub = block["published"]
  cal = next((block[f]["profile"]["calibration"]["text"] for f in lr.FORMS
              if (block.get(f) or {}).get("profile", {}).get("calibration")), None)
  if cal:
    lines += ["", f"Profile intervals: each parameter held on a grid across its search box, the "
              f"others re-optimised; threshold {cal}. A profile that stays under the threshold "
              f"to the box's edge is not identified by these data (the range it covers is "
              f"shown, not an interval); `profile.png` draws each (unless --no-figures)."
              + (" With the base held fixed the profile is conditional on it: the base's own "
                 "error is not in it (--repeat-base joint re-optimises the base at every "
                 "profile point)." if block.get("base_mode", "fixed") == "fixed" else "")]
  failed = [f"{f}: {block[f]['bootstrap'].get('n_failed')} of "
            f"{block[f]['bootstrap'].get('n_resamples')} bootstrap replicates"
            for f in lr.FORMS if (block.get(f) or {}).get("bootstrap", {}).get("n_failed")]
  failed += [f"{f}: leave-one-out fold U = {x['unique_tokens']:.4g} ({x['reason']})"
             for f in lr.FORMS for x in (block.get(f) or {}).get(
                 "leave_one_unique_out", {}).get("failed_folds", [])]
  if failed:
    lines += ["", "Not fitted (left out, counted): " + "; ".join(failed) + "."]
  lines += ["", f"{block['verdict']}. The base law alone (repetition ignored) is off by "
            f"{100 * block['base_only_on_repeated']['rms_rel_error']:.2f}% RMS on the repeated "
            f"runs. Published (Muennighoff et al. 2023): R_D* = {pub['R_D_star']:.4g}, "
            f"R_N* = {pub['R_N_star']:.4g}."]
  if block.get("overfit", {}).get("optimal_epochs"):
    lines.append(f"The additive form's loss at fixed N and U is lowest at "
                 f"{block['overfit']['optimal_epochs']:.3g} epochs.")
  for v in block.get("validation", []):
    preds = "; ".join(f"{k} {p['predicted_loss']:.4f} ({100 * p['rel_error']:+.2f}%)"
                      for k, p in v["predictions"].items())
    lines.append(f"Validation run `{v['run_id']}` (N {v['N']:.4g}, D {v['D']:.4g}, U "
                 f"{v['unique_tokens'] or float('inf'):.4g}, {v['epochs'] or 0:.3g} epochs): "
                 f"measured {v['measured_loss']:.4f}{se_text(v)}; predicted {preds}.")
  lines.append("")
  return lines


def plot_repeat(report: RepeatReport, out_dir: str) -> list[str]:
  """``repeat``: loss vs epochs per unique size (colour) with both forms' curves at each
  (U, N) of the runs (solid: Muennighoff, dashed: additive), and the validation run (red star)
  with each form's prediction. Returns the PNG and SVG paths."""
  r = report.rows
  sizes = np.unique(r.U[r.repeated])  # the unique sizes some run repeats
  cmap = plt.get_cmap("viridis")
  fig, ax = plt.subplots(figsize=(7, 5))
  for i, U in enumerate(sizes):
    color = cmap(0.9 * i / max(len(sizes) - 1, 1))
    m = np.isclose(r.U, U, rtol=1e-9)
    ax.scatter(r.epochs[m], r.loss[m], color=color, s=22, zorder=3,
               label=f"U = {U:.3g} tokens")
    for N in np.unique(r.N[m]):
      e_max = max(float(r.epochs[m & (r.N == N)].max()), 1.0)
      e = np.geomspace(min(float(r.epochs[m & (r.N == N)].min()), 1.0), e_max * 1.2, 60)
      for form, f in report.forms.items():
        ax.plot(e, f["law"].loss(N, e * U, U), _FORM_STYLES[form], color=color, lw=1, alpha=0.8)
  for v in report.validation:  # the held-out run: measured (star) and each law's prediction
    if not v.get("epochs"):
      continue
    ax.scatter([v["epochs"]], [v["measured_loss"]], marker="*", s=140, color="tab:red",
               zorder=4, label=f"validation run (U = {v['unique_tokens']:.3g}), measured")
    for form, mark in (("muennighoff", "x"), ("overfit", "+")):
      p = v["predictions"].get(form)
      if p:
        ax.scatter([v["epochs"]], [p["predicted_loss"]], marker=mark, s=80, color="tab:red",
                   zorder=4, label=f"validation run, {form} prediction")
  for form in report.forms:
    ax.plot([], [], _FORM_STYLES[form], color="gray", label=_FORM_TITLES[form])
  ax.set_xscale("log")
  ax.set_xlabel("epochs D / U")
  ax.set_ylabel("final eval loss (nats/token)")
  ax.set_title("Repeated data: loss vs epochs per unique size")
  ax.legend(fontsize=7)
  os.makedirs(out_dir, exist_ok=True)
  return save_figure(fig, out_dir, "repeat")


def _first_upper(text: str) -> str:
  return text[:1].upper() + text[1:]


def plot_profiles(profiles: dict, out_dir: str) -> list[str]:
  """``profile``: one small panel per profiled parameter, the statistic 2·lambda·Δf against
  the parameter (log axis for R*), the threshold dashed, the range within it shaded.

  Args:
    profiles: title -> :func:`analysis.profile.profile`'s dict (e.g. "muennighoff R_D_star").
    out_dir: folder.

  Returns:
    The PNG and SVG paths ([] when there is nothing to draw).
  """
  items = [(t, p) for t, p in profiles.items() if p and p.get("grid")]
  if not items:
    return []
  fig, axes = plt.subplots(1, len(items), figsize=(2.6 * len(items), 2.3), squeeze=False)
  for ax, (title, p) in zip(axes[0], items):
    x = np.asarray(p["grid"], dtype=np.float64)
    y = np.asarray([np.nan if v is None else v for v in p["statistic"]], dtype=np.float64)
    ax.plot(x, y, ".-", color="tab:blue", lw=1, ms=3)
    ax.axhline(p["threshold"], ls="--", color="gray", lw=0.8)
    lo, hi = p["covered"]
    ax.axvspan(lo, hi, color="tab:green" if p["identified"] else "tab:red", alpha=0.15)
    if p["identified"]:  # the interval and as much again either side, on a linear axis
      ax.set_xlim(lo - (hi - lo), hi + (hi - lo))
    elif x.min() > 0 and x.max() / x.min() > 50:  # the whole box of a decay constant
      ax.set_xscale("log")
    ax.set_ylim(0, max(3 * p["threshold"], 1.0))
    ax.set_title(f"{title}{'' if p['identified'] else ' (not identified)'}", fontsize=7)
    ax.tick_params(labelsize=6)
  axes[0][0].set_ylabel("2·λ·Δ objective", fontsize=7)
  os.makedirs(out_dir, exist_ok=True)
  return save_figure(fig, out_dir, "profile")


def save_figure(fig, out_dir: str, stem: str) -> list[str]:
  """``fig`` written as ``out_dir/stem.png`` (130 dpi) and ``.svg``, then closed; the paths.
  (The fit's other figures, :mod:`analysis.plots`, are saved through it too.)"""
  paths = []
  for ext in ("png", "svg"):
    path = os.path.join(out_dir, f"{stem}.{ext}")
    try:
      io_lib.save_figure_atomic(fig, path, dpi=130 if ext == "png" else None,
                                bbox_inches="tight")
    except BaseException:
      plt.close(fig)
      raise
    paths.append(path)
  plt.close(fig)
  return paths
