"""A finished ladder's figures against the targets of a trustworthy miniature ladder.

    python benchmarks/ladder_acceptance.py WORKDIR [--wall-s SECONDS] [--json OUT]

Reads WORKDIR/results.jsonl and WORKDIR/fit/fit.json (``chinchax ladder``'s
outputs) and prints, as markdown:

* the span of the grid (decades of C) and the wall time (``--wall-s``, as
  timed by ``benchmarks/ladder_acceptance.sh``);
* throughput: Σ 6·N·D over every run (grid and validation) / wall time, and
  as a share of this host's measured float32 matmul peak (the calibration
  ``chinchax train`` caches, ``chinchax.train.mfu``); the median per-run MFU;
* each approach's exponent a with its 95% bootstrap interval and width, the
  largest gap between the approaches' a, Approach 3's E (whether its interval
  reaches 0, the optimum lies outside the box of L-BFGS starts, or only starts
  on the box's edge reach it);
* the mean absolute residual of Approach 2's IsoFLOP parabolas (loss against
  the fitted quadratic in ln N, every size of the budgets it used);
* the validation run's predicted vs measured loss;
* where the runs' own time went, from each run's summary.json: their summed wall
  time, its steps (step time × steps, the first compiling step left out), the
  first step's compilation, and the rest (data check, evals, checkpoints, init).

Targets: ≥ 1.5 decades, Approaches 1 and 2 within 0.05 in a (Approach 3 judged
by its form check: fit.json's ``agreement``), each interval narrower than 0.15, E > 0.05, parabola residual ≤ 0.01 nats, |rel_error| ≤ 2%.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import platform
import re
import statistics
import sys

import numpy as np

from chinchax.train import mfu


def _rows(workdir: pathlib.Path) -> list[dict]:
  return [json.loads(line) for line in (workdir / "results.jsonl").read_text().splitlines()
          if line.strip()]


def _peak_flops() -> tuple[float, str]:
  """This host's float32 matmul peak as chinchax calibrated it in a process free to use every
  core: the largest such entry of the cache (a pinned ladder worker's own entry measures its
  one core and is left out; with K devices the calibration runs on all K at once, so any
  device count measures the whole host)."""
  path = mfu.cpu_flops_cache()
  try:
    data = json.loads(path.read_text())
  except (OSError, ValueError):
    return math.nan, "not measured (run chinchax train once)"
  # "host|cpu|K cores|K usable|jax V|D devices|all at once", or older "…|1 devices" entries.
  host = f"{platform.node()}|"
  whole = [(float(v), k) for k, v in data.items() if k.startswith(host) and (
      k.endswith("|1 devices") or (k.endswith("|all at once")
                                   and re.search(r"\|(\d+) cores\|\1 usable\|", k)))]
  if not whole:
    return math.nan, f"no whole-host entry for {platform.node()} in {path}"
  flops, key = max(whole)
  devices = re.search(r"\d+ devices", key).group(0)
  return flops, f"{path} ({devices})"


def run_time_split(workdir: pathlib.Path) -> dict | None:
  """Seconds summed over WORKDIR/runs/*/summary.json, from each run's one uninterrupted
  invocation: {"runs", "wall_s", "step_s", "compile_s", "other_s", "skipped"}.

  ``step_s`` is step_time_s × the steps after the compiling one (a run started from another
  run's checkpoint, ``init_step`` > 0, counts only its own steps); ``other_s`` is the rest of
  the wall time (data check, evals, checkpoints, init). A resumed run (its wall time covers
  only the last invocation), an unreadable summary or one without finite times is left out
  and counted in ``skipped``. None when no run is left.
  """
  parts = {"runs": 0, "wall_s": 0.0, "step_s": 0.0, "compile_s": 0.0, "skipped": 0}
  for path in sorted((workdir / "runs").glob("*/summary.json")):
    try:
      s = json.loads(path.read_text())
      times = [float(s[k]) for k in ("wall_s", "step_time_s", "compile_s")]
      steps = int(s["steps"]) - int(s.get("init_step") or 0)
      usable = not s.get("resumed") and all(map(math.isfinite, times)) and steps >= 1
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
      usable = False
    if not usable:
      parts["skipped"] += 1
      continue
    wall, step_time, compile_s = times
    parts["runs"] += 1
    parts["wall_s"] += wall
    parts["step_s"] += step_time * (steps - 1)
    parts["compile_s"] += compile_s
  if not parts["runs"]:
    return None
  parts["other_s"] = parts["wall_s"] - parts["step_s"] - parts["compile_s"]
  return parts


