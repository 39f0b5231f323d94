"""Tests of the fitters (Approaches 1-3, bootstrap, fit_all) on data generated from a known law."""

import numpy as np
import pytest

from chinchax.laws import parametric as laws
from analysis.isoflop.approach1 import APPROACH1_N_POINTS, fit_approach1, smooth_curve
from analysis.isoflop.approach2 import fit_approach2
from analysis.isoflop.approach3 import chinchilla_grid, fit_approach3, huber_objective
from analysis.isoflop.approaches import support_reason
from analysis.isoflop.bootstrap import bootstrap
from analysis.errors import ApproachUnsupported, FitOptionError
from analysis.isoflop.fit import fit_all
from analysis.runs import runs_from_arrays
from analysis.isoflop.synthetic import synthetic_runs

TRUE = laws.ParametricLaw("true", E=1.8, A=480.0, B=2100.0, alpha=0.35, beta=0.37)
BUDGETS = np.geomspace(1e18, 1e21, 7)


@pytest.fixture(scope="module")
def noisy_runs():
  """Final losses with 0.3% noise per run."""
  return synthetic_runs(TRUE, BUDGETS, n_sizes=9, noise=0.003, seed=1)


@pytest.fixture(scope="module")
def curve_runs():
  """Eval curves with 0.1% noise per point (Approach 1 picks single runs, so it is the
  most noise-sensitive approach)."""
  return synthetic_runs(TRUE, BUDGETS, n_sizes=9, curve_noise=0.001, seed=1, curve_points=25)


@pytest.fixture(scope="module")
def approach3(noisy_runs):
  # Every 9th start of the 4500-point grid keeps this test quick; the full grid
  # is exercised on the Epoch data in test_analysis_epoch.py.
  return fit_approach3(noisy_runs, starts=chinchilla_grid()[::9])


def test_huber_gradient_matches_finite_differences():
  rng = np.random.default_rng(0)
  runs = synthetic_runs(TRUE, BUDGETS, n_sizes=5, noise=0.01, seed=2)
  logN, logD, logL = np.log(runs.N), np.log(runs.D), np.log(runs.loss)
  for theta in (np.array([6.2, 7.6, 0.59, 0.35, 0.37]),      # near the optimum: mostly quadratic
                np.array([3.0, 12.0, -0.5, 0.8, 0.9]),       # far: mostly linear Huber branch
                rng.uniform([0, 0, -1, 0, 0], [25, 25, 1, 2, 2])):
    f, g = huber_objective(theta, logN, logD, logL)
    num = np.zeros(5)
    for k in range(5):
      h = 1e-6 * max(1.0, abs(theta[k]))
      e = np.zeros(5)
      e[k] = h
      num[k] = (huber_objective(theta + e, logN, logD, logL)[0]
                - huber_objective(theta - e, logN, logD, logL)[0]) / (2 * h)
    assert np.allclose(g, num, rtol=1e-4, atol=1e-8 * max(1.0, np.abs(num).max())), (theta, g, num)
    # The value is the summed Huber loss of the log-space residuals.
    pred = np.log(np.exp(theta[2]) + np.exp(theta[0]) * runs.N ** -theta[3]
                  + np.exp(theta[1]) * runs.D ** -theta[4])
    r = pred - logL
    huber = np.where(np.abs(r) <= 1e-3, 0.5 * r ** 2, 1e-3 * (np.abs(r) - 0.5e-3))
    assert f == pytest.approx(huber.sum(), rel=1e-10)


def test_grid_is_chinchillas_4500_starts():
  g = chinchilla_grid()
  assert g.shape == (4500, 5)
  assert sorted(set(g[:, 0])) == [0, 5, 10, 15, 20, 25]
  assert sorted(set(g[:, 2])) == [-1, -0.5, 0, 0.5, 1]
  assert sorted(set(g[:, 3])) == [0, 0.5, 1, 1.5, 2]
  assert len({tuple(row) for row in g}) == 4500


def test_approach3_recovers_parameters(approach3):
  for name in ("E", "A", "B", "alpha", "beta"):
    assert getattr(approach3, name) == pytest.approx(getattr(TRUE, name), rel=0.05), name
  assert abs(approach3.a - TRUE.a) < 0.02
  assert approach3.converged and approach3.n_starts == 500
  assert np.sqrt(np.mean(approach3.residuals ** 2)) < 0.006


