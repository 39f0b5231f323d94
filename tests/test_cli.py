"""`chinchax train` bad input: one clear `error:` line, exit status 2, nothing written."""

import contextlib
import os
import pathlib
import subprocess
import sys

import pytest

from chinchax import cli

REPO = pathlib.Path(__file__).resolve().parent.parent


def _train(capsys, tmp_path, *flags, corpus=None):
  argv = ["train", f"--config={REPO}/configs/train.py:tiny", f"--config.workdir={tmp_path}/run",
          f"--config.data.store_root={tmp_path}/stores", "--config.mesh.num_cpu_devices=0"]
  if corpus is not None:
    argv += ["--config.data.source=files", f"--config.data.paths={corpus}"]
  rc = cli.main(argv + list(flags))
  err = capsys.readouterr().err.strip().splitlines()
  return rc, err


@pytest.mark.parametrize("flags, needle", [
    (["--config.model.d_model=30", "--config.model.n_heads=4"], "model.d_model=30 is not divisible by model.n_heads=4"),
    (["--config.mesh.data=2", "--config.mesh.fsdp=2"], "= 4 but there are 8 devices"),
    (["--config.mesh.data=-1", "--config.mesh.fsdp=8", "--config.train.global_batch_size=12"],
     "global_batch_size=12 is not divisible by the data-parallel size"),
    (["--config.budget.mode=flops", "--config.budget.flops=-5.0"], "budget.flops=-5.0"),
    (["--config.model.attention=flashy"], "model.attention='flashy'"),
    # tiny budgets by steps: a typed budget knob of another mode would be ignored
    (["--config.budget.tokens=1000"], "--config.budget.tokens=1000 has no effect: "
     "budget.mode='steps' sets D from budget.steps; add --config.budget.mode=tokens"),
    (["--config.budget.mode=tokens_per_param", "--config.budget.steps=2"],
     "--config.budget.steps=2 has no effect: budget.mode='tokens_per_param'"),
])
def test_config_errors(capsys, tmp_path, small_corpus, flags, needle):
  rc, err = _train(capsys, tmp_path, *flags, corpus=f"{small_corpus}/*.txt")
  assert rc == 2
  assert len(err) == 1 and err[0].startswith("error:") and needle in err[0], err
  assert not (tmp_path / "run").exists()


def test_missing_corpus_glob(capsys, tmp_path):
  rc, err = _train(capsys, tmp_path, corpus=f"{tmp_path}/no_such_dir/*.txt")
  assert rc == 2 and len(err) == 1 and "matches no file" in err[0], err
  assert not (tmp_path / "run").exists()


def test_empty_corpus(capsys, tmp_path):
  (tmp_path / "c").mkdir()
  (tmp_path / "c" / "a.txt").write_text("")
  rc, err = _train(capsys, tmp_path, corpus=f"{tmp_path}/c/*.txt")
  assert rc == 2 and len(err) == 1 and "no non-empty document" in err[0], err


def test_corpus_smaller_than_one_batch(capsys, tmp_path):
  (tmp_path / "c").mkdir()
  for i in range(4):
    (tmp_path / "c" / f"{i}.txt").write_text(f"a short document {i}. " * 3)
  rc, err = _train(capsys, tmp_path, "--config.data.val_fraction=0.3", corpus=f"{tmp_path}/c/*.txt")
  assert rc == 2 and len(err) == 1 and "fewer than one batch" in err[0], err
  assert not (tmp_path / "run").exists()


def test_repetition_refused_with_epochs(capsys, tmp_path, small_corpus):
  rc, err = _train(capsys, tmp_path, "--config.budget.steps=5000", "--config.train.global_batch_size=64",
                  "--config.train.seq_len=256", corpus=f"{small_corpus}/*.txt")
  assert rc == 2 and len(err) == 1 and "epochs" in err[0] and "allow_repeat" in err[0], err


def test_console_script_usage():
  out = subprocess.run([sys.executable, "-m", "chinchax.cli", "nonsense"], capture_output=True, text=True)
  assert out.returncode == 2 and "unknown verb 'nonsense'" in out.stderr


