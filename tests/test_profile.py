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


def test_bench_traces_each_point_after_its_timed_steps(tmp_path):
  # bench.profile_steps: each point's extra traced steps land in profile/<point name>/, through
  # the isolated child too; the timed steps are the ones without the trace.
  import json

  from chinchax import cli

  repo = pathlib.Path(__file__).resolve().parent.parent
  wd = tmp_path / "bench"
  rc = cli.main(["bench", "--config", f"{repo}/configs/bench.py:tiny", f"--config.workdir={wd}",
                 "--config.bench.isolate=True", "--config.bench.profile_steps=2",
                 "--config.sweeps.batch.global_batch_size=8"])
  assert rc == 0
  rows = [json.loads(l) for l in (wd / "results.jsonl").read_text().splitlines()]
  ok = [r for r in rows if r["status"] == "ok"]
  assert len(ok) == 1 and ok[0]["timed_steps"] == 2
  point_dir = wd / "profile" / ok[0]["name"]
  assert ok[0]["profile_dir"] == str(point_dir)
  traces = sorted(point_dir.rglob("*.xplane.pb"))
  assert len(traces) == 1, traces
  assert b"train_step" in traces[0].read_bytes()
  assert sorted(p.name for p in (wd / "profile").iterdir()) == [ok[0]["name"]]


def test_bench_profile_steps_must_be_a_count(tmp_path, capsys):
  from chinchax import cli

  repo = pathlib.Path(__file__).resolve().parent.parent
  rc = cli.main(["bench", "--config", f"{repo}/configs/bench.py:tiny",
                 f"--config.workdir={tmp_path / 'b'}", "--config.bench.profile_steps=-1"])
  assert rc == 2
  assert "bench.profile_steps" in capsys.readouterr().err
