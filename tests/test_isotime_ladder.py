"""IsoTime ladder: time budgets become fixed step counts, width × depth at equal N, bad input."""

import json
import math

import jax
import pytest

from chinchax.cost import budget
from chinchax import config as config_lib
from chinchax.runtime import distributed as distributed_lib
from chinchax.laws import parametric as laws
from chinchax.cost import step_time as step_time_lib
from chinchax.cost import work
from chinchax import ladder
import chinchax.ladder.isotime as isotime


def _step_time_file(path, s_per_flop: float, intercept_s: float = 2e-3):
  """A step-time file whose model is t = intercept_s + s_per_flop · FLOPs (exact, no noise)."""
  path.write_text(json.dumps({
      "format": step_time_lib.STEP_TIME_FORMAT, "hardware": "cpu", "n_devices": 1,
      "compute_dtype": "float32", "attention": "xla", "measurements": [],
      "fit": {"intercept_s": intercept_s, "s_per_flop": s_per_flop, "s_per_byte": 0.0}}))
  return path


def _config(tmp_path, small_corpus, store_root, **ladder_overrides):
  c = config_lib.get_ladder_variant("tiny")
  c.workdir = str(tmp_path / "ladder")
  c.ladder.update(budget_kind="seconds", t_min=0.5, t_max=1.0, n_budgets=2, sizes_per_budget=3,
                  spread=2.0, depths="1,2", flops_per_s=2e9, min_steps=3,
                  step_time=str(_step_time_file(tmp_path / "st.json", 1e-12)))
  c.ladder.update(**ladder_overrides)
  d = c.train_config.data
  d.update(source="files", paths=str(small_corpus / "*.txt"), store_root=str(store_root),
           val_fraction=0.1)
  c.train_config.train.peak_flops_per_device = 1e9  # skip the CPU calibration
  return c


def test_isotime_variant_grid_has_depths_at_equal_n_per_budget():
  c = config_lib.get_ladder_variant("isotime")
  runs = isotime.plan_runs(c.ladder, c.train_config.train, 257)
  budgets = sorted({r.seconds_budget for r in runs})
  assert len(budgets) >= 3 and budgets[-1] / budgets[0] >= 10 - 1e-9
  assert len({r.run_id for r in runs}) == len(runs)
  for T in budgets:
    levels = {}
    for r in runs:
      if r.seconds_budget == T:
        levels.setdefault(r.N_target, []).append(r)
    assert len(levels) == c.ladder.sizes_per_budget
    for n_target, rs in levels.items():
      assert sorted(r.shape.n_layers for r in rs) == [1, 2, 4]
      for r in rs:  # ≈ equal N: the width is the nearest at its depth
        assert abs(math.log(r.counts.total / n_target)) < math.log(1.45), (r.run_id, n_target)
      # the hyperparameter rule reads the same nominal compute for the whole budget
      assert [r.C_budget for r in rs] == pytest.approx([T * c.ladder.flops_per_s] * len(rs))


def test_seconds_budget_is_a_fixed_step_count_a_resumed_run_keeps(tmp_path, small_corpus,
                                                                  store_root, monkeypatch):
  c = _config(tmp_path, small_corpus, store_root)
  # 10 ms a step: the 1 s budget is ~100 steps (not ~500 at the default 2 ms intercept).
  _step_time_file(tmp_path / "st.json", 1e-12, intercept_s=1e-2)
  plan = ladder.prepare(c, jax.devices()[:1])
  r = max(plan.runs, key=lambda x: x.seconds_budget)
  gbs = r.hparams.global_batch_size
  t = 1e-2 + 1e-12 * work.step_flops(r.shape, gbs, profile=work.ExecutionProfile(4, True, False))
  planned = isotime.time_plan(plan, r)
  assert planned["steps"] == math.floor(r.seconds_budget / t)
  assert planned["step_time_s"] == pytest.approx(t)
  assert planned["step_time_source"].startswith("model")
  # The run is preempted half-way; meanwhile the step-time source changes (another host, a
  # new fit): the resumed run keeps its planned steps and schedule.
  half = planned["steps"] // 2
  monkeypatch.setattr(distributed_lib, "reached_preemption", lambda step: step == half)
  with pytest.raises(distributed_lib.Preempted):
    ladder.train_run(plan, r, 1, "test")
  monkeypatch.undo()
  _step_time_file(tmp_path / "st.json", 5e-12, intercept_s=2e-2)  # would plan half the steps
  assert isotime.time_plan(plan, r)["steps"] == planned["steps"]
  row = ladder.train_run(plan, r, 2, "test")
  assert row["status"] == "done" and row["resumed"]
  assert row["steps"] == planned["steps"]
  assert row["D"] == planned["steps"] * gbs * c.train_config.train.seq_len
  assert row["seconds_budget"] == r.seconds_budget and row["budget_kind"] == "seconds"
  assert row["step_time_planned_s"] == pytest.approx(t)
  assert row["train_time_s"] == pytest.approx(row["step_time_s"] * row["steps"])
  assert row["hardware"] == "cpu" and row["n_devices"] == 1
  cfg = json.loads((plan.workdir / "runs" / r.run_id / "config.json").read_text())
  assert cfg["budget"]["steps"] == planned["steps"] == cfg["config"]["budget"]["steps"]


