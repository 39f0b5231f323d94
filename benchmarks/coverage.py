"""Coverage of the 95% bootstrap intervals of a (N_opt ∝ C^a) on ladders from a known law.

    python benchmarks/coverage.py [--ladders 40] [--resamples 60] [--jobs 2] [--json OUT]
        [--only 1|2|3] [--approach3] [--method runs] [--fixed-design] [--settings wide]

Each setting draws many synthetic IsoFLOP ladders from a known parametric law
L(N, D) = E + A/N^alpha + B/D^beta (Hoffmann et al. 2022, "Training
Compute-Optimal Large Language Models", arXiv 2203.15556, eq. 2), whose true
exponent is a = beta / (alpha + beta) (ibid., Sec. 3.3). Two sets of constants:

* ``chinchilla``: the paper's Approach 3 fit, E = 1.69337, A = 406.401,
  B = 410.723, alpha = 0.33917, beta = 0.28491 (Sec. 3.3 / eq. 10, unrounded
  from the paper's source; a = 0.4565);
* ``epoch``: Besiroglu et al. 2024 ("Chinchilla Scaling: A replication
  attempt", arXiv 2404.10102, Table 1 / eq. 4), E = 1.817, A = 482.01,
  B = 2085.43, alpha = 0.348, beta = 0.366 (a = 0.5126).

A ladder has ``budgets`` IsoFLOP budgets log-spaced over [c_min, c_max] and,
per budget, ``sizes`` model sizes log-spaced over [M/span, M·span] around
M = N_opt(C)·(C/C_mid)^skew (C_mid the geometric middle budget; skew 0 centres
every grid on the true optimum, skew ≠ 0 is a ladder planned with a wrong
exponent, whose end budgets have their optima off-centre), D = C / (6N). Each
run's final loss is L(N, D)·(1 + s·z), z ~ N(0, 1), with s = ``noise`` at
C_mid, ``noise_ratio`` times larger at c_min than at c_max (log-linear in C),
and its ``final_eval_loss_se`` is s × that loss; its eval curve (for
Approach 1) is the law at 16 FLOP values log-spaced over the run's last
decade, times the same factor.

Every ladder is fitted with the project's own functions
(:func:`analysis.isoflop.approaches.fit_approach`) and bootstrapped
(:func:`analysis.isoflop.bootstrap.bootstrap`, the default ``"residuals"`` method
unless ``--method runs``). Per approach and setting the table gives the share
of ladders whose 95% interval of a covers the true a, its Monte-Carlo
standard error sqrt(p(1 - p)/n), the shares of intervals wholly below and
above the truth, the median interval width against the spread of a_hat over
the ladders (an honest interval is about 2·1.96 s.d. wide) and the budgets
that Approach 2's replicates left out; a last row pools all settings.
Ladders whose full fit fails are counted apart ("not fitted").
``--fixed-design`` refits Approach 2's replicates on the full fit's budgets
and sizes (:mod:`analysis.isoflop.approach2_design`) instead of choosing them again.
Approach 3 (``--approach3``) starts L-BFGS from a 32-point grid to stay cheap.
``--settings wide`` runs :data:`WIDE_SETTINGS` instead: grids of ±16× and ±32× around
the optimum, where the law's IsoFLOP profiles are visibly not parabolas in ln N, each
with and without Approach 2's ``--window``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import math
import os
import sys
import time

import numpy as np

from chinchax.laws import parametric as laws
from analysis.isoflop.approach3 import parse_grid, start_grid
from analysis.isoflop.approaches import FitOptions, fit_approach
from analysis.isoflop.bootstrap import DEFAULT_METHOD, METHODS, bootstrap
from analysis.errors import FitError
from analysis.runs import Runs, runs_from_arrays, tokens_6nd

LAWS = {"chinchilla": laws.get_law("chinchilla-approach3-unrounded"),
        "epoch": laws.get_law("epoch")}
CURVE_POINTS = 16            # curve evals per run, over its last decade of FLOPs (the ladder's)
A3_GRID = "alpha=0.2:0.6:2,beta=0.2:0.6:2,logE=0:1:2,logA=4:8:2,logB=4:8:2"


@dataclasses.dataclass(frozen=True)
class Setting:
  """One kind of ladder: a law, its IsoFLOP grid and the noise on each run's loss."""

  law: str = "chinchilla"
  budgets: int = 5
  sizes: int = 7
  noise: float = 0.005       # relative s.d. of a run's final loss
  span: float = 4.0          # sizes from N_opt / span to N_opt · span
  c_min: float = 6e18
  c_max: float = 3e21
  window: int | None = None  # Approach 2's --window
  skew: float = 0.0          # grid centres follow C^(a + skew): off the optimum at the ends
  noise_ratio: float = 1.0   # noise at the smallest budget over that at the largest

  @property
  def label(self) -> str:
    w = "" if self.window is None else f", window {self.window}"
    k = f", skew {self.skew:+g}" if self.skew else ""
    r = f", noise ×{self.noise_ratio:g} small/large C" if self.noise_ratio != 1 else ""
    return (f"{self.law} {self.budgets}×{self.sizes}, ±{self.span:g}×, "
            f"{100 * self.noise:g}%{r}{k}{w}")

  def noise_at(self, C: float) -> float:
    """The relative s.d. of a run's loss at budget C: ``noise`` at the middle budget (geometric),
    ``noise_ratio`` times larger at ``c_min`` than at ``c_max``, log-linear in C."""
    t = math.log(C / math.sqrt(self.c_min * self.c_max)) / math.log(self.c_max / self.c_min)
    return self.noise * self.noise_ratio ** (-t)

  def centre(self, C: float) -> float:
    """The centre of budget C's sizes: the true N_opt times (C / C_mid)^skew, C_mid the
    geometric middle budget (a ladder planned with a guessed exponent a + skew)."""
    n_opt, _ = LAWS[self.law].optimal_allocation(float(C))
    return float(n_opt) * (C / math.sqrt(self.c_min * self.c_max)) ** self.skew

  @property
  def true_a(self) -> float:
    law = LAWS[self.law]
    return law.beta / (law.alpha + law.beta)