@pytest.mark.parametrize("flags, needle", [
    (["--config.model.dmodel=3"], "unknown config key 'dmodel'"),
    (["--config.model.d_model=abc"], "d_model=abc"),
    (["--config.train.peak_lr=True"], "could not convert string to float: 'True'"),
    (["stray_positional"], "unexpected argument(s) 'stray_positional'"),
])
def test_parse_errors_are_one_line(capsys, tmp_path, flags, needle):
  rc, err = _train(capsys, tmp_path, *flags)
  assert rc == 2 and len(err) == 1 and needle in err[0], err


def test_missing_config_file(capsys, tmp_path):
  rc = cli.main(["train", f"--config={tmp_path}/nosuch.py:tiny"])
  err = capsys.readouterr().err.strip().splitlines()
  assert rc == 2 and len(err) == 1 and "does not exist" in err[0], err


def test_resume_with_changed_run_settings_is_refused(capsys, tmp_path, small_corpus):
  flags = ["--config.budget.steps=4", "--config.train.checkpoint_every=2", "--config.train.eval_every=4",
           "--config.train.peak_flops_per_device=1e9"]
  rc, err = _train(capsys, tmp_path, *flags, corpus=f"{small_corpus}/*.txt")
  assert rc == 0, err
  before = {p: p.stat().st_mtime_ns for p in (tmp_path / "run").rglob("*") if p.is_file()}
  rc, err = _train(capsys, tmp_path, *flags, "--config.train.peak_lr=0.01", "--config.seed=7",
                   corpus=f"{small_corpus}/*.txt")
  assert rc == 2 and len(err) == 1, err
  assert "train.peak_lr=0.01 (saved 0.003)" in err[0] and "seed=7 (saved 0)" in err[0], err
  after = {p: p.stat().st_mtime_ns for p in (tmp_path / "run").rglob("*") if p.is_file()}
  assert after == before


def test_resume_with_changed_model_data_or_missing_config_is_refused(capsys, tmp_path, small_corpus):
  """rope_theta, norm_eps, a changed corpus under the same glob, a lost config.json: one error
  line each, before the token store is built, and nothing in the workdir or store root changes."""
  import shutil
  corpus = tmp_path / "corpus"
  shutil.copytree(small_corpus, corpus)
  flags = ["--config.budget.steps=4", "--config.train.checkpoint_every=2",
           "--config.train.eval_every=4", "--config.train.peak_flops_per_device=1e9"]
  rc, err = _train(capsys, tmp_path, *flags, corpus=f"{corpus}/*.txt")
  assert rc == 0, err

  def files():  # the corpus-scan cache (stores/fingerprints/) may learn the changed corpus
    return {p: p.stat().st_mtime_ns if p.is_file() else None
            for root in (tmp_path / "run", tmp_path / "stores") for p in root.rglob("*")
            if "fingerprints" not in p.relative_to(tmp_path).parts}

  before = files()
  for extra, needle in [(["--config.model.rope_theta=500.0"], "model.rope_theta=500.0 (saved 10000.0)"),
                        (["--config.model.norm_eps=1e-05"], "model.norm_eps=1e-05 (saved 1e-06)")]:
    rc, err = _train(capsys, tmp_path, *flags, *extra, corpus=f"{corpus}/*.txt")
    assert rc == 2 and len(err) == 1 and needle in err[0], err
  (corpus / "zz_new.txt").write_text("another document, matching the same glob\n" * 50)
  rc, err = _train(capsys, tmp_path, *flags, corpus=f"{corpus}/*.txt")
  assert rc == 2 and len(err) == 1 and "the corpus" in err[0] and "other documents" in err[0], err
  (corpus / "zz_new.txt").unlink()
  assert files() == before
  (tmp_path / "run" / "config.json").rename(tmp_path / "config.json.moved")
  rc, err = _train(capsys, tmp_path, *flags, corpus=f"{corpus}/*.txt")
  assert rc == 2 and len(err) == 1 and "but no config.json" in err[0], err
  (tmp_path / "config.json.moved").rename(tmp_path / "run" / "config.json")
  rc, err = _train(capsys, tmp_path, *flags, corpus=f"{corpus}/*.txt")  # unchanged: resumes
  assert rc == 0, err


