"""Warmup-stable-decay schedules, trunk checkpoints kept at branch steps, cooldowns from a trunk."""

import json
import math
import pathlib

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from chinchax import checkpoint as checkpoint_lib
from chinchax import config as config_lib
from chinchax import train as train_lib
from chinchax.data import pipeline as pipeline_lib
from chinchax.train import optim


def _resolve(**train):
  c = config_lib.get_variant("tiny")
  c.train.update(**train)
  return c, train_lib.resolve(c, 1, backend="cpu")


def test_wsd_values_at_hand_computed_steps():
  """peak 1, end 0.1, warmup 4, decay from step 15 to the last step 19 (span 4)."""
  lin = optim.wsd_schedule(1.0, 0.1, 4, 15, 19, "linear")
  sq = optim.wsd_schedule(1.0, 0.1, 4, 15, 19, "1-sqrt")
  for s, want in [(0, 0.0), (1, 0.25), (2, 0.5), (4, 1.0), (10, 1.0), (15, 1.0),
                  (16, 1.0 - 0.9 * 0.25), (17, 0.55), (19, 0.1)]:
    assert float(lin(s)) == pytest.approx(want, abs=1e-6), s
  for s, want in [(2, 0.5), (15, 1.0), (16, 0.1 + 0.9 * 0.5), (17, 0.1 + 0.9 * (1 - math.sqrt(0.5))),
                  (18, 0.1 + 0.9 * (1 - math.sqrt(0.75))), (19, 0.1)]:
    assert float(sq(s)) == pytest.approx(want, abs=1e-6), s
  trunk = optim.wsd_schedule(1.0, 0.1, 4, 40, 39, "1-sqrt")  # decay at or past the end: none
  assert [float(trunk(s)) for s in (3, 4, 20, 39)] == [0.75, 1.0, 1.0, 1.0]
  no_warmup = optim.wsd_schedule(2.0, 0.0, 0, 8, 9, "linear")
  assert [float(no_warmup(s)) for s in (0, 8, 9)] == [2.0, 2.0, 0.0]


def test_wsd_decay_start_from_the_fraction_and_explicit():
  """tiny: 20 steps, warmup 5 capped to 2; decay_fraction 0.2 → decay from round(16) = 16."""
  c, spec = _resolve(schedule="wsd", peak_lr=1.0, min_lr_ratio=0.0, decay_shape="linear")
  assert (spec.steps, spec.warmup_steps, spec.decay_start_step) == (20, 2, 16)
  lr = train_lib.lr_schedule(c, spec)
  assert [float(lr(s)) for s in (1, 2, 16)] == [0.5, 1.0, 1.0]
  assert float(lr(17)) == pytest.approx(2 / 3) and float(lr(19)) == 0.0
  _, spec = _resolve(schedule="wsd", decay_fraction=0.15)
  assert spec.decay_start_step == 17  # round(20 · 0.85)
  _, spec = _resolve(schedule="wsd", decay_start_step=50)
  assert spec.decay_start_step == 50
  _, spec = _resolve()
  assert spec.decay_start_step == 0  # cosine: no decay start


def test_cosine_is_unchanged():
  """The default schedule is the Chinchilla cosine: warmup 2 of 20 steps, end at step 19."""
  c, spec = _resolve(peak_lr=1.0)
  assert c.train.schedule == "cosine"
  lr = train_lib.lr_schedule(c, spec)
  for s in (0, 1, 2, 7, 12, 19):
    want = s / 2 if s < 2 else 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (s - 2) / 17))
    assert float(lr(s)) == pytest.approx(want, abs=1e-6), s


@pytest.mark.parametrize("knob,value,words", [
    ("schedule", "wsdx", "train.schedule='wsdx' is not one of 'cosine', 'wsd'"),
    ("decay_fraction", 0.0, "train.decay_fraction=0.0 must lie in (0, 0.9]"),
    ("decay_fraction", 0.95, "train.decay_fraction=0.95 must lie in (0, 0.9]"),
    ("decay_shape", "sqrt", "train.decay_shape='sqrt' is not one of 'linear', '1-sqrt'"),
    ("decay_start_step", -3, "train.decay_start_step=-3 must be >= 0"),
    ("save_steps", "10,x", "train.save_steps='10,x': 'x' is not a positive step number"),
    ("save_steps", "0", "train.save_steps='0': '0' is not a positive step number"),
    ("init_step", 4, "train.init_step=4 needs train.init_from"),
    ("init_step", -1, "train.init_step=-1 must be >= 0"),
])
def test_bad_knobs_give_one_clear_error(knob, value, words):
  c = config_lib.get_variant("tiny")
  c.train[knob] = value
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(c)
  assert words in str(e.value)


def test_decay_start_inside_the_warmup_is_refused():
  with pytest.raises(config_lib.ConfigError, match=r"decay_start_step=1 is inside the 2-step"):
    _resolve(schedule="wsd", decay_start_step=1)


class _FakeSplit:
  n_tokens = 1000  # 31 windows of 33 tokens


