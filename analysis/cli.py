"""Command line: fit scaling laws to a results table.

    chinchax fit RESULTS [--approach 1|2|3|all] [--out DIR] [--bootstrap N] [--seed S]
    python -m analysis.cli [fit] RESULTS ...

RESULTS is the ladder's JSONL results table or a CSV with columns N, loss and D
or C (Epoch AI's ``Model Size``, ``Training FLOP``, ``loss`` work too). Writes
``fit.json`` (every number; the Approach-3 law as E, A, B, alpha, beta),
``fit.md`` and the figures (PNG and SVG) into DIR.

Exit status: 0 on success, 2 for bad input or an approach that the table
cannot support when it was asked for explicitly.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from analysis import fit as fitlib
from chinchax import laws
from analysis import plots
from analysis import report as reportlib
from analysis.io import ResultsError, load_results


def build_parser() -> argparse.ArgumentParser:
  """The ``fit`` argument parser (argv starts with RESULTS)."""
  p = argparse.ArgumentParser(
      prog="chinchax fit",
      description="Fit Chinchilla's Approaches 1-3 (Hoffmann et al. 2022) to a results table, "
                  "with bootstrap intervals, figures and a report.")
  p.add_argument("results", metavar="RESULTS",
                 help="results table: ladder JSONL, or CSV with N, loss and D or C")
  p.add_argument("--approach", default="all", choices=("1", "2", "3", "all"),
                 help="approach to fit; 'all' skips (with a stated reason) those the table "
                      "cannot support, an explicit one that cannot run is an error")
  p.add_argument("--out", default=None, metavar="DIR",
                 help="output directory (default: 'fit' beside RESULTS)")
  p.add_argument("--bootstrap", type=int, default=200, metavar="N",
                 help="bootstrap resamples per approach (0 = no intervals)")
  p.add_argument("--seed", type=int, default=0, help="bootstrap seed")
  p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                 help="processes for Approach 3's 4500 L-BFGS starts")
  p.add_argument("--drop-highest-loss", type=int, default=0, metavar="K",
                 help="drop the K runs with the highest loss before fitting (Besiroglu et al. "
                      "2024 drop 5 from the Chinchilla data)")
  p.add_argument("--min-budgets", type=int, default=3,
                 help="fewest IsoFLOP budgets a table must have")
  p.add_argument("--compare", action="append", default=None, metavar="LAW",
                 help="published law name or fit JSON to draw beside the fit (repeatable; "
                      f"default: {', '.join(laws.PUBLISHED_LAWS)})")
  p.add_argument("--no-figures", action="store_true", help="skip the figures")
  p.add_argument("--quiet", action="store_true", help="print only errors")
  return p


def main(argv: list[str] | None = None) -> int:
  """Runs ``fit``; ``argv`` starts with RESULTS (a leading ``fit`` is accepted too).

  Returns:
    0 on success, 2 on bad input or an unsupported, explicitly requested approach.
  """
  argv = list(sys.argv[1:] if argv is None else argv)
  if len(argv) > 1 and argv[0] == "fit" and not os.path.isfile("fit"):
    argv = argv[1:]
  args = build_parser().parse_args(argv)
  say = (lambda msg: None) if args.quiet else (lambda msg: print(msg, flush=True))
  err = lambda msg: print(f"chinchax fit: error: {msg}", file=sys.stderr)  # noqa: E731
  for flag, value, low in (("--bootstrap", args.bootstrap, 0), ("--jobs", args.jobs, 1),
                           ("--drop-highest-loss", args.drop_highest_loss, 0),
                           ("--min-budgets", args.min_budgets, 1)):
    if value < low:
      err(f"{flag} must be >= {low}, got {value}")
      return 2
  try:
    compare = [laws.get_law(name) for name in (args.compare or list(laws.PUBLISHED_LAWS))]
  except ValueError as e:
    err(str(e))
    return 2
  t0 = time.perf_counter()
  try:
    runs = load_results(args.results, min_budgets=args.min_budgets)
    runs = runs.drop_highest_loss(args.drop_highest_loss)
  except ResultsError as e:
    err(str(e))
    return 2
  say(f"loaded {len(runs)} runs ({runs.n_failed} failed, ignored) in "
      f"{len(runs.budgets())} IsoFLOP budgets from {args.results}")
  approaches = fitlib.APPROACHES if args.approach == "all" else (args.approach,)
  try:
    report = fitlib.fit_all(runs, approaches, n_bootstrap=args.bootstrap, seed=args.seed,
                            strict=args.approach != "all", n_jobs=args.jobs, log=say)
  except fitlib.FitError as e:
    err(f"approach {args.approach}: {e}")
    return 2
  if not report.results:
    err("no approach could be fitted: " + "; ".join(
        f"approach {k}: {v}" for k, v in report.skipped.items()))
    return 2
  out = args.out or os.path.join(os.path.dirname(os.path.abspath(args.results)), "fit")
  figures = [] if args.no_figures else plots.make_figures(report, out, compare)
  json_path, md_path = reportlib.write_report(report, out, compare, figures)
  for k, res in sorted(report.results.items()):
    p = res.params()
    boot = report.bootstraps.get(k)
    ci = f" [{boot.ci['a'][0]:.3f}, {boot.ci['a'][1]:.3f}]" if boot else ""
    extra = ""
    if k == "3":
      extra = (f"  E={p['E']:.4g} A={p['A']:.4g} B={p['B']:.4g} alpha={p['alpha']:.4g} "
               f"beta={p['beta']:.4g}")
    say(f"approach {k}: a = {p['a']:.4f}{ci}{extra}")
  for k, reason in report.skipped.items():
    say(f"approach {k}: skipped: {reason}")
  say(f"wrote {json_path}, {md_path} and {len(figures)} figure files in "
      f"{time.perf_counter() - t0:.1f} s")
  return 0


if __name__ == "__main__":
  sys.exit(main())
