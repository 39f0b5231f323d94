"""The fit report: a JSON file with every number and a short markdown summary.

JSON layout (``fit.json``):

* ``input``: source, run counts (fitted, failed), budgets, ranges of N, D, C, loss,
  and ``eval_noise``: the eval noise floor (median, min and max over runs of
  the final eval loss's standard error over its eval windows, the runs that
  have one, the windows per run), or null when the table has no SEs.
* top level ``E``, ``A``, ``B``, ``alpha``, ``beta``, ``a``, ``b``, ``G`` — the
  Approach-3 law when Approach 3 was fitted (so that
  :func:`chinchax.laws.parametric.get_law` can load the file and ``chinchax plan`` can use it).
* ``approach1`` / ``approach2`` / ``approach3``: ``status`` ("ok" | "skipped"
  with ``reason``), the parameters, ``fit_range_flops`` ((C_min, C_max) of the
  budgets used, so ``chinchax plan --law fit.json`` can warn about
  extrapolation), ``warnings``, ``ci`` (95% bootstrap intervals of every
  parameter and exponent), ``std`` and ``bootstrap`` (how it was drawn).
* ``warnings``: every warning as {"approach", "message"} (also in ``fit.md``).
* ``agreement``: Approaches 1 and 2's |Δa| against 0.05 and Approach 3's form
  check (:func:`analysis.isoflop.diagnostics.agreement`; "Agreement" in ``fit.md``).
* ``frontier``: per C, each approach's N_opt, D_opt, tokens per parameter,
  predicted loss (Approach 3) and the bootstrap interval of N_opt.
* ``published``: the published laws' exponents and their allocation at the
  data's largest C, for comparison.
* ``repeat`` (a table whose runs repeat data, D > unique_tokens): the repetition laws'
  fits (:mod:`analysis.repeat.report`: form, params, intervals, leave-one-unique-size-out
  errors, the validation run's predictions); Approaches 1-3 then fit the runs of one epoch
  or less.
* ``runs``: each fitted run's run_id, N, D, tokens_per_param, C (6ND), budget, loss and
  loss_se (the eval standard error; null without one); fit.md tabulates them.
* ``recipe``: what the fitted runs shared (tokenizer, corpus, seq_len, shape family, init,
  LR/batch rule, schedule, optimizer, N kind; :mod:`analysis.recipe`), and ``units``: what
  the law's loss is measured in (:class:`chinchax.laws.units.LossUnits`).
"""

from __future__ import annotations

import json
import math
import os
from typing import Sequence

import numpy as np

from chinchax.laws import parametric as laws
from analysis.isoflop import approach2
from analysis import recipe as recipe_lib
from analysis import profile as profile_lib
from analysis.repeat import report as repeat_report
from analysis import validation as validation_lib
from analysis.isoflop.approach1 import APPROACH1_QUADRATIC_SIZES
from analysis.isoflop.approach3 import THETA_NAMES
from analysis.isoflop.approaches import APPROACHES
from analysis.isoflop.bootstrap import BootstrapResult, percentile_interval, residual_pool
from analysis.isoflop.diagnostics import agreement, agreement_markdown
from analysis.isoflop.fit import FitReport


def _f(x) -> float | None:
  """JSON-safe float (NaN/inf -> None)."""
  if x is None:
    return None
  x = float(x)
  return x if math.isfinite(x) else None


def _fmt(x, digits: int = 4) -> str:
  if x is None or (isinstance(x, float) and not math.isfinite(x)):
    return "–"
  x = float(x)
  if x != 0 and (abs(x) >= 1e5 or abs(x) < 1e-3):
    return f"{x:.{digits - 1}e}"
  return f"{x:.{digits}g}"


