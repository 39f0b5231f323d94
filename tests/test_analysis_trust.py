"""Fits that do not crash and say when they cannot be trusted.

Approach 2 on profiles whose minimum is not bracketed (straight, flat and
noisy, one-sided), its known biases on wide or lopsided grids (Hoffmann et al.
2022 App. D; Besiroglu et al. 2024, arXiv 2404.10102) and the windowed fit
that removes them; fit ranges in fit.json; Approach-3 diagnostics on the
command line; per-run weights, the asymmetric loss and a user-given start grid.
"""

import json
import math

import numpy as np
import pytest

from chinchax import cli as chinchax_cli
from chinchax.laws import parametric as laws
from analysis.isoflop import approach3
from analysis.isoflop.approach2 import fit_approach2, fit_isoflop_parabola
from analysis.isoflop.approach3 import fit_approach3, huber_objective, parse_grid, start_grid
from analysis.isoflop.bootstrap import bootstrap
from analysis.runs import runs_from_arrays
from analysis.isoflop.synthetic import synthetic_runs

TRUE = laws.ParametricLaw("true", E=1.8, A=480.0, B=2100.0, alpha=0.35, beta=0.37)
GOOD = np.geomspace(1e18, 1e20, 4)


@pytest.fixture
def small_grid(monkeypatch):
  """Every 25th start of the 4500-point grid, to keep the command-line tests quick."""
  full = approach3.chinchilla_grid()
  monkeypatch.setattr(approach3, "chinchilla_grid", lambda: full[::25])


def _write_csv(path, runs, budgets=False):
  """``runs`` as a CSV of N, D, loss (and C_budget); returns the path."""
  with open(path, "w") as f:
    f.write("N,D,loss" + (",C_budget" if budgets else "") + "\n")
    for i in range(len(runs)):
      cells = [runs.N[i], runs.D[i], runs.loss[i]] + ([runs.budget[i]] if budgets else [])
      f.write(",".join(repr(float(v)) for v in cells) + "\n")
  return path


def _bad_profiles_table(path):
  """Four good budgets plus a straight, a flat-noisy and a one-sided IsoFLOP profile."""
  good = synthetic_runs(TRUE, GOOD, n_sizes=7, noise=0.001, seed=3)
  rows = [(float(n), float(c), float(l), float(b))
          for n, c, l, b in zip(good.N, good.C, good.loss, good.budget)]
  rng = np.random.default_rng(0)
  for C, kind in ((3e20, "straight"), (6e20, "flat"), (1e21, "one-sided")):
    n_opt, _ = TRUE.optimal_allocation(C)
    if kind == "one-sided":
      Ns = n_opt * np.geomspace(1 / 64, 1 / 4, 7)        # every size below the optimum
      losses = TRUE.loss(Ns, C / (6 * Ns))
    else:
      Ns = np.geomspace(1e7, 1e9, 7)
      x = np.log(Ns)
      if kind == "straight":    # a Kaplan-like profile: the optimum far beyond the largest N
        losses = 3.0 - 0.1 * x + 1e-9 * x ** 2
      else:
        losses = 2.5 + 0.002 * rng.standard_normal(Ns.size)
    rows += [(float(n), C, float(l), C) for n, l in zip(Ns, losses)]
  with open(path, "w") as f:
    f.write("N,C,loss,C_budget\n")
    for n, c, l, b in rows:
      f.write(f"{n!r},{c!r},{l!r},{b!r}\n")
  return path


# --- 1. no crash: budgets whose minimum is not bracketed are left out ----------------------------

def test_nearly_straight_profile_is_left_out_not_an_overflow():
  N = np.geomspace(1e7, 1e9, 7)
  x = np.log(N)
  for loss in (3.0 - 0.1 * x + 1e-9 * x ** 2,      # vertex far above: exp() overflows
               2.0 + 0.1 * x + 1e-9 * x ** 2):     # vertex far below: exp() underflows to 0
    p = fit_isoflop_parabola(1e20, N, loss)
    assert p.status == "edge" and p.reason
    assert not math.isfinite(p.N_opt)


