"""Golden test: the Approach-3 refit of Chinchilla's data.

Besiroglu et al. 2024 (arXiv 2404.10102) refit Chinchilla's Approach 3 on the
245 points Epoch AI extracted from Chinchilla Fig. 4, after dropping the 5
highest losses: E = 1.817 [1.769, 1.871], A = 482.01 [285, 744],
B = 2085.43 [1042, 5810], alpha = 0.348 [0.317, 0.373], beta = 0.366
[0.331, 0.415] (95% bootstrap intervals).
"""

import csv
import json
import os

import pytest

from chinchax import cli as chinchax_cli
from chinchax.laws import parametric as laws

EPOCH_CSV = "/work/shared/reference/epoch_chinchilla_svg_extracted_data.csv"
TOLERANCE = {"E": 0.03, "A": 0.03, "B": 0.05, "alpha": 0.03, "beta": 0.03}


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
  """Runs `chinchax fit FILE --approach 3 --out DIR` on the CSV minus its 5 highest losses."""
  tmp = tmp_path_factory.mktemp("epoch")
  with open(EPOCH_CSV) as f:
    rows = list(csv.DictReader(f))
  rows.sort(key=lambda r: float(r["loss"]), reverse=True)
  path = tmp / "chinchilla_240.csv"
  with open(path, "w") as f:
    f.write("N,C,loss\n")
    for r in rows[5:]:
      f.write(f"{r['Model Size']},{r['Training FLOP']},{r['loss']}\n")
  out = tmp / "out"
  rc = chinchax_cli.main(["fit", str(path), "--approach", "3", "--out", str(out), "--bootstrap", "50",
                 "--seed", "0", "--quiet"])
  assert rc == 0
  with open(out / "fit.json") as f:
    return json.load(f), out


def test_parameters_match_epoch_refit(fitted):
  data, _ = fitted
  epoch = laws.get_law("epoch")
  assert data["input"]["n_runs"] == 240
  for name, tol in TOLERANCE.items():
    value = data[name]
    lo, hi = laws.EPOCH_CI95[name]
    assert lo <= value <= hi, (name, value)
    assert value == pytest.approx(getattr(epoch, name), rel=tol), name
  assert data["approach3"]["E"] == data["E"]
  assert data["a"] == pytest.approx(0.513, abs=0.02)


def test_full_grid_fit_is_fast_and_reports_grid_edge(fitted):
  data, _ = fitted
  a3 = data["approach3"]
  assert a3["n_starts"] == 4500
  assert a3["huber_delta"] == 1e-3
  # The fit's wall time is reported (a benchmark figure), not asserted: it depends on machine load.
  assert a3["wall_time_s"] > 0.0
  assert isinstance(a3["best_start_on_grid_edge"], bool)
  assert a3["n_starts_at_best"] >= 1 and a3["n_interior_starts_at_best"] >= 1
  assert a3["optimum_inside_grid"] is True


def test_bootstrap_intervals_for_every_parameter(fitted):
  data, _ = fitted
  ci = data["approach3"]["ci"]
  for name in ("E", "A", "B", "alpha", "beta", "a", "b", "G"):
    lo, hi = ci[name]
    assert lo < data[name] < hi, name
  # Epoch's intervals are of the same width as ours (theirs: alpha in [0.317, 0.373]).
  assert 0.005 < ci["alpha"][1] - ci["alpha"][0] < 0.1


def test_outputs_and_law_round_trip(fitted):
  data, out = fitted
  for name in ("fit.json", "fit.md", "isoflop.png", "isoflop.svg", "frontier.png",
               "frontier.svg", "contours.png", "contours.svg", "residuals.png", "residuals.svg"):
    assert os.path.getsize(out / name) > 0, name
  law = laws.get_law(str(out / "fit.json"))
  assert isinstance(law, laws.ParametricLaw)
  assert law.alpha == data["alpha"] and law.B == data["B"]
  md = (out / "fit.md").read_text()
  assert "Approach 3" in md and f"{data['alpha']:.5g}"[:5] in md