def _boot_dict(boot: BootstrapResult | None) -> dict:
  if boot is None:
    return {"ci": None, "std": None, "bootstrap": None}
  return {
      "ci": {k: [_f(lo), _f(hi)] for k, (lo, hi) in boot.ci.items()},
      "std": {k: _f(v) for k, v in boot.std.items()},
      "bootstrap": {"n_resamples": boot.n_resamples, "n_failed": boot.n_failed,
                    "seed": boot.seed, "level": boot.level, "method": boot.method,
                    "resampling": boot.resampling, "residual_sd": _f(boot.residual_sd),
                    "residual_dof": boot.residual_dof,
                    "wall_time_s": round(boot.wall_time_s, 3),
                    "failures": dict(boot.failures), "bounds_rule": boot.bounds_rule,
                    "budgets_left_out": [{"C": _f(C), "n_resamples": n}
                                         for C, n in sorted(boot.budgets_left_out.items())]},
  }


def _loss_function(res) -> str:
  """The Approach-3 objective in words."""
  text = "sum of Huber(LSE(logA - alpha ln N, logB - beta ln D, logE) - ln L)"
  if res.weighted:
    text = text.replace("sum of", "weighted sum of")
  if res.asymmetry != 1.0:
    text += f", times {res.asymmetry:g} where the law predicts a lower loss than observed"
  return text


def _approach_dict(key: str, res, boot, warnings: Sequence[str] = ()) -> dict:
  d: dict = {"status": "ok"}
  d.update({k: _f(v) for k, v in res.params().items()})
  if key in ("1", "2"):
    d["fit_range_flops"] = [_f(v) for v in res.law.fit_range_flops]
  if key == "1":
    d.update({"envelope": res.envelope, "edge_fraction": _f(res.edge_fraction),
              "n_envelope_points": int(len(res.C)),
              "C_range": [_f(res.C[0]), _f(res.C[-1])],
              "distinct_N_on_envelope": int(res.n_winning_sizes)})
  elif key == "2":
    d.update({"n_budgets_used": len(res.used), "n_budgets_left_out": len(res.left_out),
              "window": res.window, "noise_floor": _f(res.noise_floor),
              "noise_t": approach2.NOISE_T,
              "budgets_below_noise": [_f(p.C) for p in res.below_noise],
              "budgets": [p.to_dict() for p in res.budgets]})
    for b in d["budgets"]:
      for k, v in list(b.items()):
        if isinstance(v, float):
          b[k] = _f(v)
  elif key == "3":
    d.update({
        "objective": _f(res.objective), "huber_delta": res.delta,
        "loss_function": _loss_function(res),
        "asymmetry": res.asymmetry, "weighted": res.weighted,
        "grid_box": ({n: [float(a), float(b)] for n, a, b in zip(THETA_NAMES, *res.grid_box)}
                     if res.grid_box is not None else None),
        "optimizer": "scipy.optimize.minimize L-BFGS-B, analytic gradient",
        "n_starts": res.n_starts, "n_starts_at_best": res.n_starts_at_best,
        "n_interior_starts_at_best": res.n_interior_starts_at_best,
        "best_start": dict(zip(THETA_NAMES, (float(v) for v in res.best_start))),
        "best_start_on_grid_edge": res.best_start_on_grid_edge,
        "optimum_inside_grid": res.optimum_inside_grid,
        "converged": res.converged, "n_iter": res.n_iter,
        "wall_time_s": round(res.wall_time_s, 3),
        "residual_rms": _f(np.sqrt(np.mean(res.residuals ** 2))),
        "fit_range_flops": [_f(v) for v in res.fit_range_flops],
    })
  d["warnings"] = list(warnings)
  d.update(_boot_dict(boot))
  return d


def _frontier_rows(report: FitReport) -> list[dict]:
  runs = report.runs
  cmax = runs.C.max()
  lo = math.floor(math.log10(runs.C.min()))
  hi = math.ceil(math.log10(report.frontier_C.max()))
  rows = []
  for e in range(lo, hi + 1):
    C = 10.0 ** e
    row: dict = {"C": C, "extrapolated": bool(C > cmax * 1.0001 or C < runs.C.min() / 1.0001)}
    for k, res in sorted(report.results.items()):
      law = res.law
      n_opt, d_opt = law.optimal_allocation(C)
      entry = {"N_opt": _f(n_opt), "D_opt": _f(d_opt), "tokens_per_param": _f(d_opt / n_opt)}
      if law.has_loss:
        entry["loss"] = _f(law.optimal_loss(C))
      boot = report.bootstraps.get(k)
      if boot is not None and boot.samples:
        ns = []
        for i in range(len(next(iter(boot.samples.values())))):
          params = {p: boot.samples[p][i] for p in boot.samples}
          ns.append(_law_like(k, params).optimal_allocation(C)[0])
        if ns:
          entry["N_opt_ci"] = [_f(v) for v in percentile_interval(ns, boot.level)]
      row[f"approach{k}"] = entry
    rows.append(row)
  return rows


