"""The eval noise floor: final_eval_loss_se read from tables, reported, and used by Approach 2."""

import json
import math

import numpy as np
import pytest

from analysis.isoflop import approach2 as approach2_lib
from analysis.isoflop.approach2 import (curvature_se_from_noise, fit_approach2, fit_isoflop_parabola)
from analysis.errors import ResultsError
from analysis.isoflop.fit import fit_all
from analysis.io import load_results, write_results_jsonl
from analysis.report import markdown, report_dict, write_report
from analysis.runs import runs_from_arrays

X = np.array([-2.0, -1.0, 0.0, 1.0, 2.0])  # ln(N / N0): five sizes a factor e apart
SE = 0.005


def _budget(C, p2, n0=1e4, wiggle=0.0):
  """Five runs at budget C whose loss is 3 + p2·x² (+ a fixed wiggle) at x = ln(N / n0)."""
  N = n0 * np.exp(X)
  loss = 3.0 + p2 * X ** 2 + wiggle * np.array([1.0, -1.0, 0.0, -1.0, 1.0])
  return N, C / (6 * N), loss


def _table(flat_p2=0.0005):
  """Three budgets with a real parabola (depth 0.08 nats) and one nearly flat (depth 0.002)."""
  parts = [_budget(1e15, 0.02, 1e4), _budget(1e16, 0.02, 3e4), _budget(1e17, 0.02, 1e5),
           _budget(1e18, flat_p2, 3e5, wiggle=1e-5)]
  N, D, L = (np.concatenate([p[i] for p in parts]) for i in range(3))
  B = np.repeat([1e15, 1e16, 1e17, 1e18], 5)
  return N, D, L, B


def test_curvature_se_by_hand():
  # Unweighted fit on x = -2..2: p2's row of (XᵀX)⁻¹Xᵀ is (x² - 2)/14, so se(p2) = σ/√14.
  assert curvature_se_from_noise(X, np.full(5, SE), None) == pytest.approx(SE / math.sqrt(14))
  # Errors on the middle point only: (0 - 2)/14 · σ.
  assert curvature_se_from_noise(X, np.array([0, 0, SE, 0, 0]), None) == pytest.approx(
      2 * SE / 14)
  # Weights that drop no point but scale all equally leave it unchanged.
  assert curvature_se_from_noise(X, np.full(5, SE), np.full(5, 3.0)) == pytest.approx(
      SE / math.sqrt(14))


def test_real_parabola_passes_and_flat_one_is_flagged():
  N, D, L = _budget(1e15, 0.02)
  ok = fit_isoflop_parabola(1e15, N, L, loss_se=np.full(5, SE))
  assert ok.status == "ok"
  assert ok.curvature_z_noise == pytest.approx(0.02 / (SE / math.sqrt(14)), rel=1e-6)
  N, D, L = _budget(1e15, 0.0005, wiggle=1e-5)
  without = fit_isoflop_parabola(1e15, N, L)
  assert without.status == "ok" and without.curvature_t > 10  # residuals alone cannot tell
  flagged = fit_isoflop_parabola(1e15, N, L, loss_se=np.full(5, SE))
  assert flagged.status == "below-noise" and math.isnan(flagged.N_opt)
  assert flagged.curvature_z_noise < approach2_lib.NOISE_T
  assert "eval noise floor" in flagged.reason
  # The same flat profile measured 10x more precisely is resolved.
  assert fit_isoflop_parabola(1e15, N, L, loss_se=np.full(5, SE / 10)).status == "ok"


def test_noise_flag_with_three_sizes():
  N, L = 1e4 * np.exp(X[1:4]), 3.0 + 0.0005 * X[1:4] ** 2
  p = fit_isoflop_parabola(1e15, N, L, loss_se=np.full(3, SE))
  assert math.isnan(p.curvature_t) and p.status == "below-noise"


def test_flagged_budget_is_left_out_and_reported(tmp_path):
  N, D, L, B = _table()
  ses = np.full(20, SE)
  ses[3] = np.nan  # a row without an SE takes the table's median
  runs = runs_from_arrays(N, D, L, budget=B, loss_se=ses, eval_windows=np.full(20, 4096))
  res = fit_approach2(runs)
  assert [p.status for p in res.budgets] == ["ok", "ok", "ok", "below-noise"]
  assert [p.C for p in res.below_noise] == [1e18] and res.noise_floor == SE
  assert any(w.startswith("budget C = 1e+18 left out (below-noise)") for w in res.warnings())

  report = fit_all(runs, ("2",), n_bootstrap=0)
  data = report_dict(report)
  assert data["input"]["eval_noise"] == {"median_se": SE, "min_se": SE, "max_se": SE,
                                         "n_runs": 19, "eval_windows": 4096}
  assert data["approach2"]["budgets_below_noise"] == [1e18]
  assert data["approach2"]["noise_floor"] == SE
  assert data["approach2"]["n_budgets_used"] == 3
  assert any("below-noise" in w["message"] for w in data["warnings"])
  json_path, md_path = write_report(report, str(tmp_path))
  md = open(md_path).read()
  assert "Eval noise floor: median standard error of the final eval loss 0.005 nats/token" in md
  assert "19 of 20 runs, 4,096 eval windows per run" in md
  assert "below-noise" in md
  assert json.load(open(json_path))["input"]["eval_noise"]["median_se"] == SE


def test_without_se_nothing_changes():
  N, D, L, B = _table()
  runs = runs_from_arrays(N, D, L, budget=B)
  res = fit_approach2(runs)
  assert [p.status for p in res.budgets] == ["ok"] * 4 and res.noise_floor is None
  assert all(math.isnan(p.curvature_z_noise) for p in res.budgets)
  data = report_dict(fit_all(runs, ("2",), n_bootstrap=0))
  assert data["input"]["eval_noise"] is None and data["approach2"]["budgets_below_noise"] == []
  assert "Eval noise floor: not measured" in markdown(data)


def test_tables_carry_the_se(tmp_path):
  N, D, L, B = _table()
  path = tmp_path / "results.jsonl"
  rows = [{"run_id": f"r{i}", "status": "done", "C_budget": B[i], "N": N[i], "D": D[i],
           "final_eval_loss": L[i], "final_eval_loss_se": None if i == 0 else 0.001 * (1 + i % 3),
           **({"eval_windows": 2048} if i % 2 else {})} for i in range(20)]
  path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
  runs = load_results(str(path))
  assert math.isnan(runs.loss_se[0]) and runs.loss_se[1] == 0.002
  noise = runs.eval_noise()
  assert noise.n_runs == 19 and noise.median_se == 0.002 and noise.eval_windows == 2048
  again = tmp_path / "again.jsonl"
  write_results_jsonl(runs, str(again))
  back = load_results(str(again))
  np.testing.assert_array_equal(back.loss_se, runs.loss_se)
  np.testing.assert_array_equal(back.eval_windows, runs.eval_windows)

  csv = tmp_path / "r.csv"
  csv.write_text("N,D,loss,C_budget,final_eval_loss_se\n" + "".join(
      f"{N[i]},{D[i]},{L[i]},{B[i]},{'' if i == 0 else SE}\n" for i in range(20)))
  runs = load_results(str(csv))
  assert runs.eval_noise().n_runs == 19 and runs.eval_windows is None
  assert load_results(str(csv)).subset([1, 2]).loss_se.tolist() == [SE, SE]

  path.write_text(json.dumps({**rows[1], "final_eval_loss_se": -1.0}) + "\n")
  with pytest.raises(ResultsError, match="final_eval_loss_se"):
    load_results(str(path), min_budgets=1)
