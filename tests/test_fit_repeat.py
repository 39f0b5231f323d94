"""Repetition laws (chinchax.laws.repeat) and their fits (analysis.repeat.fit, repeat_report).

Truth is independent: hand-computed D', penalty and the one-epoch reduction, and synthetic
runs drawn from each form at known parameters (plus 0.2% noise) fitted back as ``chinchax fit``
does (the base by Approach 3 on the single-epoch runs, then the form).
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from chinchax.laws import parametric as laws
from chinchax.laws import repeat as lr
from analysis.isoflop import approach3
from analysis.repeat import fit as fr
from analysis import pipeline
from analysis.repeat import report as rr
from analysis.runs import runs_from_arrays

TRUE_BASE = laws.ParametricLaw(name="truth", E=1.8, A=400.0, B=1500.0, alpha=0.34, beta=0.30)


def _design():
  """Single-epoch IsoFLOP rows (no unique_tokens) and repeated rows at 3 unique sizes."""
  N, D, U = [], [], []
  for C in (1e15, 1e16, 1e17):
    for n in np.geomspace(2e5, 2e7, 5):
      N.append(n), D.append(C / (6 * n)), U.append(np.inf)
  for u in (5e6, 2e7, 8e7):
    for n in (1e6, 4e6):
      for ep in (1, 2, 4, 8, 16, 32):
        N.append(n), D.append(ep * u), U.append(u)
  return np.array(N), np.array(D), np.array(U)


def _runs(law, seed=0):
  N, D, U = _design()
  noise = np.exp(np.random.default_rng(seed).normal(0.0, 0.002, len(N)))
  runs = runs_from_arrays(N, D, np.asarray(law.loss(N, D, U)) * noise)
  return dataclasses.replace(runs, unique_tokens=U)


def _base(runs):
  """Approach 3 on the runs of one epoch or less, from a coarse start grid (for speed)."""
  grid = approach3.start_grid(approach3.parse_grid(
      "logA=0:20:5,logB=0:20:5,logE=-1:1:3,alpha=0.25:1:3,beta=0.25:1:3"))
  return approach3.fit_approach3(fr.single_epoch(runs), grid=grid).law


def test_effective_data_by_hand():
  law = lr.MuennighoffLaw(base=TRUE_BASE, R_D_star=15.0, R_N_star=None)
  # U = 1e9, D = 5e9: R_D = 4, D' = 1e9 + 1e9 * 15 * (1 - exp(-4/15)).
  want = 1e9 + 1e9 * 15.0 * (1.0 - math.exp(-4.0 / 15.0))
  assert law.effective_data(5e9, 1e9) == pytest.approx(want, rel=1e-12)
  assert want == pytest.approx(4.5111e9, rel=1e-4)  # 15 * 0.23407 = 3.5111 repetitions' worth
  # Excess parameters: N_opt(U) = G (U G)^(beta/alpha); N = 3 N_opt gives R_N = 2.
  law_n = lr.MuennighoffLaw(base=TRUE_BASE, R_D_star=15.0, R_N_star=5.0)
  G = (0.34 * 400.0 / (0.30 * 1500.0)) ** (1 / 0.64)
  n_opt = G * (1e9 * G) ** (0.30 / 0.34)
  assert lr.tokens_to_params(TRUE_BASE, 1e9) == pytest.approx(n_opt, rel=1e-12)
  want_n = n_opt + n_opt * 5.0 * (1.0 - math.exp(-2.0 / 5.0))
  assert law_n.effective_params(3 * n_opt, 5e9, 1e9) == pytest.approx(want_n, rel=1e-12)


def test_one_epoch_is_chinchilla():
  law = lr.MuennighoffLaw(base=TRUE_BASE, R_D_star=15.4, R_N_star=5.3)
  N, D = 1e6, 4e8  # N below N_opt(D) for this base: no excess parameters
  assert N < lr.tokens_to_params(TRUE_BASE, D)
  chin = 1.8 + 400.0 / N ** 0.34 + 1500.0 / D ** 0.30
  assert law.loss(N, D, D) == pytest.approx(chin, rel=1e-12)
  assert law.loss(N, D, 10 * D) == pytest.approx(chin, rel=1e-12)   # fewer than one epoch
  assert law.loss(N, D, math.inf) == pytest.approx(chin, rel=1e-12)  # fresh data
  assert lr.OverfitLaw(base=TRUE_BASE, P=0.05).loss(N, D, D) == pytest.approx(chin, rel=1e-12)
  # The additive penalty by hand: P ln(epochs) B / U^beta at 4 epochs.
  pen = 0.05 * math.log(4.0) * 1500.0 / D ** 0.30
  assert lr.OverfitLaw(base=TRUE_BASE, P=0.05).loss(N, 4 * D, D) == pytest.approx(
      TRUE_BASE.loss(N, 4 * D) + pen, rel=1e-12)
  assert law.loss(N, 4 * D, D) > TRUE_BASE.loss(N, 4 * D)  # repeats are worth less than fresh


def test_base_law_rows_are_every_run_of_one_epoch_or_less():
  # D <= U is a single-epoch run whatever its unique set (each run of a published table may
  # carry its own U); only D > U repeats.
  from analysis.runs import Runs
  N = np.array([1e6, 1e6, 1e6, 1e6, 2e6])
  D = np.array([1e8, 1e8, 5e8, 2e7, 1e8])
  for U, keep in ((np.array([np.inf, 2e8, 2e8, 2e8, np.inf]), [0, 1, 3, 4]),
                  (np.array([4e8, 2e8, 2e8, 2e8, 4e8]), [0, 1, 3, 4]),
                  (np.array([4e8, 2e8, 2e8, 2e8, 1e8]), [0, 1, 3, 4])):  # e: exactly one epoch
    runs = Runs(N=N, D=D, loss=np.full(5, 3.0), budget=6 * N * D, run_id=tuple("abcde"),
                unique_tokens=U)
    assert list(fr.single_epoch(runs).run_id) == [("abcde")[i] for i in keep]


def test_overfit_optimal_epochs_by_hand():
  law = lr.OverfitLaw(base=TRUE_BASE, P=0.02)
  e_star = law.optimal_epochs
  assert e_star == pytest.approx((0.30 / 0.02) ** (1 / 0.30), rel=1e-12)
  U, N = 1e8, 1e7
  grid = np.geomspace(1.0, 1e6, 200001)
  assert grid[np.argmin(law.loss(N, grid * U, U))] == pytest.approx(e_star, rel=1e-3)


@pytest.mark.parametrize("form,truth", [
    ("muennighoff", lr.MuennighoffLaw(base=TRUE_BASE, R_D_star=10.0, R_N_star=4.0)),
    ("overfit", lr.OverfitLaw(base=TRUE_BASE, P=0.1)),
])
def test_fit_recovers_known_parameters(form, truth):
  """As ``chinchax fit --repeat-base joint`` does it: the base by Approach 3 on the runs of
  one epoch or less (a coarse start grid, for speed), then the form and the base together;
  under Muennighoff's law those runs are not Chinchilla's (excess parameters act at one
  epoch), so the base starts off biased and only the joint polish removes that."""
  runs = _runs(truth)
  base = _base(runs)
  rows = fr.RepeatRows.from_runs(runs)
  law, _ = fr.fit_form(form, base, rows, joint=form == "muennighoff")
  for k, v in truth.params().items():
    assert law.params()[k] == pytest.approx(v, rel=0.1), k
  for k in ("alpha", "beta"):  # E trades with A and alpha within the noise: judged below
    assert getattr(law.base, k) == pytest.approx(getattr(TRUE_BASE, k), rel=0.05), k
  pred, true = law.loss(rows.N, rows.D, rows.U), truth.loss(rows.N, rows.D, rows.U)
  assert np.max(np.abs(pred / true - 1)) < 0.005


def _write_table(path, runs, held):
  with open(path, "w") as f:
    for i in range(len(runs)):
      u = runs.unique_tokens[i]
      row = {"run_id": runs.run_id[i], "status": "done", "N": float(runs.N[i]),
             "D": float(runs.D[i]), "final_eval_loss": float(runs.loss[i])}
      if np.isfinite(u):
        row["unique_tokens"] = float(u)
      f.write(json.dumps(row) + "\n")
    f.write(json.dumps({**held, "status": "done", "role": "validation"}) + "\n")


def test_chinchax_fit_writes_the_repeat_block(tmp_path):
  """End to end through ``chinchax fit``'s function: Approach 3 on the single-epoch rows, both
  forms on all, the block, its fit.md section and figure, the validation run."""
  truth = lr.OverfitLaw(base=TRUE_BASE, P=0.1)
  runs = _runs(truth, seed=1)
  held = {"run_id": "val", "N": 2e6, "D": 12 * 3e7, "unique_tokens": 3e7,
          "final_eval_loss": float(truth.loss(2e6, 12 * 3e7, 3e7))}
  _write_table(tmp_path / "results.jsonl", runs, held)
  report = pipeline.fit_results(
      tmp_path / "results.jsonl", tmp_path / "fit", approach="3", n_bootstrap=8, min_budgets=1,
      compare=["epoch"], grid="logA=0:20:5,logB=0:20:5,logE=-1:1:3,alpha=0.25:1:3,beta=0.25:1:3")
  # Approach 3 saw the 15 fresh rows and the 6 of one epoch of a smaller unique set.
  assert len(report.runs) == 21
  data = json.loads((tmp_path / "fit" / "fit.json").read_text())
  block = data["repeat"]
  assert block["form"] == "overfit" and block["input"]["n_repeated"] == 30
  lo, hi = block["overfit"]["ci"]["P"]
  assert lo <= block["overfit"]["params"]["P"] <= hi
  assert block["overfit"]["params"]["P"] == pytest.approx(0.1, rel=0.1)
  loo = block["overfit"]["leave_one_unique_out"]
  assert [f["unique_tokens"] for f in loo["folds"]] == [5e6, 2e7, 8e7]
  assert all(f["n_runs"] == 10 for f in loo["folds"])  # 2 sizes × 5 epoch counts past 1
  assert loo["rms_rel_error"] < 0.01    # the true form predicts a held-out size to noise
  assert block["muennighoff"]["leave_one_unique_out"]["rms_rel_error"] > loo["rms_rel_error"]
  v = block["validation"][0]
  assert v["epochs"] == pytest.approx(12.0)
  assert abs(v["predictions"]["overfit"]["rel_error"]) < 0.01
  again = rr.validation_from_block(block, held)   # what add_validation writes from fit.json
  for k, p in v["predictions"].items():
    assert again["predictions"][k]["predicted_loss"] == pytest.approx(p["predicted_loss"],
                                                                      rel=1e-12)
  logged = []  # the ladder's path: the validation run added to the fit after it
  pipeline.add_validation(tmp_path / "results.jsonl", tmp_path / "fit", log=logged.append)
  assert logged[0].startswith("repeat: validation run val (12 epochs")
  assert logged[-1].startswith("validation: run val") and logged[-1].endswith(
      "by the single-epoch law (repetition ignored; the repeat lines above give the "
      "repetition laws')"), logged
  assert "## Data-constrained runs" in (tmp_path / "fit" / "fit.md").read_text()
  assert (tmp_path / "fit" / "repeat.png").stat().st_size > 1000
  assert "repeat.svg" in data["figures"] and "profile.png" in data["figures"]
  assert data["repeat"]["overfit"]["profile"]["P"]["identified"]
  assert "P in [" in (tmp_path / "fit" / "fit.md").read_text()


def test_block_loads_back_as_law():
  base = TRUE_BASE
  block = {"form": "overfit", "overfit": {"params": {"P": 0.03}},
           "muennighoff": {"params": {"R_D_star": 12.0, "R_N_star": None}}}
  assert lr.law_from_block(block, base).P == 0.03
  m = lr.law_from_block(block, base, "muennighoff")
  assert m.R_D_star == 12.0 and m.R_N_star is None
  with pytest.raises(ValueError, match="no fitted 'nope' form"):
    lr.law_from_block(block, base, "nope")


def test_no_repeated_run_is_an_error():
  N, D, _ = _design()
  runs = runs_from_arrays(N[:15], D[:15], TRUE_BASE.loss(N[:15], D[:15]))
  assert not fr.has_repetition(runs)
  with pytest.raises(fr.FitError, match="more than one epoch"):
    fr.fit_form("overfit", TRUE_BASE, fr.RepeatRows.from_runs(runs))


def test_fit_law_flag_is_checked_before_fitting(tmp_path, capsys):
  """``chinchax fit --law`` on an IsoFLOP table: only as the base of repetition fits, and only
  a law with a loss; one error line each, nothing written."""
  from chinchax import cli
  truth = lr.OverfitLaw(base=TRUE_BASE, P=0.1)
  runs = _runs(truth)
  _write_table(tmp_path / "rep.jsonl", runs, {"run_id": "v", "N": 2e6, "D": 4e7,
                                              "final_eval_loss": 3.0})
  fresh = fr.single_epoch(runs).subset(np.arange(15))
  _write_table(tmp_path / "fresh.jsonl", fresh, {"run_id": "v", "N": 2e6, "D": 4e7,
                                                 "final_eval_loss": 3.0})
  for table, law, want in (("fresh.jsonl", "epoch", "tables whose runs repeat data"),
                           ("rep.jsonl", "chinchilla-approach1", "has no L(N, D)"),
                           ("rep.jsonl", "no-such-law", "unknown law")):
    rc = cli.main(["fit", str(tmp_path / table), "--law", law, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("error:") and want in err[0]
  assert not (tmp_path / "o").exists()
