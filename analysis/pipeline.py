"""Fitting a results file end to end: load, fit, write the report and the figures.

:func:`fit_results` is the function behind ``chinchax fit`` (``chinchax.cli.fit``),
for callers that hold a path rather than an argv (the ladder's closing fit).
"""

from __future__ import annotations

import json
import os
import time
from typing import Callable, Sequence

import numpy as np

from chinchax.laws import parametric as laws
from chinchax.storage import paths as paths_lib
from analysis.repeat import fit as fit_repeat_lib
from analysis import figures as figures_lib
from analysis import plots
from analysis.repeat import report as repeat_report
from analysis import report as reportlib
from analysis import validation as validation_lib
from analysis.isoflop.approach3 import HUBER_DELTA, parse_grid, start_grid
from analysis.isoflop.approaches import APPROACHES, FitOptions
from analysis.isoflop.bootstrap import DEFAULT_METHOD, check_method
from analysis.isoflop.diagnostics import outside_interval
from analysis.errors import ApproachUnsupported, FitError, FitOptionError, ResultsError
from analysis.isoflop.fit import FitReport, fit_all
from analysis.isoflop.profile import profile_a
from analysis import profile as profile_lib
from analysis.io import load_results

DEFAULT_JOBS = min(2, os.cpu_count() or 1)  # processes for Approach 3's starts


def default_out_dir(results_path: str | os.PathLike) -> str:
  """The output folder when none is given: ``fit`` beside the results file (a URL's too)."""
  if paths_lib.is_url(results_path):
    return str(results_path).rstrip("/").rsplit("/", 1)[0] + "/fit"
  return os.path.join(os.path.dirname(os.path.abspath(results_path)), "fit")