# The default study: from a small noisy ladder to a wide, dense, quiet one; ladders planned with
# a wrong exponent (skew: the ends' optima sit off the grids' centres, as in real tables); noise
# that falls with C (small budgets noisier).
DEFAULT_SETTINGS = (
    Setting("chinchilla", 4, 5, 0.005),
    Setting("chinchilla", 5, 7, 0.005),
    Setting("chinchilla", 12, 9, 0.005, skew=0.12, window=3),
    Setting("epoch", 8, 12, 0.002, span=6.0, skew=0.1),
    Setting("epoch", 6, 7, 0.01),
    Setting("chinchilla", 8, 7, 0.005, noise_ratio=4.0),
    Setting("chinchilla", 6, 9, 0.003, span=8.0, skew=-0.1),
)

# Wide grids (±16×, ±32× around the optimum, as in published ladders): the law's IsoFLOP
# profiles are not parabolas in ln N over such spans (analysis.isoflop.approach2's "span" warning), so
# a whole-grid quadratic is biased and its residuals are misfit; each with and without --window.
WIDE_SETTINGS = (
    Setting("chinchilla", 8, 11, 0.005, span=16.0),
    Setting("chinchilla", 8, 11, 0.005, span=16.0, window=3),
    Setting("epoch", 8, 13, 0.005, span=32.0),
    Setting("epoch", 8, 13, 0.005, span=32.0, window=3),
)
SETTINGS = {"default": DEFAULT_SETTINGS, "wide": WIDE_SETTINGS}


def make_ladder(s: Setting, rng: np.random.Generator) -> Runs:
  """One synthetic ladder of setting ``s`` (module docstring), noise drawn from ``rng``."""
  law = LAWS[s.law]
  N, D, L, SE, B, curves = [], [], [], [], [], []
  for C in np.geomspace(s.c_min, s.c_max, s.budgets):
    noise = s.noise_at(float(C))
    for n in s.centre(float(C)) * np.geomspace(1.0 / s.span, s.span, s.sizes):
      factor = 1.0 + noise * rng.standard_normal()
      flops = np.geomspace(C / 10.0, C, CURVE_POINTS)
      curve = law.loss(n, tokens_6nd(flops, n)) * factor
      N.append(n), D.append(tokens_6nd(C, n)), B.append(float(C))
      L.append(float(curve[-1])), SE.append(noise * float(curve[-1]))
      curves.append(np.stack([flops, curve], axis=1))
  return runs_from_arrays(N, D, L, budget=B, curves=curves, loss_se=SE,
                          source=f"coverage:{s.label}")