def test_probe_is_cached_per_shape_and_host(tmp_path, small_corpus, store_root):
  c = _config(tmp_path, small_corpus, store_root, step_time="probe", probe_steps=5)
  plan = ladder.prepare(c, jax.devices()[:1], check_data=False)
  r = plan.runs[0]
  first = isotime.probe(plan, r)
  assert not first["cached"] and first["step_time_s"] > 0 and first["timed_steps"] == 5
  again = isotime.probe(plan, r)
  assert again["cached"] and again["step_time_s"] == first["step_time_s"]
  assert list((plan.workdir / isotime.PROBES_DIR).glob("*/*.json"))
  tp = isotime.time_plan(plan, r)
  assert tp["steps"] == math.floor(r.seconds_budget / first["step_time_s"])
  assert tp["step_time_source"] == "probe"


@pytest.mark.parametrize("overrides, match", [
    ({"t_min": 0.0}, r"ladder.t_min=0.0 must be a positive number of seconds"),
    ({"t_min": -2.0}, r"ladder.t_min=-2.0 must be a positive number of seconds"),
    ({"t_max": 0.1}, r"ladder.t_max=0.1 s is below ladder.t_min=0.5 s"),
    ({"depths": "0,2"}, r"ladder.depths='0,2' must be distinct positive integers"),
    ({"depths": "two"}, r"ladder.depths='two'"),
    ({"flops_per_s": 0.0}, r"ladder.flops_per_s=0.0 must be a positive number of FLOPs per second"),
    ({"step_time": "/nonexistent/st.json"}, r"ladder.step_time='/nonexistent/st.json' must be"),
    ({"schedule": "wsd"}, r"ladder.schedule='wsd' needs ladder.budget_kind='flops'"),
    ({"budget_kind": "hours"}, r"ladder.budget_kind='hours' is not one of 'flops', 'seconds'"),
])
def test_bad_time_budgets_are_one_clear_error(tmp_path, small_corpus, store_root, overrides,
                                              match):
  c = _config(tmp_path, small_corpus, store_root, **overrides)
  with pytest.raises(config_lib.ConfigError, match=match):
    ladder.prepare(c, jax.devices()[:1])
  assert not (tmp_path / "ladder").exists()


def test_a_shape_that_cannot_step_in_its_budget_fails_before_any_run(tmp_path, small_corpus,
                                                                      store_root):
  # 1 s per step (the intercept) and budgets of 0.5–1 s: not one step fits.
  c = _config(tmp_path, small_corpus, store_root)
  _step_time_file(tmp_path / "st.json", 0.0, intercept_s=1.0)
  with pytest.raises(config_lib.ConfigError,
                     match=r"budget of 0.5 s holds only 0 steps \(ladder.min_steps=3\); raise "
                           r"ladder.t_min to at least 3 s"):
    ladder.prepare(c, jax.devices()[:1])
  workdir = tmp_path / "ladder"
  assert not (workdir / "results.jsonl").exists() and not (workdir / "runs").exists()


def test_validation_run_is_the_best_predicted_shape(tmp_path, small_corpus, store_root):
  c = _config(tmp_path, small_corpus, store_root)
  plan = ladder.prepare(c, jax.devices()[:1], check_data=False)
  fit = {"kind": "isotime", "E": 1.2, "A": 30.0, "B": 400.0, "alpha": 0.35, "beta": 0.3,
         "chosen_predictor": "flops+bytes",
         "step_time": {"predictor": "flops+bytes", "intercept_s": 1e-3, "s_per_flop": 2e-11,
                       "s_per_byte": 1e-10, "compute_dtype": "float32", "attention": "xla",
                       "n_devices": 1}}
  path = tmp_path / "fit.json"
  path.write_text(json.dumps(fit))
  run, pred = isotime.plan_validation(plan, path)
  assert run.role == "validation" and run.run_id.startswith("VT")
  assert run.seconds_budget == pytest.approx(c.ladder.validate_factor * c.ladder.t_max)
  law = laws.law_from_dict(fit)
  seq = c.train_config.train.seq_len
  prof = work.ExecutionProfile(4, True, False)

  def predicted(shape, gbs):
    t = 1e-3 + 2e-11 * work.step_flops(shape, gbs, profile=prof) + 1e-10 * work.bytes_per_step(
        shape, gbs, profile=prof)
    steps = math.floor(run.seconds_budget / t)
    return law.loss(budget.param_counts(shape).total, steps * gbs * seq), t

  loss, t = predicted(run.shape, run.hparams.global_batch_size)
  assert pred["predicted_loss"] == pytest.approx(loss) and pred["predicted_step_time_s"] == \
      pytest.approx(t)
  for r in plan.runs:  # no grid shape at the validation's batch is predicted better
    other = ladder.grid.make_run(c.ladder, c.train_config.train, run.C_budget, r.N_target, 257,
                                 n_layers=r.shape.n_layers, seconds=run.seconds_budget,
                                 shape=r.shape)
    assert predicted(other.shape, other.hparams.global_batch_size)[0] >= loss - 1e-12
