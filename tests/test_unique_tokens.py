"""data.unique_tokens: epochs over a prefix of whole documents, resume, rows, bad input."""

import json
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest

from chinchax import checkpoint as checkpoint_lib
from chinchax import config as config_lib
from chinchax import ladder
from chinchax import train as train_lib
from chinchax.data import builder as builder_lib
from chinchax.data import pipeline as pipeline_lib
from chinchax.data import sources as sources_lib
from chinchax.data import store as store_lib
from chinchax.data import unique as unique_lib

REPO = pathlib.Path(__file__).resolve().parent.parent


def _train_split(c):
  directory = builder_lib.prepare(c.data, progress=False)
  return directory, store_lib.TokenSplit(directory, "train")


def _losses(workdir):
  rows = [json.loads(x) for x in (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines()]
  return {r["step"]: r["loss"] for r in rows if "loss" in r}


def test_prefix_is_whole_documents_nearest_the_ask(tiny_config):
  directory, split = _train_split(tiny_config)
  starts = np.load(directory / "train_docs.npy")  # hand count: documents' start offsets
  ends = list(starts[1:]) + [split.n_tokens]
  got = unique_lib.document_ends(directory, split.n_tokens)
  assert list(got) == ends
  a, b = ends[1], ends[2]  # the ends of documents 2 and 3
  assert unique_lib.prefix_tokens(got, split.n_tokens, a) == a
  assert unique_lib.prefix_tokens(got, split.n_tokens, a + (b - a) // 3) == a
  assert unique_lib.prefix_tokens(got, split.n_tokens, b - (b - a) // 3) == b
  assert unique_lib.prefix_tokens(got, split.n_tokens, 1) == ends[0]  # at least one document
  assert unique_lib.prefix_tokens(got, split.n_tokens, split.n_tokens) == split.n_tokens
  with pytest.raises(sources_lib.DataError, match=r"exceeds the training split"):
    unique_lib.prefix_tokens(got, split.n_tokens, split.n_tokens + 1)


def test_shuffled_order_keeps_whole_random_documents(tiny_config):
  directory, split = _train_split(tiny_config)
  starts = np.load(directory / "train_docs.npy")
  ends = unique_lib.document_ends(directory, split.n_tokens)
  doc_len = dict(zip(starts.tolist(), (ends - starts).tolist()))
  s, l = unique_lib.select_documents(ends, 20000, "shuffled", seed=5)
  assert all(doc_len[a] == b for a, b in zip(s.tolist(), l.tolist()))  # whole documents
  assert list(s) != list(starts[:len(s)])  # not the store's first documents
  s2, _ = unique_lib.select_documents(ends, 60000, "shuffled", seed=5)
  assert list(s2[:len(s)]) == list(s)  # a larger budget keeps a superset, same order
  view = unique_lib.DocumentsView(split, s, l)
  full = split.all_tokens()
  expect = np.concatenate([full[a:a + b] for a, b in zip(s, l)])
  np.testing.assert_array_equal(view.all_tokens(), expect)  # the documents, concatenated
  T = 32
  ids = np.array([0, 3, (view.n_tokens - 1) // T - 1])
  np.testing.assert_array_equal(view.read_windows(ids * T, T + 1),
                                np.stack([expect[i * T:i * T + T + 1] for i in ids]))


def test_each_epoch_is_a_fresh_permutation_of_the_prefix(tiny_config):
  directory, split = _train_split(tiny_config)
  T, B = 32, 8
  ends = unique_lib.document_ends(directory, split.n_tokens)
  unique = unique_lib.prefix_tokens(ends, split.n_tokens, 6000)
  n = (unique - 1) // T  # windows of the prefix
  steps = -(-3 * n // B)  # three epochs and a bit
  batches = pipeline_lib.TrainBatches(unique_lib.PrefixSplit(split, unique), T, B, steps, seed=3,
                                      allow_repeat=True)
  order = [i for s in range(steps) for i in batches.window_ids(s)]
  epochs = [order[e * n:(e + 1) * n] for e in range(3)]
  for e in epochs:
    assert sorted(e) == list(range(n))  # every window of the prefix once, none outside it
  assert epochs[0] != epochs[1] and epochs[1] != epochs[2]  # each epoch its own order
  full = split.all_tokens()
  for s in (0, steps - 1):  # the tokens are the prefix's windows, all inside the prefix
    for row, i in zip(batches.batch(s), batches.window_ids(s)):
      assert i * T + T + 1 <= unique
      np.testing.assert_array_equal(row, full[i * T:i * T + T + 1].astype(np.int32))
  again = pipeline_lib.TrainBatches(unique_lib.PrefixSplit(split, unique), T, B, steps, seed=3,
                                    allow_repeat=True)  # a pure function of (seed, step)
  assert again.window_ids(steps - 2) == batches.window_ids(steps - 2)


def test_resume_mid_epoch_is_bitwise_and_summary_counts_epochs(tiny_config, tmp_path, capsys):
  c = tiny_config
  _, split = _train_split(c)
  c.data.update(unique_tokens=5000, allow_repeat=True)
  c.budget.steps = 24
  c.train.update(log_every=1, eval_every=100, checkpoint_every=100, eval_batches=1)
  c.workdir = str(tmp_path / "ref")
  ref = train_lib.train(c, devices=jax.devices()[:1], verbose=False)
  c.workdir = str(tmp_path / "split")
  c.train.stop_after_s = 1e-9  # stops (checkpointed) after its first timed step
  first = train_lib.train(c, devices=jax.devices()[:1], verbose=False)
  assert first["stopped_by_time"] and 0 < first["steps"] < 24
  assert first["tokens"] < first["unique_tokens"]  # stopped inside the first epoch
  c.train.stop_after_s = 0.0
  capsys.readouterr()
  s = train_lib.train(c, devices=jax.devices()[:1], verbose=True)
  assert s["resumed"] and s["steps"] == 24
  data_line = next(l for l in capsys.readouterr().out.splitlines() if l.startswith("data "))
  # the epochs are of the prefix, and the line says so (not of the whole split it names)
  assert data_line.endswith(f"run reads {24 * 8 / ((s['unique_tokens'] - 1) // 32):.3f} epochs "
                            f"of {s['unique_tokens']:,} unique tokens (data.unique_tokens=5,000 "
                            f"in whole documents, store order)"), data_line
  assert _losses(tmp_path / "split") == _losses(tmp_path / "ref")  # bitwise
  assert s["final_eval_loss"] == ref["final_eval_loss"]
  tokens = 24 * 8 * 32
  directory, _ = _train_split(c)
  U = unique_lib.prefix_tokens(unique_lib.document_ends(directory, split.n_tokens),
                               split.n_tokens, 5000)
  assert (s["tokens"], s["unique_tokens"], s["repeated_tokens"]) == (tokens, U, tokens - U)
  assert s["epochs"] == pytest.approx(tokens / U) and s["epochs"] > 1
  assert json.loads((tmp_path / "split" / "summary.json").read_text())["epochs"] == s["epochs"]
  c.data.unique_tokens = 6000  # another prefix: another data stream, refused on resume
  with pytest.raises(checkpoint_lib.CheckpointError, match=r"data.unique_tokens=6000 \(saved 5000\)"):
    train_lib.train(c, devices=jax.devices()[:1], verbose=False)


@pytest.mark.parametrize("data, needle", [
    (dict(unique_tokens=10 ** 9), "data.unique_tokens=1,000,000,000 exceeds the training split"),
    (dict(unique_tokens=200), "data.unique_tokens=200 is smaller than one batch: "
                              "global_batch_size=8 windows of seq_len+1=33 tokens need at least "
                              "257 tokens"),
    (dict(unique_tokens=5000, allow_repeat=True, max_epochs=1.5), "more than data.max_epochs=1.5"),
    (dict(unique_tokens=5000), "set --config.data.allow_repeat=True"),
    (dict(unique_tokens=-1), "data.unique_tokens=-1 must be an integer >= 0"),
])
def test_bad_unique_tokens_fail_before_any_step(tiny_config, data, needle):
  c = tiny_config
  c.data.update(**data)
  c.budget.steps = 40
  with pytest.raises(sources_lib.DataError) as e:
    train_lib.train(c, devices=jax.devices()[:1], verbose=False)
  assert needle in str(e.value) and "\n" not in str(e.value)
  assert not (pathlib.Path(c.workdir) / "checkpoints").exists()  # nothing trained


@pytest.mark.parametrize("data, needle", [
    (dict(unique_tokens=-5), "data.unique_tokens=-5 must be an integer >= 0"),
    (dict(unique_order="random"), "data.unique_order='random' is not one of 'store', 'shuffled'"),
    (dict(max_epochs=-1.0), "data.max_epochs=-1.0 must be a number >= 0 (0 = no limit)"),
])
def test_bad_unique_values_are_refused_before_any_line_is_printed(tiny_config, data, needle,
                                                                   capsys):
  c = tiny_config
  c.data.update(**data)
  with pytest.raises(sources_lib.DataError, match=needle.replace("(", r"\(").replace(")", r"\)")):
    train_lib.train(c, devices=jax.devices()[:1], verbose=True)
  assert capsys.readouterr().out == ""  # no model/mesh/batch lines above the error line


def test_a_tiny_epoch_limit_shows_the_epochs_to_its_precision(tiny_config):
  """data.max_epochs far below one epoch of the whole split: the line's epochs are not "0.00"."""
  c = tiny_config
  c.data.max_epochs, c.budget.steps = 1e-5, 40
  _, split = _train_split(c)
  epochs = 40 * 8 / ((split.n_tokens - 1) // 32)  # hand count: sequences / windows of the split
  with pytest.raises(sources_lib.DataError) as e:
    train_lib.train(c, devices=jax.devices()[:1], verbose=False)
  assert f"the run reads {epochs:.3g} epochs of it (the training split's" in str(e.value)
  assert "more than data.max_epochs=1e-05" in str(e.value)


def test_cli_prints_one_error_line(small_corpus, store_root, tmp_path):
  cmd = [sys.executable, "-m", "chinchax.cli", "train", f"--config={REPO}/configs/train.py:tiny",
         f"--config.workdir={tmp_path / 'run'}", f"--config.data.store_root={store_root}",
         "--config.data.source=files", f"--config.data.paths={small_corpus}/*.txt",
         "--config.data.val_fraction=0.1", "--config.mesh.num_cpu_devices=1",
         "--config.budget.steps=40", "--config.data.unique_tokens=5000"]
  out = subprocess.run(cmd, env=dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu"),
                       capture_output=True, text=True, timeout=300)
  errs = [l for l in out.stderr.splitlines() if l.startswith("error:")]
  assert out.returncode == 2 and len(errs) == 1, out.stderr[-2000:]
  assert "epochs of it (data.unique_tokens=5,000 rounds to" in errs[0]
  assert "--config.data.allow_repeat=True" in errs[0]


def _repeat_ladder(tmp_path, small_corpus, store_root):
  c = config_lib.get_ladder_variant("repeat_tiny")
  c.workdir = str(tmp_path / "ladder")
  c.ladder.update(c_min=2e8, c_max=2e8, n_budgets=1, sizes_per_budget=3, bootstrap=5)
  d = c.train_config.data
  d.update(source="files", paths=str(small_corpus / "*.txt"), store_root=str(store_root),
           val_fraction=0.1)
  c.train_config.train.peak_flops_per_device = 1e9  # skip the CPU calibration
  # The final eval only, on 16 windows, and one checkpoint a run: less to compile and to write.
  c.train_config.train.update(eval_points=0, eval_windows=16, checkpoint_every=1000)
  return c


def test_repeat_ladder_rows_carry_unique_tokens_and_epochs(tmp_path, small_corpus, store_root):
  c = _repeat_ladder(tmp_path, small_corpus, store_root)
  c.ladder.update(unique_tokens="5000", validate_unique_tokens=0)  # 3 runs, then the whole split
  path = ladder.run_ladder(c)
  rows = {r["run_id"]: r for r in map(json.loads, path.read_text().splitlines())}
  assert len(rows) == 3 and all(i.startswith("U5000_C2.00e+08_N") for i in rows)
  directory, split = _train_split(c.train_config)
  U = unique_lib.prefix_tokens(unique_lib.document_ends(directory, split.n_tokens),
                               split.n_tokens, 5000)
  for r in rows.values():
    assert r["status"] == "done" and r["unique_tokens_target"] == 5000
    assert r["unique_tokens"] == U and r["epochs"] == pytest.approx(r["D"] / U)
    assert r["repeated_tokens"] == max(0, r["D"] - U)
  assert max(r["epochs"] for r in rows.values()) > 1
  # The validation run is fixed by the config: it trains without any fit.
  plan = ladder.prepare(c, check_data=False, write=False)
  row = ladder.run_validation(plan, tmp_path / "no-fit.json")
  assert row["role"] == "validation" and row["run_id"].startswith("VC3.00e+08_N")
  assert (row["unique_tokens"], row["repeated_tokens"]) == (split.n_tokens, 0)
  assert row["epochs"] == pytest.approx(row["D"] / split.n_tokens)


def test_repeat_ladder_refuses_a_prefix_it_cannot_train(tmp_path, small_corpus, store_root):
  c = _repeat_ladder(tmp_path, small_corpus, store_root)
  c.ladder.unique_tokens = "0,10000000"
  with pytest.raises(sources_lib.DataError, match=r"^run U10000000_C2\.00e\+08_N\d+ .*exceeds"):
    ladder.prepare(c)
  c.ladder.unique_tokens = "0,5000"
  c.train_config.data.allow_repeat = False
  with pytest.raises(sources_lib.DataError, match="set --config.data.allow_repeat=True"):
    ladder.prepare(c)
  assert not (pathlib.Path(c.workdir) / "rows").exists()
  # The validation run's U is fixed by the config: checked before the grid trains, not after.
  c.train_config.data.allow_repeat = True
  c.ladder.validate_unique_tokens = 10
  with pytest.raises(sources_lib.DataError, match=r"^validation run VU10_C3\.00e\+08_N\d+ "
                     r"\(ladder\.validate_unique_tokens=10, .*smaller than one batch"):
    ladder.prepare(c)
  assert not (pathlib.Path(c.workdir) / "rows").exists()
  c.ladder.validate_unique_tokens = 0
  for bad in ("0,x", "5000,5000", "-3"):
    c.ladder.unique_tokens = bad
    with pytest.raises(config_lib.ConfigError, match="ladder.unique_tokens="):
      ladder.validate_ladder(c.ladder)
