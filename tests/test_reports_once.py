"""Reports say each thing once, in words; read-only queries write nothing (issue 26, items 4-8)."""

import json
import pathlib
import re
import shutil

import jax
import numpy as np
import pytest

from analysis.isoflop import bootstrap as bootstrap_lib
from analysis.isoflop import fit as fit_lib
from analysis.io import write_results_jsonl
from analysis.isoflop.synthetic import synthetic_runs
from chinchax import checkpoint as checkpoint_lib
from chinchax import cli
from chinchax.runtime import distributed as distributed_lib
from chinchax.laws import parametric as laws
from chinchax.model import sharding as sharding_lib
from chinchax import train as train_lib
from chinchax.train import summary as summary_lib

REPO = pathlib.Path(__file__).resolve().parent.parent
TRUE = laws.ParametricLaw("true", E=1.8, A=480.0, B=2100.0, alpha=0.35, beta=0.37)


def _train_argv(tmp_path, corpus, *flags):
  return ["train", f"--config={REPO}/configs/train.py:tiny", f"--config.workdir={tmp_path}/run",
          f"--config.data.store_root={tmp_path}/stores", "--config.mesh.num_cpu_devices=0",
          "--config.data.source=files", f"--config.data.paths={corpus}", *flags]


# ---------------------------------------------------------------- item 4


def test_a_preempted_train_says_preempted_once(capsys, tmp_path, small_corpus, monkeypatch):
  monkeypatch.setattr(distributed_lib, "install_sigterm_handler", lambda: False)
  monkeypatch.setattr(distributed_lib, "reached_preemption", lambda step: step == 2)
  rc = cli.main(_train_argv(tmp_path, f"{small_corpus}/*.txt", "--config.budget.steps=6",
                            "--config.train.peak_flops_per_device=1e9"))
  said = capsys.readouterr()
  assert rc == distributed_lib.PREEMPTED_EXIT_CODE
  text = (said.out + said.err).replace(str(tmp_path), "TMP")  # its name holds the word too
  lines = [l for l in text.splitlines() if "preempted" in l]
  assert len(lines) == 1 and "checkpoint saved at step 2" in lines[0], lines


def _table(tmp_path, drop_top=0):
  runs = synthetic_runs(TRUE, np.geomspace(1e18, 1e20, 4), n_sizes=5, span=4.0, noise=0.004,
                        curve_points=12, seed=3)
  path = tmp_path / "results.jsonl"
  write_results_jsonl(runs, str(path))
  if drop_top:  # the smallest budget loses its largest sizes: its minimum is not bracketed
    rows = [json.loads(l) for l in path.read_text().splitlines()]
    low = min(r["C_budget"] for r in rows)
    big = sorted((r for r in rows if r["C_budget"] == low), key=lambda r: r["N"])[-drop_top:]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows if r not in big))
  return path


def test_an_estimate_outside_its_own_interval_is_flagged_with_the_replicates(
    capsys, tmp_path, monkeypatch):
  """Approach 1's bootstrap, made to succeed in 3 of 20 replicates with an interval beside the
  point estimate: stdout's result line and fit.md both say so, with "3 of 20"."""
  real = bootstrap_lib.bootstrap

  def few_successes(runs, approach, res, **kw):
    boot = real(runs, approach, res, **kw)
    a = res.params()["a"]
    boot.ci = {**boot.ci, "a": (a + 0.05, a + 0.09)}
    boot.n_failed = boot.n_resamples - 3
    return boot

  monkeypatch.setattr(fit_lib, "bootstrap", few_successes)
  out = tmp_path / "fit"
  rc = cli.main(["fit", str(_table(tmp_path)), "--approach", "1", "--bootstrap", "20",
                 "--out", str(out), "--no-figures"])
  said = capsys.readouterr()
  assert rc == 0, said.err
  line = [l for l in said.out.splitlines() if l.startswith("approach 1: a = ")]
  assert len(line) == 1 and "outside its interval" in line[0] and "3 of 20" in line[0], line
  md = (out / "fit.md").read_text()
  assert re.search(r"a = [\d.]+ lies outside its own 95% interval \[[\d.]+, [\d.]+\], from 3 of "
                   r"20 bootstrap replicates fitted", md), md[:1500]


def test_an_estimate_inside_its_interval_is_not_flagged(capsys, tmp_path):
  out = tmp_path / "fit"
  assert cli.main(["fit", str(_table(tmp_path)), "--approach", "1", "--bootstrap", "20",
                   "--out", str(out), "--no-figures"]) == 0
  assert "outside" not in capsys.readouterr().out + (out / "fit.md").read_text()


def test_a_left_out_budget_is_said_once_on_stdout_stderr_and_in_fit_md(capsys, tmp_path):
  out = tmp_path / "fit"
  rc = cli.main(["fit", str(_table(tmp_path, drop_top=2)), "--approach", "2", "--bootstrap", "0",
                 "--out", str(out), "--no-figures"])
  said = capsys.readouterr()
  assert rc == 0, said.err
  reason = re.search(r"budget C = 1e\+18 left out \(edge\): (.*)$", said.err, re.M)
  assert reason, said.err
  text = reason.group(1)
  assert (said.out + said.err).count(text) == 1
  md = (out / "fit.md").read_text()
  assert md.count(text) == 1, md
  assert "| edge (see Warnings) |" in md


# ---------------------------------------------------------------- item 5