def figures(workdir: pathlib.Path, wall_s: float | None) -> dict:
  rows = [r for r in _rows(workdir) if r.get("status") == "done"]
  grid = [r for r in rows if r.get("role", "grid") != "validation"]
  fit = json.loads((workdir / "fit" / "fit.json").read_text())
  budgets = sorted({r["C_budget"] for r in grid})
  flops = sum(6.0 * r["N"] * r["D"] for r in rows)
  peak, peak_src = _peak_flops()
  out = {"runs": len(grid), "validation_runs": len(rows) - len(grid), "budgets": budgets,
         "decades": math.log10(budgets[-1] / budgets[0]), "wall_s": wall_s,
         "flops_6nd": flops, "run_seconds": sum(r.get("wall_time_s", 0.0) for r in rows),
         "peak_flops": peak, "peak_source": peak_src,
         "median_run_mfu": statistics.median(r["mfu"] for r in rows if r.get("mfu") == r.get("mfu"))}
  if wall_s:
    out["throughput_flops_per_s"] = flops / wall_s
    out["share_of_peak"] = flops / wall_s / peak
  a = {}
  for k in ("1", "2", "3"):
    d = fit.get(f"approach{k}", {})
    if d.get("status") == "ok":
      lo, hi = (d.get("ci") or {}).get("a", [math.nan, math.nan])
      a[k] = {"a": d["a"], "ci": [lo, hi], "width": hi - lo}
  out["a"] = a
  vals = [v["a"] for v in a.values()]
  out["a_gap"] = max(vals) - min(vals) if vals else math.nan
  out["a_gap_1_2"] = (abs(a["1"]["a"] - a["2"]["a"]) if "1" in a and "2" in a else math.nan)
  out["approach3_form"] = (fit.get("agreement") or {}).get("approach3_form")
  d3 = fit.get("approach3", {})
  if d3.get("status") == "ok":
    lo, hi = d3["ci"]["E"]
    out["E"] = {"E": d3["E"], "ci": [lo, hi], "best_start_on_grid_edge": d3["best_start_on_grid_edge"],
                "n_interior_starts_at_best": d3.get("n_interior_starts_at_best", 0),
                "optimum_inside_grid": d3["optimum_inside_grid"]}
  res = []
  for b in fit.get("approach2", {}).get("budgets", []):
    if b.get("status") != "ok":
      continue
    lo, hi = b["N_fitted"]
    for r in grid:
      if math.isclose(r["C_budget"], b["C"], rel_tol=1e-6) and lo <= r["N"] <= hi:
        res.append(abs(r["final_eval_loss"] - np.polyval(b["coeffs"], math.log(r["N"]))))
  out["parabola_mean_abs_residual"] = float(np.mean(res)) if res else math.nan
  out["eval_noise"] = fit.get("input", {}).get("eval_noise")
  out["validation"] = fit.get("validation")
  out["run_time"] = run_time_split(workdir)
  return out


