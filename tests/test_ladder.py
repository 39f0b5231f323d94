"""Ladder: grid and shape rule, one row per run, failed runs recorded, resume after a kill."""

import json
import math
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from chinchax.cost import budget
from chinchax import config as config_lib
from chinchax import ladder
from chinchax.planning import shapes as shapes_lib

REPO = pathlib.Path(__file__).resolve().parent.parent


def _ladder_config(tmp_path, small_corpus, store_root):
  c = config_lib.get_ladder_variant("tiny")
  c.workdir = str(tmp_path / "ladder")
  c.ladder.update(c_min=2e8, c_max=8e8, n_budgets=3, sizes_per_budget=3, spread=3.0, bootstrap=5)
  d = c.train_config.data
  d.update(source="files", paths=str(small_corpus / "*.txt"), store_root=str(store_root),
           val_fraction=0.1)
  c.train_config.train.peak_flops_per_device = 1e9  # skip the CPU calibration
  return c


def test_shape_rule_is_close_and_documented_bounds():
  for n in (3e3, 2e4, 1e5, 1e6):
    s = shapes_lib.propose_shapes(n, vocab_size=257, seq_len=128,
                                  rule=shapes_lib.PRESETS["ladder"], k=1)[0].shape
    N = budget.param_counts(s).total
    assert abs(math.log(N / n)) < math.log(1.25), (n, N)
    assert s.n_layers == 2 and s.d_model % 4 == 0 and s.d_model % s.n_heads == 0
    assert s.n_heads == 2 and (s.head_dim >= 16 or s.d_model < 32)


def test_grid_centres_the_optimum(tmp_path, small_corpus, store_root):
  c = _ladder_config(tmp_path, small_corpus, store_root)
  c.ladder.update(c_min=1e12, c_max=1e14, n_budgets=3, sizes_per_budget=5, spread=3.0)
  runs = ladder.plan_runs(c.ladder, c.train_config.train, 257)
  budgets = sorted({r.C_budget for r in runs})
  assert len(budgets) == 3 and budgets[1] == pytest.approx(1e13)
  for C in budgets:
    Ns = sorted(r.counts.total for r in runs if r.C_budget == C)
    n_opt = math.sqrt(C / (6 * c.ladder.tokens_per_param))
    assert len(Ns) == 5 and Ns[0] < n_opt < Ns[-1]
    for r in runs:
      assert r.D == pytest.approx(r.C_budget / (6 * r.counts.total))


def test_bad_ladder_configs(tmp_path, small_corpus, store_root):
  c = _ladder_config(tmp_path, small_corpus, store_root)
  c.ladder.c_max = 1e7
  with pytest.raises(config_lib.ConfigError, match="c_max=1e\\+07 is below ladder.c_min"):
    ladder.run_ladder(c)
  c = _ladder_config(tmp_path, small_corpus, store_root)
  c.ladder.sizes_per_budget = 2
  with pytest.raises(config_lib.ConfigError, match="sizes_per_budget=2"):
    ladder.run_ladder(c)
  c = _ladder_config(tmp_path, small_corpus, store_root)
  c.ladder.update(c_min=1e3, c_max=1e4, min_steps=5)
  with pytest.raises(config_lib.ConfigError, match="only 0 steps of 8×32 tokens"):
    ladder.run_ladder(c)
  c = _ladder_config(tmp_path, small_corpus, store_root)
  c.ladder.update(c_min=1e13, c_max=1e13, n_budgets=1)
  with pytest.raises(config_lib.ConfigError, match="epochs of the"):
    ladder.run_ladder(c)
  assert not (tmp_path / "ladder" / "results.jsonl").exists()