def fit_results(results_path: str | os.PathLike, out_dir: str | os.PathLike | None = None, *,
                approach: str = "all", n_bootstrap: int = 200, seed: int = 0,
                n_jobs: int = DEFAULT_JOBS, drop_highest_loss: int = 0, min_budgets: int = 3,
                compare: Sequence[str] | None = None, figures: bool = True,
                log: Callable[[str], None] | None = None,
                warn: Callable[[str], None] | None = None, window: int | None = None,
                huber_delta: float = HUBER_DELTA, loss: str = "huber", asymmetry: float = 2.0,
                grid: str | np.ndarray | None = None,
                bootstrap_method: str = DEFAULT_METHOD,
                envelope: str = "quadratic", repeat_base: laws.ParametricLaw | None = None,
                repeat_base_from: str = "", repeat_base_mode: str | None = None) -> FitReport:
  """Fits a results table and writes ``fit.json``, ``fit.md`` and the figures into ``out_dir``.

  Args:
    results_path: the ladder's JSONL results table, or a CSV with columns N,
      loss and D or C (:func:`analysis.io.load_results`).
    out_dir: output folder (created); None or "": ``fit`` beside ``results_path``.
      Either may be a ``gs://`` URL: the table is read from a local copy, the
      outputs are written locally and uploaded when all are written.
    approach: "1", "2", "3" or "all". "all" skips, with a stated reason, the
      approaches the table cannot support; an explicit one that cannot run is
      an error.
    n_bootstrap: bootstrap resamples per approach (0 = no intervals).
    seed: bootstrap seed.
    n_jobs: processes for Approach 3's L-BFGS starts.
    drop_highest_loss: runs with the highest loss to drop before fitting
      (Besiroglu et al. 2024, arXiv 2404.10102, drop 5 from Chinchilla's data).
    min_budgets: fewest IsoFLOP budgets the table must have.
    compare: published law names or fit JSON paths to draw and tabulate beside
      the fit; None: every law of :data:`chinchax.laws.parametric.PUBLISHED_LAWS`.
    figures: whether to write the figures (PNG and SVG).
    log: progress printer (one line per call); None prints nothing.
    warn: printer of the fit's warnings (:mod:`analysis.isoflop.diagnostics`, one
      line each, without a "warning:" prefix); None: through ``log`` as
      "warning: ...". They are in ``fit.json`` and ``fit.md`` either way.
    window: Approach 2: fit each parabola on the sizes within ``window``
      places of the lowest observed loss (None: all sizes); Approach 2's residual
      bootstrap pools the residuals of those windowed quadratics (Approaches 1 and 3 keep
      the pool over all sizes).
    huber_delta: Approach 3's Huber threshold (Chinchilla: 1e-3).
    loss: Approach 3's loss, "huber" or "asymmetric".
    asymmetry: factor on under-predicted runs of the asymmetric loss.
    grid: Approach 3's start grid: a spec for
      :func:`analysis.isoflop.approach3.parse_grid` ("alpha=0:1:11,...") or an array
      (S, 5); None: :func:`analysis.isoflop.approach3.default_grid` (Chinchilla's
      4500 starts unless every loss lies above e).
    bootstrap_method: "residuals" (default: each replicate keeps the table's
      N, D and budgets and resamples the noise, the pooled residuals in ln L
      of per-budget quadratics) or "runs" (resample runs with replacement);
      :func:`analysis.isoflop.bootstrap.bootstrap`.
    envelope: Approach 1's reading of the envelope, "quadratic" or "argmin"
      (:func:`analysis.isoflop.approach1.fit_approach1`).
    repeat_base: a table whose runs repeat data: the single-epoch law of the repetition
      fits (:mod:`analysis.repeat.report`); None: the table's own Approach 3.
    repeat_base_from: where ``repeat_base`` comes from, in words.
    repeat_base_mode: "fixed" (the base held while the repetition constants are fitted: the
      papers' two-stage procedure) or "joint" (polished with them); None: "fixed" for a
      ``repeat_base`` given, "joint" for the table's own Approach 3 (held fixed, a base fitted
      on the same table gives intervals far too narrow: docs/fitting.md).

  Returns:
    The :class:`~analysis.isoflop.fit.FitReport`.

  Raises:
    FitOptionError: an unknown law in ``compare``, an unknown ``approach``, or
      a bad window, Huber delta, loss, asymmetry, grid, bootstrap method or envelope.
    ResultsError: the table cannot be read or used.
    ApproachUnsupported: an explicitly requested approach cannot run on the table.
    FitError: no approach could be fitted, or the requested one failed.
    PathError: ``out_dir`` cannot be created or written (checked before any fit).
  """
  out = os.fspath(out_dir) if out_dir else default_out_dir(results_path)
  paths_lib.check_writable_dir(out, "fit output directory")
  say = log or (lambda msg: None)
  tell = warn or (lambda msg: say(f"warning: {msg}"))
  shown_results = results_path = os.fspath(results_path)
  results_path = paths_lib.local_copy(results_path)  # a gs:// table: read from a local copy
  if approach != "all" and approach not in APPROACHES:
    raise FitOptionError(f"unknown approach {approach!r}; valid: all, {', '.join(APPROACHES)}")
  try:
    compare_laws = [laws.get_law(name) for name in (compare or list(laws.PUBLISHED_LAWS))]
  except ValueError as e:
    raise FitOptionError(str(e)) from None
  check_method(bootstrap_method)
  if repeat_base_mode is None:
    repeat_base_mode = "fixed" if repeat_base is not None else "joint"
  if repeat_base_mode not in fit_repeat_lib.BASE_MODES:
    raise FitOptionError(f"unknown repeat base mode {repeat_base_mode!r}; valid: "
                         f"{', '.join(fit_repeat_lib.BASE_MODES)}")
  options = FitOptions(window=window, huber_delta=huber_delta, loss=loss, asymmetry=asymmetry,
                       grid=_grid(grid), envelope=envelope)
  t0 = time.perf_counter()
  runs = load_results(results_path, min_budgets=min_budgets)
  runs = runs.drop_highest_loss(drop_highest_loss)
  say(f"loaded {len(runs)} runs ({runs.n_failed} failed, ignored) in "
      f"{len(runs.budgets())} IsoFLOP budgets from {shown_results}")
  approaches = APPROACHES if approach == "all" else (approach,)
  all_runs = runs
  if fit_repeat_lib.has_repetition(runs):  # Approaches 1-3 fit the runs of one epoch or less
    runs = fit_repeat_lib.single_epoch(runs)
    if not len(runs):
      raise ResultsError(f"{shown_results}: all {len(all_runs)} runs repeat data (D > "
                         f"unique_tokens): Approaches 1-3 and the repetition laws' fit report "
                         f"need runs of one epoch or less (D <= unique_tokens, or no "
                         f"unique_tokens) beside them; add the single-epoch runs")
    say(f"{len(all_runs) - len(runs)} runs repeat data (D > unique_tokens): Approaches 1-3 fit "
        f"the {len(runs)} runs of one epoch or less; the repetition laws fit all")
  try:
    report = fit_all(runs, approaches, n_bootstrap=n_bootstrap, seed=seed,
                     strict=approach != "all", n_jobs=n_jobs, log=say, options=options,
                     bootstrap_method=bootstrap_method)
  except FitError as e:
    raise type(e)(f"approach {approach}: {e}") from None
  if not report.results:
    raise FitError("no approach could be fitted: " + "; ".join(
        f"approach {k}: {v}" for k, v in report.skipped.items()))
  if "3" in report.results and options.loss == "huber":
    report.profiles["3"] = profile_a(report.results["3"], runs, delta=options.huber_delta)
  if all_runs is not runs:
    report.repeat = _fit_repeat(all_runs, report, n_bootstrap, seed, say, repeat_base,
                                repeat_base_from, repeat_base_mode)
  with paths_lib.staged_dir(out) as local_out:  # gs://: uploaded once everything is written
    figure_paths = plots.make_figures(report, local_out, compare_laws) if figures else []
    if figures:
      figure_paths += repeat_report.plot_profiles(_profiles_to_draw(report), local_out)
    json_path, md_path = reportlib.write_report(report, local_out, compare_laws, figure_paths)
    if figures:  # drawn from fit.json, as add_validation redraws it
      figure_paths += _validation_figure(json_path, report.runs, local_out)
    v = _validation_of(json_path)
  if paths_lib.is_url(out):
    json_path, md_path = (f"{out.rstrip('/')}/{os.path.basename(p)}" for p in (json_path, md_path))
  for k, res in sorted(report.results.items()):
    p = res.params()
    boot = report.bootstraps.get(k)
    ci = f" [{boot.ci['a'][0]:.3f}, {boot.ci['a'][1]:.3f}]" if boot else ""
    extra = ""
    if k == "3":
      extra = (f"  E={p['E']:.4g} A={p['A']:.4g} B={p['B']:.4g} alpha={p['alpha']:.4g} "
               f"beta={p['beta']:.4g}")
    outside = outside_interval(res, boot)
    flag = f"  (outside its interval: {outside.split(', from ')[1]})" if outside else ""
    say(f"approach {k}: a = {p['a']:.4f}{ci}{flag}{extra}")
    prof = report.profiles.get(k) or {}
    if prof.get("a"):
      say(f"approach {k}: {profile_lib.describe('a', prof['a'])}; "
          f"{profile_lib.describe('b', prof['b'])}")
  if v is not None and v["rel_error"] is not None:
    say(f"validation: run {v['run_id']} at C={v['C']:.3g}: predicted loss "
        f"{v['predicted_loss']:.4f}, measured {v['measured_loss']:.4f} nats/token "
        f"({100 * v['rel_error']:+.2f}%)" + (" by the single-epoch law (repetition ignored; "
                                              "the repeat lines above give the repetition laws')"
                                              if report.repeat is not None else ""))
  for k, msgs in sorted(report.warnings.items()):
    for msg in msgs:
      tell(f"approach {k}: {msg}")
  say(f"wrote {json_path}, {md_path} and {len(figure_paths)} figure files in "
      f"{time.perf_counter() - t0:.1f} s")
  return report