def _law_like(key: str, params: dict) -> laws.Law:
  if key == "3":
    return laws.ParametricLaw(name="boot", E=params["E"], A=params["A"], B=params["B"],
                              alpha=params["alpha"], beta=params["beta"])
  return laws.PowerLawAllocation(name="boot", k_N=params["k_N"], a=params["a"])


def report_dict(report: FitReport, compare: Sequence[laws.Law] = (),
                figures: Sequence[str] = ()) -> dict:
  """Every number of a fit as a JSON-ready dict (layout in the module docstring)."""
  runs = report.runs
  out: dict = {
      "input": {
          "source": runs.source, "n_runs": len(runs), "n_failed": runs.n_failed,
          "n_budgets": int(len(runs.budgets())),
          "budgets_from": "C_budget column" if runs.has_budget_column else "C = 6ND grouped",
          "budgets": [_f(b) for b in runs.budgets()],
          "has_eval_curves": runs.curves is not None,
          "N_range": [_f(runs.N.min()), _f(runs.N.max())],
          "D_range": [_f(runs.D.min()), _f(runs.D.max())],
          "C_range": [_f(runs.C.min()), _f(runs.C.max())],
          "loss_range": [_f(runs.loss.min()), _f(runs.loss.max())],
          "eval_noise": _noise_dict(runs),
          "units": {"N": "parameters", "D": "tokens", "C": "FLOPs (6ND)", "loss": "nats/token"},
      },
      "approaches_requested": list(report.requested),
  }
  if "3" in report.results:
    a3 = report.results["3"]
    out.update({k: _f(v) for k, v in a3.params().items()})
    out["fit_range_flops"] = [_f(v) for v in a3.fit_range_flops]
    out["law_from"] = "approach3"
  for key in APPROACHES:
    if key in report.results:
      out[f"approach{key}"] = _approach_dict(key, report.results[key], report.bootstraps.get(key),
                                             report.warnings.get(key, ()))
    elif key in report.skipped:
      out[f"approach{key}"] = {"status": "skipped", "reason": report.skipped[key]}
  if "approach3" in out and report.profiles.get("3"):
    out["approach3"]["profile"] = report.profiles["3"]
  out["warnings"] = [{"approach": k, "message": m} for k in APPROACHES
                     for m in report.warnings.get(k, ())]
  pool = residual_pool(runs)    # the runs' scatter, as fit_all judges Approach 3's warnings by
  out["agreement"] = agreement(report.results, pool.sd if pool.dof > 0 else None)
  out["frontier"] = _frontier_rows(report)
  cmax = float(runs.C.max())
  pub = {}
  for law in compare:
    n_opt, d_opt = law.optimal_allocation(cmax)
    entry = law.to_dict()
    entry.update({"at_C": cmax, "N_opt": n_opt, "D_opt": d_opt, "tokens_per_param": d_opt / n_opt})
    if law.has_loss:
      entry["loss"] = law.optimal_loss(cmax)
    pub[law.name] = entry
  out["published"] = pub
  out["recipe"] = recipe_lib.table_recipe(runs.source)
  out["units"] = recipe_lib.table_units(runs.source, out["recipe"]).to_dict()
  out["figures"] = [os.path.basename(p) for p in figures]
  out["runs"] = _run_rows(runs)
  if runs.held_out:
    out["validation"] = validation_lib.validation_block(out, runs.held_out[-1])
  if report.repeat is not None:
    out["repeat"] = (report.repeat if isinstance(report.repeat, dict)
                     else report.repeat.to_dict())
  return out


