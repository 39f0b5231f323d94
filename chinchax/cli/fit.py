"""``chinchax fit``: fit scaling laws to a results table (front end of ``analysis.pipeline``).

Fits Chinchilla's Approaches 1-3 (Hoffmann et al. 2022) with bootstrap
intervals. RESULTS is the ladder's JSONL results table or a CSV with columns N, loss and D
or C (Epoch AI's ``Model Size``, ``Training FLOP``, ``loss`` work too; ``unique_tokens`` or
``U`` for runs drawn from a limited set of unique tokens). Writes
``fit.json`` (every number; the Approach-3 law as E, A, B, alpha, beta),
``fit.md`` and the figures (PNG and SVG) into DIR. Warnings on the fit (biased
or undetermined parabolas, budgets left out, an optimum outside the start
grid, ...) are printed as ``warning:`` lines and written into both files.

An IsoTime table (rows with ``"budget_kind": "seconds"``, from an IsoTime
ladder) is fitted by ``analysis.isotime.fit.fit_isotime`` instead: step-time
predictors compared leave-one-shape-out (FLOPs vs bytes, "Time Matters",
Inbar & Sernau 2024), the final loss predicted from shape and seconds, wider
vs deeper per time budget; its validation run is added when there is one.
``--law PATH`` takes L(N, D) from a FLOP ladder's fit.json instead of fitting
it on the IsoTime runs.

A table whose runs repeat data (D > unique_tokens) gets the repetition laws too
(``analysis.repeat.report``: Approaches 1-3 on the runs of one epoch or less, D <= U);
there ``--law`` gives their single-epoch law instead of the table's Approach 3, and
``--repeat-base fixed`` (the default with ``--law``: the papers' two-stage procedure; without
``--law``, the table's own Approach 3 fitted first and then held) holds that law while the
repetition constants are fitted, ``joint`` (the default without ``--law``, whose base is fitted
on the same table) refits it with them. Each repetition constant (and
Approach 3's a, b) gets a profile-likelihood interval beside its bootstrap one; a constant the
table cannot pin down is reported as not identified, with the range its profile covers.

Bad input, or an approach that the table cannot support when it was asked
for explicitly, raises a ``UserError`` (``chinchax.cli.main``: one ``error:``
line, exit 2).

Example:
  chinchax fit runs/ladder/results.jsonl --approach all --out runs/ladder/fit
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
from typing import Callable

from analysis.repeat import fit as fit_repeat
from analysis.isotime import fit as isotime
from analysis import recipe
from analysis import tuning
from analysis.isoflop.approach1 import APPROACH1_ENVELOPES
from analysis.isoflop.approach3 import HUBER_DELTA
from analysis.isoflop.approaches import LOSSES
from analysis.isoflop.bootstrap import DEFAULT_METHOD, METHODS, check_method
from analysis.errors import FitOptionError, ResultsError
from analysis.io import load_results
from analysis.pipeline import DEFAULT_JOBS, default_out_dir, fit_results
from analysis import recipe
from chinchax import console
from chinchax.storage import diskfull
from chinchax.storage import paths as paths_lib
from chinchax.laws import parametric as laws
from chinchax.cli import helptext
from chinchax.planning import shapes


def build_parser() -> argparse.ArgumentParser:
  """The ``fit`` argument parser (argv starts with RESULTS)."""
  p = helptext.parser("fit", __doc__)
  p.add_argument("results", metavar="RESULTS",
                 help="results table: ladder JSONL, or CSV with N, loss and D or C")
  p.add_argument("--approach", default="all", choices=("1", "2", "3", "all"),
                 help="approach to fit; 'all' skips (with a stated reason) those the table "
                      "cannot support, an explicit one that cannot run is an error")
  p.add_argument("--out", default=None, metavar="DIR",
                 help="output directory (default: fit/ beside RESULTS)")
  p.add_argument("--bootstrap", type=int, default=200, metavar="N",
                 help="bootstrap resamples per approach (0 = no intervals)")
  p.add_argument("--seed", type=int, default=0, help="bootstrap seed")
  p.add_argument("--bootstrap-method", default=DEFAULT_METHOD, metavar="|".join(METHODS),
                 help="'residuals' (default): keep the ladder's sizes and budgets and resample "
                      "the noise (pooled residuals in ln L of per-budget quadratics in ln N); "
                      "'runs': resample runs with replacement")
  p.add_argument("--jobs", type=int, default=DEFAULT_JOBS,
                 help="processes for Approach 3's L-BFGS starts")
  p.add_argument("--drop-highest-loss", type=int, default=0, metavar="K",
                 help="drop the K runs with the highest loss before fitting (Besiroglu et al. "
                      "2024 drop 5 from the Chinchilla data)")
  p.add_argument("--min-budgets", type=int, default=3,
                 help="fewest IsoFLOP budgets a table must have")
  p.add_argument("--compare", action="append", default=None, metavar="LAW",
                 help="published law name or fit JSON to draw beside the fit (repeatable; "
                      f"default: {', '.join(laws.PUBLISHED_LAWS)})")
  p.add_argument("--window", type=int, default=None, metavar="K",
                 help="Approach 2 only: fit each parabola only on the K sizes either side of the "
                      "lowest observed loss, and pool Approach 2's bootstrap residuals from those "
                      "windowed parabolas (default: all sizes); a narrow window removes the bias "
                      "of wide IsoFLOP grids. K = 1 leaves no residual dof: the bootstrap "
                      "resamples runs instead, with a warning")
  p.add_argument("--envelope", default="quadratic", choices=APPROACH1_ENVELOPES,
                 help="Approach 1: N_opt at each FLOP value is the minimum of a quadratic in ln N "
                      "through the winning size and 2 sizes either side (default), or the "
                      "winning size itself (argmin, Chinchilla's rule)")
  p.add_argument("--loss", default="huber", choices=LOSSES,
                 help="Approach 3's loss: Chinchilla's Huber, or an asymmetric Huber that "
                      "weighs runs the law under-predicts by --asymmetry")
  p.add_argument("--asymmetry", type=float, default=2.0, metavar="F",
                 help="factor of the asymmetric loss (default 2)")
  p.add_argument("--huber-delta", type=float, default=HUBER_DELTA, metavar="X",
                 help=f"Approach 3's Huber threshold (default {HUBER_DELTA:g}, Chinchilla's)")
  p.add_argument("--grid", default=None, metavar="SPEC",
                 help="Approach 3's start grid, e.g. 'alpha=0:1:11,beta=0:1:11' (NAME=lo:hi:count "
                      "or NAME=v1/v2/...; NAME in logA, logB, logE, alpha, beta; others keep "
                      "Chinchilla's 4500-start values); a figure 'starts' shows the objective "
                      "over it")
  p.add_argument("--law", default=None, metavar="PATH",
                 help="IsoTime tables: take L(N, D) from this fit JSON (e.g. a FLOP ladder's "
                      "fit.json) instead of fitting Approach 3 on the IsoTime runs; tables whose "
                      "runs repeat data: the repetition laws' single-epoch law (a fit JSON or "
                      "published name) instead of the table's own Approach 3")
  p.add_argument("--mixed-tokenizers", action="store_true",
                 help="fit a table whose runs used different tokenizers anyway (their losses "
                      "are in different units: the law holds for none of them; default: "
                      "refused)")
  p.add_argument("--repeat-base", default=None, choices=fit_repeat.BASE_MODES,
                 help="tables whose runs repeat data: 'fixed' holds the single-epoch law while "
                      "the repetition constants are fitted, as Muennighoff et al. 2023 do "
                      "(default with --law; without --law the two stages in one command: the "
                      "table's own Approach 3 on its runs of one epoch or less, then held); "
                      "'joint' refits it together with them (default without --law: a base "
                      "fitted on the same table, held fixed, gives intervals far too narrow; "
                      "docs/fitting.md)")
  p.add_argument("--no-figures", action="store_true", help="skip the figures")
  p.add_argument("--quiet", action="store_true", help="print only errors")
  return p


def _check_counts(args: argparse.Namespace) -> None:
  """Raises FitOptionError for a count flag below its least value, a non-positive factor or an
  unknown bootstrap method (names the flag)."""
  for flag, value, low in (("--bootstrap", args.bootstrap, 0), ("--jobs", args.jobs, 1),
                           ("--drop-highest-loss", args.drop_highest_loss, 0),
                           ("--min-budgets", args.min_budgets, 1)):
    if value < low:
      raise FitOptionError(f"{flag} must be >= {low}, got {value}")
  if args.window is not None and args.window < 1:
    raise FitOptionError(f"--window must be >= 1, got {args.window}")
  for flag, value in (("--asymmetry", args.asymmetry), ("--huber-delta", args.huber_delta)):
    if not value > 0:
      raise FitOptionError(f"{flag} must be > 0, got {value}")
  try:
    check_method(args.bootstrap_method)
  except FitOptionError as e:
    raise FitOptionError(f"--bootstrap-method: {e}") from None


def _check_loss_units(args: argparse.Namespace) -> None:
  """Refuses (ResultsError) a table whose runs used different tokenizers, naming each with its
  number of runs, unless ``--mixed-tokenizers`` (then: one warning)."""
  try:
    groups = recipe.tokenizer_groups(paths_lib.local_copy(args.results))
  except OSError:
    return  # a missing table: the fit's own reader says so
  if len(groups) < 2:
    return
  listed = "; ".join(f"{words}: {n} run{'s' if n != 1 else ''}" for words, n in groups)
  if args.mixed_tokenizers:
    if not args.quiet:
      console.warn(f"fitting runs of {len(groups)} tokenizers together (--mixed-tokenizers): "
                   f"{listed}; the law's loss units are unknown")
    return
  raise ResultsError(f"{args.results} holds runs of {len(groups)} tokenizers, whose losses are "
                     f"in different units (nats per token of different tokens): {listed}; fit "
                     f"each tokenizer's runs as a table of their own, or pass "
                     f"--mixed-tokenizers to fit them together anyway")


def ladder_flop_shape(vocab_size: int, seq_len: int) -> Callable[[float], dict]:
  """N -> the ladder shape rule's shape for N parameters (``shapes.PRESETS["ladder"]``), as a
  dict with d_model, n_layers, n_heads, d_ff, N, aspect_ratio, ...: the FLOP-optimal shape an
  IsoTime fit compares the time-optimal one with (``analysis.isotime.fit.fit_isotime``)."""
  def flop_shape(n: float) -> dict:
    return shapes.propose_shapes(float(n), vocab_size=int(vocab_size), seq_len=int(seq_len),
                                 rule=shapes.PRESETS["ladder"], k=1)[0].to_dict()
  return flop_shape


def _fit_isotime(args: argparse.Namespace, info: dict) -> None:
  """The IsoTime fit of ``args.results`` and its validation run (when the table has one)."""
  say = None if args.quiet else console.say
  flop_shape = (ladder_flop_shape(info["vocab_size"], info["seq_len"])
                if info["vocab_size"] and info["seq_len"] else None)
  isotime.fit_isotime(args.results, args.out, law_path=args.law, flop_shape=flop_shape,
                      log=say, warn=(lambda msg: None) if args.quiet else console.warn,
                      figures=not args.no_figures, grid=args.grid)
  if info["has_validation"]:
    isotime.add_isotime_validation(args.results, args.out, log=say)


FIT_FILES_BYTES = 1e6  # fit.json, fit.md and 8 figures of a default ladder's fit: 0.8 MB


def disk_full_guard(out_dir):
  """Turns a full disk while the fit's files are written to ``out_dir`` into one
  :class:`~chinchax.storage.diskfull.DiskFull` line (a figure's write names no file)."""
  @contextlib.contextmanager
  def guard():
    try:
      yield
    except OSError as e:
      if not diskfull.is_disk_full(e):
        raise
      raise diskfull.disk_full("writing the fit's files (fit.json, fit.md, figures)", out_dir,
                               FIT_FILES_BYTES, then="the results table is kept") from None
  return guard()


def main(argv: list[str] | None = None) -> int:
  """Runs ``fit``; ``argv`` starts with RESULTS. Returns 0 (also for ``--help``).

  Raises:
    UserError: a bad flag, an unreadable or unusable table, or an explicitly
      requested approach the table cannot support; nothing is written.
  """
  argv = list(sys.argv[1:] if argv is None else argv)
  try:
    args = build_parser().parse_args(argv)
  except SystemExit as e:  # --help
    return e.code if isinstance(e.code, int) else 0
  _check_counts(args)
  _check_loss_units(args)
  info = isotime.isotime_table_info(args.results)
  if info is not None:
    _fit_isotime(args, info)
    return 0
  base = _repeat_base(args) if args.law else None
  if args.repeat_base is not None and not args.law:
    _repeated_table(args, "--repeat-base")
  with disk_full_guard(args.out or default_out_dir(args.results)):
    _fit_table(args, base)
  return 0


def _repeated_table(args, flag: str) -> None:
  """FitOptionError unless some run of the table repeats data (the table's own errors are
  left to the fit)."""
  try:
    runs = load_results(args.results, min_budgets=1)
  except ResultsError:
    return  # the fit itself says what is wrong with the table
  if not fit_repeat.has_repetition(runs):
    raise FitOptionError(f"{flag} is for tables whose runs repeat data (some run with D > "
                         f"unique_tokens; {args.results} has none)" + (
                             " and IsoTime tables (rows with budget_kind 'seconds'); an "
                             "IsoFLOP table's law is fitted from the table"
                             if flag == "--law" else ""))


def _repeat_base(args) -> laws.ParametricLaw:
  """``--law`` on an IsoFLOP table: the single-epoch law of its repetition fits, allowed
  only when some run repeats data, the law has all five parameters and its loss units are
  the table's (FitOptionError otherwise, or for a law without a loss); a law that records no
  units is taken to be in the table's, with a warning."""
  _repeated_table(args, "--law")
  _check_base_parameters(args.law)
  try:
    law = laws.get_law(args.law)
  except ValueError as e:
    raise FitOptionError(f"--law: {e}") from None
  if not isinstance(law, laws.ParametricLaw):
    raise FitOptionError(f"--law {args.law!r} has no L(N, D) (Approach 1/2 only allocate); "
                         f"the repetition laws need an Approach-3 law")
  table_units = recipe.table_units(args.results, recipe.table_recipe(args.results))
  if law.units.known and table_units.known and not law.units.same_tokenizer(table_units):
    raise FitOptionError(f"--law {args.law!r} predicts loss in {law.units.describe()}, the "
                         f"table's losses are {table_units.describe()}: a base law must be in "
                         f"the table's loss units (fit one on runs with the table's tokenizer)")
  if not law.units.known and table_units.known and not args.quiet:
    console.warn(f"--law {args.law!r} records no loss units (no recipe in the law file): it is "
                 f"taken to be in the table's, {table_units.describe()}")
  return law


def _check_base_parameters(spec: str) -> None:
  """FitOptionError when a ``--law`` file holds a base law with some of E, A, B, alpha, beta
  missing or not finite numbers (a fixed base needs all five)."""
  if spec in laws.PUBLISHED_LAWS or not os.path.isfile(spec):
    return
  try:
    with open(spec) as f:
      d = json.load(f)
  except (OSError, ValueError):
    return  # get_law says what is wrong with it
  if not isinstance(d, dict):
    return
  d = d if any(k in d for k in _BASE_KEYS) else (d.get("approach3") or {})
  if not isinstance(d, dict) or not any(k in d for k in _BASE_KEYS):
    return
  bad = [k for k in _BASE_KEYS if not (isinstance(d.get(k), (int, float))
                                       and not isinstance(d.get(k), bool)
                                       and math.isfinite(d[k]))]
  if bad:
    raise FitOptionError(f"--law {spec!r}: the base law needs E, A, B, alpha and beta as "
                         f"finite numbers; {', '.join(bad)} "
                         f"{'is' if len(bad) == 1 else 'are'} missing or not a number")


_BASE_KEYS = ("E", "A", "B", "alpha", "beta")


def _fit_table(args, repeat_base=None) -> None:
  fit_results(args.results, args.out, approach=args.approach, n_bootstrap=args.bootstrap,
              seed=args.seed, n_jobs=args.jobs, drop_highest_loss=args.drop_highest_loss,
              min_budgets=args.min_budgets, compare=args.compare, figures=not args.no_figures,
              log=None if args.quiet else console.say,
              warn=(lambda msg: None) if args.quiet else console.warn, window=args.window,
              huber_delta=args.huber_delta, loss=args.loss, asymmetry=args.asymmetry,
              grid=args.grid, bootstrap_method=args.bootstrap_method, envelope=args.envelope,
              repeat_base=repeat_base, repeat_base_from=f"--law {args.law}" if args.law else "",
              repeat_base_mode=args.repeat_base or ("fixed" if args.law else "joint"))
  if tuning.tuned_rows(tuning.read_rows(args.results)):  # a tuned ladder's table
    tuning.tuning_report(args.results, args.out or default_out_dir(args.results),
                         log=(lambda msg: None) if args.quiet else console.say)