def test_ladder_status_writes_nothing_into_a_fresh_workdir(capsys, tmp_path):
  wd = tmp_path / "ladder"
  rc = cli.main(["ladder", f"--config={REPO}/configs/ladder.py:tiny", f"--config.workdir={wd}",
                 "--config.ladder.status=True"])
  out = capsys.readouterr().out
  assert rc == 0 and "9 not recorded yet" in out, out
  assert not wd.exists()
  wd.mkdir()  # an existing, empty workdir stays empty
  assert cli.main(["ladder", f"--config={REPO}/configs/ladder.py:tiny", f"--config.workdir={wd}",
                   "--config.ladder.status=True"]) == 0
  assert list(wd.iterdir()) == []


# ---------------------------------------------------------------- item 6


@pytest.mark.parametrize("eval_loss, unigram, below, above", [
    (3.0, 4.0, 0.25, 0.0),   # a quarter below the unigram entropy
    (5.0, 4.0, 0.0, 0.25),   # an untrained model, a quarter above it
    (4.0, 4.0, 0.0, 0.0),
])
def test_eval_below_unigram_is_never_negative(eval_loss, unigram, below, above):
  gap = summary_lib.unigram_gap(eval_loss, unigram)
  assert gap == {"eval_below_unigram": pytest.approx(below), "eval_above_unigram": pytest.approx(above)}


def test_a_run_above_the_unigram_entropy_reports_it_in_words(tiny_config, capsys):
  """Two steps from init: the eval loss is about ln 257 = 5.55 nats, above the corpus's unigram
  entropy; the summary says so without a negative 'below'."""
  c = tiny_config
  c.budget.steps = 2
  c.train.update(eval_every=2, log_every=2, checkpoint_every=2, peak_lr=1e-5)
  s = train_lib.train(c, devices=jax.devices()[:1])
  assert s["final_eval_loss"] > s["val_unigram_entropy_nats"]
  assert s["eval_below_unigram"] == 0.0
  assert s["eval_above_unigram"] == pytest.approx(
      s["final_eval_loss"] / s["val_unigram_entropy_nats"] - 1)
  out = capsys.readouterr().out
  assert "above it (not yet better than a unigram model)" in out and "-" not in out.split(
      "eval loss is")[1].split("%")[0]


# ---------------------------------------------------------------- item 8


def test_a_read_failure_names_the_array_and_file_in_words():
  text = ('OUT_OF_RANGE: Error opening "zarr" driver: Error reading "opt_state.1.0.count/.zarray" '
          'in OCDBT database at local file "/w/checkpoints/20/default/": Error reading Byte range '
          '[0, 3056) of local file "/w/checkpoints/20/default/d/ae0c": Requested byte range '
          '[0, 3056) is not valid for value of size 1018 [tensorstore_spec=\'{"driver":"zarr"}\'] '
          '<bound method pybind11_detail_function_record_v1_system_libstdcpp_gxx_abi_1xxx_use_'
          'cxx11.__repr__ of <tensorstore.Spec object at 0x7f>>')
  from chinchax.checkpoint import integrity
  msg = integrity.read_failure(ValueError(text))
  assert msg == ("array opt_state/1/0/count, file /w/checkpoints/20/default/d/ae0c: truncated "
                 "(1,018 of 3,056 bytes)")
  other = integrity.read_failure(RuntimeError("boom [tensorstore_spec='{}'] <bound method x>"))
  assert other == "RuntimeError: boom"


def test_a_truncated_checkpoint_is_reported_in_words(tiny_config, tmp_path, capsys):
  c = tiny_config
  c.train.update(checkpoint_every=10, keep_checkpoints=3)
  train_lib.train(c, devices=jax.devices()[:1], verbose=False)
  item = pathlib.Path(c.workdir) / "checkpoints" / "20" / "default"
  for f in item.rglob("*"):
    if f.is_file() and f.parent.name == "d":
      f.write_bytes(f.read_bytes()[:len(f.read_bytes()) // 3])
  spec = train_lib.resolve(c, 1)
  program = train_lib.build_program(c, spec, sharding_lib.make_mesh(spec.mesh, jax.devices()[:1]))
  capsys.readouterr()
  ckpt = checkpoint_lib.Checkpointer(pathlib.Path(c.workdir) / "checkpoints", 10, 3)
  assert int(ckpt.restore_latest(program.abstract_state, program.shardings)["step"]) == 10
  ckpt.wait_and_close()
  err = capsys.readouterr().err
  assert re.search(r"is unreadable: .*array [\w/]+, file \S+/checkpoints/20/default/\S+: "
                   r"truncated \([\d,]+ of [\d,]+ bytes\)", err), err
  for raw in ("tensorstore_spec", "<bound", "pybind11", "ValueError"):
    assert raw not in err, err
  shutil.rmtree(c.workdir)


def test_an_empty_corpus_is_named_by_its_files(capsys, tmp_path):
  corpus = tmp_path / "c"
  corpus.mkdir()
  for name in ("a.txt", "b.txt"):
    (corpus / name).write_text("")
  rc = cli.main(_train_argv(tmp_path, f"{corpus}/*.txt"))
  err = [l for l in capsys.readouterr().err.splitlines() if l.strip()]
  assert rc == 2 and len(err) == 1, err
  assert f"corpus of 2 file(s) {corpus}/a.txt, {corpus}/b.txt has no non-empty document" in err[0]
  assert "{" not in err[0] and "'kind'" not in err[0], err