def test_bad_profiles_fit_without_traceback_and_write_fit_json(tmp_path, capsys):
  table = _bad_profiles_table(tmp_path / "bad.csv")
  out = tmp_path / "out"
  rc = chinchax_cli.main(["fit", str(table), "--approach", "2", "--out", str(out),
                          "--bootstrap", "20", "--seed", "2"])
  assert rc == 0
  data = json.loads((out / "fit.json").read_text())
  budgets = {b["C"]: b for b in data["approach2"]["budgets"]}
  for C in (3e20, 6e20, 1e21):
    assert budgets[C]["status"] != "ok" and budgets[C]["reason"], budgets[C]
  assert [budgets[C]["status"] for C in GOOD] == ["ok"] * 4
  assert abs(data["approach2"]["a"] - TRUE.a) < 0.02
  err = capsys.readouterr().err
  md = (out / "fit.md").read_text()
  for C in (3e20, 6e20, 1e21):
    assert f"budget C = {C:.3g} left out" in err
    assert f"budget C = {C:.3g} left out" in md
  assert (out / "isoflop.png").exists()


def test_every_bootstrap_resample_leaves_bad_budgets_out(tmp_path):
  from analysis.io import load_results
  runs = load_results(str(_bad_profiles_table(tmp_path / "bad.csv")))
  full = fit_approach2(runs)
  for seed in range(4):
    boot = bootstrap(runs, "2", full, n_resamples=30, seed=seed)   # never raises
    assert boot.n_failed + len(boot.samples["a"]) == 30
    assert sum(boot.failures.values()) == boot.n_failed <= 3
    # Budgets left out of the full fit stay out of every resample: no stray exponents.
    assert not set(boot.budgets_left_out) & {3e20, 6e20, 1e21}
    assert boot.ci["a"][1] - boot.ci["a"][0] < 0.05, boot.ci["a"]
  lo, hi = boot.ci["a"]
  assert lo <= TRUE.a + 0.02 and hi >= TRUE.a - 0.02


# --- 3. the edge message says where the lowest observed loss is ----------------------------------

def test_edge_message_names_the_lowest_observed_loss():
  N = np.geomspace(1e8, 1e9, 8)
  loss = np.array([3.0, 2.8, 2.6, 2.4, 2.2, 2.0, 1.9, 1.95])   # lowest at N[6], interior
  p = fit_isoflop_parabola(1e20, N, loss)
  assert p.status == "edge"
  assert f"lowest observed loss is at an interior N = {N[6]:.3g}" in p.reason
  assert "vertex lies above" in p.reason
  assert "sits at the" not in p.reason
  mirrored = fit_isoflop_parabola(1e20, N, loss[::-1])
  assert f"interior N = {N[1]:.3g}" in mirrored.reason and "vertex lies below" in mirrored.reason
  low = fit_isoflop_parabola(1e20, N, np.linspace(2.0, 3.0, 8) + 0.01 * np.log(N) ** 2)
  assert f"lowest observed loss is at the smallest sampled N ({N[0]:.3g}" in low.reason


# --- 2. warnings for Approach 2's biases, and the windowed fit -----------------------------------

def _drifting_grid(span, n_sizes, offsets, budgets):
  """IsoFLOP grids of ±span around offset·N_opt(C): the offset drifts with C, as real grids do."""
  N, D, L, B = [], [], [], []
  for C, off in zip(budgets, offsets):
    n_opt, _ = TRUE.optimal_allocation(C)
    for n in n_opt * off * np.geomspace(1 / span, span, n_sizes):
      N.append(n)
      D.append(C / (6 * n))
      L.append(TRUE.loss(n, C / (6 * n)))
      B.append(C)
  return runs_from_arrays(N, D, L, budget=B)


def test_windowed_parabolas_reduce_the_extrapolation_error_of_a_wide_grid():
  budgets = np.geomspace(1e18, 1e20, 5)
  runs = _drifting_grid(32.0, 13, [0.5, 0.7, 1.0, 1.4, 2.0], budgets)
  truth, _ = TRUE.optimal_allocation(1e21)
  wide = fit_approach2(runs)
  near = fit_approach2(runs, window=2)
  err_wide = abs(wide.law.optimal_allocation(1e21)[0] / truth - 1)
  err_near = abs(near.law.optimal_allocation(1e21)[0] / truth - 1)
  assert err_wide > 0.05
  assert err_near < 0.01 and err_near < err_wide / 4
  assert all(p.n_sizes_fitted == 5 for p in near.used)
  text = " ".join(wide.warnings())
  assert "more than 16x" in text and "--window" in text
  assert not any("16x" in w for w in near.warnings())


