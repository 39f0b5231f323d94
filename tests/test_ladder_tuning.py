"""Tuned ladders (chinchax.ladder.tuning, analysis.tuning): knobs, the row of a trials run,
the best-LR estimate, the LR law, and a small tuned ladder end to end."""

import json
import math
import pathlib

import numpy as np
import pytest

from chinchax import config as config_lib
from chinchax import ladder
import chinchax.ladder.tuning as tuning
from analysis import tuning as tuning_report
from test_ladder import _ladder_config


@pytest.mark.parametrize("update,needle", [
    ({"lr_trials": 0}, r"ladder.lr_trials=0 must be a positive integer"),
    ({"seeds": -1}, r"ladder.seeds=-1 must be a positive integer"),
    ({"lr_trial_factor": 1.0}, r"ladder.lr_trial_factor=1.0 must be a number > 1"),
    ({"lr_trial_center": 0.0}, r"ladder.lr_trial_center=0.0 must be a positive number"),
    ({"lr_trials": 3, "schedule": "wsd"}, r"schedule='wsd': a cooldown starts"),
    ({"seeds": 2, "budget_kind": "seconds"}, r"budget_kind='seconds': K trials take"),
])
def test_bad_tuning_knobs_are_one_error_before_any_run(tmp_path, small_corpus, store_root,
                                                       update, needle):
  c = _ladder_config(tmp_path, small_corpus, store_root)
  c.ladder.update(**update)
  with pytest.raises(config_lib.ConfigError, match=needle):
    ladder.run_ladder(c)
  assert not (tmp_path / "ladder" / "results.jsonl").exists()


def test_a_ladder_takes_its_trials_from_its_own_knobs(tmp_path, small_corpus, store_root):
  c = _ladder_config(tmp_path, small_corpus, store_root)
  c.train_config.train.lr_multipliers = "0.5,2"
  with pytest.raises(config_lib.ConfigError, match=r"train_config.train.lr_multipliers='0.5,2' "
                                                   r"in a ladder: give a ladder its trials"):
    ladder.run_ladder(c)
  assert not (tmp_path / "ladder").exists()


def test_multipliers_are_centred_on_the_rule():
  lc = config_lib.get_ladder_variant("tiny").ladder
  lc.update(lr_trials=3, lr_trial_factor=2.0)
  assert tuning.multipliers(lc) == (0.5, 1.0, 2.0)
  lc.update(lr_trials=4, lr_trial_factor=4.0)
  assert tuning.multipliers(lc) == pytest.approx((0.125, 0.5, 2.0, 8.0))
  lc.lr_trials = 1
  assert tuning.multipliers(lc) == (1.0,)
  lc.update(lr_trials=3, lr_trial_factor=2.0, lr_trial_center=2.0)
  assert tuning.multipliers(lc) == (1.0, 2.0, 4.0)


def _summary(tmp_path, finals):
  """A trials run's summary and metrics.jsonl: trials (mult, seed) with final eval ``finals``."""
  keys = list(finals)
  records = [{"trial": i, "lr_mult": m, "seed": s, "peak_lr": 0.01 * m,
              "final_eval_loss": finals[(m, s)], "final_eval_loss_se": 0.001,
              "final_train_loss": None if finals[(m, s)] is None else finals[(m, s)] + 0.1,
              "diverged_step": None if finals[(m, s)] is not None else 5}
             for i, (m, s) in enumerate(keys)]
  with open(tmp_path / "metrics.jsonl", "w") as f:
    for step in (10, 20):
      f.write(json.dumps({"step": step, "loss": 1.0, "trial_eval_loss": [
          None if finals[k] is None else finals[k] + (20 - step) / 100 for k in keys]}) + "\n")
  return {"trials": records, "final_eval_loss": 0.0, "best_trial": 0}


