"""Trials in one program (train/trials.py): equality with single runs, a trial that diverges
alone, resume, and bad input."""

import json
import math
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from chinchax import config as config_lib
from chinchax.model import sharding as sharding_lib
from chinchax import checkpoint as checkpoint_lib
from chinchax import train as train_lib
import chinchax.train.loop as loop_lib
import chinchax.train.spec as spec_lib
import chinchax.train.step as step_lib
import chinchax.train.trials as trials_lib

ONE = jax.devices()[:1]


@pytest.mark.parametrize("field,text,needle", [
    ("lr_multipliers", "0.5,x", r"'x' is not a positive number"),
    ("lr_multipliers", "1,-2", r"'-2' is not a positive number"),
    ("lr_multipliers", "1,1.0", r"repeats '1.0'"),
    ("trial_seeds", "0,-1", r"'-1' is not an integer in \[0, 2\^32\)"),
    ("trial_seeds", "4294967296", r"'4294967296' is not an integer in \[0, 2\^32\)"),
    ("trial_seeds", "²", r"'²' is not an integer"),
    ("lr_multipliers", "1,1e42", r"1e\+42 × train.peak_lr=0.003 overflows float32"),
    ("trial_seeds", "3,3", r"repeats '3'"),
])
def test_bad_trials_are_one_clear_error(tiny_config, field, text, needle):
  tiny_config.train[field] = text
  with pytest.raises(config_lib.ConfigError, match=needle):
    config_lib.validate(tiny_config)


def test_trials_are_multipliers_times_seeds(tiny_config):
  c = tiny_config
  assert trials_lib.parse_trials(c) == ()
  c.train.update(lr_multipliers="0.5,2", trial_seeds="4,7", peak_lr=0.01)
  got = [(t.index, t.lr_mult, t.seed, t.peak_lr) for t in trials_lib.parse_trials(c)]
  assert got == [(0, 0.5, 4, 0.005), (1, 0.5, 7, 0.005), (2, 2.0, 4, 0.02), (3, 2.0, 7, 0.02)]
  single = trials_lib.trial_config(c, trials_lib.parse_trials(c)[3])
  assert (single.seed, single.train.peak_lr, single.data.shuffle_seed) == (7, 0.02, c.seed)
  assert trials_lib.parse_trials(single) == ()


def _program_config(mults: str, seeds: str, batching: str):
  c = config_lib.get_variant("tiny")
  c.model.update(compute_dtype="float32", vocab_size=257)
  c.budget.update(mode="steps", steps=40)
  c.train.update(lr_multipliers=mults, trial_seeds=seeds, trial_batching=batching)
  return c


def test_each_trial_equals_its_single_run():
  """Trial k after 8 steps against the single run of trial_config(k) on the same batches:
  bitwise with batching=loop; within 1e-5 with vmap (batched kernels may reorder sums)."""
  rng = np.random.default_rng(0)
  base = _program_config("0.5,2", "0,1", "loop")
  spec = spec_lib.resolve(base, 1)
  mesh = sharding_lib.make_mesh(spec.mesh, ONE)
  batches = [rng.integers(0, 257, (spec.global_batch_size, spec.seq_len + 1)).astype(np.int32)
             for _ in range(8)]
  trials = trials_lib.parse_trials(base)
  singles = []
  for t in trials:
    program = step_lib.build_program(trials_lib.trial_config(base, t), spec, mesh)
    state = program.init_state()
    for b in batches:
      state, _ = program.step(state, program.global_batch(b))
    singles.append(jax.tree.leaves(jax.device_get(state["params"])))
  assert not np.array_equal(singles[0][0], singles[1][0])  # the seeds differ
  worst = {}
  for batching in ("loop", "vmap"):
    program, _ = trials_lib.build_trials_program(
        _program_config("0.5,2", "0,1", batching), spec, mesh, trials)
    state = program.init_state()
    for b in batches:
      state, m = program.step(state, program.global_batch(b))
    stacked = jax.tree.leaves(jax.device_get(state["params"]))
    worst[batching] = max(float(np.max(np.abs(a[t.index] - s)))
                          for t in trials for a, s in zip(stacked, singles[t.index]))
    assert bool(np.all(m["alive"]))
  assert worst["loop"] == 0.0
  assert worst["vmap"] < 1e-5, worst


def _toy_single_step_for(m):
  """A one-parameter step w ← w − m; its loss turns NaN from step 3 on when m > 1."""

  def step(state, batch):
    w = state["params"]["w"] - m
    loss = jnp.where((m > 1.0) & (state["step"] >= 3), jnp.nan, jnp.sum(w))
    return ({"step": state["step"] + 1, "params": {"w": w},
             "opt_state": {"count": state["opt_state"]["count"] + 1}},
            {"loss": loss, "grad_norm": jnp.float32(1.0), "lr": m})

  return step


