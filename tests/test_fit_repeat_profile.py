"""Repetition fits that say what the data cannot pin down: the base held or refitted, profile-
likelihood intervals, no crash on a table of per-run unique sets, and the input they refuse.

Truth is independent: tables drawn from known laws (analysis.isoflop.synthetic), least-squares
standard errors from scipy's curve_fit for the profile's width where the Huber objective is
least squares, and the command line run end to end.
"""

from __future__ import annotations

import contextlib
import io
import json
import math

import numpy as np
import pytest
import scipy.optimize

from chinchax import cli
from chinchax.laws import parametric as laws
from chinchax.laws import repeat as lr
from analysis.isoflop import approach3, synthetic
from analysis.isoflop.approaches import fit_approach
from analysis.isoflop.bootstrap import bootstrap
from analysis.isoflop.diagnostics import approach_warnings
from analysis.isoflop.profile import profile_a
from analysis.repeat import fit as fr
from analysis.repeat import profile as rp

BASE = laws.ParametricLaw(name="truth", E=1.8, A=400.0, B=1500.0, alpha=0.34, beta=0.30)
BUDGETS = (1e15, 1e16, 1e17)
UNIQUE = (5e6, 2e7, 8e7)


def _table(law, epochs, sizes, noise=0.005, seed=0, own_unique=False, n_sizes=7,
           upper_span=1.0):
  return synthetic.synthetic_repeat_runs(law, BUDGETS, UNIQUE, epochs, sizes, n_sizes=n_sizes,
                                         upper_span=upper_span, noise=noise, seed=seed,
                                         own_unique=own_unique)


def _write(path, runs, recipe=None):
  with open(path, "w") as f:
    for i in range(len(runs)):
      row = {"run_id": f"r{i}", "status": "done", "N": float(runs.N[i]), "D": float(runs.D[i]),
             "final_eval_loss": float(runs.loss[i])}
      if math.isfinite(runs.unique_tokens[i]):
        row["unique_tokens"] = float(runs.unique_tokens[i])
      if recipe:
        row["recipe"] = recipe
      f.write(json.dumps(row) + "\n")


def _cli(*argv):
  out, err = io.StringIO(), io.StringIO()
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    rc = cli.main([str(a) for a in argv])
  return rc, out.getvalue(), err.getvalue()


def test_repetition_law_at_a_far_trial_point_does_not_overflow():
  # alpha + beta near 0: G = (alpha A / (beta B))^(1 / (alpha + beta)) overflows a float.
  far = laws.ParametricLaw(name="far", E=1.0, A=1e10, B=1.0, alpha=0.01, beta=0.001)
  with pytest.raises(OverflowError):
    far.G  # noqa: B018 - what the law's loss used to evaluate
  n = lr.tokens_to_params(far, np.array([1e6, 1e9]))
  assert np.all(n > 0)
  loss = lr.MuennighoffLaw(far, 5.0, 3.0).loss(np.array([1e6, 1e7]), 4e9, 1e9)
  assert np.all(np.isfinite(loss))
  # In range, the log-space form is the closed form.
  want = BASE.G * (1e9 * BASE.G) ** (BASE.beta / BASE.alpha)
  assert lr.tokens_to_params(BASE, 1e9) == pytest.approx(want, rel=1e-12)


def test_failed_replicates_and_folds_are_counted_not_raised(monkeypatch):
  runs = _table(lr.OverfitLaw(BASE, 0.1), (2, 8, 32), (1e6, 4e6), n_sizes=5)
  rows = fr.RepeatRows.from_runs(runs)
  law, theta = fr.fit_form("overfit", BASE, rows)
  real, calls = fr.fit_form, []

  def flaky(*a, **k):  # every other replicate meets the float trouble of a far trial point
    calls.append(1)
    if len(calls) % 2:
      raise OverflowError("(34, 'Numerical result out of range')")
    return real(*a, **k)
  monkeypatch.setattr(fr, "fit_form", flaky)
  boot = fr.bootstrap_form("overfit", rows, law, theta, n=6, refit_base=False)
  assert boot["n_failed"] == 3 and sum(boot["failures"].values()) == 3
  assert next(iter(boot["failures"])).startswith("OverflowError")
  assert boot["ci"]["P"] is not None     # from the 3 replicates fitted
  loo = fr.leave_one_unique_out("overfit", BASE, rows, theta)
  assert len(loo["failed_folds"]) + len(loo["folds"]) == 3 and loo["failed_folds"]