def test_resume_with_another_tokenizer_file_is_refused(tmp_path):
  """data.tokenizer_path is compared by content: another tokenizer.json of the same vocab size."""
  import ml_collections
  from chinchax import checkpoint, config as config_lib
  c = config_lib.get_variant("tiny")
  (tmp_path / "checkpoints" / "2").mkdir(parents=True)
  spec = ml_collections.ConfigDict(dict(model=dict(vocab_size=257), n_params=1, n_kind="total",
                                        tokens=1, steps=1, flops_6nd=1.0))
  checkpoint.write_run_config(tmp_path, c, spec, {"tokenizer_sha256": "a" * 64,
                                                  "store_fingerprint": "b" * 64})
  checkpoint.check_compatible(tmp_path, c, 257, tokenizer_sha256="a" * 64)
  with pytest.raises(checkpoint.CheckpointError, match="data.tokenizer_path.*other contents"):
    checkpoint.check_compatible(tmp_path, c, 257, tokenizer_sha256="c" * 64)


@pytest.mark.parametrize("where, needle", [
    ("workdir_under_proc", "workdir /proc/chinchax-run cannot be created in /proc"),
    ("workdir_is_file", "is a file, not a directory"),
    ("store_under_proc", "data.store_root /proc/chinchax-stores cannot be created in /proc"),
    ("store_is_file", "is a file, not a directory"),
])
def test_unwritable_directories_are_one_error_line_before_the_store(capsys, tmp_path, small_corpus,
                                                                     where, needle):
  (tmp_path / "a_file").write_text("not a directory")
  flags = {"workdir_under_proc": ["--config.workdir=/proc/chinchax-run"],
           "workdir_is_file": [f"--config.workdir={tmp_path}/a_file"],
           "store_under_proc": ["--config.data.store_root=/proc/chinchax-stores"],
           "store_is_file": [f"--config.data.store_root={tmp_path}/a_file"]}[where]
  rc, err = _train(capsys, tmp_path, *flags, corpus=f"{small_corpus}/*.txt")
  assert rc == 2 and len(err) == 1 and err[0].startswith("error:") and needle in err[0], err
  assert not (tmp_path / "stores").exists() and not (tmp_path / "run").exists()
  assert (tmp_path / "a_file").read_text() == "not a directory"


@contextlib.contextmanager
def _unprivileged():
  """Permissions apply to root only under another effective uid (nobody), for this block."""
  if os.geteuid() != 0:
    yield
    return
  os.seteuid(65534)
  try:
    yield
  finally:
    os.seteuid(0)


def test_read_only_and_unreadable_paths_name_themselves(tmp_path):
  import tempfile
  from chinchax.storage import paths
  from chinchax.data import sources
  root = pathlib.Path(tempfile.mkdtemp(dir="/tmp", prefix="chinchax-perm-"))
  try:
    root.chmod(0o755)
    ro, corpus, hidden = root / "ro", root / "corpus", root / "hidden"
    for d in (ro, corpus, hidden):
      d.mkdir()
    (corpus / "a.txt").write_text("readable")
    (corpus / "b.txt").write_text("unreadable")
    (hidden / "c.txt").write_text("behind an unreadable directory")
    ro.chmod(0o555)
    (corpus / "b.txt").chmod(0o000)
    hidden.chmod(0o000)
    with _unprivileged():
      with pytest.raises(paths.PathError, match=f"workdir {ro} is not writable"):
        paths.check_writable_dir(ro, "workdir")
      with pytest.raises(paths.PathError, match=f"workdir {ro}/run cannot be created in {ro}"):
        paths.check_writable_dir(ro / "run", "workdir")
      with pytest.raises(paths.PathError, match=f"corpus file {corpus}/b.txt cannot be read"):
        sources.FileSource(f"{corpus}/*.txt")
      with pytest.raises(paths.PathError, match=f"directory {hidden} cannot be read"):
        sources.FileSource(f"{hidden}/*.txt")
      sources.FileSource(f"{corpus}/a.txt")
    assert sorted(p.name for p in ro.iterdir()) == []  # the probes leave nothing behind
  finally:
    for d in (root / "ro", root / "hidden"):
      d.chmod(0o755)
    import shutil
    shutil.rmtree(root)


