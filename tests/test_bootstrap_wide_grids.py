"""Intervals on wide grids: the windowed residual pool, and the bounds rule on a said aloud."""

import numpy as np
import pytest

from chinchax.laws import parametric as laws
from analysis.isoflop import synthetic
from analysis.isoflop.approaches import FitOptions, fit_approach
from analysis.isoflop.bootstrap import bootstrap, residual_pool
from analysis.isoflop.diagnostics import approach_warnings
from analysis.report import _bounds_text, _boot_dict

LAW = laws.ParametricLaw("wide", E=1.0, A=30.0, B=200.0, alpha=0.35, beta=0.35)
NOISE = 0.001  # standard deviation of the runs' noise in ln L


def _wide(span=32.0, n_sizes=11, seed=0, law=LAW, noise=NOISE):
  return synthetic.synthetic_runs(law, [1e12, 1e13, 1e14, 1e15], n_sizes=n_sizes, span=span,
                                  noise=noise, seed=seed)


def test_windowed_pool_measures_the_noise_not_the_parabolas_misfit():
  runs = _wide()
  whole, windowed = residual_pool(runs), residual_pool(runs, window=2)
  # Over ±32× the profiles are not parabolas in ln N: the whole-grid pool is their misfit.
  assert whole.sd > 2 * NOISE
  # On the 5 sizes around each minimum the quadratic holds: the pool is the injected noise.
  assert windowed.sd == pytest.approx(NOISE, rel=0.5)
  assert windowed.dof == 4 * (5 - 3) and windowed.budgets.size == 4


def test_windowed_fit_bootstraps_from_its_windowed_pool():
  runs = _wide()
  opts = FitOptions(window=2)
  full = fit_approach(runs, "2", options=opts)
  boot = bootstrap(runs, "2", full, n_resamples=30, seed=0, options=opts)
  assert boot.residual_sd == pytest.approx(residual_pool(runs, window=2).sd)
  assert "within 2 places of its lowest loss" in boot.method
  plain = bootstrap(runs, "2", fit_approach(runs, "2"), n_resamples=30, seed=0)
  assert plain.residual_sd == pytest.approx(residual_pool(runs).sd)


def test_bounds_rule_counts_what_it_drops_and_flags_the_truncated_interval():
  # beta >> alpha puts a = beta / (alpha + beta) near 1; noisy runs push replicates over it.
  law = laws.ParametricLaw("steep", E=1.0, A=3.0, B=500.0, alpha=0.05, beta=0.9)
  runs = synthetic.synthetic_runs(law, [1e11, 1e12, 1e13, 1e14, 1e15], n_sizes=7, span=4.0,
                                  noise=0.01, seed=3)
  full = fit_approach(runs, "2")
  boot = bootstrap(runs, "2", full, n_resamples=60, seed=0)
  below, above = boot.bounds_dropped
  assert above > 0 and below == 0
  n_bounds = sum(n for msg, n in boot.failures.items() if "fitted exponent a" in msg)
  assert above == n_bounds  # hand count from the failures' own messages
  msgs = [m for m in approach_warnings("2", full, boot) if "bounds rule" in m]
  assert msgs and f"{above} of 60 replicates" in msgs[0] and "upper end" in msgs[0]
  d = _boot_dict(boot)["bootstrap"]
  assert d["bounds_rule"]["truncated"] and d["bounds_rule"]["dropped_above_1"] == above
  assert f"it removed {above}" in _bounds_text(d)
  assert np.isfinite(boot.ci["a"][1]) and boot.ci["a"][1] < 1.0
