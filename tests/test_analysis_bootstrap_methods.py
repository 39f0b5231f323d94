"""The two bootstrap methods: resampling the noise of a fixed design ("residuals") vs runs."""

import json

import numpy as np
import pytest

from chinchax import cli as chinchax_cli
from chinchax.laws import parametric as laws
from analysis import pipeline
from analysis.isoflop.approach3 import parse_grid, start_grid
from analysis.isoflop.approaches import FitOptions, fit_approach
from analysis.isoflop.bootstrap import METHODS, bootstrap, residual_pool, residual_replicate
from analysis.errors import FitOptionError
from analysis.isoflop.fit import fit_all
from analysis.io import write_results_jsonl
from analysis.runs import runs_from_arrays, tokens_6nd
from analysis.isoflop.synthetic import synthetic_runs

TRUE = laws.ParametricLaw("true", E=1.8, A=480.0, B=2100.0, alpha=0.35, beta=0.37)
BUDGETS = np.geomspace(1e18, 1e21, 4)
GRID = "alpha=0.2:0.5:2,beta=0.2:0.5:2,logE=-1:1:2,logA=0:10:2,logB=0:10:2"
OPTIONS = FitOptions(grid=start_grid(parse_grid(GRID)))


def _quadratic_table(n_sizes=5, curves=True):
  """IsoFLOP profiles whose ln L is exactly a quadratic in ln N (no noise, no misfit)."""
  N, D, L, B, C_curves = [], [], [], [], []
  for C in BUDGETS:
    n_opt, _ = TRUE.optimal_allocation(float(C))
    l_opt = float(TRUE.loss(n_opt, tokens_6nd(C, n_opt)))
    for n in n_opt * np.geomspace(1 / 8, 8, n_sizes):
      loss = l_opt * np.exp(0.02 * np.log(n / n_opt) ** 2)
      N.append(n), D.append(tokens_6nd(C, n)), L.append(loss), B.append(C)
      flops = np.geomspace(C / 100, C, 12)
      C_curves.append(np.stack([flops, loss * (C / flops) ** 0.1], axis=1))
  return runs_from_arrays(N, D, L, budget=B, curves=C_curves if curves else None)


def test_pool_inflates_and_centres_hand_computed_residuals():
  runs = _quadratic_table()
  bump = np.zeros(len(runs))
  bump[2], bump[7] = 0.01, -0.004          # one run of budget 0 and one of budget 1 moved
  moved = runs_from_arrays(runs.N, runs.D, runs.loss * np.exp(bump), budget=runs.budget)
  pool = residual_pool(moved)
  assert pool.dof == 4 * (5 - 3) and pool.residuals.size == 20
  # By hand: the residuals of one budget are the moved value projected off the quadratics.
  x = np.log(runs.N[:5]) - np.log(runs.N[:5]).mean()
  X = np.stack([np.ones(5), x, x * x], axis=1)
  M = np.eye(5) - X @ np.linalg.pinv(X)
  r0, r1 = M[:, 2] * 0.01, M[:, 2] * -0.004
  raw = np.concatenate([r0, r1, np.zeros(10)])
  assert pool.sd == pytest.approx(np.sqrt(raw @ raw / 8), rel=1e-9)
  expect = raw * np.sqrt(5 / 2)
  assert np.allclose(pool.residuals, expect - expect.mean(), atol=1e-12)
  assert abs(pool.residuals.mean()) < 1e-15


def test_residual_intervals_cover_truth_and_are_narrower_than_runs():
  runs = synthetic_runs(TRUE, BUDGETS, n_sizes=5, noise=0.01, seed=1)
  for approach, n in (("2", 50), ("3", 40)):
    full = fit_approach(runs, approach, options=OPTIONS)
    width = {}
    for method in METHODS:
      boot = bootstrap(runs, approach, full, n_resamples=n, seed=0, options=OPTIONS,
                       method=method, n_extra_starts=2)
      assert boot.resampling == method
      lo, hi = boot.ci["a"]
      width[method] = hi - lo
      if method == "residuals":
        assert lo <= TRUE.a <= hi, (approach, lo, hi)
        assert boot.n_failed == 0
        assert f"{boot.residual_dof} dof" in boot.method and boot.residual_dof == 8
        assert f"s.d. {boot.residual_sd:.3g}" in boot.method
        assert 0.004 < boot.residual_sd < 0.02
    assert width["residuals"] < width["runs"], (approach, width)