def _noise_dict(runs) -> dict | None:
  noise = runs.eval_noise()
  if noise is None:
    return None
  return {k: (_f(v) if isinstance(v, float) else v) for k, v in noise.to_dict().items()}


def _noise_line(inp: dict) -> str:
  """The eval noise floor in one sentence."""
  noise = inp.get("eval_noise")
  if not noise:
    return ("Eval noise floor: not measured (the table has no final_eval_loss_se; train with "
            "train.eval_windows > 0).")
  windows = (f", {noise['eval_windows']:,} eval windows per run" if noise["eval_windows"]
             else "")
  return (f"Eval noise floor: median standard error of the final eval loss "
          f"{_fmt(noise['median_se'])} nats/token (range {_fmt(noise['min_se'])}–"
          f"{_fmt(noise['max_se'])}) over {noise['n_runs']} of {inp['n_runs']} runs{windows}; "
          f"Approach 2 leaves out a budget whose curvature is within "
          f"{approach2.NOISE_T:g} standard errors of 0 propagated from these SEs.")


def _bounds_text(boot: dict) -> str:
  """fit.md's sentence on the bounds rule on a and the replicates it removed."""
  b = boot.get("bounds_rule")
  if not b:
    return ""
  n = b["dropped_below_0"] + b["dropped_above_1"]
  cut = (f" ({b['dropped_below_0']} at or below 0, {b['dropped_above_1']} at or above 1): the "
         f"interval of a is truncated there" if n else "")
  return (f" Bounds rule: {b['rule']} (N_opt or D_opt would shrink as C grows); it removed "
          f"{n}{cut}.")


def _ci_text(d: dict, key: str) -> str:
  ci = (d.get("ci") or {}).get(key)
  if not ci or ci[0] is None:
    return ""
  return f" [{_fmt(ci[0])}, {_fmt(ci[1])}]"


def _run_rows(runs) -> list[dict]:
  """Each fitted run: run_id, N, D, D/N, C = 6ND (FLOPs), budget, loss and its eval s.e."""
  se = runs.loss_se if runs.loss_se is not None else [None] * len(runs)
  return [{"run_id": runs.run_id[i], "N": _f(runs.N[i]), "D": _f(runs.D[i]),
           "tokens_per_param": _f(runs.D[i] / runs.N[i]), "C": _f(runs.C[i]),
           "budget": _f(runs.budget[i]), "loss": _f(runs.loss[i]), "loss_se": _f(se[i])}
          for i in np.lexsort((runs.N, runs.budget))]


def _run_table(rows: list[dict]) -> list[str]:
  """The fit.md table of the fitted runs (budget, then N order)."""
  lines = ["## Runs fitted", "", "| run | N | D | D/N | C = 6ND (FLOPs) | loss ± eval s.e. |",
           "|---|---:|---:|---:|---:|---|"]
  for r in rows:
    se = f" ± {r['loss_se']:.4f}" if r.get("loss_se") is not None else ""
    lines.append(f"| `{r['run_id']}` | {r['N']:,.0f} | {r['D']:,.0f} | "
                 f"{r['tokens_per_param']:.1f} | {r['C']:.3g} | {r['loss']:.4f}{se} |")
  return lines + [""]


