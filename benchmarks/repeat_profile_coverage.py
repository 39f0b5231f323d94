"""Coverage of the repetition constants' profile-likelihood and bootstrap intervals.

Draws data-constrained tables from Muennighoff et al. 2023's law at known constants
(:func:`analysis.isoflop.synthetic.synthetic_repeat_runs`), fits R_D* and R_N* as ``chinchax
fit`` does with the base held fixed (:mod:`analysis.repeat.fit`), and counts how often the 95%
profile interval (:mod:`analysis.repeat.profile`) and the residual-bootstrap interval hold the
true constants, and how often each constant is reported as not identified.

Two settings (base E = 1.8, A = 400, B = 1500, alpha = 0.34, beta = 0.30; single-epoch rows at
C = 1e15, 1e16, 1e17 FLOPs, 7 sizes each from N_opt/8 to N_opt, so none has excess
parameters; unique sizes U = 5e6, 2e7, 8e7 tokens; 0.5% noise in ln L):

* ``identifiable``: R_D* = 10, R_N* = 4; repeated rows at N = 1e6, 4e6, 1.6e7 and
  2, 4, 8, 16, 32, 64 epochs.
* ``ridge``: R_D* = 15.4, R_N* = 5.3 (the published values); repeated rows at N = 1e6, 4e6
  and only 1.2 and 1.4 epochs: R_D / R_D* <= 0.03, where D' ≈ U·(1 + R_D) whatever R_D*.

Each table is fitted (``--modes``) with the true base given and held (``--law`` the truth: the
profile's own calibration), with the base fitted by Approach 3 on the table's single-epoch rows
and then held (``chinchax fit``'s default: the intervals are conditional on that base), and,
with ``--modes joint``, with that base polished jointly (``--repeat-base joint``: the profile
re-optimises the base at every point).

  python benchmarks/repeat_profile_coverage.py --setting identifiable --tables 50
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np

from analysis.isoflop import approach3, synthetic
from analysis.repeat import fit as fr
from analysis.repeat import profile as rp
from chinchax.laws import parametric as laws
from chinchax.laws import repeat as lr

BASE = laws.ParametricLaw(name="truth", E=1.8, A=400.0, B=1500.0, alpha=0.34, beta=0.30)
SETTINGS = {
    "identifiable": dict(law=lr.MuennighoffLaw(BASE, 10.0, 4.0), epochs=(2, 4, 8, 16, 32, 64),
                         sizes=(1e6, 4e6, 1.6e7)),
    "ridge": dict(law=lr.MuennighoffLaw(BASE, 15.4, 5.3), epochs=(1.2, 1.4), sizes=(1e6, 4e6)),
}
BUDGETS = (1e15, 1e16, 1e17)
UNIQUE = (5e6, 2e7, 8e7)
NOISE = 0.005
# Approach 3's starts for the fitted base: a small grid (the default's 4,500 starts take
# ~15 s a table on a busy 2-core host).
GRID = "logA=4:8:3,logB=5:9:3,logE=0:1:2,alpha=0.2:0.5:2,beta=0.2:0.5:2"


def one_table(setting: str, seed: int, n_boot: int, n_grid: int, modes=("true_base",
                                                                       "fitted_base")) -> dict:
  s = SETTINGS[setting]
  truth = s["law"]
  runs = synthetic.synthetic_repeat_runs(truth, BUDGETS, UNIQUE, s["epochs"], s["sizes"],
                                         upper_span=1.0, noise=NOISE, seed=seed)
  rows = fr.RepeatRows.from_runs(runs)
  fitted = approach3.fit_approach3(fr.single_epoch(runs),
                                   grid=approach3.start_grid(approach3.parse_grid(GRID))).law
  out = {}
  cases = {"true_base": (BASE, False, False), "fitted_base": (fitted, True, False),
           "joint": (fitted, True, True)}
  for which in modes:
    base, refit, joint = cases[which]
    law, theta = fr.fit_form("muennighoff", base, rows, joint=joint)
    prof = rp.profile_form("muennighoff", base, rows, law, theta, n_grid=n_grid, joint=joint)
    boot = fr.bootstrap_form("muennighoff", rows, law, theta, n=n_boot, seed=seed,
                             refit_base=refit, joint=joint)
    res = {}
    for k, true in truth.params().items():
      p = prof.get(k)
      ci = boot["ci"].get(k)
      res[k] = {"estimate": law.params()[k],
                "profile_covered": p["covered"] if p else None,
                "profile_identified": p["identified"] if p else None,
                "profile_holds": bool(p and p["covered"][0] <= true <= p["covered"][1]),
                "bootstrap": ci, "bootstrap_holds": bool(ci and ci[0] <= true <= ci[1])}
    out[which] = res
  return out


def summarise(results: list[dict], truth) -> dict:
  out = {}
  for which in [m for m in ("true_base", "fitted_base", "joint") if m in results[0]]:
    for k in truth.params():
      rs = [r[which][k] for r in results]
      n = len(rs)
      ident = [r for r in rs if r["profile_identified"]]
      out[f"{which}/{k}"] = {
          "tables": n,
          "profile_coverage": sum(r["profile_holds"] for r in rs) / n,
          "profile_coverage_when_identified": (sum(r["profile_holds"] for r in ident)
                                               / len(ident) if ident else None),
          "bootstrap_coverage": sum(r["bootstrap_holds"] for r in rs) / n,
          "not_identified": sum(not r["profile_identified"] for r in rs) / n,
          "median_estimate": float(np.median([r["estimate"] for r in rs])),
      }
  return out


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--setting", choices=sorted(SETTINGS), default="identifiable")
  ap.add_argument("--tables", type=int, default=50)
  ap.add_argument("--bootstrap", type=int, default=50)
  ap.add_argument("--grid", type=int, default=21, help="profile points across each box")
  ap.add_argument("--modes", default="true_base,fitted_base",
                  help="comma-separated: true_base (the truth's base held), fitted_base "
                       "(Approach 3's base held: chinchax fit's default), joint (--repeat-base "
                       "joint)")
  ap.add_argument("--out", default=None,
                  help="JSONL file: one line per table as it finishes (a run cut short keeps "
                       "its tables; --summarise reads it back)")
  ap.add_argument("--summarise", default=None, metavar="JSONL",
                  help="print the summary of an --out file instead of fitting")
  args = ap.parse_args()
  truth = SETTINGS[args.setting]["law"]
  if args.summarise:
    with open(args.summarise) as f:
      results = [json.loads(line) for line in f if line.strip()]
  else:
    t0 = time.perf_counter()
    results = []
    for seed in range(args.tables):
      results.append(one_table(args.setting, seed, args.bootstrap, args.grid,
                               tuple(args.modes.split(","))))
      if args.out:
        with open(args.out, "a") as f:
          f.write(json.dumps(results[-1]) + "\n")
      print(f"{seed + 1} tables, {time.perf_counter() - t0:.0f} s", flush=True)
  summary = summarise(results, truth)
  print(json.dumps({"setting": args.setting, "noise": NOISE, "summary": summary}, indent=1))


if __name__ == "__main__":
  main()
