"""train.profile_steps: a jax.profiler trace of chosen steps lands in <workdir>/profile/."""

import pathlib

import jax

from chinchax import train as train_lib


def test_profile_trace_holds_the_train_step(tiny_config):
  c = tiny_config
  c.budget.steps = 6
  c.train.update(profile_steps=2, profile_first_step=3, log_every=2, eval_every=6,
                 checkpoint_every=6)
  train_lib.train(c, devices=jax.devices()[:1], verbose=False)
  traces = sorted((pathlib.Path(c.workdir) / "profile").rglob("*.xplane.pb"))
  assert len(traces) == 1, traces
  data = traces[0].read_bytes()
  assert b"train_step" in data  # the jitted train step's program ran inside the trace


def test_profile_is_off_by_default(tiny_config):
  c = tiny_config
  c.budget.steps = 3
  train_lib.train(c, devices=jax.devices()[:1], verbose=False)
  assert not (pathlib.Path(c.workdir) / "profile").exists()