def test_warnings_for_lopsided_grids_few_sizes_and_large_residuals(tmp_path, capsys):
  budgets = np.geomspace(1e18, 1e20, 4)
  lopsided = _drifting_grid(4.0, 7, [3.0] * 4, budgets)      # minimum near the smallest sizes
  assert any("lopsided" in w for w in fit_approach2(lopsided).warnings())
  few = synthetic_runs(TRUE, budgets, n_sizes=3, span=4.0)
  assert any("fewer than 5 model sizes" in w and "zero width" in w
             for w in fit_approach2(few).warnings())
  noisy = synthetic_runs(TRUE, budgets, n_sizes=7, span=4.0, noise=0.01, seed=0)
  assert any("residual RMS" in w for w in fit_approach2(noisy).warnings())
  centred = synthetic_runs(TRUE, budgets, n_sizes=7, span=4.0)
  assert fit_approach2(centred).warnings() == []
  path = _write_csv(tmp_path / "few.csv", few)
  assert chinchax_cli.main(["fit", str(path), "--approach", "2", "--out", str(tmp_path / "o"),
                            "--bootstrap", "5", "--no-figures"]) == 0
  err = capsys.readouterr().err
  assert "warning: approach 2: fewer than 5 model sizes" in err
  assert "fewer than 5 model sizes" in (tmp_path / "o" / "fit.md").read_text()
  data = json.loads((tmp_path / "o" / "fit.json").read_text())
  assert any("fewer than 5" in w["message"] for w in data["warnings"])


def test_window_option_reaches_fit_json(tmp_path):
  runs = _drifting_grid(32.0, 13, [0.5, 0.7, 1.0, 1.4, 2.0], np.geomspace(1e18, 1e20, 5))
  path = _write_csv(tmp_path / "wide.csv", runs, budgets=True)
  out = tmp_path / "o"
  assert chinchax_cli.main(["fit", str(path), "--approach", "2", "--window", "2", "--out",
                            str(out), "--bootstrap", "0", "--no-figures", "--quiet"]) == 0
  a2 = json.loads((out / "fit.json").read_text())["approach2"]
  assert a2["window"] == 2 and all(b["n_sizes_fitted"] == 5 for b in a2["budgets"])
  assert chinchax_cli.main(["fit", str(path), "--window", "0", "--out", str(tmp_path / "x")]) == 2


# --- 4. fit ranges of Approaches 1 and 2 reach `chinchax plan --law fit.json` --------------------

def test_plan_with_approach1_and_2_fits_warns_about_extrapolation(tmp_path, capsys):
  runs = synthetic_runs(TRUE, GOOD, n_sizes=7, noise=0.0005, seed=5, curve_points=20)
  from analysis.io import write_results_jsonl
  path = tmp_path / "results.jsonl"
  write_results_jsonl(runs, str(path))
  for approach in ("1", "2"):
    out = tmp_path / f"a{approach}"
    assert chinchax_cli.main(["fit", str(path), "--approach", approach, "--out", str(out),
                              "--bootstrap", "0", "--no-figures", "--quiet"]) == 0
    section = json.loads((out / "fit.json").read_text())[f"approach{approach}"]
    lo, hi = section["fit_range_flops"]
    assert lo == pytest.approx(GOOD[0], rel=0.05) and hi == pytest.approx(GOOD[-1], rel=0.05)
    capsys.readouterr()
    assert chinchax_cli.main(["plan", "--flops", "1e24", "--law", str(out / "fit.json"),
                              "--json"]) == 0
    captured = capsys.readouterr()
    plan = json.loads(captured.out)
    assert any("above the largest budget" in w and "extrapolation" in w
               for w in plan["warnings"]), plan["warnings"]
    assert "extrapolation" in captured.err


# --- 5. Approach-3 diagnostics on the command line -----------------------------------------------