def test_checkpoint_directory_lost_mid_run_is_one_error_line(capsys, tmp_path, small_corpus,
                                                              monkeypatch):
  from chinchax import checkpoint
  save = checkpoint.Checkpointer.save

  def failing_save(self, step, state, force=False):
    if step == 4:  # the directory stops accepting files (here: a file takes its place)
      self.manager.wait_until_finished()
      self.directory.rename(self.directory.with_name("kept"))
      self.directory.write_text("")
    return save(self, step, state, force)

  monkeypatch.setattr(checkpoint.Checkpointer, "save", failing_save)
  rc, err = _train(capsys, tmp_path, "--config.budget.steps=6", "--config.train.checkpoint_every=2",
                   "--config.train.log_every=1", "--config.train.peak_flops_per_device=1e9",
                   corpus=f"{small_corpus}/*.txt")
  assert rc == 2 and len(err) == 1 and "checkpoint directory" in err[0] and "cannot save step 4" in err[0], err
  assert (tmp_path / "run" / "kept" / "2").is_dir()
  rows = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
  assert len(rows) == 4  # every row up to the failed save is written


def test_unknown_key_without_a_close_match_lists_the_section(capsys, tmp_path):
  rc, err = _train(capsys, tmp_path, "--config.train.learning_rate=3e-4")
  assert rc == 2 and len(err) == 1, err
  assert "unknown config key 'train.learning_rate'" in err[0] and "peak_lr" in err[0], err


def test_a_reader_that_leaves_early_is_not_an_error():
  """`chinchax plan ... | true` (the reader gone before the plan is written): no traceback, and
  the status a shell gives a writer whose reader left (141 = 128 + SIGPIPE), or 0 when only the
  final flush met the closed pipe."""
  proc = subprocess.run(f"{sys.executable} -m chinchax.cli plan --flops 1e21 | true; "
                        f"echo ${{PIPESTATUS[0]}}", shell=True, capture_output=True, text=True,
                        timeout=120, executable="/bin/bash")
  assert proc.stdout.strip() in ("0", "141") and proc.stderr == "", proc.stderr


@pytest.mark.parametrize("argv", [
    ["plan", "--flops", "1e21", "--write-config", "/proc/x.py"],
    ["fit", "{csv}", "--approach", "2", "--bootstrap", "0", "--out", "{file}"],
    ["export", "{file}", "--out", "/proc/exp"],
])
def test_unwritable_outputs_are_one_error_line(argv, tmp_path, capsys):
  """An output path that is a file or cannot be created: one `error:` line, exit 2, no traceback."""
  f = tmp_path / "a_file.py"
  f.write_text("x = 1\n")
  csv = REPO.parent / "shared" / "reference" / "epoch_chinchilla_svg_extracted_data.csv"
  argv = [a.format(csv=csv, file=f) for a in argv]
  assert cli.main(argv) == 2
  err = [l for l in capsys.readouterr().err.splitlines() if l.strip()]
  assert len(err) == 1 and err[0].startswith("error:"), err


def test_training_goes_on_when_its_output_pipe_closes(tmp_path):
  """`chinchax train ... | head -1`: the run finishes (summary written) and exits 0."""
  wd = tmp_path / "run"
  proc = subprocess.run(
      f"{sys.executable} -m chinchax.cli train --config={REPO}/configs/train.py:tiny "
      f"--config.workdir={wd} --config.mesh.num_cpu_devices=0 | head -1; "
      f"echo ${{PIPESTATUS[0]}}", shell=True, capture_output=True, text=True, timeout=300,
      executable="/bin/bash", env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert proc.stdout.splitlines()[-1] == "0", proc.stderr[-2000:]
  assert (wd / "summary.json").exists()