def test_approach3_is_exact_without_noise():
  runs = synthetic_runs(TRUE, BUDGETS, n_sizes=7, noise=0.0)
  start = np.array([[5.0, 8.0, 0.5, 0.5, 0.5]])
  res = fit_approach3(runs, starts=start)
  assert res.alpha == pytest.approx(TRUE.alpha, rel=1e-3)
  assert res.B == pytest.approx(TRUE.B, rel=1e-2)
  assert res.best_start_on_grid_edge is False and res.optimum_inside_grid


def test_approach2_recovers_exponents(noisy_runs):
  res = fit_approach2(noisy_runs)
  assert abs(res.a - TRUE.a) < 0.02
  assert abs(res.b - TRUE.b) < 0.02
  assert len(res.used) == len(BUDGETS)


@pytest.mark.parametrize("envelope", ["quadratic", "argmin"])
def test_approach1_recovers_exponents(curve_runs, envelope):
  res = fit_approach1(curve_runs, envelope=envelope)
  assert res.envelope == envelope
  assert abs(res.a - TRUE.a) < 0.02
  assert abs(res.b - TRUE.b) < 0.02
  assert len(res.C) == APPROACH1_N_POINTS
  assert res.n_winning_sizes > 10
  assert np.allclose(6 * res.N_env * res.D_env, res.C)


def test_approach1_quadratic_envelope_beats_argmin_on_a_small_ladder():
  """A ladder-sized grid (4 budgets over 1.5 decades, 5 sizes each, 0.4% noise per run): against
  the known law, reading N_opt off a quadratic through the winning size and its neighbours errs
  less than the winning size itself (the argmin can only take the grid's sizes)."""
  law = laws.ParametricLaw("ladder-like", E=1.1, A=90.0, B=60.0, alpha=0.55, beta=0.40)
  err = {"quadratic": [], "argmin": []}
  for seed in range(24):
    runs = synthetic_runs(law, np.geomspace(2.5e10, 8e11, 4), n_sizes=5, span=2.5, noise=0.004,
                          seed=seed, curve_points=31, curve_noise=0.002)
    for envelope in err:
      err[envelope].append(fit_approach1(runs, envelope=envelope).a - law.a)
  rmse = {k: float(np.sqrt(np.mean(np.square(v)))) for k, v in err.items()}
  assert rmse["quadratic"] < 0.9 * rmse["argmin"], rmse    # 0.79 on these seeds, 0.75-0.79 on 100-200
  assert abs(np.mean(err["quadratic"])) < 0.03, rmse


def test_approach1_quadratic_envelope_finds_a_minimum_between_sizes():
  """Three sizes, losses exactly quadratic in ln N with the minimum a third of the way from the
  middle size to the largest: the quadratic puts N_opt there, the argmin on the middle size.
  Past the first two curves' end only the largest size has a loss: it is N_opt there."""
  sizes = np.array([1e4, 2e4, 4e4])
  x_min = np.log(sizes[1]) + np.log(2.0) / 3
  curves = []
  for n, end in zip(sizes, (1e11, 1e11, 1.2e11)):
    flops = np.geomspace(1e10, end, 9)
    curves.append(np.stack([flops, 3.0 - 0.2 * np.log(flops / 1e10)
                            + 0.1 * (np.log(n) - x_min) ** 2], axis=1))
  runs = runs_from_arrays(sizes, [c[-1, 0] / (6 * n) for c, n in zip(curves, sizes)],
                          [c[-1, 1] for c in curves], curves=curves, budget=[1e11] * 3)
  q = fit_approach1(runs, envelope="quadratic")
  g = fit_approach1(runs, envelope="argmin")
  assert q.N_env[0] == pytest.approx(np.exp(x_min), rel=1e-9)
  assert g.N_env[0] == sizes[1]
  assert np.allclose(q.N_env[1:], sizes[2]) and np.allclose(g.N_env[1:], sizes[2])
  with pytest.raises(FitOptionError, match="unknown Approach 1 envelope 'nearest'"):
    fit_approach1(runs, envelope="nearest")


def test_approach2_leaves_out_edge_budgets():
  runs = synthetic_runs(TRUE, BUDGETS, n_sizes=5, span=4.0)
  # Shift the last budget's sizes far above its optimum: its minimum is at the smallest N.
  N = runs.N.copy()
  last = runs.budget == BUDGETS[-1]
  N[last] *= 20
  shifted = runs_from_arrays(N, runs.budget / (6 * N), TRUE.loss(N, runs.budget / (6 * N)),
                             budget=runs.budget)
  res = fit_approach2(shifted)
  assert [p.status for p in res.budgets] == ["ok"] * 6 + ["edge"]
  assert "smallest sampled N" in res.budgets[-1].reason
  assert abs(res.a - TRUE.a) < 0.005