def test_approach3_diagnostics_are_printed(tmp_path, capsys):
  runs = synthetic_runs(TRUE, GOOD, n_sizes=7, noise=0.002, seed=6)
  path = _write_csv(tmp_path / "final.csv", runs)
  out = tmp_path / "o"
  # alpha and beta start in [1, 2]: the optimum (0.35, 0.37) lies outside the grid's box.
  rc = chinchax_cli.main(["fit", str(path), "--approach", "3", "--out", str(out), "--bootstrap",
                          "5", "--grid", "alpha=1:2:3,beta=1:2:3,logA=5:15:3,logB=5:15:3",
                          "--jobs", "1"])
  assert rc == 0
  err = capsys.readouterr().err
  assert "warning: approach 3: the optimum lies outside the box of the start grid" in err
  assert "alpha = 0.3" in err
  md = (out / "fit.md").read_text()
  assert "the optimum lies outside the box of the start grid" in md
  data = json.loads((out / "fit.json").read_text())
  assert data["approach3"]["optimum_inside_grid"] is False
  assert data["approach3"]["n_starts"] == 3 * 3 * 3 * 3 * 5
  assert data["alpha"] == pytest.approx(TRUE.alpha, rel=0.05)
  # 7. the objective over the user-given grid is drawn.
  for ext in ("png", "svg"):
    assert (out / f"starts.{ext}").stat().st_size > 0


# --- 6. the published Approach-3 constants ---------------------------------------------------------

# Chinchilla (Hoffmann et al. 2022, arXiv 2203.15556) Table A3, Approach 3 columns:
# (N params, C FLOPs, D tokens).
TABLE_A3_APPROACH3 = ((400e6, 2.21e19, 9.2e9), (1e9, 1.62e20, 27.1e9),
                      (10e9, 2.46e22, 410.1e9), (67e9, 1.71e24, 4.1e12))


@pytest.mark.parametrize("N,C,D", TABLE_A3_APPROACH3)
def test_rounded_constants_miss_table_a3_and_unrounded_reproduce_it(N, C, D):
  rounded, _ = laws.get_law("chinchilla-approach3").optimal_allocation(C)
  unrounded, _ = laws.get_law("chinchilla-approach3-unrounded").optimal_allocation(C)
  assert 0.15 < 1 - rounded / N < 0.25
  assert unrounded == pytest.approx(N, rel=0.05)


def test_plan_with_the_rounded_law_says_so(capsys):
  assert chinchax_cli.main(["plan", "--flops", "1e21", "--law", "chinchilla-approach3"]) == 0
  out = capsys.readouterr().out
  assert "Table A3" in out and "chinchilla-approach3-unrounded" in out
  assert chinchax_cli.main(["plan", "--flops", "1e21", "--law", "chinchilla-approach3",
                            "--json"]) == 0
  j = json.loads(capsys.readouterr().out)
  assert "chinchilla-approach3-unrounded" in j["law"]["source"]


# --- 7. weights, loss choice, start grid -----------------------------------------------------------

def test_weighted_asymmetric_objective_gradient_matches_finite_differences():
  runs = synthetic_runs(TRUE, GOOD, n_sizes=5, noise=0.01, seed=2)
  logN, logD, logL = np.log(runs.N), np.log(runs.D), np.log(runs.loss)
  w = np.random.default_rng(1).uniform(0.2, 3.0, len(runs))
  theta = np.array([6.2, 7.6, 0.59, 0.35, 0.37])
  f, g = huber_objective(theta, logN, logD, logL, 1e-2, w, 3.0)
  num = np.zeros(5)
  for k in range(5):
    e = np.zeros(5)
    e[k] = 1e-6
    num[k] = (huber_objective(theta + e, logN, logD, logL, 1e-2, w, 3.0)[0]
              - huber_objective(theta - e, logN, logD, logL, 1e-2, w, 3.0)[0]) / 2e-6
  assert np.allclose(g, num, rtol=1e-4, atol=1e-9)
  r = np.log(np.exp(theta[2]) + np.exp(theta[0]) * runs.N ** -theta[3]
             + np.exp(theta[1]) * runs.D ** -theta[4]) - logL
  hub = np.where(np.abs(r) <= 1e-2, 0.5 * r ** 2, 1e-2 * (np.abs(r) - 0.5e-2))
  assert f == pytest.approx((w * np.where(r < 0, 3.0, 1.0) * hub).sum(), rel=1e-10)
  # Without weights and asymmetry it is Chinchilla's objective, to the bit.
  f0, g0 = huber_objective(theta, logN, logD, logL)
  f1, g1 = huber_objective(theta, logN, logD, logL, 1e-3, np.ones(len(runs)), 1.0)
  assert f0 == pytest.approx(f1, rel=1e-14) and np.allclose(g0, g1, rtol=1e-12)