def _profiles_to_draw(report) -> dict:
  """Title -> profile dict of every profile the fit computed (Approach 3's a, the repetition
  constants), for ``profile.png``."""
  out = {f"approach 3: {k}": (report.profiles.get("3") or {}).get(k) for k in ("a",)}
  rep = report.repeat
  if rep is not None and not isinstance(rep, dict):
    for form, f in rep.forms.items():
      for k, p in (f.get("profile") or {}).items():
        if isinstance(p, dict) and "grid" in p:
          out[f"{form}: {k}"] = p
  return {k: v for k, v in out.items() if v}


def _fit_repeat(runs, report, n_bootstrap: int, seed: int, say, base=None,
                base_from: str = "", base_mode: str = "fixed") -> object:
  """The repetition fits of a table whose runs repeat data (analysis.repeat.report), with
  ``base`` as the single-epoch law, else Approach 3's when it was fitted; {"status":
  "skipped"} when they fail."""
  a3 = report.results.get("3")
  own = base is None  # the table's own single-epoch law: refitted in each bootstrap replicate
  if base is None and a3 is not None:
    base = a3.law
    base_from = (f"this fit's Approach 3 (on the {len(report.runs)} runs of one epoch or "
                 f"less)")
  try:
    rep = repeat_report.fit_repeat(runs, base, n_bootstrap=n_bootstrap, seed=seed, log=say,
                                   base_from=base_from or "given", base_mode=base_mode,
                                   refit_base=own)
  except (FitError, ApproachUnsupported, ValueError, ArithmeticError) as e:
    say(f"repeat: not fitted: {e}")
    return {"status": "skipped", "reason": str(e)}
  say(f"repeat: {rep.verdict}")
  for v in rep.validation:
    say(_repeat_validation_line(v))
  return rep


