"""The IsoTime fit's files: ``fit.json``, ``fit.md`` and two figures, written atomically.

``fit.json`` keys (seconds, FLOPs, bytes, nats/token; no NaN, unknowns are null):

* ``kind``: "isotime"; ``source``: the results table; ``name``: the law's name for
  ``chinchax plan --law``;
* ``E``, ``A``, ``B``, ``alpha``, ``beta``, ``fit_range_flops``: the law L(N, D) at the top
  level (``chinchax.laws.parametric.law_from_dict`` reads them), and ``law``: the same with ``from``
  (in-sample Approach 3 on these runs, or the file given) and ``in_sample``;
* ``n_runs``, ``n_failed``, ``n_validation``, ``n_other``, ``n_shapes``, ``budgets_s``,
  ``runs`` (per fitted run: run_id, seconds_budget, N_target, d_model, n_layers, aspect, N,
  D, loss, step_time_s);
* ``predictors``: per step-time predictor ("Time Matters", Inbar & Sernau 2024) its
  held-out (leave-one-shape-out) MAPE, R², largest errors, all-rows coefficients and
  per-run held-out predictions (``runs`` order); ``chosen_predictor``;
* ``step_time``: the chosen predictor for ``chinchax.cost.step_time.model_from_dict``;
* ``loss_prediction``: per run the loss predicted from shape and seconds, median and worst
  |relative error|;
* ``wider_vs_deeper``: per budget the time-optimal, predicted-optimal and FLOP-optimal
  shapes, loss vs aspect per N level, a verdict; ``answer``;
* ``validation`` (after :func:`analysis.isotime.fit.add_isotime_validation`); ``figures``.
"""

from __future__ import annotations

import json
import math
import os
import uuid

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import ticker  # noqa: E402

from analysis import io as io_lib
from analysis.isotime import steptime_cv

_MARKERS = {"flops": "o", "bytes": "s", "flops+bytes": "D", "roofline": "^", "xla-flops": "v",
            "xla-bytes": "P"}


def run_summary(row: dict) -> dict:
  """One fitted run as fit.json's ``runs`` lists it."""
  shape, gbs = steptime_cv.row_shape(row)
  return {"run_id": row["run_id"], "seconds_budget": float(row["seconds_budget"]),
          "N_target": float(row.get("N_target") or row["N"]), "d_model": shape.d_model,
          "n_layers": shape.n_layers, "aspect": shape.d_model / shape.n_layers,
          "global_batch_size": gbs, "N": row["N"], "D": row["D"],
          "loss": row["final_eval_loss"], "step_time_s": row["step_time_s"],
          "step_time_measured_s": steptime_cv.measured_step_time(row)}