def markdown(data: dict) -> str:
  """A short markdown summary of :func:`report_dict`'s output."""
  inp = data["input"]
  lines = ["# Scaling-law fit", ""]
  lines.append(f"Input: `{inp['source']}` — {inp['n_runs']} runs fitted, {inp['n_failed']} failed "
               f"(ignored); {inp['n_budgets']} IsoFLOP budgets ({inp['budgets_from']}); "
               f"N {_fmt(inp['N_range'][0])}–{_fmt(inp['N_range'][1])} params, "
               f"C {_fmt(inp['C_range'][0])}–{_fmt(inp['C_range'][1])} FLOPs, "
               f"loss {_fmt(inp['loss_range'][0])}–{_fmt(inp['loss_range'][1])} nats/token.")
  lines += ["", _noise_line(inp), ""]
  if data.get("warnings"):
    lines += ["## Warnings", ""]
    lines += [f"- Approach {w['approach']}: {w['message']}" for w in data["warnings"]]
    lines.append("")
  lines += ["## Exponents (N_opt ∝ C^a, D_opt ∝ C^b; 95% bootstrap intervals)", "",
            "| law | a | b |", "|---|---|---|"]
  for key in APPROACHES:
    d = data.get(f"approach{key}")
    if d is None:
      continue
    if d["status"] != "ok":
      lines.append(f"| Approach {key} | skipped | {d['reason']} |")
      continue
    lines.append(f"| Approach {key} | {_fmt(d['a'])}{_ci_text(d, 'a')} | "
                 f"{_fmt(d['b'])}{_ci_text(d, 'b')} |")
  for name, p in data.get("published", {}).items():
    lines.append(f"| {name} (published) | {_fmt(p['a'])} | {_fmt(p['b'])} |")
  lines.append("")
  lines += agreement_markdown(data.get("agreement"))
  if data.get("validation"):
    lines += validation_lib.markdown(data["validation"])
  rep = data.get("repeat")
  if rep and rep.get("status") == "ok":
    lines += repeat_report.markdown(rep)
  elif rep:
    lines += ["## Data-constrained runs (repeated data)", "",
              f"Not fitted: {rep.get('reason')}.", ""]
  d3 = data.get("approach3")
  if d3 and d3["status"] == "ok":
    lines += ["## Approach 3: L(N, D) = E + A / N^alpha + B / D^beta", "",
              "| parameter | value | 95% CI |", "|---|---|---|"]
    for k in ("E", "A", "B", "alpha", "beta", "a", "b", "G"):
      ci = (d3.get("ci") or {}).get(k)
      ci_s = f"[{_fmt(ci[0])}, {_fmt(ci[1])}]" if ci and ci[0] is not None else "–"
      lines.append(f"| {k} | {_fmt(d3[k], 5)} | {ci_s} |")
    bs = d3["best_start"]
    lines += ["", f"Summed Huber loss (δ = {d3['huber_delta']:g}) {_fmt(d3['objective'])} after "
              f"L-BFGS from {d3['n_starts']} starts ({d3['wall_time_s']:.1f} s); "
              f"{d3['n_starts_at_best']} starts reached the best optimum "
              f"({d3['n_interior_starts_at_best']} of them from the grid's interior). Best start "
              f"(logA, logB, logE, alpha, beta) = ({', '.join(_fmt(v) for v in bs.values())}), "
              f"{'ON' if d3['best_start_on_grid_edge'] else 'not on'} the grid's edge; optimum "
              f"{'inside' if d3['optimum_inside_grid'] else 'OUTSIDE'} the grid. "
              f"Residual RMS (ln L) {_fmt(d3['residual_rms'])}."]
    if d3["n_interior_starts_at_best"] == 0:
      lines.append("WARNING: only starts on the grid's edge reached the best optimum; a wider "
                   "grid of starts might find a better one.")
    prof = d3.get("profile") or {}
    if prof.get("a"):
      lines.append(f"Profile likelihood: {profile_lib.describe('a', prof['a'])}; "
                   f"{profile_lib.describe('b', prof['b'])} (ln A, ln B, ln E and alpha + beta "
                   f"re-optimised at each point; threshold "
                   f"{prof['calibration']['text']}).")
    if d3.get("bootstrap"):
      lines.append(f"Bootstrap: {d3['bootstrap']['method']} ({d3['bootstrap']['wall_time_s']:.1f} s"
                   f", {d3['bootstrap']['n_failed']} failed).{_bounds_text(d3['bootstrap'])}")
    lines.append("")
  for key in ("1", "2"):
    d = data.get(f"approach{key}")
    if d and d["status"] == "ok":
      lines.append(f"## Approach {key}: N_opt = k_N C^a")
      lines.append("")
      lines.append(f"k_N = {_fmt(d['k_N'])}{_ci_text(d, 'k_N')}, a = {_fmt(d['a'])}"
                   f"{_ci_text(d, 'a')}; k_D = {_fmt(d['k_D'])}, b = {_fmt(d['b'])}"
                   f"{_ci_text(d, 'b')}.")
      if d.get("bootstrap"):
        lines.append(f"Bootstrap: {d['bootstrap']['method']} ({d['bootstrap']['wall_time_s']:.1f}"
                     f" s, {d['bootstrap']['n_failed']} failed).{_bounds_text(d['bootstrap'])}")
      if key == "1":
        how = ("the minimum of a quadratic in ln N through the winning size and up to "
               f"{APPROACH1_QUADRATIC_SIZES} sizes either side" if d.get("envelope") == "quadratic"
               else "the winning size")
        lines.append(f"Envelope: {d['n_envelope_points']} FLOP values, N_opt = {how}, "
                     f"{d['distinct_N_on_envelope']} sizes winning some of them; "
                     f"{100 * d['edge_fraction']:.0f}% of points won by the smallest or largest N.")
      if key == "2" and d.get("window"):
        lines.append(f"Each parabola fitted on the sizes within {d['window']} places of the "
                     f"lowest observed loss.")
      if key == "2":
        lines += ["", "| C (FLOPs) | sizes | N_opt | D_opt | loss_min | status |",
                  "|---|---|---|---|---|---|"]
        few = [b for b in d["budgets"] if b["status"] == "too-few-sizes"]
        for b in d["budgets"]:
          if b["status"] == "too-few-sizes" and len(few) > 5:
            continue
          # A reason the Warnings section gives already is said there only.
          said = b["reason"] and any(b["reason"] in m for m in d.get("warnings", ()))
          status = b["status"] + (f": {b['reason']}" if b["reason"] and not said else
                                  " (see Warnings)" if said else "")
          lines.append(f"| {_fmt(b['C'])} | {b['n_sizes']} | {_fmt(b['N_opt'])} | "
                       f"{_fmt(b['D_opt'])} | {_fmt(b['loss_opt'])} | {status} |")
        if len(few) > 5:
          lines.append(f"\n{len(few)} further budgets have fewer than 3 model sizes (left out; "
                       f"listed in fit.json).")
      lines.append("")
  keys = [k for k in APPROACHES if data.get(f"approach{k}", {}).get("status") == "ok"]
  if keys:
    lines += ["## Compute-optimal frontier (* = extrapolated beyond the data)", "",
              "| C (FLOPs) | " + " | ".join(f"A{k}: N_opt | A{k}: D_opt | A{k}: D/N" for k in keys)
              + (" | A3: loss |" if "3" in keys else " |"),
              "|---|" + "---|---|---|" * len(keys) + ("---|" if "3" in keys else "")]
    for row in data["frontier"]:
      cells = [f"{_fmt(row['C'])}{'*' if row['extrapolated'] else ''}"]
      for k in keys:
        e = row[f"approach{k}"]
        cells += [_fmt(e["N_opt"]), _fmt(e["D_opt"]), _fmt(e["tokens_per_param"], 3)]
      if "3" in keys:
        cells.append(_fmt(row["approach3"]["loss"]))
      lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
  if data.get("recipe"):
    lines += recipe_lib.markdown_lines(data["recipe"], data.get("units"))
  if data.get("runs"):
    lines += _run_table(data["runs"])
  if data.get("figures"):
    lines += ["## Figures", ""] + [f"- {f}" for f in data["figures"]] + [""]
  return "\n".join(lines)


def write_report(report: FitReport, out_dir: str, compare: Sequence[laws.Law] = (),
                 figures: Sequence[str] = ()) -> tuple[str, str]:
  """Writes ``fit.json`` and ``fit.md`` into ``out_dir``; returns their paths."""
  os.makedirs(out_dir, exist_ok=True)
  return write_json_and_markdown(report_dict(report, compare, figures), out_dir)


def write_json_and_markdown(data: dict, out_dir: str) -> tuple[str, str]:
  """Writes a :func:`report_dict` dict as ``fit.json`` and ``fit.md``; returns their paths."""
  json_path = os.path.join(out_dir, "fit.json")
  md_path = os.path.join(out_dir, "fit.md")
  with open(json_path, "w") as f:
    json.dump(data, f, indent=2, allow_nan=False)
  with open(md_path, "w") as f:
    f.write(markdown(data))
  return json_path, md_path
