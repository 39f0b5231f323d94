"""Evals and checkpoints on the wall clock: train.eval_every_s, train.checkpoint_every_s."""

import json
import pathlib

import jax

from chinchax import train as train_lib
from chinchax.train.cadence import WallClock


class _Clock:
  def __init__(self):
    self.t = 100.0

  def __call__(self):
    return self.t


def test_wall_clock_is_due_after_its_interval_and_resets():
  clock = _Clock()
  w = WallClock(eval_every_s=10.0, checkpoint_every_s=30.0, clock=clock)
  assert w.due() == (False, False)
  clock.t += 10.0
  assert w.due() == (True, False)
  w.evaluated()
  clock.t += 20.0
  assert w.due() == (True, True)
  w.checkpointed()
  w.evaluated()
  assert w.due() == (False, False)
  assert WallClock(0.0, 0.0, clock=clock).due() == (False, False)


def _rows(workdir):
  return [json.loads(x) for x in (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines()]


def test_timed_cadence_evaluates_and_checkpoints_at_log_steps(tiny_config, tmp_path):
  """With the step cadences out of reach, a tiny interval in seconds evaluates and checkpoints
  at every log step; without it, only the last step is evaluated and saved."""
  seen = {}
  for name, every_s in (("timed", 1e-9), ("steps", 0.0)):
    c = tiny_config.copy_and_resolve_references()
    c.workdir = str(tmp_path / name)
    c.budget.update(mode="steps", steps=6)
    c.train.update(log_every=2, eval_every=10**6, checkpoint_every=10**6, keep_checkpoints=10,
                   eval_points=0, eval_every_s=every_s, checkpoint_every_s=every_s)
    train_lib.train(c, devices=jax.devices()[:1], verbose=False)
    evals = [r["step"] for r in _rows(c.workdir) if "eval_loss" in r]
    ckpts = sorted(int(p.name) for p in (tmp_path / name / "checkpoints").iterdir()
                   if p.name.isdigit())
    seen[name] = (evals, ckpts)
  assert seen["timed"] == ([2, 4, 6], [2, 4, 6])
  assert seen["steps"] == ([6], [6])