def test_weights_discount_outliers_and_asymmetry_lifts_the_law():
  runs = synthetic_runs(TRUE, GOOD, n_sizes=7, noise=0.001, seed=4)
  loss = runs.loss.copy()
  loss[::6] *= 1.15                                   # a few broken runs
  w = np.ones(len(runs))
  w[::6] = 0.0
  starts = np.array([[6.0, 7.5, 0.6, 0.35, 0.37]])
  bad = runs_from_arrays(runs.N, runs.D, loss, budget=runs.budget)
  weighted = runs_from_arrays(runs.N, runs.D, loss, budget=runs.budget, weight=w)
  plain = fit_approach3(bad, starts=starts, delta=0.05)
  fixed = fit_approach3(weighted, starts=starts, delta=0.05)
  assert fixed.weighted and abs(fixed.alpha - TRUE.alpha) < abs(plain.alpha - TRUE.alpha)
  assert fixed.alpha == pytest.approx(TRUE.alpha, rel=0.05)
  noisy = synthetic_runs(TRUE, GOOD, n_sizes=7, noise=0.01, seed=4)
  sym = fit_approach3(noisy, starts=starts)
  asym = fit_approach3(noisy, starts=starts, asymmetry=4.0)
  assert np.mean(asym.residuals) > np.mean(sym.residuals)   # predicts higher losses


def test_weight_column_and_grid_spec(tmp_path):
  from analysis.io import load_results
  p = tmp_path / "w.csv"
  p.write_text("N,C,loss,weight\n1e8,1e18,3.0,1\n2e8,1e18,2.9,0.5\n1e8,1e19,2.7,2\n")
  runs = load_results(str(p), min_budgets=1)
  assert list(runs.weight) == [1.0, 0.5, 2.0]
  assert list(runs.subset([2, 0]).weight) == [2.0, 1.0]
  g = parse_grid("alpha=0:1:3,beta=0.2/0.4")
  assert list(g["alpha"]) == [0.0, 0.5, 1.0] and list(g["beta"]) == [0.2, 0.4]
  assert start_grid(g).shape == (6 * 6 * 5 * 3 * 2, 5)
  assert np.array_equal(start_grid(None), approach3.chinchilla_grid())
  for bad in ("gamma=0:1:3", "alpha=0:1", "alpha=0:1:0", "alpha"):
    with pytest.raises(ValueError, match="start grid"):
      parse_grid(bad)


def test_approach3_optimum_beyond_float_range_is_a_fit_error_not_an_overflow(monkeypatch):
  """An optimum with log A ≈ 900 (seen on a 3×3 tiny ladder) is refused with a reason."""
  runs = synthetic_runs(laws.get_law("epoch"), np.geomspace(1e18, 1e20, 3), n_sizes=5, seed=0)

  def runaway(starts, *args, **kw):
    x = np.tile(np.array([902.2, 7.0, 0.5, 4.0, 0.3]), (len(starts), 1))
    return x, np.full(len(starts), 1e-3), np.ones(len(starts), int), np.ones(len(starts), bool)

  monkeypatch.setattr(approach3, "run_lbfgs_starts", runaway)
  with pytest.raises(approach3.FitError, match=r"log A = 902.2, beyond what a float can hold"):
    fit_approach3(runs, polish=False)


