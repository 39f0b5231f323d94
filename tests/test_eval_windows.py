"""train.eval_windows: fixed validation windows whatever the batch size, and the loss's standard error."""

import json
import math
import pathlib

import jax
import numpy as np
import pytest

from chinchax import config as config_lib
from chinchax.model import sharding as sharding_lib
from chinchax import train as train_lib
from chinchax.data import pipeline as pipeline_lib
from chinchax.data import sources as sources_lib
from chinchax.data import store as store_lib
from chinchax.train import evaluate as evaluate_lib
from chinchax.train import summary as summary_lib

N_WINDOWS = 100  # not a multiple of the 64-row chunk: the last chunk is padded


def _evaluator(config, devices, host_params=None):
  """(windows, evaluate, params, program) for ``config`` on ``devices``; ``host_params`` (numpy
  pytree) placed onto this program's shardings, else the program's fresh init."""
  spec = train_lib.resolve(config, len(devices))
  mesh = sharding_lib.make_mesh(spec.mesh, devices)
  program = train_lib.build_program(config, spec, mesh)
  data = train_lib.prepare_data(config, spec)
  if host_params is None:
    params = program.init_state()["params"]
  else:
    params = jax.device_put(host_params, program.shardings["params"])
  return data, evaluate_lib.Evaluator(program, data), params, program


def _by_hand(program, params, split, seq_len, ids):
  """Per-window mean cross-entropy by a plain forward and float64 numpy log-softmax."""
  from flax import nnx
  model = nnx.merge(program.graphdef, jax.device_get(params))
  x = np.stack([split.read(int(i) * seq_len, seq_len + 1).astype(np.int32) for i in ids])
  logits = np.asarray(model(x[:, :-1]), dtype=np.float64)
  m = logits.max(-1, keepdims=True)
  log_z = (m + np.log(np.exp(logits - m).sum(-1, keepdims=True)))[..., 0]
  target = np.take_along_axis(logits, x[:, 1:, None], axis=-1)[..., 0]
  return (log_z - target).mean(-1)


def test_same_windows_whatever_the_batch_and_se_by_hand(tiny_config):
  c8 = tiny_config.copy_and_resolve_references()
  c8.train.eval_windows = N_WINDOWS
  data8, eval8, params, prog8 = _evaluator(c8, jax.devices())
  host = jax.device_get(params)
  c16 = c8.copy_and_resolve_references()
  c16.train.global_batch_size = 16
  data16, eval16, params16, _ = _evaluator(c16, jax.devices(), host)
  c1 = c8.copy_and_resolve_references()
  c1.mesh.update(data=1, fsdp=1, tensor=1)
  data1, eval1, params1, prog1 = _evaluator(c1, jax.devices()[:1], host)

  W = (data8.val_split.n_tokens - 1) // c8.train.seq_len
  ids = np.arange(N_WINDOWS) * W // N_WINDOWS
  for d in (data8, data16, data1):
    np.testing.assert_array_equal(d.windows.window_ids, ids)
    assert d.evals == []
  assert data8.windows.chunk_rows == 64 and len(data8.windows.chunks) == 2

  loss8, se8 = eval8(params)
  loss16, se16 = eval16(params16)
  assert (loss8, se8) == (loss16, se16)  # bitwise: the same windows in the same chunks
  loss1, se1 = eval1(params1)
  assert loss1 == pytest.approx(loss8, rel=1e-6) and se1 == pytest.approx(se8, rel=1e-4)

  per_window = _by_hand(prog1, params1, data1.val_split, c1.train.seq_len, ids)
  mean = per_window.sum() / N_WINDOWS
  se = math.sqrt(((per_window - mean) ** 2).sum() / (N_WINDOWS - 1)) / math.sqrt(N_WINDOWS)
  assert loss8 == pytest.approx(mean, rel=1e-5)
  assert se8 == pytest.approx(se, rel=1e-4)
  assert 0 < se8 < 0.1


def test_window_ids_and_stats():
  np.testing.assert_array_equal(pipeline_lib.eval_window_ids(10, 4), [0, 2, 5, 7])
  np.testing.assert_array_equal(pipeline_lib.eval_window_ids(3, 3), [0, 1, 2])
  assert pipeline_lib.eval_chunk_rows(8) == 64 and pipeline_lib.eval_chunk_rows(3) == 66
  mean, se = evaluate_lib.window_stats([1.0, 2.0, 3.0, 6.0])
  assert mean == 3.0 and se == pytest.approx(math.sqrt(14 / 3) / 2)  # s² = (4+1+0+9)/3
  assert math.isnan(evaluate_lib.window_stats([2.0])[1])