def test_base_is_held_by_default_and_refitted_on_request():
  truth = lr.MuennighoffLaw(BASE, 10.0, 4.0)
  rows = fr.RepeatRows.from_runs(_table(truth, (2, 8, 32), (1e6, 4e6), n_sizes=5))
  start = laws.ParametricLaw(name="start", E=1.7, A=420.0, B=1400.0, alpha=0.34, beta=0.30)
  held, _ = fr.fit_form("muennighoff", start, rows)
  assert held.base is start
  joint, _ = fr.fit_form("muennighoff", start, rows, joint=True)
  assert joint.base.E != start.E and joint.base.B != start.B


def test_profile_width_is_least_squares_width_where_huber_is_least_squares():
  """Noise far below Huber's delta: the objective is least squares, so the 95% profile
  interval of P is P ± 1.96 se to first order, se from scipy's curve_fit on the same rows."""
  truth = lr.OverfitLaw(BASE, 0.1)
  rows = fr.RepeatRows.from_runs(_table(truth, (2, 4, 8, 16), (1e6, 4e6), noise=1e-4,
                                        n_sizes=5))
  law, theta = fr.fit_form("overfit", BASE, rows)
  prof = rp.profile_form("overfit", BASE, rows, law, theta, n_grid=41)
  assert prof["calibration"]["inside_delta"] > 0.99
  p = prof["P"]
  assert p["identified"] and p["covered"][0] < 0.1 < p["covered"][1]
  f = lambda x, P: np.log(lr.OverfitLaw(BASE, P).loss(rows.N[x.astype(int)], rows.D[x.astype(int)], rows.U[x.astype(int)]))
  idx = np.arange(len(rows.N))
  (P_ls,), cov = scipy.optimize.curve_fit(f, idx, np.log(rows.loss), p0=[0.1])
  se = math.sqrt(cov[0, 0])
  assert p["covered"][0] == pytest.approx(P_ls - 1.96 * se, abs=0.1 * se)
  assert p["covered"][1] == pytest.approx(P_ls + 1.96 * se, abs=0.1 * se)


def test_a_flat_ridge_is_not_identified_and_a_designed_table_is():
  ridge = rows = fr.RepeatRows.from_runs(_table(lr.MuennighoffLaw(BASE, 15.4, 5.3), (1.2, 1.4),
                                                (1e6, 4e6), seed=1))
  law, theta = fr.fit_form("muennighoff", BASE, ridge)
  prof = rp.profile_form("muennighoff", BASE, ridge, law, theta, n_grid=17)
  assert not prof["R_D_star"]["identified"] and prof["R_D_star"]["open"][1]
  assert prof["R_D_star"]["covered"][1] == pytest.approx(fr.R_STAR_BOUNDS[1])
  assert "not identified by these data" in rp.profile_lines("muennighoff", prof)[0]
  rows = fr.RepeatRows.from_runs(_table(lr.MuennighoffLaw(BASE, 10.0, 4.0),
                                        (2, 4, 8, 16, 32, 64), (1e6, 4e6, 1.6e7), seed=1))
  law, theta = fr.fit_form("muennighoff", BASE, rows)
  prof = rp.profile_form("muennighoff", BASE, rows, law, theta, n_grid=17)
  for k, true in (("R_D_star", 10.0), ("R_N_star", 4.0)):
    assert prof[k]["identified"], k
    lo, hi = prof[k]["interval"]
    assert lo < true < hi and hi / lo < 1.5, (k, lo, hi)


