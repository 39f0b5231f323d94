"""The ladder's shape rule and its held-out validation run.

Independent truths: hand-checked shape properties along the width grid, the
fit of a table with and without its validation row, and the prediction of a
validation row recomputed from fit.json's own law.
"""

import json

import numpy as np
import pytest

from analysis import io as io_lib
from analysis import pipeline
from analysis.isoflop import synthetic
from chinchax.cost import budget
from chinchax import config as config_lib
from chinchax.laws import parametric as laws
from chinchax import ladder
from chinchax.planning import shapes

RULE = shapes.PRESETS["ladder"]
FEW_STARTS = "alpha=0.2:0.5:2,beta=0.2:0.5:2,logE=-1:1:2,logA=0:10:2,logB=0:10:2"  # 32 starts


def _ladder_shape(d_model):
  return shapes.shape_for(d_model, RULE.min_layers, vocab_size=257, seq_len=64, rule=RULE)


def test_ladder_shape_rule_is_smooth_and_monotone_in_N():
  widths = list(range(RULE.min_width, 400, RULE.quantum))
  Ns = [budget.param_counts(_ladder_shape(d)).total for d in widths]
  assert all(b > a for a, b in zip(Ns, Ns[1:]))                   # strictly increasing
  ratios = np.array(Ns[1:]) / np.array(Ns[:-1])
  assert ratios.max() < 1.9 and np.all(np.diff(ratios) < 0.1)     # steps shrink, never jump
  for d in widths:
    s = _ladder_shape(d)
    assert s.n_layers == 2 and s.n_heads == 2 and s.n_heads * s.head_dim == d
    assert s.head_dim % 2 == 0 and (s.head_dim >= 16 or d < 32)
    assert abs(s.d_ff - 8 * d / 3) <= RULE.quantum / 2


def test_default_grid_depth_is_fixed_and_sizes_grow_within_each_budget():
  c = config_lib.get_ladder_variant("default")
  runs = ladder.plan_runs(c.ladder, c.train_config.train, 257)
  assert {r.shape.n_layers for r in runs} == {2}
  assert np.log10(c.ladder.c_max / c.ladder.c_min) >= 1.5
  for C in {r.C_budget for r in runs}:
    Ns = [r.counts.total for r in runs if r.C_budget == C]
    assert len(Ns) == c.ladder.sizes_per_budget and Ns == sorted(set(Ns))
    n_opt = (C / (6 * c.ladder.tokens_per_param)) ** 0.5
    assert min(Ns) < n_opt < max(Ns)                              # the grid brackets its centre
  for r in runs:  # DeepSeek's batch, shrunk only where the run would take < batch_min_steps steps
    ds_batch = round(0.2920 * r.C_budget ** 0.3271 / 64)
    assert r.hparams.peak_lr == pytest.approx(0.3118 * r.C_budget ** -0.125)
    assert r.hparams.global_batch_size <= ds_batch
    assert r.hparams.steps >= c.ladder.batch_min_steps or r.hparams.global_batch_size == ds_batch


def _table(tmp_path, rows):
  path = tmp_path / "results.jsonl"
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return path


def _grid_rows():
  law = laws.get_law("chinchilla-approach3-unrounded")
  runs = synthetic.synthetic_runs(law, [1e18, 3e18, 1e19, 3e19], n_sizes=5, span=4.0,
                                  noise=0.002, seed=1)
  return [{"run_id": f"r{i}", "status": "done", "C_budget": float(runs.budget[i]),
           "N": float(runs.N[i]), "D": float(runs.D[i]), "final_eval_loss": float(runs.loss[i])}
          for i in range(len(runs))]


def test_validation_row_is_held_out_of_the_fit_and_compared_with_its_law(tmp_path):
  rows = _grid_rows()
  (tmp_path / "a").mkdir()
  plain = pipeline.fit_results(_table(tmp_path / "a", rows), tmp_path / "fa", n_bootstrap=0,
                               n_jobs=1, figures=False, grid=FEW_STARTS)
  val = {"run_id": "VC1e20_N1", "role": "validation", "status": "done", "C_budget": 1e20,
         "N": 4.0e9, "D": 1e20 / (6 * 4.0e9), "final_eval_loss": 2.5}
  (tmp_path / "b").mkdir()
  table = _table(tmp_path / "b", rows + [val])
  assert len(io_lib.load_results(str(table))) == len(rows)       # never fitted
  with_val = pipeline.fit_results(table, tmp_path / "fb", n_bootstrap=0, n_jobs=1,
                                  figures=False, grid=FEW_STARTS)
  for k in plain.results:                                        # the same fit, bit for bit
    assert with_val.results[k].params() == plain.results[k].params()
  data = json.loads((tmp_path / "fb" / "fit.json").read_text())
  v = data["validation"]
  predicted = data["E"] + data["A"] / val["N"] ** data["alpha"] + data["B"] / val["D"] ** data["beta"]
  assert v["predicted_loss"] == pytest.approx(predicted, rel=1e-12)
  assert v["rel_error"] == pytest.approx((2.5 - predicted) / predicted, rel=1e-12)
  assert (v["C"], v["N"], v["measured_loss"], v["law"]) == (1e20, 4.0e9, 2.5, "approach3")
  assert "Validation run" in (tmp_path / "fb" / "fit.md").read_text()
  # Adding the row to an existing fit (the ladder's path) writes the same block.
  added = pipeline.add_validation(table, tmp_path / "fa")
  assert added == pytest.approx(v)
  assert json.loads((tmp_path / "fa" / "fit.json").read_text())["validation"] == added