def test_row_of_a_trials_run_is_its_best_lr_averaged_over_seeds(tmp_path):
  finals = {(0.5, 0): 3.0, (0.5, 1): 3.2, (1.0, 0): 2.9, (1.0, 1): 3.1,
            (2.0, 0): 2.7, (2.0, 1): None}  # ×2's best seed diverged in the other: ×2 is out
  row = tuning.row_fields(_summary(tmp_path, finals), tmp_path, n_params=100,
                          tokens_per_step=10)
  assert row["best_lr_mult"] == 1.0 and row["best_peak_lr"] == 0.01
  assert row["final_eval_loss"] == pytest.approx(3.0)
  assert row["seed_sd"] == pytest.approx(np.std([2.9, 3.1], ddof=1))
  assert row["final_eval_loss_se"] == pytest.approx(row["seed_sd"] / math.sqrt(2))
  # the mean of the two seeds' curves at ×1: FLOPs 6·N·step·tokens_per_step
  np.testing.assert_allclose(row["eval_curve"], [[6e4, 3.1], [1.2e5, 3.0]])
  assert len(row["trials"]) == 6 and row["trials"][5]["eval_curve"][0][0] == 6e4
  assert math.isnan(row["trials"][5]["eval_curve"][0][1])


def test_refined_lr_finds_the_vertex_and_flags_the_edge():
  best = 0.013
  trials = [{"lr_mult": m, "seed": 0, "peak_lr": 0.01 * m,
             "final_eval_loss": 2.0 + (math.log(0.01 * m) - math.log(best)) ** 2}
            for m in (0.5, 1.0, 2.0)]
  mult, lr, edge = tuning_report.refined_lr(trials)
  assert (mult, edge) == (1.0, False) and lr == pytest.approx(best, rel=1e-9)
  trials[2]["final_eval_loss"] = 1.0  # the lowest at the grid's end
  assert tuning_report.refined_lr(trials) == (2.0, 0.02, True)


def test_power_law_recovers_its_constants():
  N = np.geomspace(1e3, 1e6, 5)
  law = tuning_report.power_law(N, 0.7 * N ** -0.3)
  assert law["k"] == pytest.approx(0.7) and law["p"] == pytest.approx(-0.3) and law["n"] == 5
  assert tuning_report.power_law([1.0, 2.0], [1.0, 2.0]) is None


def test_a_tuned_ladder_keeps_every_trial_and_fits_each_points_best(tmp_path, small_corpus,
                                                                    store_root):
  c = _ladder_config(tmp_path, small_corpus, store_root)
  c.ladder.update(c_min=4e8, c_max=4e8, n_budgets=1, fit=False, validate=False, workers=1,
                  lr_trials=2, lr_trial_factor=4.0)
  # One checkpoint a run (at its end) and 16 eval windows: less to write and to evaluate.
  c.train_config.train.update(checkpoint_every=1000, eval_windows=16)
  results = ladder.run_ladder(c)
  rows = [json.loads(l) for l in pathlib.Path(results).read_text().splitlines()]
  assert len(rows) == 3 and all(r["status"] == "done" for r in rows)
  for r in rows:
    assert [t["lr_mult"] for t in r["trials"]] == [0.5, 2.0]
    rule = r["hparams"]["peak_lr"]
    assert [t["peak_lr"] for t in r["trials"]] == pytest.approx([rule / 2, rule * 2])
    best = min(r["trials"], key=lambda t: t["final_eval_loss"])
    assert r["final_eval_loss"] == best["final_eval_loss"]
    assert r["best_lr_mult"] == best["lr_mult"] and r["eval_curve"] == best["eval_curve"]
    assert r["eval_curve"][-1][1] == pytest.approx(r["final_eval_loss"])
  out = tmp_path / "fit"
  report = tuning_report.tuning_report(str(results), str(out), log=lambda m: None)
  assert len(report["points"]) == 3 and "error" in report["a_untuned"]  # one budget, no ×1
  assert "| C4.00e+08" in (out / "tuning.md").read_text()