def _one_ladder(job: tuple) -> dict:
  """Fits and bootstraps one ladder: approach -> {"a", "lo", "hi"} or {"error"}."""
  s, seed, approaches, n_resamples, method, fixed_design = job
  rng = np.random.default_rng(seed)
  runs = make_ladder(s, rng)
  out = {}
  for k in approaches:
    options = FitOptions(window=s.window,
                         grid=start_grid(parse_grid(A3_GRID)) if k == "3" else None)
    try:
      full = fit_approach(runs, k, options=options)
      boot = bootstrap(runs, k, full, n_resamples=n_resamples, seed=seed, options=options,
                       method=method, n_extra_starts=2, fixed_design=fixed_design)
    except FitError as e:
      out[k] = {"error": str(e).split(" (")[0][:80]}
      continue
    lo, hi = boot.ci["a"]
    out[k] = {"a": full.params()["a"], "lo": lo, "hi": hi, "true_a": s.true_a,
              "left_out": int(sum(boot.budgets_left_out.values())), "failed": boot.n_failed}
  return out


def summarize(per_ladder: list[dict], approaches) -> dict:
  """Per approach, over ladders (each entry of ``per_ladder`` is :func:`_one_ladder`'s output):
  n fitted, coverage of the true a and its Monte-Carlo s.e. sqrt(p(1 - p)/n), the shares of
  intervals wholly above or below the truth, the median width, the s.d. of a_hat - a over
  ladders (the spread an honest interval should match: width ≈ 2·1.96·s.d.), the width
  ratio median width / (2·1.96·s.d.), the median |a_hat - a| and the mean number of budgets
  left out per ladder's bootstrap (Approach 2)."""
  out = {}
  for k in approaches:
    fits = [r[k] for r in per_ladder if "a" in r[k] and math.isfinite(r[k]["lo"])]
    n = len(fits)
    if not n:
      out[k] = {"n": 0, "not_fitted": len(per_ladder)}
      continue
    err = np.array([f["a"] - f["true_a"] for f in fits])
    cover = np.array([f["lo"] <= f["true_a"] <= f["hi"] for f in fits])
    p = float(cover.mean())
    sd = float(np.std(err, ddof=1)) if n > 1 else float("nan")
    width = float(np.median([f["hi"] - f["lo"] for f in fits]))
    out[k] = {"n": n, "not_fitted": len(per_ladder) - n, "coverage": p,
              "coverage_se": math.sqrt(max(p * (1 - p), 1.0 / n) / n),
              "median_width": width, "sd_a": sd,
              "width_ratio": width / (2 * 1.959964 * sd) if sd > 0 else float("nan"),
              "median_abs_error": float(np.median(np.abs(err))),
              "below": float(np.mean([f["true_a"] < f["lo"] for f in fits])),
              "above": float(np.mean([f["true_a"] > f["hi"] for f in fits])),
              "mean_left_out": float(np.mean([f["left_out"] for f in fits]))}
  return out