def test_validation_run_uses_the_fitted_laws_N_opt(tmp_path):
  c = config_lib.get_ladder_variant("tiny")
  c.workdir = str(tmp_path / "lad")
  plan = ladder.prepare(c, check_data=False)
  law = {"E": 1.0, "A": 50.0, "B": 500.0, "alpha": 0.4, "beta": 0.35, "law_from": "approach3"}
  (tmp_path / "fit.json").write_text(json.dumps(law))
  run = ladder.plan_validation(plan, tmp_path / "fit.json")
  C = c.ladder.validate_factor * c.ladder.c_max
  n_opt = laws.law_from_dict(law).optimal_allocation(C)[0]
  assert run.role == "validation" and run.run_id.startswith("V") and run.C_budget == C
  # the nearest shape of the ladder's rule to the law's N_opt
  best = shapes.propose_shapes(n_opt, vocab_size=257, seq_len=32, rule=RULE, k=1)[0]
  assert run.counts.total == best.N


@pytest.mark.parametrize("knob,value,words", [
    ("validate_factor", 1.0, "validate_factor=1.0 must be a number > 1"),
    ("batch_min_steps", 0, "batch_min_steps=0 must be an integer >= 1"),
    ("hparams", "mup", "ladder.hparams='mup' is not a known"),
])
def test_bad_ladder_science_knobs(knob, value, words):
  c = config_lib.get_ladder_variant("tiny")
  c.ladder[knob] = value
  with pytest.raises(config_lib.ConfigError, match=words.replace("(", "\\(").replace(")", "\\)")):
    ladder.validate_ladder(c.ladder)


def test_validation_run_on_more_devices_rounds_only_its_own_batch(tmp_path):
  """The main process trains the validation run on one device per local worker: its batch is
  rounded to them, the grid keeps the batches a one-device worker gives its runs."""
  import jax
  c = config_lib.get_ladder_variant("tiny")
  c.workdir = str(tmp_path / "lad")
  law = {"E": 1.0, "A": 50.0, "B": 500.0, "alpha": 0.4, "beta": 0.35, "law_from": "approach3"}
  (tmp_path / "fit.json").write_text(json.dumps(law))
  c.ladder.hparams = "deepseek"
  one = ladder.prepare(c, devices=jax.devices()[:1], check_data=False)
  two = ladder.prepare(c, devices=jax.devices()[:2], check_data=False)
  v1 = ladder.plan_validation(one, tmp_path / "fit.json")
  v2 = ladder.plan_validation(two, tmp_path / "fit.json")
  ds = round(0.2920 * v1.C_budget ** 0.3271 / c.train_config.train.seq_len)
  assert v1.hparams.global_batch_size == max(1, ds)
  assert v2.hparams.global_batch_size % 2 == 0 and abs(v2.hparams.global_batch_size - ds) <= 1
  assert v2.run_id == v1.run_id and v2.shape == v1.shape
  assert any(r.hparams.global_batch_size % 2 for r in one.runs)  # the grid of a 1-device worker


def test_status_with_local_workers_lists_the_batches_the_workers_train(tmp_path):
  """``ladder.workers=2`` gives the main process two CPU devices (for the validation run); the
  grid it lists must still be the one-device workers' grid."""
  import subprocess
  import sys
  listings = []
  for k in (1, 2):
    out = subprocess.run(
        [sys.executable, "-m", "chinchax.cli", "ladder", f"--config.workdir={tmp_path / 'lad'}",
         "--config.ladder.status=True", f"--config.ladder.workers={k}"],
        capture_output=True, text=True, timeout=300, check=True).stdout
    listings.append([line for line in out.splitlines() if "batch=" in line])
  lc = config_lib.get_ladder_variant("default").ladder
  assert listings[0] == listings[1] and len(listings[0]) == lc.n_budgets * lc.sizes_per_budget
  assert any(int(line.split("batch=")[1].split()[0]) % 2 for line in listings[0])  # odd: unrounded


def test_a_ladder_with_few_curve_evals_is_warned_about(tmp_path):
  from chinchax.ladder import driver
  from chinchax.ladder import worker as worker_lib
  c = config_lib.get_ladder_variant("default")
  c.workdir = str(tmp_path / "lad")
  assert driver.sparse_curve_line(worker_lib.prepare(c, check_data=False)) is None
  c.train_config.train.eval_points_from = 0.995
  plan = worker_lib.prepare(c, check_data=False)
  line = driver.sparse_curve_line(plan)
  shortest = min(plan.runs, key=lambda r: r.hparams.steps)
  # 16 points log-spaced over [0.995·steps, steps] round to at most 0.005·steps + 2 distinct steps.
  k = len({round(s) for s in np.geomspace(0.995 * shortest.hparams.steps, shortest.hparams.steps,
                                           16)})
  assert k < driver.MIN_CURVE_POINTS
  assert line is not None and "eval_points_from=0.995" in line and f"only {k} curve" in line
