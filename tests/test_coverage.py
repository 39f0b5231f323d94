"""Honest intervals: bootstrap coverage of a on ladders from a known law, Approach 2's fixed-design
replicates, and the fit's agreement criterion (Approaches 1-2 within 0.05, Approach 3 by form)."""

import dataclasses
import importlib.util
import pathlib
import sys

import numpy as np
import pytest

from chinchax.laws import parametric as laws
from analysis.isoflop import approach3
from analysis.isoflop.approach2 import fit_approach2
from analysis.isoflop.approach2_design import refit_on_design
from analysis.isoflop.approach3 import parse_grid, start_grid
from analysis.isoflop.approaches import FitOptions
from analysis.isoflop.bootstrap import bootstrap, residual_pool
from analysis.isoflop.diagnostics import AGREEMENT_TOL, agreement, agreement_markdown
from analysis.isoflop.fit import fit_all
from analysis.report import markdown, report_dict
from analysis.runs import runs_from_arrays
from analysis.isoflop.synthetic import synthetic_runs

_PATH = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "coverage.py"
TRUE = laws.ParametricLaw("true", E=1.8, A=480.0, B=2100.0, alpha=0.35, beta=0.37)
GRID = start_grid(parse_grid("alpha=0.2:0.5:2,beta=0.2:0.5:2,logE=-1:1:2,logA=0:10:2,"
                             "logB=0:10:2"))


@pytest.fixture(scope="module")
def cov():
  """benchmarks/coverage.py as a module (its name would clash with the coverage package)."""
  spec = importlib.util.spec_from_file_location("chinchax_coverage_study", _PATH)
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module     # dataclasses (and worker processes) look it up by name
  spec.loader.exec_module(module)
  return module


# --- the benchmark's ladders come from the law it names ------------------------------------------

def test_ladder_grids_follow_skew_and_noise_ratio(cov):
  s = cov.Setting("chinchilla", 5, 7, 0.004, skew=0.2, noise_ratio=4.0)
  runs = cov.make_ladder(dataclasses.replace(s, noise=0.0), np.random.default_rng(0))
  law = cov.LAWS["chinchilla"]
  assert np.allclose(runs.loss, law.loss(runs.N, runs.D), rtol=1e-12)   # noise 0: the law
  budgets = runs.budgets()
  centre = [np.exp(np.log(runs.N[runs.budget == C]).mean()) for C in budgets]
  ratio = np.array(centre) / np.array([law.optimal_allocation(C)[0] for C in budgets])
  # Grid centres drift from the optimum as C^skew, 1 at the middle budget.
  assert np.allclose(np.log(ratio), 0.2 * np.log(budgets / np.sqrt(s.c_min * s.c_max)))
  assert s.noise_at(s.c_min) / s.noise_at(s.c_max) == pytest.approx(4.0)
  assert s.true_a == pytest.approx(law.a)


# --- Approach 2 on the full fit's design ---------------------------------------------------------

def test_fixed_design_refit_of_the_data_is_the_full_fit():
  runs = synthetic_runs(TRUE, np.geomspace(1e18, 1e21, 6), n_sizes=9, span=6.0, noise=0.004,
                        seed=3)
  for window in (None, 2):
    full = fit_approach2(runs, window=window)
    again = refit_on_design(runs, full)
    assert again.a == pytest.approx(full.a, rel=1e-12)
    assert [p.C for p in again.used] == [p.C for p in full.used]


def test_fixed_design_replicates_keep_the_budgets_that_reselection_drops(cov):
  """Grids planned with a wrong exponent put the end budgets' optima near a grid edge: residual
  replicates that choose their budgets again leave those out; on the fixed design they stay."""
  s = cov.Setting("chinchilla", 12, 9, 0.005, skew=0.3, window=3)
  runs = cov.make_ladder(s, np.random.default_rng(4))
  full = fit_approach2(runs, window=3)
  again = bootstrap(runs, "2", full, n_resamples=40, seed=0)
  fixed = bootstrap(runs, "2", full, n_resamples=40, seed=0, fixed_design=True)
  assert sum(again.budgets_left_out.values()) > 5 * max(1, sum(fixed.budgets_left_out.values()))
  assert fixed.n_failed == 0
  for boot in (again, fixed):
    lo, hi = boot.ci["a"]
    assert lo < full.a < hi


# --- coverage --------------------------------------------------------------------------------------

def test_approach2_intervals_cover_the_true_exponent(cov):
  """30 ladders of each of two settings, Approach 2, 40 residual replicates each: the 95%
  intervals cover the law's a in 80-100% of ladders and are about as wide as a_hat scatters."""
  settings = (cov.Setting("chinchilla", 5, 7, 0.005),
              cov.Setting("epoch", 8, 9, 0.003, span=6.0, skew=0.1))
  study = cov.run_study(settings, n_ladders=30, n_resamples=40, approaches=("2",), seed=7)
  for row in study[:-1]:
    v = row["approaches"]["2"]
    assert v["n"] == 30, row
    assert 0.8 <= v["coverage"] <= 1.0, row
    assert 0.7 <= v["width_ratio"] <= 1.4, row
  assert study[-1]["label"] == "all settings" and study[-1]["approaches"]["2"]["n"] == 60