def test_a_diverging_trial_stops_alone():
  step = jax.jit(trials_lib.make_trials_step(_toy_single_step_for, jnp.array([0.5, 2.0])))
  state = {"step": jnp.int32(0), "params": {"w": jnp.zeros((2, 3))},
           "opt_state": {"count": jnp.zeros((2,), jnp.int32)},
           "alive": jnp.ones((2,), bool), "diverged_step": jnp.zeros((2,), jnp.int32)}
  for _ in range(6):
    state, m = step(state, jnp.zeros((1, 2), jnp.int32))
  # trial 1 took steps 0, 1, 2 (w = -6), its 4th step was non-finite: frozen since, the other on
  np.testing.assert_array_equal(state["params"]["w"], [[-3.0] * 3, [-6.0] * 3])
  np.testing.assert_array_equal(state["opt_state"]["count"], [6, 3])
  np.testing.assert_array_equal(state["alive"], [True, False])
  np.testing.assert_array_equal(state["diverged_step"], [0, 4])
  assert float(m["loss"]) == -9.0 and math.isnan(float(m["trial_loss"][1]))
  all_dead = jax.jit(trials_lib.make_trials_step(_toy_single_step_for, jnp.array([3.0, 2.0])))
  state = {**state, "alive": jnp.ones((2,), bool), "step": jnp.int32(5)}
  state, m = all_dead(state, jnp.zeros((1, 2), jnp.int32))
  assert math.isnan(float(m["loss"])) and not bool(np.any(m["alive"]))


def test_a_trial_whose_parameters_turn_nan_stops_alone():
  """An infinite update leaves the loss of its step finite: the parameters are checked too."""

  def single_step_for(m):
    def step(state, batch):
      w = jnp.where(m > 1.0, jnp.nan, state["params"]["w"] - m)
      return ({"step": state["step"] + 1, "params": {"w": w}, "opt_state": state["opt_state"]},
              {"loss": jnp.float32(1.0), "grad_norm": jnp.float32(1.0), "lr": m})
    return step

  step = jax.jit(trials_lib.make_trials_step(single_step_for, jnp.array([2.0, 0.5])))
  state = {"step": jnp.int32(0), "params": {"w": jnp.zeros((2, 3))},
           "opt_state": {"count": jnp.zeros((2,), jnp.int32)},
           "alive": jnp.ones((2,), bool), "diverged_step": jnp.zeros((2,), jnp.int32)}
  for _ in range(3):
    state, m = step(state, jnp.zeros((1, 2), jnp.int32))
  np.testing.assert_array_equal(state["params"]["w"], [[0.0] * 3, [-1.5] * 3])
  np.testing.assert_array_equal(state["diverged_step"], [1, 0])
  assert float(m["lr"]) == 0.5  # the first live trial's


def _trials_run(c, workdir, **train):
  c = c.copy_and_resolve_references()
  c.workdir = str(workdir)
  c.budget.update(mode="steps", steps=12)
  c.train.update(progress=False, log_every=2, eval_every=6, checkpoint_every=4, **train)
  return c


def _rows(workdir):
  return [json.loads(l) for l in (pathlib.Path(workdir) / "metrics.jsonl").read_text().split("\n")
          if l.strip()]


@pytest.fixture(scope="module")
def trials_reference(small_corpus, store_root, tmp_path_factory):
  c = config_lib.get_variant("tiny")
  c.data.update(source="files", paths=str(small_corpus / "*.txt"), store_root=str(store_root),
                val_fraction=0.1)
  c.mesh.num_cpu_devices = 0
  root = tmp_path_factory.mktemp("trials")
  c = _trials_run(c, root / "ref", lr_multipliers="0.5,2", trial_batching="loop")
  return c, train_lib.train(c, devices=ONE, verbose=False)