def test_train_reports_the_se_and_too_many_windows_is_one_error(tiny_config):
  c = tiny_config.copy_and_resolve_references()
  c.train.eval_windows = N_WINDOWS
  c.budget.steps = 4
  c.train.update(eval_every=2, log_every=2, peak_flops_per_device=1e9)
  c.mesh.update(data=1, fsdp=1, tensor=1)
  s = train_lib.train(c, devices=jax.devices()[:1], verbose=False)
  assert s["eval_windows"] == N_WINDOWS and s["eval_tokens"] == N_WINDOWS * c.train.seq_len
  assert 0 < s["final_eval_loss_se"] < 0.1
  assert json.loads((pathlib.Path(c.workdir) / "summary.json").read_text())[
      "final_eval_loss_se"] == s["final_eval_loss_se"]
  rows = [json.loads(l) for l in (pathlib.Path(c.workdir) / "metrics.jsonl").read_text().splitlines()]
  evals = [r for r in rows if "eval_loss" in r]
  assert [r["step"] for r in evals] == [2, 4]
  assert evals[-1]["eval_loss"] == s["final_eval_loss"]
  assert evals[-1]["eval_loss_se"] == s["final_eval_loss_se"]

  split = store_lib.TokenSplit(pathlib.Path(s["store"]), "val")
  W = (split.n_tokens - 1) // c.train.seq_len
  big = tiny_config.copy_and_resolve_references()
  big.train.eval_windows = W + 1
  big.workdir = str(pathlib.Path(c.workdir).parent / "big")
  with pytest.raises(sources_lib.DataError) as e:
    train_lib.train(big, devices=jax.devices()[:1], verbose=False)
  assert f"train.eval_windows={W + 1}" in str(e.value) and f"({W})" in str(e.value)
  assert not (pathlib.Path(big.workdir) / "checkpoints").exists()  # before any state or compile


def test_default_keeps_the_eval_batches_and_reports_no_se(tiny_config):
  assert config_lib.base_config().train.eval_windows == 0
  c = tiny_config.copy_and_resolve_references()
  spec = train_lib.resolve(c, 8)
  data = train_lib.prepare_data(c, spec)
  assert data.windows is None and len(data.evals) == c.train.eval_batches
  assert data.evals[0].shape == (c.train.global_batch_size, c.train.seq_len + 1)
  assert summary_lib.json_float(None) is None and summary_lib.json_float(float("nan")) is None


@pytest.mark.parametrize("bad", [-1, True])
def test_eval_windows_must_be_a_count(bad):
  c = config_lib.base_config()
  c.train.eval_windows = bad
  with pytest.raises(config_lib.ConfigError, match="train.eval_windows"):
    config_lib.validate(c)


def test_curve_evals_read_an_evenly_spread_subset_and_the_final_eval_all(tiny_config):
  """train.curve_eval_windows: intermediate evals average whole chunks spread over the set
  (checked by hand), the final eval all windows."""
  c = tiny_config.copy_and_resolve_references()
  c.train.eval_windows = 4 * 64 + 10  # 4 full chunks and a padded one
  c1 = c.copy_and_resolve_references()
  c1.mesh.update(data=1, fsdp=1, tensor=1)
  data, full, params, program = _evaluator(c1, jax.devices()[:1])
  curve = evaluate_lib.Evaluator(program, data, curve_windows=100)  # -> 2 chunks: the 1st and 4th
  w = data.windows
  per_window = _by_hand(program, params, data.val_split, c.train.seq_len, w.window_ids)
  mean_sub, se_sub = curve(params, final=False)
  sub = np.concatenate([per_window[0:64], per_window[192:256]])
  assert mean_sub == pytest.approx(sub.mean(), abs=1e-5)
  assert se_sub == pytest.approx(sub.std(ddof=1) / math.sqrt(sub.size), rel=1e-3)
  mean_all, _ = curve(params, final=True)
  assert mean_all == pytest.approx(per_window.mean(), abs=1e-5)
  assert mean_all == pytest.approx(full(params)[0], abs=1e-6)
  with pytest.raises(config_lib.ConfigError, match="curve_eval_windows"):
    bad = c.copy_and_resolve_references()
    bad.train.curve_eval_windows = -1
    config_lib.validate(bad)


def test_eval_points_from_spreads_the_curve_over_the_runs_last_part():
  """train.eval_points_from: the log-spaced curve evals start at that fraction of the steps."""
  whole = train_lib.log_spaced_steps(1000, 4)
  assert sorted(whole) == [1, 10, 100, 1000]
  last_decade = train_lib.log_spaced_steps(1000, 4, 0.1)
  assert sorted(last_decade) == [100, 215, 464, 1000]
  assert train_lib.log_spaced_steps(5, 8, 0.1) == {1, 2, 3, 4, 5}   # never before step 1
  assert train_lib.log_spaced_steps(1000, 0, 0.1) == set()
  for bad in (1.0, -0.1, float("nan")):
    c = config_lib.base_config()
    c.train.eval_points_from = bad
    with pytest.raises(config_lib.ConfigError, match="train.eval_points_from"):
      config_lib.validate(c)