def test_approach3_warns_when_its_form_misses_the_runs_by_more_than_their_scatter(
    tmp_path, small_grid):
  """Losses from the additive law (0.3% noise): no warning. The same runs times
  exp(0.02·(ln(D/N) - mean)²), a bend along D/N that each budget's quadratic in ln N absorbs
  but E + A/N^alpha + B/D^beta cannot: the misfit is named, with its size against the scatter."""
  budgets = np.geomspace(1e18, 1e20, 4)
  clean = synthetic_runs(TRUE, budgets, n_sizes=7, span=4.0, noise=0.003, seed=2)
  r = np.log(clean.D / clean.N)
  bent = runs_from_arrays(clean.N, clean.D, clean.loss * np.exp(0.02 * (r - r.mean()) ** 2),
                          budget=clean.budget)
  texts = {}
  for name, runs in (("clean", clean), ("bent", bent)):
    for boot in ("0", "3"):      # judged against the runs' scatter whatever the bootstrap
      out = tmp_path / f"{name}-{boot}"
      assert chinchax_cli.main(["fit", str(_write_csv(tmp_path / f"{name}.csv", runs,
                                                      budgets=True)),
                                "--approach", "3", "--out", str(out), "--bootstrap", boot,
                                "--bootstrap-method", "runs", "--no-figures", "--quiet"]) == 0
      texts[name, boot] = " ".join(w["message"] for w in
                                   json.loads((out / "fit.json").read_text())["warnings"])
  for boot in ("0", "3"):
    assert "does not hold to the runs' precision" not in texts["clean", boot]
    assert "does not hold to the runs' precision" in texts["bent", boot]
    assert "their scatter about the IsoFLOP quadratics" in texts["bent", boot]


def test_default_grid_carries_log_e_on_past_e_only_for_losses_above_it():
  """Chinchilla's 4500 starts while the lowest loss is at most e (or unusable); above e, the log
  E axis goes on in steps of 0.5 to the first value >= ln(lowest loss), at most to 3, each with
  the 900 combinations of the other coordinates."""
  full = approach3.chinchilla_grid()
  for min_loss in (1.2, math.e, float("nan"), 0.0, -1.0):
    assert np.array_equal(approach3.default_grid(min_loss), full)
  top = full[np.isclose(full[:, 2], 1.0)]
  assert len(top) == 900
  for min_loss, added in ((3.78, [1.5]), (math.exp(2.0), [1.5, 2.0]), (10.0, [1.5, 2.0, 2.5]),
                          (1e6, [1.5, 2.0, 2.5, 3.0]), (float("inf"), [])):
    g = approach3.default_grid(min_loss)
    assert g.shape == (4500 + 900 * len(added), 5)
    assert np.array_equal(g[:4500], full)
    assert sorted(set(g[4500:, 2])) == added
    for e in added:
      block = g[g[:, 2] == e]
      assert np.array_equal(np.delete(block, 2, axis=1), np.delete(top, 2, axis=1))
    if min_loss < math.exp(approach3.MAX_DEFAULT_LOG_E):
      assert g[:, 2].max() >= math.log(min_loss) > g[:, 2].max() - 0.5
  assert approach3.default_grid(1e300).shape == (4500 + 4 * 900, 5)  # capped at ln E = 3


def test_approach3_brackets_an_irreducible_loss_above_e(monkeypatch):
  """Runs from a law with E = 3.2 (ln E = 1.16, beyond Chinchilla's start box of ln E <= 1):
  the default starts bracket it and the fit recovers it; Chinchilla's grid given explicitly
  finds the same optimum but calls it outside its box. (A 243-start grid with Chinchilla's
  box stands in for its 4500 starts.)"""
  coarse = start_grid({"logA": np.array([0.0, 10.0, 25.0]), "logB": np.array([0.0, 10.0, 25.0]),
                       "logE": np.array([-1.0, 0.0, 1.0]), "alpha": np.array([0.0, 0.5, 2.0]),
                       "beta": np.array([0.0, 0.5, 2.0])})
  monkeypatch.setattr(approach3, "chinchilla_grid", lambda: coarse)
  law = laws.ParametricLaw("high-E", E=3.2, A=480.0, B=2100.0, alpha=0.35, beta=0.37)
  runs = synthetic_runs(law, GOOD, n_sizes=5, noise=0.0, seed=0)
  assert runs.loss.min() > math.e
  res = fit_approach3(runs)
  assert res.optimum_inside_grid and res.grid_box[1][2] == 1.5
  assert res.E == pytest.approx(3.2, rel=1e-3) and res.a == pytest.approx(law.a, abs=2e-3)
  chinchilla = fit_approach3(runs, grid=approach3.chinchilla_grid())
  assert not chinchilla.optimum_inside_grid
  assert chinchilla.E == pytest.approx(res.E, rel=1e-3)