def test_batch_of_a_step_does_not_depend_on_the_run_length():
  """The window ids of step s are the same whatever the run's total steps, past an epoch too."""
  kw = dict(seq_len=32, global_batch_size=8, seed=3)
  one_epoch = pipeline_lib.TrainBatches(_FakeSplit(), steps=3, **kw)  # 24 of 31 windows
  longer = pipeline_lib.TrainBatches(_FakeSplit(), steps=25, allow_repeat=True, **kw)
  longest = pipeline_lib.TrainBatches(_FakeSplit(), steps=40, allow_repeat=True, **kw)
  assert longer.plan.epochs > 6 and longest.plan.epochs > 10
  assert all(one_epoch.window_ids(s) == longest.window_ids(s) for s in range(3))
  assert all(longer.window_ids(s) == longest.window_ids(s) for s in range(25))
  assert longest.window_ids(0) != longest.window_ids(4)  # the check can fail: epochs differ


# ---- trunk + cooldown = direct run ------------------------------------------------------------

S, BRANCH, TRUNK = 20, 14, 24


def _wsd_config(tiny_config, workdir, steps, decay_start, **train):
  c = tiny_config.copy_and_resolve_references()
  c.workdir = str(workdir)
  c.budget.steps = steps
  c.train.update(schedule="wsd", decay_start_step=decay_start, decay_shape="1-sqrt",
                 warmup_steps=2, log_every=1, eval_every=1000, checkpoint_every=5,
                 keep_checkpoints=1, **train)
  return c


def _rows(workdir):
  rows = [json.loads(l) for l in (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines()]
  return {r["step"]: (r["loss"], r["grad_norm"], r["lr"]) for r in rows}


def _arrays(workdir, step):
  restored = ocp.PyTreeCheckpointer().restore(pathlib.Path(workdir) / "checkpoints" / str(step)
                                              / "default")
  leaves = jax.tree_util.tree_flatten_with_path(restored)[0]
  return {jax.tree_util.keystr(p): np.asarray(x) for p, x in leaves}


@pytest.mark.filterwarnings("ignore:Sharding info not provided")
def test_cooldown_from_a_trunk_equals_the_direct_run_bitwise(tiny_config, tmp_path):
  """wsd run of S steps decaying from BRANCH == constant trunk (kept at BRANCH) + cooldown."""
  one = jax.devices()[:1]
  direct = _wsd_config(tiny_config, tmp_path / "direct", S, BRANCH)
  train_lib.train(direct, devices=one, verbose=False)
  trunk = _wsd_config(tiny_config, tmp_path / "trunk", TRUNK, TRUNK, save_steps=str(BRANCH))
  train_lib.train(trunk, devices=one, verbose=False)
  # keep_checkpoints=1 kept only the last interval checkpoint, plus the branch step.
  assert sorted(int(p.name) for p in (tmp_path / "trunk" / "checkpoints").iterdir()
                if p.name.isdigit()) == [BRANCH, TRUNK]
  cool = _wsd_config(tiny_config, tmp_path / "cool", S, BRANCH, init_from=str(tmp_path / "trunk"),
                     init_step=BRANCH)
  summary = train_lib.train(cool, devices=one, verbose=False)
  assert summary["init_step"] == BRANCH and summary["steps"] == S

  d, t, c = _rows(tmp_path / "direct"), _rows(tmp_path / "trunk"), _rows(tmp_path / "cool")
  assert sorted(c) == list(range(BRANCH + 1, S + 1))
  assert all(c[s] == d[s] for s in c)  # bitwise: loss, grad norm, lr of every step after BRANCH
  assert all(t[s] == d[s] for s in range(1, BRANCH + 1))  # the same trajectory up to the branch
  assert t[BRANCH + 2][2] == pytest.approx(trunk.train.peak_lr) and d[BRANCH + 2][2] < trunk.train.peak_lr
  a, b = _arrays(tmp_path / "direct", S), _arrays(tmp_path / "cool", S)
  assert a.keys() == b.keys() and len(a) > 10
  for k in a:
    assert np.array_equal(a[k], b[k]), k

  # A rerun resumes from the cooldown's own checkpoint: init_from (now a missing path) is ignored.
  cool.train.init_from = str(tmp_path / "gone")
  again = train_lib.train(cool, devices=one, verbose=False)
  assert again["resumed"] and again["init_step"] == BRANCH
  assert again["final_eval_loss"] == summary["final_eval_loss"]

  # Refusals, before any data is read or a step is taken.
  bad = {"shape": (dict(), dict(d_model=64), r"model.d_model=32, but this run has model.d_model=64"),
         "step": (dict(init_step=7), dict(), r"no checkpoint at train.init_step=7; its saved steps "
                                             rf"are {BRANCH}, {TRUNK}"),
         "seq_len": (dict(seq_len=16), dict(), r"train.seq_len=32, but this run has train.seq_len=16"),
         "late": (dict(init_step=TRUNK), dict(), rf"at step {TRUNK} is not before this run's last"),
         }
  for name, (train_kw, model_kw, words) in bad.items():
    c = _wsd_config(tiny_config, tmp_path / f"bad_{name}", S, BRANCH,
                    init_from=str(tmp_path / "trunk" / "checkpoints"),
                    **{"init_step": BRANCH, **train_kw})
    c.model.update(**model_kw)
    with pytest.raises(checkpoint_lib.CheckpointError, match=words):
      train_lib.train(c, devices=one, verbose=False)
    assert not (tmp_path / f"bad_{name}" / "metrics.jsonl").exists(), name