def run_study(settings=DEFAULT_SETTINGS, *, n_ladders: int = 40, n_resamples: int = 100,
              approaches=("1", "2"), seed: int = 0, method: str = DEFAULT_METHOD,
              jobs: int = 1, fixed_design: bool = False) -> list[dict]:
  """The coverage study: one :func:`summarize` row per setting, then a row "all settings"
  pooling every ladder (its s.d. and width ratio mix settings and are left out)."""
  work = [(s, seed + 1000 * i + j, tuple(approaches), n_resamples, method, fixed_design)
          for i, s in enumerate(settings) for j in range(n_ladders)]
  if jobs > 1:
    with concurrent.futures.ProcessPoolExecutor(jobs) as ex:
      results = list(ex.map(_one_ladder, work, chunksize=2))
  else:
    results = [_one_ladder(w) for w in work]
  out = []
  for i, s in enumerate(settings):
    part = results[i * n_ladders:(i + 1) * n_ladders]
    out.append({"setting": dataclasses.asdict(s), "label": s.label, "true_a": s.true_a,
                "approaches": summarize(part, approaches)})
  pooled = summarize(results, approaches)
  for v in pooled.values():
    v.update(sd_a=float("nan"), width_ratio=float("nan"), median_width=float("nan"))
  out.append({"setting": None, "label": "all settings", "true_a": float("nan"),
              "approaches": pooled})
  return out


def _pct(x: float) -> str:
  return f"{100 * x:.0f}%"


def markdown(study: list[dict], n_ladders: int, n_resamples: int) -> str:
  """The study as a markdown table, one row per setting and approach."""
  lines = [f"| setting (true a) | approach | coverage ± MC s.e. ({n_ladders} ladders, "
           f"{n_resamples} resamples) | below / above | median width | s.d. of a_hat | "
           f"width / (3.92 s.d.) | budgets left out per ladder |",
           "|---|---|---|---|---|---|---|---|"]
  for row in study:
    name = row["label"] + ("" if math.isnan(row["true_a"]) else f" ({row['true_a']:.4f})")
    for k, v in row["approaches"].items():
      if not v["n"]:
        lines.append(f"| {name} | {k} | not fitted | | | | | |")
        continue
      miss = f", {v['not_fitted']} not fitted" if v["not_fitted"] else ""
      num = (lambda x, f: "–" if not math.isfinite(x) else format(x, f))
      lines.append(f"| {name} | {k} | {_pct(v['coverage'])} ± {100 * v['coverage_se']:.0f}"
                   f"{miss} | {_pct(v['below'])} / {_pct(v['above'])} | "
                   f"{num(v['median_width'], '.4f')} | {num(v['sd_a'], '.4f')} | "
                   f"{num(v['width_ratio'], '.2f')} | {v['mean_left_out']:.1f} |")
  return "\n".join(lines)


def main(argv=None) -> int:
  """The command line (module docstring); prints the table and the wall time."""
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--ladders", type=int, default=40, help="replicate ladders per setting")
  p.add_argument("--resamples", type=int, default=60, help="bootstrap replicates per ladder")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--method", choices=METHODS, default=DEFAULT_METHOD)
  p.add_argument("--approach3", action="store_true", help="also Approach 3 (32 starts)")
  p.add_argument("--only", choices=("1", "2", "3"), default=None, help="one approach only")
  p.add_argument("--fixed-design", action="store_true",
                 help="Approach 2's replicates refit the full fit's budgets and sizes instead "
                      "of choosing them again (analysis.isoflop.approach2_design; for comparison)")
  p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
  p.add_argument("--json", default=None, help="also write the study here")
  p.add_argument("--settings", choices=tuple(SETTINGS), default="default",
                 help="the default study, or the wide grids (±16×, ±32×, with and without "
                      "--window)")
  args = p.parse_args(argv)
  approaches = ("1", "2", "3") if args.approach3 else ("1", "2")
  if args.only:
    approaches = (args.only,)
  t0 = time.perf_counter()
  study = run_study(SETTINGS[args.settings], n_ladders=args.ladders, n_resamples=args.resamples, approaches=approaches,
                    seed=args.seed, method=args.method, jobs=args.jobs,
                    fixed_design=args.fixed_design)
  wall = time.perf_counter() - t0
  print(markdown(study, args.ladders, args.resamples))
  print(f"\n{wall:.0f} s, {args.jobs} processes, method {args.method}"
        f"{', Approach 2 on the fixed design' if args.fixed_design else ''}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"ladders": args.ladders, "resamples": args.resamples, "seed": args.seed,
                 "method": args.method, "fixed_design": args.fixed_design, "wall_s": wall,
                 "study": study}, f, indent=2)
  return 0


if __name__ == "__main__":
  sys.exit(main())