def test_a_trials_run_equals_its_single_runs(trials_reference, tmp_path):
  c, summary = trials_reference
  assert [r["lr_mult"] for r in summary["trials"]] == [0.5, 2.0]
  evals = [r["final_eval_loss"] for r in summary["trials"]]
  assert summary["best_trial"] == int(np.argmin(evals))
  assert summary["final_eval_loss"] == min(evals)
  single_c = trials_lib.trial_config(c, trials_lib.parse_trials(c)[1])
  single_c.workdir = str(tmp_path / "single")
  single = train_lib.train(single_c, devices=ONE, verbose=False)
  assert single["final_eval_loss"] == evals[1]
  trial_rows = {r["step"]: r for r in _rows(c.workdir)}
  for r in _rows(single_c.workdir):
    assert trial_rows[r["step"]]["trial_loss"][1] == r["loss"]
    if "eval_loss" in r:
      assert trial_rows[r["step"]]["trial_eval_loss"][1] == r["eval_loss"]
  # export: trial 1 of the trials run is the single run's model, tensor for tensor
  import safetensors.numpy as st
  from chinchax.export import writer as export_lib
  got = st.load_file(str(export_lib.export(c.workdir, tmp_path / "e1", trial=1)
                         / "model.safetensors"))
  want = st.load_file(str(export_lib.export(single_c.workdir, tmp_path / "es")
                          / "model.safetensors"))
  assert got.keys() == want.keys() and all(np.array_equal(got[k], want[k]) for k in got)
  best = export_lib.export(c.workdir, tmp_path / "eb")
  assert json.loads((best / "export_info.json").read_text())["trial"] == summary["best_trial"]
  with pytest.raises(export_lib.ExportError, match=r"--trial 2 is out of range"):
    export_lib.export(c.workdir, tmp_path / "e2", trial=2)
  with pytest.raises(export_lib.ExportError, match=r"is a single run"):
    export_lib.export(single_c.workdir, tmp_path / "e3", trial=0)


def test_a_preempted_trials_run_resumes_bitwise(trials_reference, tmp_path, monkeypatch):
  c, summary = trials_reference
  c = _trials_run(c, tmp_path / "run")
  with monkeypatch.context() as m:
    m.setattr(loop_lib.distributed_lib, "reached_preemption", lambda step: step == 7)
    with pytest.raises(loop_lib.distributed_lib.Preempted):
      train_lib.train(c, devices=ONE, verbose=False)
  other = c.copy_and_resolve_references()
  other.train.lr_multipliers = "0.5,4"
  with pytest.raises(checkpoint_lib.CheckpointError, match=r"train.lr_multipliers='0.5,4'"):
    train_lib.train(other, devices=ONE, verbose=False)
  c.train.lr_multipliers = "0.50,2.0"  # the saved '0.5,2' written otherwise: the same trials
  resumed = train_lib.train(c, devices=ONE, verbose=False)
  assert resumed["resumed"] and resumed["trials"] == summary["trials"]
  assert [r["trial_loss"] for r in _rows(c.workdir)] == [
      r["trial_loss"] for r in _rows(summary["workdir"])]


def test_a_trial_that_diverges_in_a_run_stops_alone(trials_reference, tmp_path, monkeypatch):
  """A step whose loss is NaN once its LR passes 4e-3 (trial ×2's peak is 6e-3)."""
  c, _ = trials_reference
  real = step_lib.make_train_step

  def poisoned(*args, **kwargs):
    inner = real(*args, **kwargs)

    def step(state, batch):
      new, metrics = inner(state, batch)
      return new, {**metrics, "loss": jnp.where(metrics["lr"] > 4e-3, jnp.nan, metrics["loss"])}
    return step

  monkeypatch.setattr(step_lib, "make_train_step", poisoned)
  s = train_lib.train(_trials_run(c, tmp_path / "run"), devices=ONE, verbose=False)
  ok, bad = s["trials"]
  assert s["steps"] == 12 and s["best_trial"] == 0 and math.isfinite(ok["final_eval_loss"])
  assert bad["final_eval_loss"] is None and bad["diverged_step"] >= 1
  assert all(r["trial_loss"][1] is None for r in _rows(tmp_path / "run")
             if r["step"] >= bad["diverged_step"])


def test_trials_cannot_start_from_another_run(tiny_config):
  tiny_config.train.update(lr_multipliers="1,2", init_from="/some/run")
  with pytest.raises(config_lib.ConfigError, match=r"cannot start 2 trials"):
    trials_lib.check_supported(tiny_config, trials_lib.parse_trials(tiny_config))


def test_auto_batching_is_loop_on_cpu_and_vmap_on_accelerators():
  assert trials_lib.resolve_batching("auto", "cpu") == "loop"
  assert trials_lib.resolve_batching("auto", "gpu") == "vmap"
  assert trials_lib.resolve_batching("vmap", "cpu") == "vmap"


def test_a_single_run_cannot_start_from_a_trials_run(trials_reference, tmp_path):
  c, _ = trials_reference
  single = trials_lib.trial_config(c, trials_lib.parse_trials(c)[0])
  single.workdir = str(tmp_path / "from_trials")
  single.train.init_from = c.workdir
  single.budget.steps = 20  # past the source's step 12
  with pytest.raises(checkpoint_lib.CheckpointError, match=r"is a trials run \(train.lr_multipliers"
                                                           r"='0.5,2'.*continue from a single run"):
    train_lib.train(single, devices=ONE, verbose=False)
  assert not (tmp_path / "from_trials" / "checkpoints").exists()