def test_approach3_profile_of_a_holds_the_truth_and_mirrors_b():
  runs = synthetic.synthetic_runs(BASE, np.geomspace(1e15, 1e18, 4), n_sizes=7, noise=0.005)
  grid = approach3.start_grid(approach3.parse_grid(
      "logA=4:8:3,logB=5:9:3,logE=0:1:2,alpha=0.2:0.5:2,beta=0.2:0.5:2"))
  res = approach3.fit_approach3(runs, grid=grid)
  prof = profile_a(res, runs, n_grid=21)
  a, b = prof["a"], prof["b"]
  assert a["identified"] and a["interval"][0] < BASE.a < a["interval"][1]
  assert a["interval"][0] < res.law.a < a["interval"][1]
  assert b["interval"] == pytest.approx([1 - a["interval"][1], 1 - a["interval"][0]])


def test_per_run_unique_sets_fit_end_to_end_and_plan(tmp_path):
  """The shape of a published data-constrained table: every single-epoch run carries its own
  unique set (U = D, read once), repeated runs theirs; fitted from the command line with a
  fixed --law base and Approach 2, then planned from with --unique-tokens."""
  truth = lr.MuennighoffLaw(BASE, 10.0, 4.0)
  _write(tmp_path / "t.jsonl", _table(truth, (2, 8, 32), (1e6, 4e6), seed=3, own_unique=True,
                                      n_sizes=5, upper_span=None))
  (tmp_path / "base.json").write_text(json.dumps(BASE.to_dict()))
  rc, out, err = _cli("fit", tmp_path / "t.jsonl", "--law", tmp_path / "base.json",
                      "--approach", "2", "--no-figures", "--bootstrap", "8", "--min-budgets", "1",
                      "--out", tmp_path / "fit")
  assert rc == 0, err
  assert "Traceback" not in err
  assert "runs repeat data (D > unique_tokens): Approaches 1-3 fit the 15 runs" in out
  assert ("repeat: base held fixed (two-stage, as Muennighoff et al. 2023): E = 1.8, A = 400, "
          "B = 1500, alpha = 0.34, beta = 0.3") in out
  data = json.loads((tmp_path / "fit" / "fit.json").read_text())
  block = data["repeat"]
  assert block["status"] == "ok" and block["base_mode"] == "fixed"
  assert block["muennighoff"]["base"] == {"E": 1.8, "A": 400.0, "B": 1500.0, "alpha": 0.34,
                                          "beta": 0.30}
  assert block["muennighoff"]["profile"]["R_D_star"]["identified"]
  md = (tmp_path / "fit" / "fit.md").read_text()
  assert "Base held fixed (two-stage" in md and "95% profile" in md
  rc, out, err = _cli("plan", "--flops", "1e18", "--unique-tokens", "1e8", "--law",
                      tmp_path / "fit" / "fit.json", "--hardware", "cpu")
  assert rc == 0, err
  assert "data limit" in out and "muennighoff form" in out


def test_plan_names_unidentified_constants_and_how_far_the_plan_moves(tmp_path):
  from chinchax.planning import constrained
  law = lr.MuennighoffLaw(BASE, 15.4, 5.3)
  fit = {"E": 1.8, "A": 400.0, "B": 1500.0, "alpha": 0.34, "beta": 0.30,
         "repeat": {"status": "ok", "form": "muennighoff", "muennighoff": {
             "params": law.params(), "base": {k: getattr(BASE, k) for k in
                                              ("E", "A", "B", "alpha", "beta")},
             "identified": {"R_D_star": False, "R_N_star": True},
             "profile": {"R_D_star": {"covered": [0.5, 1e4], "identified": False},
                         "R_N_star": {"covered": [4.0, 6.0], "identified": True}}}}}
  (tmp_path / "fit.json").write_text(json.dumps(fit))
  assert constrained.unidentified(str(tmp_path / "fit.json")) == {"R_D_star": [0.5, 1e4]}
  block = constrained.data_limited(1e19, 2e8, law, "t",
                                   loose=constrained.unidentified(str(tmp_path / "fit.json")))
  (span,) = block["unidentified"]
  for i, v in enumerate((0.5, 1e4)):  # each end is the optimum of the law at that constant
    n, _ = lr.DataLimitedLaw(lr.MuennighoffLaw(BASE, v, 5.3), 2e8).optimal_allocation(1e19)
    assert span["N"][i] == pytest.approx(n, rel=1e-9)
  assert span["N"][0] != pytest.approx(span["N"][1], rel=0.01)
  line = constrained.lines(block)[-1]
  assert line.startswith("    unidentified R_D_star: not pinned down") and "N* " in line