def markdown(f: dict) -> str:
  ok = lambda c: "yes" if c else "**no**"  # noqa: E731
  lines = ["| figure | value | target | met |", "|---|---|---|---|"]
  lines.append(f"| grid | {f['runs']} runs, {len(f['budgets'])} budgets "
               f"{f['budgets'][0]:.3g}–{f['budgets'][-1]:.3g} FLOPs ({f['decades']:.2f} decades) "
               f"| ≥ 1.5 decades | {ok(f['decades'] >= 1.5 - 1e-9)} |")
  if f.get("wall_s"):
    target = f.get("wall_target_min", 15.0)
    lines.append(f"| wall time | {f['wall_s'] / 60:.1f} min | ≤ {target:g} min "
                 f"| {ok(f['wall_s'] <= 60 * target)} |")
    lines.append(f"| throughput (Σ 6ND / wall) | {f['throughput_flops_per_s'] / 1e9:.2f} GFLOP/s = "
                 f"{100 * f['share_of_peak']:.1f}% of the measured matmul peak "
                 f"{f['peak_flops'] / 1e9:.1f} GFLOP/s | ≥ 25% | {ok(f['share_of_peak'] >= 0.25)} |")
  lines.append(f"| median run MFU | {100 * f['median_run_mfu']:.1f}% | | |")
  for k, v in f["a"].items():
    lines.append(f"| Approach {k} a | {v['a']:.3f} [{v['ci'][0]:.3f}, {v['ci'][1]:.3f}] "
                 f"(width {v['width']:.3f}) | width < 0.15 | {ok(v['width'] < 0.15)} |")
  lines.append(f"| gap in a, Approaches 1-2 | {f['a_gap_1_2']:.3f} | ≤ 0.05 | "
               f"{ok(f['a_gap_1_2'] <= 0.05)} |")
  lines.append(f"| largest gap in a, all three | {f['a_gap']:.3f} | (Approach 3 judged by its "
               f"form) | |")
  form = f.get("approach3_form")
  if form and form.get("holds") is not None:
    lines.append(f"| Approach 3's form: residual RMS / runs' scatter | {form['ratio']:.1f}× | "
                 f"≤ {form['limit']:g}× | {ok(form['holds'])} |")
  if "E" in f:
    e = f["E"]
    # Not on a bound: the interval stays off E = 0, the optimum lies inside the box of starts
    # and an interior start reaches it (analysis.isoflop.diagnostics warns otherwise).
    inside = (e["ci"][0] > 1e-3 and e["optimum_inside_grid"]
              and e["n_interior_starts_at_best"] > 0)
    lines.append(f"| Approach 3 E | {e['E']:.3f} [{e['ci'][0]:.3g}, {e['ci'][1]:.3g}], optimum "
                 f"{'inside' if e['optimum_inside_grid'] else 'outside'} the grid of starts, "
                 f"{e['n_interior_starts_at_best']} interior start(s) reach it | > 0.05, "
                 f"not on a bound | {ok(e['E'] > 0.05 and inside)} |")
  lines.append(f"| parabola mean abs residual | {f['parabola_mean_abs_residual']:.4f} nats | ≤ 0.01 "
               f"| {ok(f['parabola_mean_abs_residual'] <= 0.01)} |")
  if f.get("eval_noise"):
    lines.append(f"| eval noise floor (median s.e.) | {f['eval_noise'].get('median_se'):.4f} nats "
                 f"| | |")
  v = f.get("validation")
  if v and v.get("rel_error") is not None:
    lines.append(f"| validation C={v['C']:.3g}, N={v['N']:,.0f} | predicted {v['predicted_loss']:.4f},"
                 f" measured {v['measured_loss']:.4f} ({100 * v['rel_error']:+.2f}%) | ≤ 2% | "
                 f"{ok(abs(v['rel_error']) <= 0.02)} |")
  t = f.get("run_time")
  if t:
    left = f", {t['skipped']} left out (resumed or unreadable)" if t["skipped"] else ""
    lines.append(f"| runs' own time ({t['runs']} runs, summed{left}) | wall {t['wall_s']:.0f} s: steps "
                 f"{t['step_s']:.0f} s, compilation {t['compile_s']:.0f} s, the rest "
                 f"{t['other_s']:.0f} s | | |")
  return "\n".join(lines)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("workdir", type=pathlib.Path)
  p.add_argument("--wall-s", type=float, default=None, help="the ladder's wall time, seconds")
  p.add_argument("--json", type=pathlib.Path, default=None, help="also write the figures here")
  p.add_argument("--wall-target-min", type=float, default=15.0,
                 help="the wall-time target, minutes (15 for the default ladder, 45 for gutenberg)")
  args = p.parse_args(argv)
  f = figures(args.workdir, args.wall_s)
  f["wall_target_min"] = args.wall_target_min
  print(markdown(f))
  if args.json:
    args.json.write_text(json.dumps(f, indent=2, default=float))
  return 0


if __name__ == "__main__":
  sys.exit(main())
