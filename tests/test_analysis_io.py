"""Tests of analysis.io: loading results tables and rejecting bad ones with one clear error."""

import json

import numpy as np
import pytest

from chinchax.laws import parametric as laws
from analysis.io import ResultsError, load_results, write_results_jsonl
from analysis.isoflop.synthetic import synthetic_runs

EPOCH_CSV = "/work/shared/reference/epoch_chinchilla_svg_extracted_data.csv"


def _law():
  return laws.ParametricLaw("t", E=1.8, A=480.0, B=2100.0, alpha=0.35, beta=0.37)


def _rows(n_budgets=3, sizes=4):
  rows = []
  for i, C in enumerate(np.geomspace(1e18, 1e20, n_budgets)):
    for j, N in enumerate(np.geomspace(1e8, 1e9, sizes)):
      rows.append({"run_id": f"c{i}n{j}", "status": "done", "C_budget": float(C),
                   "N": int(N), "D": float(C / (6 * N)), "final_eval_loss": 3.0 - 0.1 * i + 0.01 * j})
  return rows


def _write_jsonl(path, rows):
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return str(path)


def test_epoch_csv_column_names():
  runs = load_results(EPOCH_CSV)
  assert len(runs) == 245
  assert runs.N.min() == pytest.approx(57334197.40687078)
  # D = C / (6N).
  assert runs.C.max() == pytest.approx(1.2956022673438285e+22)
  assert not runs.has_budget_column and runs.curves is None
  dropped = runs.drop_highest_loss(5)
  assert len(dropped) == 240 and dropped.loss.max() < 3.41


def test_csv_with_N_D_loss_and_with_C(tmp_path):
  p = tmp_path / "a.csv"
  p.write_text("N,D,loss\n1e8,2e9,3.0\n2e8,5e9,2.8\n4e8,1e11,2.5\n")
  runs = load_results(str(p))
  assert np.allclose(runs.D, [2e9, 5e9, 1e11])
  q = tmp_path / "b.csv"
  q.write_text("N,C,loss\n1e8,1.2e18,3.0\n2e8,6e18,2.8\n4e8,2.4e20,2.5\n")
  runs = load_results(str(q))
  assert np.allclose(runs.D, [2e9, 5e9, 1e11])


def test_jsonl_round_trip_and_failed_rows(tmp_path):
  runs = synthetic_runs(_law(), [1e18, 1e19, 1e20], n_sizes=4, curve_points=5)
  path = tmp_path / "results.jsonl"
  write_results_jsonl(runs, str(path), failed=["broken"])
  back = load_results(str(path))
  assert len(back) == len(runs) and back.n_failed == 1
  assert back.has_budget_column
  assert np.allclose(back.loss, runs.loss) and np.allclose(back.budget, runs.budget)
  assert back.curves is not None and np.allclose(back.curves[3], runs.curves[3])


def test_missing_column_csv(tmp_path):
  p = tmp_path / "a.csv"
  p.write_text("N,D\n1e8,2e9\n")
  with pytest.raises(ResultsError, match=r"a\.csv: missing column 'loss'"):
    load_results(str(p))
  q = tmp_path / "b.csv"
  q.write_text("N,loss\n1e8,3.0\n")
  with pytest.raises(ResultsError, match="missing column 'D' or 'C'"):
    load_results(str(q))


def test_missing_column_jsonl(tmp_path):
  rows = _rows()
  del rows[2]["final_eval_loss"]
  with pytest.raises(ResultsError, match=r":3: run 'c0n2' is missing column 'final_eval_loss'"):
    load_results(_write_jsonl(tmp_path / "r.jsonl", rows))


@pytest.mark.parametrize("value,message", [(float("nan"), "is NaN"), (0.0, "must be finite and > 0"),
                                           (-2.5, "must be finite and > 0"), ("abc", "not a number")])
def test_bad_loss_values(tmp_path, value, message):
  rows = _rows()
  rows[5]["final_eval_loss"] = value
  with pytest.raises(ResultsError, match=message) as info:
    load_results(_write_jsonl(tmp_path / "r.jsonl", rows))
  assert ":6: column 'final_eval_loss'" in str(info.value)


def test_bad_csv_value_names_line_and_column(tmp_path):
  p = tmp_path / "a.csv"
  p.write_text("N,D,loss\n1e8,2e9,3.0\n2e8,5e9,nan\n")
  with pytest.raises(ResultsError, match=r"a\.csv:3: column 'loss' is NaN"):
    load_results(str(p))
  p.write_text("N,D,loss\n1e8,2e9,3.0\n-2e8,5e9,2.0\n")
  with pytest.raises(ResultsError, match=r"a\.csv:3: column 'N' must be finite and > 0"):
    load_results(str(p))


def test_duplicated_runs(tmp_path):
  rows = _rows()
  rows.append(dict(rows[1]))
  with pytest.raises(ResultsError, match="duplicated run 'c0n1' \\(first on line 2\\)"):
    load_results(_write_jsonl(tmp_path / "r.jsonl", rows))
  rows = _rows()
  rows.append(dict(rows[1], run_id="again"))
  with pytest.raises(ResultsError, match="duplicated run: 'again' repeats"):
    load_results(_write_jsonl(tmp_path / "s.jsonl", rows))
  p = tmp_path / "a.csv"
  p.write_text("N,D,loss\n1e8,2e9,3.0\n2e8,5e9,2.8\n1e8,2e9,3.0\n")
  with pytest.raises(ResultsError, match="duplicated run"):
    load_results(str(p))


def test_fewer_than_three_budgets(tmp_path):
  with pytest.raises(ResultsError, match=r"only 2 IsoFLOP budget\(s\).*at least 3"):
    load_results(_write_jsonl(tmp_path / "r.jsonl", _rows(n_budgets=2)))
  assert len(load_results(_write_jsonl(tmp_path / "s.jsonl", _rows(n_budgets=3)))) == 12


def test_empty_tables(tmp_path):
  p = tmp_path / "e.csv"
  p.write_text("")
  with pytest.raises(ResultsError, match="is empty"):
    load_results(str(p))
  p.write_text("N,D,loss\n")
  with pytest.raises(ResultsError, match="no runs to fit"):
    load_results(str(p))
  q = tmp_path / "f.jsonl"
  q.write_text(json.dumps({"run_id": "x", "status": "failed"}) + "\n")
  with pytest.raises(ResultsError, match=r"no finished runs to fit \(1 failed\)"):
    load_results(str(q))
  with pytest.raises(ResultsError, match="does not exist"):
    load_results(str(tmp_path / "nope.jsonl"))


def test_invalid_json_line(tmp_path):
  p = tmp_path / "r.jsonl"
  p.write_text(json.dumps(_rows()[0]) + "\n{not json\n")
  with pytest.raises(ResultsError, match=r"r\.jsonl:2: not valid JSON"):
    load_results(str(p))


def test_eval_curves_drop_step0_and_reject_nan(tmp_path):
  rows = _rows()
  for r in rows:
    r["eval_curve"] = [[0.0, 5.5], [1e16, 4.0], [r["C_budget"], r["final_eval_loss"]]]
  runs = load_results(_write_jsonl(tmp_path / "r.jsonl", rows))
  assert runs.curves is not None and runs.curves[0].shape == (2, 2)
  rows[4]["eval_curve"][1][1] = float("nan")
  with pytest.raises(ResultsError, match=r":5: run 'c1n0' eval_curve has a NaN"):
    load_results(_write_jsonl(tmp_path / "s.jsonl", rows))
