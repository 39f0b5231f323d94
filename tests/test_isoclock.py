"""IsoTime runs on their own clock: a stable phase stopped by time, then a fixed step count."""

import json

import jax
import numpy as np
import pytest

from chinchax import config as config_lib
from chinchax.runtime import distributed as distributed_lib
from chinchax import ladder
from chinchax import train as train_lib
import chinchax.ladder.isoclock as isoclock
import chinchax.ladder.isotime as isotime
from test_isotime_ladder import _config, _step_time_file


def _final_params(workdir, cfg):
  """The final checkpoint's parameters of a run, as numpy leaves."""
  from chinchax import checkpoint as checkpoint_lib
  from chinchax.model import sharding as sharding_lib
  import chinchax.train.step as step_lib
  spec = train_lib.resolve(cfg, 1)
  program = step_lib.build_program(cfg, spec, sharding_lib.make_mesh(spec.mesh, jax.devices()[:1]))
  ckpt = checkpoint_lib.Checkpointer(workdir / "checkpoints", 10 ** 9, 1, ())
  state = ckpt.restore_latest(program.abstract_state, program.shardings)
  ckpt.wait_and_close()
  return [np.asarray(x) for x in jax.tree.leaves(state["params"])], int(state["step"])


def test_stop_after_s_stops_at_a_checkpointed_step(tiny_config, tmp_path):
  c = tiny_config
  c.workdir = str(tmp_path / "run")
  c.budget.update(mode="steps", steps=50)
  c.train.update(stop_after_s=1e-9, progress=False)
  s = train_lib.train(c, devices=jax.devices()[:1], verbose=False)
  # the first step compiles (untimed); the first timed step passes 1 ns
  assert s["stopped_by_time"] and s["steps"] == 2 and s["timed_steps"] == 1
  assert s["timed_seconds"] > 0 and np.isfinite(s["final_eval_loss"])
  _, step = _final_params(tmp_path / "run", c)
  assert step == 2


def test_stop_after_s_must_be_a_nonnegative_number(tiny_config):
  tiny_config.train.stop_after_s = -1.0
  with pytest.raises(config_lib.ConfigError, match=r"train.stop_after_s=-1.0 must be >= 0"):
    train_lib.resolve(tiny_config, 1)


def test_clocked_run_fixes_its_steps_at_the_decay_and_equals_a_direct_wsd_run(
    tmp_path, small_corpus, store_root, monkeypatch):
  c = _config(tmp_path, small_corpus, store_root, time_control="decay")
  plan = ladder.prepare(c, jax.devices()[:1])
  r = max(plan.runs, key=lambda x: x.seconds_budget)
  tp0 = isoclock.clock_plan(plan, r)
  assert "steps" not in tp0 and tp0["stable_s"] == pytest.approx(0.8 * r.seconds_budget)
  # Preempted one step into the decay: the decision is written, the resumed run keeps it
  # even though the step-time source changed meanwhile.
  seen = {}

  def preempt(step):
    tp = json.loads((isoclock.run_dir(plan, r) / isotime.TIME_PLAN_FILE).read_text())
    seen.update(tp)
    return "steps" in tp and step == tp["decay_start_step"] + 1

  monkeypatch.setattr(distributed_lib, "reached_preemption", preempt)
  with pytest.raises(distributed_lib.Preempted):
    ladder.train_run(plan, r, 1, "test")
  monkeypatch.undo()
  decided = dict(seen)
  k, S = decided["decay_start_step"], decided["steps"]
  assert decided["stable"]["steps"] == k and S > k
  assert decided["stable"]["stopped_by_time"] or k == decided["steps_cap"]
  assert S == k + max(1, round((r.seconds_budget - decided["stable"]["train_s"])
                              / decided["stable"]["step_time_s"]))
  _step_time_file(tmp_path / "st.json", 5e-12)
  row = ladder.train_run(plan, r, 2, "test")
  assert row["status"] == "done" and row["resumed"] and row["steps"] == S
  assert row["time_control"] == "decay" and row["schedule"] == "wsd"
  assert row["decay_start_step"] == k and row["stable"]["steps"] == k
  assert row["train_time_s"] == pytest.approx(row["step_time_s"] * S)
  assert not (isoclock.run_dir(plan, r) / isoclock.STABLE_DIR / "checkpoints").exists()
  # The same schedule trained from scratch, no stop, no branch: bitwise the same parameters.
  direct = isoclock.decay_config(plan, r, decided)
  direct.workdir = str(tmp_path / "direct")
  direct.train.update(init_from="", init_step=0)
  train_lib.train(direct, devices=jax.devices()[:1], verbose=False)
  got, got_step = _final_params(isoclock.run_dir(plan, r), direct)
  want, want_step = _final_params(tmp_path / "direct", direct)
  assert got_step == want_step == S
  assert all(np.array_equal(a, b) for a, b in zip(got, want))


def test_unknown_time_control_is_one_clear_error(tmp_path, small_corpus, store_root):
  c = _config(tmp_path, small_corpus, store_root, time_control="adaptive")
  with pytest.raises(config_lib.ConfigError,
                     match=r"ladder.time_control='adaptive' is not one of 'fixed', 'decay'"):
    ladder.prepare(c, jax.devices()[:1])