@pytest.mark.slow
def test_approach1_and_2_coverage_on_default_settings(cov):
  study = cov.run_study(cov.DEFAULT_SETTINGS[:3], n_ladders=30, n_resamples=40, jobs=2)
  for k in ("1", "2"):
    pooled = study[-1]["approaches"][k]
    assert 0.85 <= pooled["coverage"] <= 1.0, (k, pooled)
    for row in study[:-1]:
      assert 0.6 <= row["approaches"][k]["width_ratio"] <= 1.6, (k, row)


def test_broken_noise_scale_is_caught(cov, monkeypatch):
  """The coverage check can fail: replicates drawn with a tenth of the residual spread give
  intervals far narrower than a_hat's scatter."""
  from analysis.isoflop import bootstrap as bootstrap_lib
  real = bootstrap_lib.residual_pool

  def shrunk(runs):
    pool = real(runs)
    return dataclasses.replace(pool, residuals=pool.residuals / 10)

  monkeypatch.setattr(bootstrap_lib, "residual_pool", shrunk)
  study = cov.run_study((cov.Setting("chinchilla", 5, 7, 0.005),), n_ladders=20, n_resamples=30,
                        approaches=("2",), seed=11)
  v = study[0]["approaches"]["2"]
  assert v["coverage"] < 0.5 and v["width_ratio"] < 0.2


# --- agreement: Approaches 1 and 2 within 0.05, Approach 3 by its form -------------------------------

def _ladder_with_curves(seed=0):
  return synthetic_runs(TRUE, np.geomspace(1e18, 1e20, 5), n_sizes=7, span=4.0, noise=0.003,
                        seed=seed, curve_points=16)


def test_agreement_in_fit_json_and_fit_md(monkeypatch):
  full = approach3.chinchilla_grid()
  monkeypatch.setattr(approach3, "chinchilla_grid", lambda: full[::25])
  runs = _ladder_with_curves()
  report = fit_all(runs, n_bootstrap=0, options=FitOptions(grid=GRID))
  data = report_dict(report)
  block = data["agreement"]
  a1, a2 = report.results["1"].a, report.results["2"].a
  assert block["approach1_2"]["abs_delta_a"] == pytest.approx(abs(a1 - a2))
  assert block["approach1_2"]["agree"] is True        # both near the law's a on a clean ladder
  form = block["approach3_form"]
  assert form["scatter_sd"] == pytest.approx(residual_pool(runs).sd)
  assert form["holds"] is True and form["ratio"] < 2.0
  md = markdown(data)
  assert "## Agreement" in md and "Approaches 1 and 2" in md and "agree." in md
  assert "Approach 3's form" in md and "holds to the runs' precision" in md


def test_approach3_judged_by_form_not_by_agreement(monkeypatch):
  """A bend along D/N that per-budget quadratics absorb but E + A/N^alpha + B/D^beta cannot:
  the form check fails; Approaches 1-2's verdict does not depend on Approach 3."""
  full = approach3.chinchilla_grid()
  monkeypatch.setattr(approach3, "chinchilla_grid", lambda: full[::25])
  clean = _ladder_with_curves(seed=1)
  r = np.log(clean.D / clean.N)
  bend = np.exp(0.02 * (r - r.mean()) ** 2)
  bent = runs_from_arrays(clean.N, clean.D, clean.loss * bend, budget=clean.budget,
                          curves=[np.column_stack([c[:, 0], c[:, 1] * f])
                                  for c, f in zip(clean.curves, bend)])
  report = fit_all(bent, approaches=("3",), n_bootstrap=0, options=FitOptions(grid=GRID))
  block = agreement(report.results, residual_pool(bent).sd)
  assert block["approach1_2"] is None
  assert block["approach3_form"]["holds"] is False and block["approach3_form"]["ratio"] > 2.0
  md = "\n".join(agreement_markdown(block))
  assert "does NOT hold" in md and "not both fitted" in md


class _Fake:
  def __init__(self, a):
    self.a = a

  def params(self):
    return {"a": self.a}


@pytest.mark.parametrize("delta, agree", [(0.03, True), (0.07, False)])
def test_approach1_2_tolerance(delta, agree):
  block = agreement({"1": _Fake(0.45), "2": _Fake(0.45 + delta)}, scatter_sd=0.01)
  assert AGREEMENT_TOL == 0.05
  assert block["approach1_2"]["agree"] is agree
  line = agreement_markdown(block)[4]
  assert ("DISAGREE" in line) is (not agree)
