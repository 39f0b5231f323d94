"""The fit's figures and per-run table: training curves, the validation figure (redrawn once the
held-out run is in the table), and fit.md's runs with their eval standard errors."""

import json
import math

import numpy as np

from analysis import pipeline

LAW = dict(E=1.8, A=400.0, B=900.0, alpha=0.34, beta=0.28)
GRID = "alpha=0.2:0.5:3,beta=0.2:0.5:3,logA=4:8:3,logB=5:9:3,logE=0:1:3"


def _loss(N, D):
  return LAW["E"] + LAW["A"] / N ** LAW["alpha"] + LAW["B"] / D ** LAW["beta"]


def _row(run_id, C, N, noise, role=None):
  D = C / (6 * N)
  curve = [[C * f, _loss(N, D * f) + noise] for f in (0.25, 0.5, 0.75, 1.0)]
  row = {"run_id": run_id, "status": "done", "C_budget": C, "N": N, "D": D,
         "final_eval_loss": _loss(N, D) + noise, "final_eval_loss_se": 0.01, "eval_curve": curve}
  if role:
    row["role"] = role
  return row


def _table(path, with_validation=False):
  rng = np.random.default_rng(0)
  rows = [_row(f"C{C:.2e}_N{N:.0f}", C, N, float(rng.normal(0, 0.003)))
          for C in (1e15, 4e15, 1.6e16) for N in np.geomspace(2e6, 6e7, 5) * (C / 1e15) ** 0.5]
  if with_validation:
    rows.append(_row("Vval", 5e16, 2.4e7, 0.0, role="validation"))
  path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
  return rows


def test_the_fit_draws_curves_and_validation_and_tabulates_its_runs(tmp_path):
  table, out = tmp_path / "results.jsonl", tmp_path / "fit"
  rows = _table(table)
  pipeline.fit_results(table, out, n_bootstrap=3, grid=GRID, compare=["chinchilla-approach3"])
  for stem in ("curves", "validation", "isoflop", "frontier", "residuals"):
    assert (out / f"{stem}.png").stat().st_size > 10_000, stem
  data = json.loads((out / "fit.json").read_text())
  assert "validation.png" in data["figures"] and "curves.png" in data["figures"]
  assert len(data["runs"]) == len(rows) and all(r["loss_se"] == 0.01 for r in data["runs"])
  md = (out / "fit.md").read_text()
  table_lines = [l for l in md.splitlines() if l.startswith("| `C")]
  assert len(table_lines) == len(rows)
  r = rows[0]
  line = [l for l in table_lines if r["run_id"] in l][0]
  assert f"{r['D'] / r['N']:.1f}" in line and f"{r['final_eval_loss']:.4f} ± 0.0100" in line
  before = (out / "validation.png").read_bytes()
  _table(table, with_validation=True)
  v = pipeline.add_validation(table, out)
  assert v["measured_se"] == 0.01 and math.isfinite(v["predicted_loss"])
  assert (out / "validation.png").read_bytes() != before  # the held-out run is drawn
  assert "± 0.0100 (s.e.)" in (out / "fit.md").read_text()