def test_zero_noise_residual_intervals_collapse():
  runs = _quadratic_table()
  rep = fit_all(runs, ("1", "2", "3"), n_bootstrap=20, options=OPTIONS)
  assert set(rep.bootstraps) == {"1", "2", "3"}
  for k, boot in rep.bootstraps.items():
    assert boot.resampling == "residuals" and boot.n_failed == 0
    assert boot.residual_sd < 1e-12
    a = rep.results[k].params()["a"]
    lo, hi = boot.ci["a"]
    assert hi - lo < 1e-6 and abs(lo - a) < 1e-6, (k, lo, hi, a)
  # The runs method on the same table does not collapse for the envelope (Approach 1).
  runs_boot = bootstrap(runs, "1", rep.results["1"], n_resamples=20, method="runs")
  assert runs_boot.ci["a"][1] - runs_boot.ci["a"][0] > 1e-3


def test_too_few_residual_dof_falls_back_to_runs_and_says_so():
  runs = synthetic_runs(TRUE, BUDGETS[:3], n_sizes=4, noise=0.005, seed=2)   # dof 3 * (4 - 3)
  assert residual_pool(runs).dof == 3
  full = fit_approach(runs, "2")
  boot = bootstrap(runs, "2", full, n_resamples=10, method="residuals")
  assert boot.resampling == "runs" and boot.residual_sd is None
  assert boot.method.startswith("residual resampling needs >= 4 residual degrees of freedom")
  assert "the table has 3; fell back to resampling runs" in boot.method
  assert "resamples of runs with replacement within each IsoFLOP budget" in boot.method
  three = synthetic_runs(TRUE, BUDGETS, n_sizes=3, seed=2)                  # no budget of 4 sizes
  assert residual_pool(three).dof == 0
  assert "the table has 0" in bootstrap(three, "2", fit_approach(three, "2"), n_resamples=3).method


def test_replicate_keeps_the_design_and_shifts_whole_curves():
  runs = synthetic_runs(TRUE, BUDGETS, n_sizes=5, noise=0.01, seed=3, curve_points=6)
  pool = residual_pool(runs)
  rep = residual_replicate(runs, pool, np.random.default_rng(0))
  assert len(rep) == len(runs) and rep.run_id == runs.run_id
  assert np.array_equal(rep.N, runs.N) and np.array_equal(rep.D, runs.D)
  assert np.array_equal(rep.budget, runs.budget)
  assert sorted(zip(rep.N, rep.D)) == sorted(zip(runs.N, runs.D))
  e = np.log(rep.loss / runs.loss)
  assert not np.allclose(e, 0.0)
  assert all(np.min(np.abs(pool.residuals - v)) < 1e-12 for v in e)   # drawn from the pool
  for c0, c1, ei in zip(runs.curves, rep.curves, e):
    assert np.array_equal(c1[:, 0], c0[:, 0])
    assert np.allclose(np.log(c1[:, 1] / c0[:, 1]), ei, atol=1e-12)
  assert np.allclose(np.array([c[-1, 1] for c in rep.curves]), rep.loss)


def test_bad_method_is_one_error_line(tmp_path, capsys):
  runs = synthetic_runs(TRUE, BUDGETS, n_sizes=5, noise=0.005, seed=4)
  table = tmp_path / "results.jsonl"
  write_results_jsonl(runs, str(table))
  out = tmp_path / "o"
  rc = chinchax_cli.main(["fit", str(table), "--bootstrap-method", "bogus", "--out", str(out)])
  assert rc == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err == ["error: --bootstrap-method: unknown bootstrap method 'bogus'; valid: "
                 "residuals, runs"]
  assert not out.exists()
  with pytest.raises(FitOptionError, match="unknown bootstrap method 'x'"):
    pipeline.fit_results(table, out, bootstrap_method="x")
  with pytest.raises(FitOptionError, match="unknown bootstrap method"):
    fit_all(runs, ("2",), n_bootstrap=2, bootstrap_method="bogus")


def test_cli_method_reaches_fit_json_and_fit_md(tmp_path):
  runs = synthetic_runs(TRUE, BUDGETS, n_sizes=5, noise=0.005, seed=4)
  table = tmp_path / "results.jsonl"
  write_results_jsonl(runs, str(table))
  for method in ("runs", None):
    out = tmp_path / f"o-{method}"
    argv = ["fit", str(table), "--approach", "2", "--bootstrap", "8", "--out", str(out),
            "--no-figures", "--quiet"] + (["--bootstrap-method", method] if method else [])
    assert chinchax_cli.main(argv) == 0
    boot = json.loads((out / "fit.json").read_text())["approach2"]["bootstrap"]
    expect = method or "residuals"
    assert boot["resampling"] == expect
    assert (boot["residual_dof"] == 8) == (expect == "residuals")
    assert f"Bootstrap: {boot['method']}" in (out / "fit.md").read_text()