def _repeat_validation_line(v: dict) -> str:
  """One line: a held-out run's measured loss beside each repetition law's prediction."""
  preds = ", ".join(f"{k} {p['predicted_loss']:.4f} ({100 * p['rel_error']:+.2f}%)"
                    for k, p in v["predictions"].items())
  return (f"repeat: validation run {v['run_id']} ({v['epochs'] or 0:.3g} epochs of "
          f"{v['unique_tokens'] or 0:.4g} unique tokens): measured {v['measured_loss']:.4f}"
          f"{repeat_report.se_text(v)}; predicted {preds}")


def _validation_figure(json_path: str, runs, out_dir: str) -> list[str]:
  """Draws ``validation.png`` (:func:`analysis.figures.plot_validation`) from ``json_path`` and
  lists it among the report's figures; returns its paths."""
  with open(json_path) as f:
    data = json.load(f)
  paths = figures_lib.plot_validation(data, runs, out_dir)
  names = [os.path.basename(p) for p in paths]
  if names and not set(names) <= set(data.get("figures") or []):
    data["figures"] = sorted(set(data.get("figures") or []) | set(names))
    reportlib.write_json_and_markdown(data, out_dir)
  return paths


def _validation_of(json_path: str) -> dict | None:
  with open(json_path) as f:
    return json.load(f).get("validation")


def _grid(grid: str | np.ndarray | None) -> np.ndarray | None:
  """Approach 3's start grid from a spec or an array (FitOptionError when unusable)."""
  if grid is None:
    return None
  if isinstance(grid, str):
    try:
      return start_grid(parse_grid(grid))
    except ValueError as e:
      raise FitOptionError(str(e)) from None
  arr = np.atleast_2d(np.asarray(grid, dtype=np.float64))
  if arr.ndim != 2 or arr.shape[1] != 5 or not np.all(np.isfinite(arr)):
    raise FitOptionError(f"a start grid must be finite with shape (S, 5), got {arr.shape}")
  return arr


def add_validation(results_path: str | os.PathLike, out_dir: str | os.PathLike | None = None,
                   log: Callable[[str], None] | None = None) -> dict | None:
  """Adds the table's validation run to an existing fit (``fit.json``, ``fit.md``) without
  refitting; returns the ``validation`` block, or None when the table has no such run.

  The block is what :func:`fit_results` writes for the same table
  (:func:`analysis.validation.validation_block` with the law of ``fit.json``).

  Raises:
    ResultsError: the table cannot be read.
    FitError: ``fit.json`` is missing or unreadable (fit the table first).
  """
  out = os.fspath(out_dir) if out_dir else default_out_dir(results_path)
  runs = load_results(paths_lib.local_copy(os.fspath(results_path)), min_budgets=1)
  if not runs.held_out:
    return None
  json_path = f"{out.rstrip('/')}/fit.json" if paths_lib.is_url(out) else os.path.join(out, "fit.json")
  try:
    data = json.loads(paths_lib.as_path(json_path).read_text())
  except (OSError, ValueError) as e:
    raise FitError(f"cannot read {json_path} ({e}); fit {results_path} first") from None
  data["validation"] = validation_lib.validation_block(data, runs.held_out[-1])
  rep = data.get("repeat")
  if isinstance(rep, dict) and rep.get("status") == "ok":  # the repetition laws predict it too
    rep["validation"] = [repeat_report.validation_from_block(rep, row) for row in runs.held_out]
    if log is not None:
      for v in rep["validation"]:
        log(_repeat_validation_line(v))
  with paths_lib.staged_dir(out) as local_out:  # gs://: uploaded when written
    json_local, _ = reportlib.write_json_and_markdown(data, local_out)
    if data.get("figures"):  # the fit drew figures: the validation run joins its own
      _validation_figure(json_local, runs, local_out)
  v = data["validation"]
  if log is not None and v["rel_error"] is not None:
    repeated = isinstance(rep, dict) and rep.get("status") == "ok"
    log(f"validation: run {v['run_id']} at C={v['C']:.3g}: predicted loss "
        f"{v['predicted_loss']:.4f}, measured {v['measured_loss']:.4f} nats/token "
        f"({100 * v['rel_error']:+.2f}%)" + (" by the single-epoch law (repetition ignored; "
                                              "the repeat lines above give the repetition laws')"
                                              if repeated else ""))
  return v