def test_approach2_unsupported_with_too_few_sizes():
  runs = synthetic_runs(TRUE, BUDGETS, n_sizes=2)
  assert "3 or more model sizes" in support_reason(runs, "2")
  with pytest.raises(ApproachUnsupported, match="3 or more model sizes"):
    fit_approach2(runs)
  with pytest.raises(ApproachUnsupported, match="eval-loss curve"):
    fit_approach1(runs)


def test_smooth_curve_keeps_lines_and_reduces_noise():
  x = np.linspace(0.0, 5.0, 30)          # 0.17 apart: ±0.4 holds 5 points inside, 3 at the ends
  line = 3.0 - 0.2 * x
  assert np.allclose(smooth_curve(x, line, 0.4), line)
  noisy = line + np.random.default_rng(0).normal(0, 0.01, x.size)
  smoothed = smooth_curve(x, noisy, 0.4)
  assert np.std(smoothed - line) < 0.8 * np.std(noisy - line)
  assert np.array_equal(smooth_curve(x, noisy, 0.0), noisy)


def test_smooth_curve_leaves_a_sparse_curved_curve_as_measured():
  # 8 evals log-spaced over 2.6 decades of FLOPs (0.85 apart in ln FLOPs), convex in ln FLOPs like
  # a training curve: no point has a neighbour within the window, so none moves; a count-of-points
  # window would have pulled the last point down along the curvature.
  x = np.log(np.geomspace(6e8, 2.5e11, 8))
  curve = 1.7 + 0.05 * (x - x[-1]) ** 2
  assert np.array_equal(smooth_curve(x, curve), curve)
  # Dense in the same span, the end point stays within the curvature over its half window.
  xd = np.linspace(x[0], x[-1], 60)
  cd = 1.7 + 0.05 * (xd - xd[-1]) ** 2
  assert abs(smooth_curve(xd, cd)[-1] - cd[-1]) < 0.05 * 0.2 ** 2


def test_bootstrap_intervals_cover_truth_and_are_seeded(noisy_runs, approach3):
  b3 = bootstrap(noisy_runs, "3", approach3, n_resamples=40, seed=3)
  assert b3.n_failed == 0 and set(b3.ci) >= {"E", "A", "B", "alpha", "beta", "a", "b", "G"}
  for name in ("E", "alpha", "beta", "a"):
    lo, hi = b3.ci[name]
    assert lo < hi
    assert lo - 0.02 * abs(lo) <= getattr(TRUE, name) <= hi + 0.02 * abs(hi), name
  again = bootstrap(noisy_runs, "3", approach3, n_resamples=40, seed=3)
  assert again.ci == b3.ci
  other = bootstrap(noisy_runs, "3", approach3, n_resamples=40, seed=4)
  assert other.ci != b3.ci
  b2 = bootstrap(noisy_runs, "2", fit_approach2(noisy_runs), n_resamples=30, seed=0)
  assert b2.ci["a"][0] <= TRUE.a + 0.01 and b2.ci["a"][1] >= TRUE.a - 0.01
  lo_band, hi_band = b2.frontier_N
  assert np.all(lo_band <= hi_band) and lo_band.shape == b2.frontier_C.shape


def test_fit_all_skips_with_reason_or_raises_when_strict():
  runs = synthetic_runs(TRUE, BUDGETS, n_sizes=5, noise=0.002)
  rep = fit_all(runs, ("1", "2"), n_bootstrap=5)
  assert "1" in rep.skipped and "eval-loss curve" in rep.skipped["1"]
  assert "2" in rep.results and "2" in rep.bootstraps
  with pytest.raises(ApproachUnsupported, match="eval-loss curve"):
    fit_all(runs, ("1",), n_bootstrap=0, strict=True)


def test_parallel_starts_match_serial(noisy_runs):
  starts = chinchilla_grid()[::45]
  serial = fit_approach3(noisy_runs, starts=starts, n_jobs=1)
  parallel = fit_approach3(noisy_runs, starts=starts, n_jobs=2)
  assert np.array_equal(serial.theta, parallel.theta)
  assert serial.n_starts_at_best == parallel.n_starts_at_best