def finite(x):
  """``x`` with NaN and infinite floats replaced by None (strict JSON)."""
  if isinstance(x, dict):
    return {k: finite(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [finite(v) for v in x]
  if isinstance(x, float) and not math.isfinite(x):
    return None
  return x


def _pct(x, digits: int = 2) -> str:
  return "–" if x is None else f"{100 * x:.{digits}f}%"


def _g(x, digits: int = 4) -> str:
  return "–" if x is None else f"{x:.{digits}g}"


def markdown(data: dict) -> str:
  """fit.md: predictors, the chosen one, loss-prediction errors, wider vs deeper, validation."""
  lines = ["# IsoTime fit", "",
           f"Table `{data['source']}`: {data['n_runs']} finished grid runs on "
           f"{data['n_shapes']} shapes, budgets {', '.join(f'{b:g}' for b in data['budgets_s'])}"
           f" s ({data['n_failed']} failed; {data['n_validation']} validation run(s) held out, "
           f"never fitted"
           + (f"; {len(data['untimed'])} without a measured step time left out"
              if data.get("untimed") else "") + ").", "",
           "## Step-time predictors (leave one shape out)", "",
           "Predictors of \"Time Matters\" (Inbar & Sernau 2024, arXiv 2406.18922): each fitted "
           "one is fitted on the other shapes and predicts the held-out shape's seconds per "
           "step, scored against the shape's measured step time: the geometric mean of its run's "
           "and its probe's (the same program timed just before the run), or the run's alone "
           "(last MAPE column).", "",
           "| predictor | held-out MAPE | held-out R² | max abs error (s) | in-sample MAPE | "
           "coefficients | held-out MAPE vs the run alone |", "|---|---|---|---|---|---|---|"]
  for name, p in data["predictors"].items():
    if p["status"] != "ok":
      lines.append(f"| {name} | skipped: {p['reason']} | | | | | |")
      continue
    coefs = ", ".join(f"{k} {v:.3g}" for k, v in p["coefficients"].items())
    mark = " **(chosen)**" if name == data["chosen_predictor"] else ""
    lines.append(f"| {name}{mark} | {_pct(p['heldout_mape'])} | {_g(p['heldout_r2'], 3)} | "
                 f"{_g(p['heldout_max_abs_error_s'], 3)} | {_pct(p['in_sample_mape'])} | "
                 f"{coefs} | {_pct(p.get('heldout_mape_vs_run'))} |")
  st = data["step_time"]
  lines += ["", f"Chosen: **{data['chosen_predictor']}** (lowest held-out MAPE, or the simplest within 5% of it). "
            f"`chinchax plan --law fit.json` uses the `{st['predictor']}` predictor."
            + (f" {st['note']}." if st.get("note") else ""), ""]
  lp = data["loss_prediction"]
  lines += ["## Loss from shape and time", "",
            f"Law: {data['law']['from']} (E {data['E']:.4g}, A {data['A']:.4g}, "
            f"B {data['B']:.4g}, alpha {data['alpha']:.4g}, beta {data['beta']:.4g}"
            + (f", P {data['aspect_term']['P']:.4g}, kappa {data['aspect_term']['kappa']:.4g}"
               if data.get("aspect_term") else "") + "). "
            f"Steps = floor(T / held-out step time of the {lp['predictor']} predictor), "
            f"D = steps · batch · seq_len, L = L(N, D"
            + (", d_model / n_layers" if data.get("aspect_term") else "") + ").", ""]
  forms = data["law"].get("forms")
  if forms:
    lines += ["| law form | leave-one-out median abs error | worst | in-sample median |",
              "|---|---|---|---|"]
    lines += [f"| {f}{' **(chosen)**' if f == data['law']['form'] else ''} | "
              f"{_pct(v['loo_median_abs_rel_error'])} | {_pct(v['loo_max_abs_rel_error'])} | "
              f"{_pct(v['in_sample_median_abs_rel_error'])} |" for f, v in forms.items()]
    lines += [""]
  lines += [
            f"Median |relative error| {_pct(lp['median_abs_rel_error'])}, worst "
            f"{_pct(lp['max_abs_rel_error'])} (run `{lp['worst_run_id']}`).", "",
            "| run | t_pred (s) | D_pred | predicted loss | measured loss | error |",
            "|---|---|---|---|---|---|"]
  for r in lp["rows"]:
    lines.append(f"| {r['run_id']} | {_g(r['step_time_pred_s'])} | {_g(r['D_pred'])} | "
                 f"{_g(r['loss_pred'])} | {_g(r['loss'])} | {_pct(r['rel_error'])} |")
  wvd = data["wider_vs_deeper"]
  lines += ["", "## Wider or deeper (measured, equal N and equal time)", ""]
  for b in wvd["budgets"]:
    t, f = b["time_optimal"], b["flop_optimal"]
    fs = f.get("shape")
    flop = (f"d_model {fs.get('d_model')} × {fs.get('n_layers')} layers, N {_g(fs.get('N'))}"
            if fs else "shape not given")
    pred = b["predicted_optimal"]
    lines += [f"### {b['seconds_budget']:g} s: {b['verdict']}", "",
              f"Time-optimal: `{t['run_id']}` d_model {t['d_model']} × {t['n_layers']} layers "
              f"(aspect {t['aspect']:.3g}), N {_g(t['N'])}, D {_g(t['D'])}, loss "
              f"{t['loss']:.4f}. Predicted optimum: "
              + (f"`{pred['run_id']}` ("
                 f"{'the same' if b['predicted_optimum_is_measured'] else 'another'} run). "
                 if pred else "none. ")
              + f"FLOP-optimal at C {f['C']:.3g}: N_opt {_g(f['N_opt'])} ({flop}).", "",
              "| N level | run | d_model | n_layers | aspect | N | loss | predicted |",
              "|---|---|---|---|---|---|---|---|"]
    for lv in b["levels"]:
      for e in lv["runs"]:
        win = " ★" if e["run_id"] == lv["winner"] else ""
        noise = ", within noise" if lv.get("within_noise") else ""
        lines.append(f"| {_g(lv['N_target'], 3)} ({lv['verdict']}{noise}) | {e['run_id']}{win} | "
                     f"{e['d_model']} | {e['n_layers']} | {e['aspect']:.3g} | {_g(e['N'])} | "
                     f"{e['loss']:.4f} | {_g(e['loss_pred'])} |")
    lines.append("")
  lines += [f"**Answer:** {wvd['answer']}.", ""]
  v = data.get("validation")
  if v:
    lines += ["## Validation run (held out, not fitted)", "",
              f"Run `{v['run_id']}`: {v['seconds_budget']:g} s, N {_g(v['N'])}, D {_g(v['D'])}; "
              f"predicted loss {_g(v['predicted_loss'])} (planner), {_g(v['predicted_loss_fit'])} "
              f"(this fit's law at the planned steps), measured {v['measured_loss']:.4f} "
              f"nats/token: error {_pct(v['rel_error'])} (fit's law: {_pct(v['rel_error_fit'])})."
              f" Step time planned {_g(v['step_time_planned_s'])} s, this fit's predictor "
              f"{_g(v['step_time_fit_s'])} s, measured {_g(v['step_time_s'])} s; trained "
              f"{_g(v['train_time_s'])} s of {v['seconds_budget']:g} s "
              f"({_pct(v['train_time_rel'])}).", ""]
  if data.get("figures"):
    lines += ["## Figures", ""] + [f"- {f}" for f in data["figures"]] + [""]
  return "\n".join(lines)


def plot_step_time(data: dict, path: str) -> None:
  """Held-out predicted vs measured seconds per step, one marker per predictor, y = x line."""
  measured = [r.get("step_time_measured_s", r["step_time_s"]) for r in data["runs"]]
  fig, ax = plt.subplots(figsize=(6, 5.5))
  for name, p in data["predictors"].items():
    if p["status"] != "ok":
      continue
    lab = f"{name}: MAPE {100 * p['heldout_mape']:.1f}%"
    ax.scatter(measured, p["heldout_predictions_s"], marker=_MARKERS.get(name, "x"), s=22,
               alpha=0.75, label=lab + (" (chosen)" if name == data["chosen_predictor"] else ""))
  lo, hi = min(measured) / 1.5, max(measured) * 1.5
  ax.plot([lo, hi], [lo, hi], color="k", lw=0.8)
  ax.set_xscale("log")
  ax.set_yscale("log")
  ax.set_xlabel("measured step time (s)")
  ax.set_ylabel("predicted step time, shape held out (s)")
  ax.set_title("Step-time predictors, leave one shape out (Inbar & Sernau 2024)", fontsize=9)
  ax.legend(fontsize=7)
  ax.grid(True, which="both", alpha=0.2)
  try:
    io_lib.save_figure_atomic(fig, path, format="png", dpi=130, bbox_inches="tight")
  finally:
    plt.close(fig)


def plot_loss_vs_aspect(data: dict, path: str) -> None:
  """Loss vs d_model / n_layers (log x), one line per time budget × N level."""
  fig, ax = plt.subplots(figsize=(7, 5))
  budgets = data["wider_vs_deeper"]["budgets"]
  cmap = plt.get_cmap("viridis")
  for i, b in enumerate(budgets):
    col = cmap(0.9 * i / max(1, len(budgets) - 1))
    for j, lv in enumerate(b["levels"]):
      es = lv["runs"]
      ax.plot([e["aspect"] for e in es], [e["loss"] for e in es], marker="os^Dv"[j % 5],
              color=col, lw=1, ms=5, label=f"{b['seconds_budget']:g} s, N ≈ {lv['N_target']:.3g}")
      win = [e for e in es if e["run_id"] == lv["winner"]]
      ax.scatter([e["aspect"] for e in win], [e["loss"] for e in win], marker="*", s=120,
                 color=col, edgecolor="k", zorder=4)
  ax.set_xscale("log")
  ax.xaxis.set_major_formatter(ticker.ScalarFormatter())
  ax.xaxis.set_minor_formatter(ticker.NullFormatter())
  ax.set_xlabel("aspect d_model / n_layers (right: wider, shallower)")
  ax.set_ylabel("final eval loss (nats/token)")
  ax.set_title("Loss vs aspect at equal N and equal training time (★ lowest)", fontsize=9)
  ax.legend(fontsize=6, ncol=2)
  ax.grid(True, which="both", alpha=0.2)
  try:
    io_lib.save_figure_atomic(fig, path, format="png", dpi=130, bbox_inches="tight")
  finally:
    plt.close(fig)


def write_outputs(data: dict, out_dir: str, *, figures: bool = True) -> list[str]:
  """Writes the figures (when ``figures``; their names go into ``data["figures"]``), fit.json
  and fit.md into ``out_dir``, each to a temporary name first and renamed into place only
  when every file was written, so a failure leaves the earlier files whole. Returns the paths."""
  os.makedirs(out_dir, exist_ok=True)
  temps: dict[str, str] = {}

  def temp(name: str) -> str:  # a unique name beside the file, default permissions
    p = os.path.join(out_dir, f".{name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    temps[name] = p
    return p

  try:
    if figures:
      plot_step_time(data, temp("step_time_predictors.png"))
      plot_loss_vs_aspect(data, temp("loss_vs_aspect.png"))
      data["figures"] = ["step_time_predictors.png", "loss_vs_aspect.png"]
    clean = finite(data)
    text = json.dumps(clean, indent=2, allow_nan=False)
    with open(temp("fit.json"), "w") as f:
      f.write(text + "\n")
    with open(temp("fit.md"), "w") as f:
      f.write(markdown(clean))
  except BaseException:
    for p in temps.values():
      if os.path.exists(p):
        os.unlink(p)
    raise
  final = []
  for name, p in temps.items():
    os.replace(p, os.path.join(out_dir, name))
    final.append(os.path.join(out_dir, name))
  return final