@pytest.mark.parametrize("case", ["units", "no_repeats", "missing"])
def test_bad_base_input_is_one_error_line_and_writes_nothing(tmp_path, case):
  runs = _table(lr.OverfitLaw(BASE, 0.1), (2, 8), (1e6,), n_sizes=5)
  law = "epoch"
  if case == "units":   # byte-level rows, a base in Chinchilla's MassiveText tokens
    _write(tmp_path / "t.jsonl", runs, recipe={"tokenizer": {"kind": "bytes", "vocab_size": 257}})
    want = "must be in the table's loss units"
  elif case == "no_repeats":
    _write(tmp_path / "t.jsonl", fr.single_epoch(runs))
    want = "has none"
  else:
    _write(tmp_path / "t.jsonl", runs)
    (tmp_path / "b.json").write_text(json.dumps({"E": 1.8, "A": 400.0, "B": 1500.0,
                                                 "alpha": 0.34}))
    law, want = str(tmp_path / "b.json"), "beta is missing or not a number"
  rc, out, err = _cli("fit", tmp_path / "t.jsonl", "--law", law, "--out", tmp_path / "o",
                      "--min-budgets", "1")
  lines = err.strip().splitlines()
  assert rc == 2 and len(lines) == 1 and lines[0].startswith("error:") and want in lines[0], err
  assert not (tmp_path / "o").exists()


def test_window_is_approach2s_and_warns_when_it_leaves_no_residual_dof():
  runs = synthetic.synthetic_runs(BASE, np.geomspace(1e15, 1e18, 4), n_sizes=7, noise=0.005,
                                  curve_points=8, curve_noise=0.002)
  from analysis.isoflop.approaches import FitOptions
  boots = {}
  for window in (None, 1):
    opts = FitOptions(window=window)
    res1 = fit_approach(runs, "1", options=opts) if runs.curves is not None else None
    boots[window] = bootstrap(runs, "2", fit_approach(runs, "2", options=opts), n_resamples=4,
                              options=opts)
    if res1 is not None:
      boots[(window, 1)] = bootstrap(runs, "1", res1, n_resamples=4, options=opts)
  assert boots[None].resampling == "residuals" and boots[1].resampling == "runs"
  # Approach 1 fits every size: its residual pool, and so its interval, ignores the window.
  assert boots[(1, 1)].resampling == "residuals"
  assert boots[(1, 1)].ci["a"] == boots[(None, 1)].ci["a"]
  warns = approach_warnings("2", fit_approach(runs, "2", options=FitOptions(window=1)), boots[1])
  assert any("so the bootstrap fell back to resampling runs" in w for w in warns), warns
  # Approach 3's misfit warning names the residual bootstrap only when that method ran.
  grid = approach3.start_grid(approach3.parse_grid(
      "logA=4:8:3,logB=5:9:3,logE=0:1:2,alpha=0.2:0.5:2,beta=0.2:0.5:2"))
  res3 = approach3.fit_approach3(runs, grid=grid)
  from analysis.isoflop.approaches import FitOptions as FO
  for method, narrow in (("runs", False), ("residuals", True)):
    b = bootstrap(runs, "3", res3, n_resamples=3, method=method, options=FO(grid=grid))
    w = approach_warnings("3", res3, b, scatter_sd=1e-9)   # the form check fails by design
    assert any("misses the runs" in x for x in w)
    assert any("too narrow" in x for x in w) == narrow, (method, w)