def test_failed_run_is_recorded_and_ladder_goes_on(tmp_path, small_corpus, store_root, monkeypatch):
  from chinchax import train as train_lib
  c = _ladder_config(tmp_path, small_corpus, store_root)
  runs = ladder.plan_runs(c.ladder, c.train_config.train, 257)
  bad = runs[1].run_id
  calls = []

  def fake_train(cfg, devices=None, verbose=True, lease_held=False):
    assert lease_held  # the run's lease makes this worker its workdir's one writer
    calls.append(cfg.workdir)
    if cfg.workdir.endswith(bad):
      raise FloatingPointError("loss is NaN")
    return {"tokens": 1000, "steps": 4, "final_train_loss": 3.0, "final_eval_loss": 3.1,
            "final_eval_bits_per_byte": 4.5, "tokens_per_s": 1.0, "mfu": 0.0}

  monkeypatch.setattr(train_lib, "train", fake_train)
  path = ladder.run_ladder(c)
  rows = [json.loads(l) for l in path.read_text().splitlines()]
  assert len(calls) == len(runs) == len(rows)
  by_id = {r["run_id"]: r for r in rows}
  assert by_id[bad]["status"] == "failed" and "loss is NaN" in by_id[bad]["error"]
  assert sum(r["status"] == "done" for r in rows) == len(runs) - 1
  # A rerun retries only the failed run and keeps one row per run.
  calls.clear()
  ladder.run_ladder(c)
  assert [pathlib.Path(w).name for w in calls] == [bad]
  assert len(path.read_text().splitlines()) == len(runs)


def _ladder_cli(c, log, *extra):
  """Starts `chinchax ladder` on the config `c` (its ladder and data knobs) plus `extra` flags."""
  args = [f"--config={REPO}/configs/ladder.py:tiny", f"--config.workdir={c.workdir}"]
  for k in ("c_min", "c_max", "n_budgets", "sizes_per_budget", "spread", "bootstrap", "fit"):
    args.append(f"--config.ladder.{k}={c.ladder[k]}")
  d = c.train_config.data
  args += [f"--config.train_config.data.source=files", f"--config.train_config.data.paths={d.paths}",
           f"--config.train_config.data.store_root={d.store_root}",
           f"--config.train_config.data.val_fraction={d.val_fraction}",
           "--config.train_config.train.peak_flops_per_device=1e9", *extra]
  env = dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu")
  return subprocess.Popen([sys.executable, "-m", "chinchax.cli", "ladder", *args], env=env,
                          stdout=log, stderr=subprocess.STDOUT)


def test_kill_and_rerun_finishes_remaining_runs_only(tmp_path, small_corpus, store_root):
  c = _ladder_config(tmp_path, small_corpus, store_root)
  # 2 budgets × 3 sizes: 6 runs (a run's compile is most of its cost); fitting is tested in
  # test_analysis_*.
  c.ladder.update(c_min=3e8, c_max=6e8, n_budgets=2, fit=False)
  n_runs = len(ladder.plan_runs(c.ladder, c.train_config.train, 257))
  results = pathlib.Path(c.workdir) / "results.jsonl"
  # The killed process's lease on its run expires after 3 s, not the tiny variant's 20 s.
  leases = ("--config.ladder.lease_expiry_s=3", "--config.ladder.heartbeat_s=0.5",
            "--config.ladder.poll_s=0.2")
  with open(tmp_path / "first.log", "wb") as log:
    proc = _ladder_cli(c, log, *leases)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
      if results.exists() and len(results.read_text().splitlines()) >= 2:
        break
      time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
  before = {json.loads(l)["run_id"]: json.loads(l) for l in results.read_text().splitlines()}
  assert 2 <= len(before) < n_runs, (tmp_path / "first.log").read_text()[-2000:]
  with open(tmp_path / "second.log", "wb") as log:
    proc = _ladder_cli(c, log, *leases)
    assert proc.wait(timeout=600) == 0, (tmp_path / "second.log").read_text()[-3000:]
  out = (tmp_path / "second.log").read_text()
  assert f"{len(before)} already done" in out
  rows = [json.loads(l) for l in results.read_text().splitlines()]
  assert len(rows) == n_runs == len({r["run_id"] for r in rows})
  assert all(r["status"] == "done" for r in rows)
  for r in rows:  # finished runs were not run again
    if r["run_id"] in before:
      assert r == before[r["run_id"]]
    assert r["eval_curve"] and r["eval_curve"][-1][1] == pytest.approx(r["final_eval_loss"])
    assert 0 < r["final_eval_loss_se"] < 0.1  # the tiny ladder's 64 fixed eval windows
  assert not (pathlib.Path(c.workdir) / "fit").exists()
